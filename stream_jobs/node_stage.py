"""The node stage: one instance per GPU node of a cluster (keyed by ``stream_jobs.scoping.node_key``).

Inputs, in event-time order through a reorder buffer: the node's state, the states of the pods
bound to it (re-keyed by node), and its agent's samples. For every sample it attributes each GPU
to the pod(s) the kubelet assigned it to, accumulates per-pod per-GPU windows and usage, and runs
the node-local alert rules: ``idle_gpu``, ``vram_pressure``, ``gpu_health``, ``crashloop_gpu`` and
``idle_node``. It tells the cluster stage what it saw (:class:`NodeSummary` per sample,
:class:`PodUsage` when a pod leaves the node).

Time rules: a sample at ``t`` stands for ``[t, t + interval)``; a silence longer than
``gap_intervals`` intervals between two samples of one pod's GPU is a gap — it is recorded as
``gap_s`` and resets the idle and VRAM timers, it never counts as idle. Samples older than what
the stage already applied are late: counted and dropped (state updates are still applied).

State is plain JSON-serialisable data (:meth:`to_dict` / :meth:`from_dict`).
"""

from __future__ import annotations

from typing import Any

from common.logs import get_logger
from schemas.messages import (
    DEFAULT_CLUSTER,
    GpuReading,
    GpuSample,
    Message,
    NodeState,
    PodState,
    PodWindow,
    SharedGpuState,
)
from stream_jobs import alerts
from stream_jobs.attribution import Share, attribute, unit_fraction
from stream_jobs.config import EngineConfig
from stream_jobs.internal import NodeSummary, PodUsage, kept
from stream_jobs.mig import layouts_from_sample
from stream_jobs.reorder import ReorderBuffer
from stream_jobs.scoping import stamped
from stream_jobs.shared_vram import NoisyNeighbours, replicas_per_gpu
from stream_jobs.timeutil import EPS, elapsed, epoch, fmt_duration, from_epoch, iso, stable_id, window_start

log = get_logger(__name__)

KINDS: dict[str, tuple[int, type[Message]]] = {
    "node": (0, NodeState),
    "pod": (1, PodState),
    "sample": (3, GpuSample),
}
_ENDED_KEEP = 2000


def _kind_of(message: Message) -> str:
    if isinstance(message, GpuSample):
        return "sample"
    if isinstance(message, PodState):
        return "pod"
    if isinstance(message, NodeState):
        return "node"
    raise TypeError(f"the node stage does not take {type(message).__name__}")


def pod_end_reason(state: PodState) -> str | None:
    """How a pod state says the pod ended, or None while it lives."""
    if state.phase == "Succeeded":
        return "Succeeded"
    if state.phase == "Failed":
        reasons = {state.status_reason, state.last_termination_reason}
        reasons |= {c.last_termination_reason for c in state.containers}
        reasons |= {c.state_reason for c in state.containers if c.state == "terminated"}
        if "Evicted" in reasons:
            return "Evicted"
        if "Preempted" in reasons or "PreemptionByScheduler" in reasons:
            return "Preempted"
        if "OOMKilled" in reasons:
            return "OOMKilled"
        return "Failed"
    if state.deleted:
        return "Deleted"
    return None


def window_id(pod_uid: str, gpu_uuid: str, start: float) -> str:
    return stable_id("window", pod_uid, gpu_uuid, iso(start))


