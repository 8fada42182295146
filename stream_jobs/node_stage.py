"""The node stage: one instance per GPU node of a cluster (keyed by ``stream_jobs.scoping.node_key``).

Inputs, in event-time order through a reorder buffer: the node's state, the states of the pods
bound to it (re-keyed by node), and its agent's samples. For every sample it attributes each GPU
to the pod(s) the kubelet assigned it to (a DRA allocation first resolved to its GPU through the
node's ResourceSlices: :mod:`stream_jobs.dra_join`), accumulates per-pod per-GPU windows and usage, and runs
the node-local alert rules: ``idle_gpu``, ``vram_pressure``, ``gpu_health``, ``crashloop_gpu`` and
``idle_node``; the pods' caching-allocator reports go to :mod:`stream_jobs.allocator`
(``allocator_fragmentation``). It tells the cluster stage what it saw (:class:`NodeSummary` per sample,
:class:`PodUsage` when a pod leaves the node).

Time rules: a sample at ``t`` stands for ``[t, t + interval)``; a silence longer than
``gap_intervals`` intervals between two samples of one pod's GPU is a gap — it is recorded as
``gap_s`` and resets the idle and VRAM timers, it never counts as idle. Samples older than what
the stage already applied are late: counted and dropped (state updates are still applied).

State is plain JSON-serialisable data (:meth:`to_dict` / :meth:`from_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from common.logs import get_logger
from schemas.messages import DEFAULT_CLUSTER, GpuReading, GpuSample, Message, NodeState, PodState, WorkloadAllocator
from schemas.outputs import SharedGpuState
from stream_jobs import alerts, rules
from stream_jobs.allocator import AllocatorTracker, PodIdentity
from stream_jobs.attribution import Share, attribute, unit_fraction
from stream_jobs.config import EngineConfig
from stream_jobs.dra_join import device_table, join
from stream_jobs.internal import NodeSummary
from stream_jobs.json_types import JsonDict, JsonObject, as_object, as_str, float_map, int_map, record_map
from stream_jobs.mig import layouts_from_sample
from stream_jobs.scoping import stamped
from stream_jobs.shared_vram import NoisyNeighbours, replicas_per_gpu
from stream_jobs.stage import Stage
from stream_jobs.state import RESTARTS_KEPT, GpuHealth, NodeInfo, NodePod, PodGpuUsage, PodGpuWindow, WindowStamps
from stream_jobs.timeutil import EPS, elapsed, fmt_duration, from_epoch, iso, window_start

log = get_logger(__name__)

KINDS: dict[str, tuple[int, type[Message]]] = {
    "node": (0, NodeState),
    "pod": (1, PodState),
    "sample": (3, GpuSample),
    "allocator": (4, WorkloadAllocator),  # after the sample of the same instant (the GPU's memory)
}
_ENDED_KEEP = 2000
_RuleTables = list[tuple[rules.SustainedRule[rules.PodGpu], rules.RuleTable]]
"""The pod-GPU rules with the stage's table of each (``rules.POD_GPU_RULES`` order)."""
_UNHEALTHY = ("lost", "error")
"""GPU health values that fire ``gpu_health`` (as a critical XID does)."""


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


def _window_key(pod_gpu: str, ws: float) -> str:
    """The key of a pod's window on a GPU (``pod_gpu``: ``pod_uid|gpu_uuid``) starting at ``ws``."""
    return f"{pod_gpu}|{ws!r}"


@dataclass(frozen=True)
class _SampleTally:
    """What a sample's readings add up to: allocation units (whole GPUs and MIG devices, not MIG
    parents), those allocated, busy and allocated but idle, physical GPUs and their price per hour
    (USD), and the shared GPUs' states."""

    units: int
    allocated: int
    busy: int
    idle_allocated: int
    physical: int
    price: float
    shared: list[SharedGpuState]


class NodeStage(Stage):
    KINDS = KINDS
    NAME = "node stage"

    def __init__(self, node: str, config: EngineConfig, cluster: str = DEFAULT_CLUSTER) -> None:
        super().__init__(config)
        self.node = node
        self.cluster = cluster
        """The cluster of ``node``: stamped on every output (``stream_jobs.clusters.stamped``)."""
        self.info = NodeInfo()
        self.pods: dict[str, NodePod] = {}
        self.ended: dict[str, float] = {}
        self.gpus: dict[str, GpuHealth] = {}
        """Health of each GPU seen, by uuid."""
        self.last_sample: dict[str, float] = {}
        """When each ``pod_uid|gpu_uuid`` was last sampled (epoch seconds): gaps are measured from it."""
        self.usage: dict[str, PodGpuUsage] = {}
        """What each pod on the node used, by pod uid (reported when it leaves)."""
        self.windows: dict[str, PodGpuWindow] = {}
        """Open windows by ``pod_uid|gpu_uuid|window_start``."""
        self.alerting: dict[str, rules.RuleTable] = {rule.alert_type: {} for rule in rules.NODE_RULES}
        """Timers and open alerts of the sustained-condition rules, by alert type then subject key."""
        self.shared = NoisyNeighbours()
        """Free VRAM, tenants and noisy_neighbour timers of the node's shared GPUs."""
        self.counters: dict[str, int] = {"samples": 0, "late_samples": 0, "late_states": 0, "gaps": 0,
                                         "unattributed_readings": 0}
        self.allocator = AllocatorTracker(node, config.thresholds, config.window_s)
        """The pods' caching-allocator reports (``workload.allocator.v1``): figures and allocator_fragmentation."""

    # ------------------------------------------------------------------ driving (stage.Stage hooks)

    def _late(self, kind: str, ts: float, message: Message) -> None:
        if kind == "allocator":  # a gauge: the window it belongs to may be closed already
            self.counters["late_allocator"] = self.counters.get("late_allocator", 0) + 1
            return
        if kind == "sample":
            self.counters["late_samples"] += 1
            log.info("late sample dropped", node=self.node, ts=iso(ts), watermark=iso(self.wm or ts))
            return
        self.counters["late_states"] += 1
        self._apply(kind, ts, message)  # a state change is never dropped

    def _watermark_moved(self, watermark: float) -> None:
        self._close_windows(watermark, final=False)

    def _finish(self, end: float) -> None:
        """End of a replay: report pods still on the node, close every window."""
        for uid in sorted(self.pods):
            self._emit_usage(self.pods[uid], end, open_=True)
        self._close_windows(end, final=True)

    def drain(self) -> list[Message]:
        out = super().drain()
        return out if self.cluster == DEFAULT_CLUSTER else stamped(self.cluster, out)

    # ------------------------------------------------------------------ node and pod state

    def _on_node(self, ts: float, state: NodeState) -> None:
        info = self.info
        info.ready, info.deleted = state.ready and not state.deleted, state.deleted
        info.gpu_product = state.gpu_product or info.gpu_product
        info.replicas_per_gpu = replicas_per_gpu(state)
        info.dra_devices = device_table(state.dra_devices)
        if state.driver_version:
            info.driver_version = state.driver_version
        if state.cuda_driver_version:
            info.cuda_driver_version = state.cuda_driver_version
        if state.deleted:
            for uid in sorted(self.pods):
                self._end_pod(uid, ts, "node removed")
        if not info.ready:
            self._resolve_idle_node(ts, "node left" if state.deleted else "node not ready")

    def _on_pod(self, ts: float, state: PodState) -> None:
        uid = state.uid
        if uid in self.ended or (state.node is not None and state.node != self.node):
            return
        pod = self.pods.get(uid)
        if pod is None:
            pod = self.pods[uid] = NodePod(uid=uid, restarts=state.restarts)
            self.usage[uid] = PodGpuUsage()
        images = [c.image for c in state.containers if c.image]
        pod.namespace, pod.name, pod.team, pod.project = state.namespace, state.name, state.team, state.project
        pod.gpus = sum(state.gpu_requests.values())
        pod.image = images[0] if images else pod.image
        pod.last_reason = state.last_termination_reason or pod.last_reason
        if state.last_exit_code is not None:
            pod.last_exit_code = state.last_exit_code
        if state.restarts > pod.restarts:
            for _ in range(min(state.restarts - pod.restarts, RESTARTS_KEPT)):
                pod.restart_times.append(ts)
            pod.last_restart = ts
        pod.restarts = state.restarts
        window = self.config.thresholds.crashloop_window
        pod.restart_times = [t for t in pod.restart_times if t > ts - window + EPS]
        reason = pod_end_reason(state)
        if reason is not None:
            self._end_pod(uid, ts, "pod ended")
            return
        self._check_crashloop(pod, ts)

    def _end_pod(self, uid: str, ts: float, why: str) -> None:
        pod = self.pods.pop(uid, None)
        if pod is None:
            return
        for key in sorted(k for k in self.last_sample if k.startswith(uid + "|")):
            del self.last_sample[key]
            for rule in rules.POD_GPU_RULES:
                self._out += rules.close(self.alerting[rule.alert_type], key, ts, why)
        if pod.crash is not None:
            self._out.append(alerts.resolve(pod.crash, ts, why))
            pod.crash = None
        self.ended[uid] = ts
        if len(self.ended) > _ENDED_KEEP:
            for old in sorted(self.ended, key=lambda k: self.ended[k])[: len(self.ended) - _ENDED_KEEP]:
                del self.ended[old]
        self._emit_usage(pod, ts, open_=False)
        self._out += self.allocator.end_pod(uid, ts, why)

    def _emit_usage(self, pod: NodePod, ts: float, open_: bool) -> None:
        usage = self.usage[pod.uid] if open_ else self.usage.pop(pod.uid)
        message = usage.message(pod.uid, self.node, ts, open_)
        figures = self.allocator.usage(pod.uid)
        self._out.append(message.model_copy(update=figures) if figures else message)

    # ------------------------------------------------------------------ allocator reports

    def _on_allocator(self, ts: float, message: WorkloadAllocator) -> None:
        pod = self.pods.get(message.pod_uid)
        identity = PodIdentity(pod.uid, pod.namespace, pod.name) if pod is not None else None
        self._out += self.allocator.report(ts, message, identity)

    # ------------------------------------------------------------------ crash loops

    def _check_crashloop(self, pod: NodePod, ts: float) -> None:
        th = self.config.thresholds
        if pod.gpus <= 0:
            return
        info = self.info
        recent = [t for t in pod.restart_times if t > ts - th.crashloop_window + EPS]
        if pod.crash is None and recent and len(recent) >= th.crashloop_restarts:
            details: alerts.Details = {
                "restarts_in_window": len(recent), "restarts_total": pod.restarts,
                "window_s": th.crashloop_window, "driver_version": info.driver_version,
                "cuda_driver_version": info.cuda_driver_version, "image": pod.image,
                "last_exit_reason": pod.last_reason, "last_exit_code": pod.last_exit_code,
                "gpus": pod.gpus,
            }
            summary = (f"{pod.namespace}/{pod.name} restarted {len(recent)} times in "
                       f"{fmt_duration(th.crashloop_window)} on {self.node} while holding {pod.gpus} GPU(s)"
                       f" (last exit: {pod.last_reason or 'unknown'}; driver {info.driver_version}, "
                       f"CUDA {info.cuda_driver_version})")
            subj = alerts.subject("pod", pod.namespace, pod.name, self.node)
            pod.crash, message = alerts.fire(rules.CRASHLOOP_GPU.kind, subj, ts, summary, details)
            self._out.append(message)
        elif pod.crash is not None and pod.last_restart is not None \
                and elapsed(ts, pod.last_restart, rules.CRASHLOOP_GPU.quiet(th)):
            quiet = fmt_duration(rules.CRASHLOOP_GPU.quiet(th))
            self._out.append(alerts.resolve(pod.crash, ts, f"no restart for {quiet}"))
            pod.crash = None

    # ------------------------------------------------------------------ samples

    def _on_sample(self, ts: float, sample: GpuSample) -> None:
        """One sample: every reading's health, attribution and windows (:meth:`_tally`), then the
        node's summary and rules."""
        counters, info = self.counters, self.info
        counters["samples"] += 1
        dt = sample.sample_interval_s
        info.driver_version = sample.driver_version or info.driver_version
        info.cuda_driver_version = sample.cuda_driver_version or info.cuda_driver_version
        uid_by_name = {(p.namespace, p.name): uid for uid, p in self.pods.items()}
        if sample.dra_allocations:  # without allocations the join gives the sample back and counts nothing
            sample = self._join_dra(sample, uid_by_name)
        tally = self._tally(ts, sample, uid_by_name)
        self._out.append(NodeSummary(node=self.node, ts=from_epoch(ts), sample_interval_s=dt, gpus=tally.units,
                                     allocated=tally.allocated, busy=tally.busy,
                                     idle_allocated=tally.idle_allocated, mig=layouts_from_sample(sample.gpus),
                                     shared=tally.shared or None))
        if self.shared.gpus:  # forgetting walks the tracked shared GPUs: none on most nodes
            self.shared.forget({g.gpu_uuid for g in tally.shared}, self.alerting["noisy_neighbour"])
        self._idle_node(ts, tally.units, tally.physical, tally.price, tally.allocated > 0)
        for uid in sorted(uid for uid, pod in self.pods.items() if pod.crash is not None):
            self._check_crashloop(self.pods[uid], ts)

    def _tally(self, ts: float, sample: GpuSample, uid_by_name: dict[tuple[str, str], str]) -> _SampleTally:
        """Every reading's health, attribution and windows, added up for the node's summary and its
        idle-node rule. What is the same for every reading of the sample (the pod-GPU rules' tables,
        a GPU model's price) is looked up once here, not per reading or per pod's share."""
        dt = sample.sample_interval_s
        parents = {r.mig_parent_uuid for r in sample.gpus if r.mig_parent_uuid}
        units = allocated = busy = idle_alloc = physical = 0
        price = 0.0
        shared: list[SharedGpuState] = []
        config, replicated = self.config, self.info.replicas_per_gpu > 1.0
        tables = [(rule, self.alerting[rule.alert_type]) for rule in rules.POD_GPU_RULES]
        for reading in sample.gpus:
            self._health(reading, ts)
            whole = reading.mig_parent_uuid is None
            gpu_price = config.price(reading.model)
            if whole:
                physical += 1
                price += gpu_price
            if parents and reading.uuid in parents:
                continue  # a MIG parent is not an allocation unit; its MIG devices are
            units += 1
            shares = attribute(reading, uid_by_name)
            if whole and (reading.shared or replicated):
                shared += self._shared_gpu(ts, reading, shares)
            if not shares:
                continue
            allocated += 1
            unit = 1.0 if whole else unit_fraction(reading)
            device_busy = self._apply_shares(reading, shares, ts, dt, unit, gpu_price, tables)
            if device_busy is not None:
                busy += device_busy
                idle_alloc += not device_busy
        return _SampleTally(units, allocated, busy, idle_alloc, physical, price, shared)

    def _join_dra(self, sample: GpuSample, uid_by_name: dict[tuple[str, str], str]) -> GpuSample:
        """The sample with its DRA allocations' pods on their GPUs; what did not resolve is counted
        (``dra_unresolved``, ``dra_other_driver``), never raised."""
        result = join(sample, self.info.dra_devices, uid_by_name)
        for name, value in (("dra_resolved", result.resolved), ("dra_unresolved", result.unresolved),
                            ("dra_other_driver", result.other_driver)):
            if value:
                self.counters[name] = self.counters.get(name, 0) + value
        return result.sample

    def _shared_gpu(self, ts: float, reading: GpuReading, shares: list[Share]) -> list[SharedGpuState]:
        """A shared GPU's free VRAM and tenants, and its ``noisy_neighbour`` transitions."""
        gpu_state, transitions = self.shared.observe(
            ts, self.node, reading,
            # an estimated share has no memory of its own (an even split of the device's)
            [(s.pod_uid, s.namespace, s.pod, None if s.estimated else s.mem_bytes) for s in shares],
            self.config.thresholds, self.alerting["noisy_neighbour"])
        self._out.extend(transitions)
        return [gpu_state] if gpu_state is not None else []

    def _apply_shares(self, reading: GpuReading, shares: list[Share], ts: float, dt: float, unit: float,
                      price: float, tables: _RuleTables) -> bool | None:
        """Account each known pod's share of an allocated device (``unit``: :func:`unit_fraction`,
        ``price``: USD per hour of its model, ``tables``: the pod-GPU rules with their tables); whether
        the device was busy (at or above ``idle_util_pct`` for some pod), None when no share had a
        utilisation figure."""
        busy: bool | None = None
        pods, idle_below = self.pods, self.config.thresholds.idle_util_pct
        for share in shares:
            pod = pods.get(share.pod_uid)
            if pod is None:
                self.counters["unattributed_readings"] += 1
                continue
            self._account(pod, reading, share, ts, dt, unit, price, tables)
            if share.util_pct is not None:
                busy = bool(busy) or share.util_pct >= idle_below
        return busy

    def _health(self, reading: GpuReading, ts: float) -> None:
        g = self.gpus.get(reading.uuid)
        if g is None:
            g = self.gpus[reading.uuid] = GpuHealth()
        if g.alert is None and not reading.xids and reading.health not in _UNHEALTHY:
            return  # healthy, no alert to resolve: what nearly every reading is
        th = self.config.thresholds
        critical = [x for x in reading.xids if x.critical] if reading.xids else []
        bad = reading.health in _UNHEALTHY or bool(critical)
        if bad:
            g.bad_ts = ts
            if g.alert is None:
                what = (f"GPU {reading.health}" if reading.health in _UNHEALTHY
                        else "critical XID " + ", ".join(str(x.xid) for x in critical))
                details: alerts.Details = {
                    "gpu_index": reading.index, "health": reading.health, "reason": reading.health_reason,
                    "xids": [{"xid": x.xid, "critical": x.critical, "message": x.message} for x in reading.xids],
                    "model": reading.model,
                }
                summary = f"{self.node} GPU {reading.index} ({reading.uuid}): {what}"
                if reading.health_reason:
                    summary += f" ({reading.health_reason})"
                subj = alerts.subject("node", None, self.node, self.node, reading.uuid)
                g.alert, message = alerts.fire(rules.GPU_HEALTH.kind, subj, ts, summary, details)
                self._out.append(message)
        elif g.alert is not None and g.bad_ts is not None and elapsed(ts, g.bad_ts, rules.GPU_HEALTH.quiet(th)):
            self._out.append(alerts.resolve(
                g.alert, ts, f"healthy with no critical XID for {fmt_duration(rules.GPU_HEALTH.quiet(th))}"))
            g.alert = None

    def _account(self, pod: NodePod, reading: GpuReading, share: Share, ts: float, dt: float, unit: float,
                 price: float, tables: _RuleTables) -> None:
        th = self.config.thresholds
        uid = pod.uid
        key = f"{uid}|{reading.uuid}"
        last = self.last_sample.get(key)
        usage = self.usage[uid]
        gap = 0.0
        if last is not None and ts - last > th.gap_intervals * dt + EPS:
            gap = ts - last - dt
            self.counters["gaps"] += 1
            for table in self.alerting.values():
                rules.restart(table, [key])
            self._gap_windows(pod, reading, key, last + dt, ts, window_start(last, self.config.window_s))
        self.last_sample[key] = ts
        util = share.util_pct
        # seconds count per allocation unit (a MIG device is a unit); cost weighs the unit's
        # fraction of a physical GPU and the pod's share of a shared one
        usage.unit_s += dt
        usage.samples += 1
        usage.gap_s += gap
        usage.cost_units_s += dt * unit * share.share
        usage.gpu_model = reading.model
        usage.share_estimated = usage.share_estimated or share.estimated
        self.allocator.saw(uid, reading)
        idle = util is not None and util < th.idle_util_pct
        if util is not None:
            usage.data_s += dt
            usage.util_pct_s += util * dt
            if idle:
                usage.idle_s += dt
            else:
                usage.busy_s += dt
        if share.mem_bytes is not None:
            usage.peak_mem_bytes = max(usage.peak_mem_bytes or 0, share.mem_bytes)
        self._accumulate(pod, reading, share, ts, dt, idle, unit, price, key)

        context = rules.PodGpu(self.node, pod.namespace, pod.name, reading, share, th)
        for rule, table in tables:
            transitions = rules.step(rule, table, key, context, ts, th)
            if transitions:
                self._out += transitions

    def _idle_node(self, ts: float, units: int, physical: int, price_per_hour: float, allocated: bool) -> None:
        ready = self.info.ready is not False and not self.info.deleted
        holds = allocated or any(p.gpus > 0 for p in self.pods.values())
        context = rules.IdleNode(node=self.node, ready=ready, units=units, physical_gpus=physical, holds=holds,
                                 usd_per_hour=price_per_hour, gpu_model=self.info.gpu_product)
        self._out += rules.step(rules.IDLE_NODE, self.alerting["idle_node"], self.node, context, ts,
                                self.config.thresholds)

    def _resolve_idle_node(self, ts: float, why: str) -> None:
        table = self.alerting["idle_node"]
        state = table.get(self.node)
        burned = rules.idle_node_burned(state.alert, ts) if state is not None and state.alert is not None else 0.0
        self._out += rules.close(table, self.node, ts, why, cost_usd_burned=burned)

    # ------------------------------------------------------------------ windows

    def _window(self, pod: NodePod, reading: GpuReading, ws: float, key: str) -> PodGpuWindow:
        """The pod's window on the GPU starting at ``ws``, filed under ``key`` (:func:`_window_key`),
        made if it is new."""
        w = self.windows.get(key)
        if w is None:
            w = self.windows[key] = PodGpuWindow(
                pod_uid=pod.uid, namespace=pod.namespace, pod=pod.name, team=pod.team,
                project=pod.project, gpu_uuid=reading.uuid, gpu_model=reading.model, gpu_index=reading.index,
                container=next((ref.container for ref in reading.assigned_to if ref.pod_uid == pod.uid
                                or (ref.namespace, ref.pod) == (pod.namespace, pod.name)), None),
                window_start=ws,
            )
        return w

    def _accumulate(self, pod: NodePod, reading: GpuReading, share: Share, ts: float, dt: float,
                    idle: bool, unit: float, price: float, key: str) -> None:
        """Add one sample's share to the pod's windows of the GPU (``unit``: :func:`unit_fraction`,
        ``price``: USD per hour of the GPU's model, ``key``: ``pod_uid|gpu_uuid``)."""
        width = self.config.window_s
        windows = self.windows
        util, mem, power, mem_total = share.util_pct, share.mem_bytes, reading.power_w, reading.mem_total_bytes
        fraction, estimated = share.share, share.estimated
        t, end, first = ts, ts + dt, True
        while t < end - EPS:
            ws = window_start(t, width)
            seg = min(end, ws + width) - t
            window_key = _window_key(key, ws)
            w = windows.get(window_key)
            if w is None:
                w = self._window(pod, reading, ws, window_key)
            w.add(seg, first, idle, util, mem, power, fraction, estimated, seg * unit * fraction * price / 3600.0,
                  mem_total)
            first = False
            t += seg

    def _gap_windows(self, pod: NodePod, reading: GpuReading, key: str, start: float, end: float,
                     last_ws: float) -> None:
        """Record a gap's seconds in the windows it spans that were not already emitted (``key``:
        ``pod_uid|gpu_uuid``)."""
        width = self.config.window_s
        t = start
        while t < end - EPS:
            ws = window_start(t, width)
            seg = min(end, ws + width) - t
            window_key = _window_key(key, ws)
            if ws > last_ws or window_key in self.windows:
                self._window(pod, reading, ws, window_key).add_gap(seg)
            t += seg

    def _close_windows(self, watermark: float, final: bool) -> None:
        width = self.config.window_s
        done = [(w.window_start, w.pod_uid, w.gpu_uuid, key) for key, w in self.windows.items()
                if final or w.window_start + width <= watermark + EPS]
        closed = [self.windows.pop(key) for *_, key in sorted(done)]
        for start, windows in groupby(closed, key=lambda w: w.window_start):
            of_start = list(windows)
            stamps = WindowStamps.of(of_start, start, width)
            for window in of_start:
                message = window.message(self.node, stamps)
                figures = self.allocator.window_figures(message.pod_uid, message.gpu_uuid, start)
                self._out.append(message.model_copy(update=figures) if figures else message)
        self.allocator.forget_windows(watermark if not final else float("inf"))

    # ------------------------------------------------------------------ checkpoint

    def to_dict(self) -> JsonDict:
        return {
            "node": self.node, "cluster": self.cluster, **self._driving_dict(),
            "info": self.info.to_dict(),
            "pods": {uid: pod.to_dict() for uid, pod in self.pods.items()}, "ended": self.ended,
            "gpus": {uuid: g.to_dict() for uuid, g in self.gpus.items()},
            "last_sample": self.last_sample, "usage": {uid: u.to_dict() for uid, u in self.usage.items()},
            "windows": {key: w.to_dict() for key, w in self.windows.items()},
            "alerting": {name: rules.table_to_dict(table) for name, table in self.alerting.items()},
            "counters": self.counters, "allocator": self.allocator.to_dict(), "shared": self.shared.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: JsonObject, config: EngineConfig) -> NodeStage:
        stage = cls(as_str(data["node"]), config, as_str(data.get("cluster", DEFAULT_CLUSTER)))
        stage._restore_driving(data)
        stage.info = NodeInfo.from_dict(as_object(data["info"]))
        stage.pods = record_map(data["pods"], NodePod.from_dict)
        stage.ended = float_map(data["ended"])
        stage.gpus = record_map(data["gpus"], GpuHealth.from_dict)
        stage.last_sample = float_map(data["last_sample"])
        stage.usage = record_map(data["usage"], PodGpuUsage.from_dict)
        stage.windows = record_map(data["windows"], PodGpuWindow.from_dict)
        stage.alerting |= record_map(data["alerting"], rules.table_from_dict)
        stage.counters = int_map(data["counters"])
        stage.allocator = AllocatorTracker.from_dict(data.get("allocator"), stage.node, config.thresholds,
                                                     config.window_s)
        stage.shared = NoisyNeighbours(data.get("shared"))
        return stage