class NodeStage:
    def __init__(self, node: str, config: EngineConfig, cluster: str = DEFAULT_CLUSTER) -> None:
        self.node = node
        self.cluster = cluster
        """The cluster of ``node``: stamped on every output (``stream_jobs.clusters.stamped``)."""
        self.config = config
        self.wm: float | None = None
        self.buffer = ReorderBuffer()
        self.info: dict[str, Any] = {"ready": None, "deleted": False, "product": None, "driver": None,
                                     "cuda": None}
        self.pods: dict[str, dict[str, Any]] = {}
        self.ended: dict[str, float] = {}
        self.gpus: dict[str, dict[str, Any]] = {}
        self.pg: dict[str, dict[str, Any]] = {}
        self.windows: dict[str, dict[str, Any]] = {}
        self.idle_node: dict[str, Any] = {"since": None, "alert": None, "gpus": 0}
        self.shared = NoisyNeighbours()
        self.counters: dict[str, int] = {"samples": 0, "late_samples": 0, "late_states": 0, "gaps": 0,
                                         "unattributed_readings": 0}
        self._out: list[Message] = []

    # ------------------------------------------------------------------ driving

    def submit(self, message: Message) -> None:
        message = kept(message)
        kind = _kind_of(message)
        ts = epoch(message.ts)  # type: ignore[attr-defined]
        if self.wm is not None and ts <= self.wm:
            if kind == "sample":
                self.counters["late_samples"] += 1
                log.info("late sample dropped", node=self.node, ts=iso(ts), watermark=iso(self.wm))
                return
            self.counters["late_states"] += 1
            self._apply(kind, ts, message)  # a state change is never dropped
            return
        self.buffer.push(ts, KINDS[kind][0], kind, message)

    def advance(self, watermark: float) -> list[Message]:
        """Apply every buffered input with ``ts <= watermark``; close complete windows."""
        for ts, kind, message in self.buffer.pop_until(watermark):
            self._apply(kind, ts, message)
        if self.wm is None or watermark > self.wm:
            self.wm = watermark
        self._close_windows(self.wm, final=False)
        return self.drain()

    def flush(self, end: float) -> list[Message]:
        """End of a replay: apply everything, report pods still on the node, close every window."""
        self._out = self.advance(end)
        for uid in sorted(self.pods):
            self._emit_usage(self.pods[uid], end, open_=True)
        self._close_windows(end, final=True)
        return self.drain()

    def drain(self) -> list[Message]:
        out, self._out = self._out, []
        return out if self.cluster == DEFAULT_CLUSTER else stamped(self.cluster, out)

    def _apply(self, kind: str, ts: float, message: Any) -> None:
        if kind == "sample":
            self._on_sample(ts, message)
        elif kind == "pod":
            self._on_pod(ts, message)
        else:
            self._on_node(ts, message)

    # ------------------------------------------------------------------ node and pod state

    def _on_node(self, ts: float, state: NodeState) -> None:
        self.info.update(ready=state.ready and not state.deleted, deleted=state.deleted,
                         product=state.gpu_product or self.info["product"], replicas=replicas_per_gpu(state))
        if state.driver_version:
            self.info["driver"] = state.driver_version
        if state.cuda_driver_version:
            self.info["cuda"] = state.cuda_driver_version
        if state.deleted:
            for uid in sorted(self.pods):
                self._end_pod(uid, ts, "node removed")
        if not self.info["ready"]:
            self.idle_node["since"] = None
            self._resolve_idle_node(ts, "node left" if state.deleted else "node not ready")

    def _on_pod(self, ts: float, state: PodState) -> None:
        uid = state.uid
        if uid in self.ended or (state.node is not None and state.node != self.node):
            return
        pod = self.pods.get(uid)
        if pod is None:
            pod = self.pods[uid] = {
                "uid": uid, "restarts": state.restarts, "restart_times": [], "crash": None,
                "usage": {"unit_s": 0.0, "data_s": 0.0, "idle_s": 0.0, "busy_s": 0.0, "gap_s": 0.0,
                          "util_s": 0.0, "cost_units_s": 0.0, "peak_mem": None, "samples": 0, "model": None,
                          "estimated": False},
            }
        images = [c.image for c in state.containers if c.image]
        pod.update(ns=state.namespace, name=state.name, team=state.team, project=state.project,
                   gpus=sum(state.gpu_requests.values()), image=images[0] if images else pod.get("image"),
                   last_reason=state.last_termination_reason or pod.get("last_reason"),
                   last_exit_code=state.last_exit_code if state.last_exit_code is not None
                   else pod.get("last_exit_code"))
        if state.restarts > pod["restarts"]:
            for _ in range(min(state.restarts - pod["restarts"], 100)):
                pod["restart_times"].append(ts)
            pod["last_restart"] = ts
        pod["restarts"] = state.restarts
        window = self.config.thresholds.crashloop_window
        pod["restart_times"] = [t for t in pod["restart_times"] if t > ts - window + EPS]
        reason = pod_end_reason(state)
        if reason is not None:
            self._end_pod(uid, ts, "pod ended")
            return
        self._check_crashloop(pod, ts)

    def _end_pod(self, uid: str, ts: float, why: str) -> None:
        pod = self.pods.pop(uid, None)
        if pod is None:
            return
        for key in sorted(k for k in self.pg if k.startswith(uid + "|")):
            pg = self.pg.pop(key)
            for name in ("idle", "vram"):
                if pg[name] is not None:
                    self._out.append(alerts.resolve(pg[name], ts, why))
        if pod["crash"] is not None:
            self._out.append(alerts.resolve(pod["crash"], ts, why))
            pod["crash"] = None
        self.ended[uid] = ts
        if len(self.ended) > _ENDED_KEEP:
            for old in sorted(self.ended, key=lambda k: self.ended[k])[: len(self.ended) - _ENDED_KEEP]:
                del self.ended[old]
        self._emit_usage(pod, ts, open_=False)

    def _emit_usage(self, pod: dict[str, Any], ts: float, open_: bool) -> None:
        u = pod["usage"]
        self._out.append(PodUsage(
            pod_uid=pod["uid"], node=self.node, ts=from_epoch(ts), open=open_, gpu_model=u["model"],
            unit_s=u["unit_s"], data_s=u["data_s"], idle_s=u["idle_s"], busy_s=u["busy_s"], gap_s=u["gap_s"],
            util_s=u["util_s"], cost_units_s=u["cost_units_s"], peak_mem_bytes=u["peak_mem"],
            samples=u["samples"], share_estimated=u["estimated"],
        ))

    # ------------------------------------------------------------------ crash loops

    def _check_crashloop(self, pod: dict[str, Any], ts: float) -> None:
        th = self.config.thresholds
        if pod.get("gpus", 0) <= 0:
            return
        recent = [t for t in pod["restart_times"] if t > ts - th.crashloop_window + EPS]
        if pod["crash"] is None and recent and len(recent) >= th.crashloop_restarts:
            details = {
                "restarts_in_window": len(recent), "restarts_total": pod["restarts"],
                "window_s": th.crashloop_window, "driver_version": self.info["driver"],
                "cuda_driver_version": self.info["cuda"], "image": pod.get("image"),
                "last_exit_reason": pod.get("last_reason"), "last_exit_code": pod.get("last_exit_code"),
                "gpus": pod.get("gpus"),
            }
            summary = (f"{pod['ns']}/{pod['name']} restarted {len(recent)} times in "
                       f"{fmt_duration(th.crashloop_window)} on {self.node} while holding {pod.get('gpus')} GPU(s)"
                       f" (last exit: {pod.get('last_reason') or 'unknown'}; driver {self.info['driver']}, "
                       f"CUDA {self.info['cuda']})")
            subj = alerts.subject("pod", pod["ns"], pod["name"], self.node)
            pod["crash"], message = alerts.fire("crashloop_gpu", subj, ts, summary, details)
            self._out.append(message)
        elif pod["crash"] is not None and pod.get("last_restart") is not None \
                and elapsed(ts, pod["last_restart"], th.crashloop_window):
            self._out.append(alerts.resolve(pod["crash"], ts, f"no restart for {fmt_duration(th.crashloop_window)}"))
            pod["crash"] = None

    # ------------------------------------------------------------------ samples

    def _on_sample(self, ts: float, sample: GpuSample) -> None:
        th = self.config.thresholds
        self.counters["samples"] += 1
        dt = sample.sample_interval_s
        if sample.driver_version:
            self.info["driver"] = sample.driver_version
        if sample.cuda_driver_version:
            self.info["cuda"] = sample.cuda_driver_version
        uid_by_name = {(p["ns"], p["name"]): uid for uid, p in self.pods.items()}
        parents = {r.mig_parent_uuid for r in sample.gpus if r.mig_parent_uuid}
        units = allocated = busy = idle_alloc = physical = 0
        price = 0.0
        shared: list[SharedGpuState] = []
        for reading in sample.gpus:
            self._health(reading, ts)
            if reading.mig_parent_uuid is None:
                physical += 1
                price += self.config.price(reading.model)
            if reading.uuid in parents:
                continue  # a MIG parent is not an allocation unit; its MIG devices are
            units += 1
            shares = attribute(reading, uid_by_name)
            if reading.mig_parent_uuid is None and (reading.shared or self.info.get("replicas", 1.0) > 1.0):
                gpu_state, transitions = self.shared.observe(
                    ts, self.node, reading,
                    # an estimated share has no memory of its own (an even split of the device's)
                    [(s.pod_uid, s.namespace, s.pod, None if s.estimated else s.mem_bytes) for s in shares], th)
                shared += [gpu_state] if gpu_state is not None else []
                self._out.extend(transitions)
            if not shares:
                continue
            allocated += 1
            device_busy = False
            device_known = False
            for share in shares:
                pod = self.pods.get(share.pod_uid)
                if pod is None:
                    self.counters["unattributed_readings"] += 1
                    continue
                self._account(pod, reading, share, ts, dt)
                if share.util_pct is not None:
                    device_known = True
                    device_busy = device_busy or share.util_pct >= th.idle_util_pct
            if device_known:
                if device_busy:
                    busy += 1
                else:
                    idle_alloc += 1
        self._out.append(NodeSummary(node=self.node, ts=from_epoch(ts), sample_interval_s=dt, gpus=units,
                                     allocated=allocated, busy=busy, idle_allocated=idle_alloc,
                                     mig=layouts_from_sample(sample.gpus), shared=shared or None))
        self.shared.forget({g.gpu_uuid for g in shared})
        self._idle_node(ts, units, physical, price, allocated > 0)
        for uid in sorted(self.pods):
            pod = self.pods[uid]
            if pod["crash"] is not None:
                self._check_crashloop(pod, ts)

    def _health(self, reading: GpuReading, ts: float) -> None:
        th = self.config.thresholds
        g = self.gpus.setdefault(reading.uuid, {"alert": None, "bad_ts": None})
        critical = [x for x in reading.xids if x.critical]
        bad = reading.health in ("lost", "error") or bool(critical)
        if bad:
            g["bad_ts"] = ts
            if g["alert"] is None:
                what = (f"GPU {reading.health}" if reading.health in ("lost", "error")
                        else "critical XID " + ", ".join(str(x.xid) for x in critical))
                details = {
                    "gpu_index": reading.index, "health": reading.health, "reason": reading.health_reason,
                    "xids": [{"xid": x.xid, "critical": x.critical, "message": x.message} for x in reading.xids],
                    "model": reading.model,
                }
                summary = f"{self.node} GPU {reading.index} ({reading.uuid}): {what}"
                if reading.health_reason:
                    summary += f" ({reading.health_reason})"
                subj = alerts.subject("node", None, self.node, self.node, reading.uuid)
                g["alert"], message = alerts.fire("gpu_health", subj, ts, summary, details)
                self._out.append(message)
        elif g["alert"] is not None and elapsed(ts, g["bad_ts"], th.gpu_health_clear_after):
            self._out.append(alerts.resolve(
                g["alert"], ts, f"healthy with no critical XID for {fmt_duration(th.gpu_health_clear_after)}"))
            g["alert"] = None

    def _account(self, pod: dict[str, Any], reading: GpuReading, share: Share, ts: float, dt: float) -> None:
        th = self.config.thresholds
        key = f"{pod['uid']}|{reading.uuid}"
        pg = self.pg.get(key)
        if pg is None:
            pg = self.pg[key] = {"last": None, "idle_since": None, "idle": None, "vram_since": None, "vram": None}
        usage = pod["usage"]
        gap = 0.0
        if pg["last"] is not None and ts - pg["last"] > th.gap_intervals * dt + EPS:
            gap = ts - pg["last"] - dt
            self.counters["gaps"] += 1
            pg["idle_since"] = None
            pg["vram_since"] = None
            self._gap_windows(pod, reading, pg["last"] + dt, ts, window_start(pg["last"], self.config.window_s))
        pg["last"] = ts
        unit = unit_fraction(reading)
        util = share.util_pct
        # seconds count per allocation unit (a MIG device is a unit); cost weighs the unit's
        # fraction of a physical GPU and the pod's share of a shared one
        usage["unit_s"] += dt
        usage["samples"] += 1
        usage["gap_s"] += gap
        usage["cost_units_s"] += dt * unit * share.share
        usage["model"] = reading.model
        usage["estimated"] = usage["estimated"] or share.estimated
        idle = util is not None and util < th.idle_util_pct
        if util is not None:
            usage["data_s"] += dt
            usage["util_s"] += util * dt
            usage["idle_s" if idle else "busy_s"] += dt
        if share.mem_bytes is not None:
            usage["peak_mem"] = max(usage["peak_mem"] or 0, share.mem_bytes)
        self._accumulate(pod, reading, share, ts, dt, idle)

        # idle_gpu: below the threshold at every sample for idle_after
        if util is not None:
            if idle:
                if pg["idle_since"] is None:
                    pg["idle_since"] = ts
                if pg["idle"] is None and elapsed(ts, pg["idle_since"], th.idle_after):
                    held = share.processes > 0 or (share.mem_bytes or 0) > 0
                    idle_class = "vram_held" if held else "no_process"
                    details = {
                        "idle_class": idle_class, "gpu_index": reading.index, "util_pct": util,
                        "threshold_pct": th.idle_util_pct, "mem_used_bytes": share.mem_bytes,
                        "processes": share.processes, "idle_since": iso(pg["idle_since"]),
                        "share": share.share, "share_estimated": share.estimated,
                    }
                    held_text = (f"holding {(share.mem_bytes or 0) / 2**30:.1f} GiB VRAM" if held
                                 else "no process running")
                    summary = (f"{pod['ns']}/{pod['name']}: GPU {reading.index} on {self.node} below "
                               f"{th.idle_util_pct:g}% SM for {fmt_duration(ts - pg['idle_since'])} ({held_text})")
                    subj = alerts.subject("pod", pod["ns"], pod["name"], self.node, reading.uuid)
                    pg["idle"], message = alerts.fire("idle_gpu", subj, ts, summary, details)
                    self._out.append(message)
            else:
                pg["idle_since"] = None
                if pg["idle"] is not None:
                    self._out.append(alerts.resolve(pg["idle"], ts, "busy again", util_pct=util))
                    pg["idle"] = None

        # vram_pressure: device memory at or above the threshold for vram_pressure_after
        total, used = reading.mem_total_bytes, reading.mem_used_bytes
        if total and used is not None:
            pct = used / total * 100.0
            # bytes are whole: 45.6 of 48 GiB reads 94.9999999992 %, which is 95 %
            if pct >= th.vram_pressure_pct - 1e-6:
                if pg["vram_since"] is None:
                    pg["vram_since"] = ts
                if pg["vram"] is None and elapsed(ts, pg["vram_since"], th.vram_pressure_after):
                    details = {"gpu_index": reading.index, "mem_used_bytes": used, "mem_total_bytes": total,
                               "mem_used_pct": round(pct, 2), "threshold_pct": th.vram_pressure_pct}
                    summary = (f"{pod['ns']}/{pod['name']}: GPU {reading.index} on {self.node} at {pct:.1f}% "
                               f"of {total / 2**30:.0f} GiB VRAM for {fmt_duration(ts - pg['vram_since'])}")
                    subj = alerts.subject("pod", pod["ns"], pod["name"], self.node, reading.uuid)
                    pg["vram"], message = alerts.fire("vram_pressure", subj, ts, summary, details)
                    self._out.append(message)
            else:
                pg["vram_since"] = None
                if pg["vram"] is not None:
                    self._out.append(alerts.resolve(pg["vram"], ts, "below threshold", mem_used_pct=round(pct, 2)))
                    pg["vram"] = None

    def _idle_node(self, ts: float, units: int, physical: int, price_per_hour: float, allocated: bool) -> None:
        th = self.config.thresholds
        state = self.idle_node
        ready = self.info["ready"] is not False and not self.info["deleted"]
        holds = allocated or any(p.get("gpus", 0) > 0 for p in self.pods.values())
        if ready and units > 0 and not holds:
            if state["since"] is None:
                state["since"] = ts
                state["price"] = price_per_hour
                state["gpus"] = physical
            if state["alert"] is None and elapsed(ts, state["since"], th.idle_node_after):
                burned = price_per_hour * (ts - state["since"]) / 3600.0
                details = {"gpus": physical, "idle_since": iso(state["since"]),
                           "cost_usd_burned": round(burned, 4), "usd_per_hour": round(price_per_hour, 4),
                           "gpu_model": self.info["product"]}
                summary = (f"{self.node}: none of its {physical} GPUs allocated for "
                           f"{fmt_duration(ts - state['since'])} (${burned:.2f} burned) - scale-to-zero candidate")
                subj = alerts.subject("node", None, self.node, self.node)
                record, message = alerts.fire("idle_node", subj, ts, summary, details)
                record["idle_since_ts"] = state["since"]
                record["usd_per_hour"] = price_per_hour
                state["alert"] = record
                self._out.append(message)
        else:
            self._resolve_idle_node(ts, "gpu allocated" if ready else "node not ready")
            state["since"] = None

    def _resolve_idle_node(self, ts: float, why: str) -> None:
        state = self.idle_node
        if state["alert"] is None:
            return
        burned = state["alert"]["usd_per_hour"] * (ts - state["alert"]["idle_since_ts"]) / 3600.0
        self._out.append(alerts.resolve(state["alert"], ts, why, cost_usd_burned=round(burned, 4)))
        state["alert"] = None

    # ------------------------------------------------------------------ windows

    def _window(self, pod: dict[str, Any], reading: GpuReading, ws: float) -> dict[str, Any]:
        key = f"{pod['uid']}|{reading.uuid}|{ws!r}"
        w = self.windows.get(key)
        if w is None:
            w = self.windows[key] = {
                "uid": pod["uid"], "ns": pod["ns"], "name": pod["name"], "team": pod.get("team"),
                "project": pod.get("project"), "gpu": reading.uuid, "model": reading.model, "ws": ws,
                "alloc": 0.0, "busy": 0.0, "idle": 0.0, "gap": 0.0, "samples": 0, "util_s": 0.0, "data_s": 0.0,
                "util_max": None, "mem_s": 0.0, "mem_data_s": 0.0, "mem_max": None, "energy": None,
                "share_s": 0.0, "estimated": False, "cost": 0.0, "index": reading.index,
                "container": next((ref.container for ref in reading.assigned_to if ref.pod_uid == pod["uid"]
                                   or (ref.namespace, ref.pod) == (pod["ns"], pod["name"])), None),
            }
        return w

    def _accumulate(self, pod: dict[str, Any], reading: GpuReading, share: Share, ts: float, dt: float,
                    idle: bool) -> None:
        width = self.config.window_s
        unit = unit_fraction(reading)
        price = self.config.price(reading.model)
        util, mem = share.util_pct, share.mem_bytes
        t, end, first = ts, ts + dt, True
        while t < end - EPS:
            ws = window_start(t, width)
            seg = min(end, ws + width) - t
            w = self._window(pod, reading, ws)
            w["alloc"] += seg
            if first:
                w["samples"] += 1
                first = False
            if util is not None:
                w["util_s"] += util * seg
                w["data_s"] += seg
                w["idle" if idle else "busy"] += seg
                w["util_max"] = util if w["util_max"] is None else max(w["util_max"], util)
            if mem is not None:
                w["mem_s"] += mem * seg
                w["mem_data_s"] += seg
                w["mem_max"] = mem if w["mem_max"] is None else max(w["mem_max"], mem)
            if reading.power_w is not None:
                w["energy"] = (w["energy"] or 0.0) + reading.power_w * seg * share.share
                w["power_s"] = w.get("power_s", 0.0) + reading.power_w * seg
                w["power_data_s"] = w.get("power_data_s", 0.0) + seg
            if reading.mem_total_bytes is not None:
                w["mem_total"] = reading.mem_total_bytes
            w["share_s"] += share.share * seg
            w["estimated"] = w["estimated"] or share.estimated
            w["cost"] += seg * unit * share.share * price / 3600.0
            t += seg

    def _gap_windows(self, pod: dict[str, Any], reading: GpuReading, start: float, end: float,
                     last_ws: float) -> None:
        """Record a gap's seconds in the windows it spans that were not already emitted."""
        width = self.config.window_s
        t = start
        while t < end - EPS:
            ws = window_start(t, width)
            seg = min(end, ws + width) - t
            key = f"{pod['uid']}|{reading.uuid}|{ws!r}"
            if ws > last_ws or key in self.windows:
                w = self._window(pod, reading, ws)
                w["alloc"] += seg
                w["gap"] += seg
            t += seg

    def _close_windows(self, watermark: float, final: bool) -> None:
        width = self.config.window_s
        done = [(w["ws"], w["uid"], w["gpu"], key) for key, w in self.windows.items()
                if final or w["ws"] + width <= watermark + EPS]
        for _ws, _uid, _gpu, key in sorted(done):
            w = self.windows.pop(key)
            share = w["share_s"] / w["alloc"] if w["alloc"] > 0 else 1.0
            self._out.append(PodWindow(
                window_id=window_id(w["uid"], w["gpu"], w["ws"]), pod_uid=w["uid"], namespace=w["ns"],
                pod=w["name"], node=self.node, gpu_uuid=w["gpu"], gpu_model=w["model"],
                window_start=from_epoch(w["ws"]), window_end=from_epoch(w["ws"] + width),
                team=w["team"], project=w["project"], allocated_s=w["alloc"], busy_s=w["busy"], idle_s=w["idle"],
                gap_s=w["gap"], samples=w["samples"],
                avg_sm_util_pct=min(100.0, w["util_s"] / w["data_s"]) if w["data_s"] > 0 else None,
                max_sm_util_pct=w["util_max"],
                avg_mem_used_bytes=w["mem_s"] / w["mem_data_s"] if w["mem_data_s"] > 0 else None,
                max_mem_used_bytes=w["mem_max"], energy_j=w["energy"],
                share_fraction=min(1.0, max(0.0, share)), share_estimated=w["estimated"], cost_usd=w["cost"],
                gpu_index=w.get("index"), container=w.get("container"), mem_total_bytes=w.get("mem_total"),
                avg_power_w=w["power_s"] / w["power_data_s"] if w.get("power_data_s") else None,
            ))

    # ------------------------------------------------------------------ checkpoint

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node, "cluster": self.cluster, "wm": self.wm, "buffer": self.buffer.to_dict(),
            "info": self.info,
            "pods": self.pods, "ended": self.ended, "gpus": self.gpus, "pg": self.pg, "windows": self.windows,
            "idle_node": self.idle_node, "counters": self.counters, "shared": self.shared.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], config: EngineConfig) -> NodeStage:
        stage = cls(data["node"], config, data.get("cluster", DEFAULT_CLUSTER))
        stage.wm = data["wm"]
        stage.buffer = ReorderBuffer.from_dict(data["buffer"], {k: v[1] for k, v in KINDS.items()})
        stage.info = data["info"]
        stage.pods = data["pods"]
        stage.ended = data["ended"]
        stage.gpus = data["gpus"]
        stage.pg = data["pg"]
        stage.windows = data["windows"]
        stage.idle_node = data["idle_node"]
        stage.counters = data["counters"]
        stage.shared = NoisyNeighbours(data.get("shared"))
        return stage

