"""The cluster stage: a single instance (one key) that sees the whole fleet at low volume.

Inputs, in event-time order through a reorder buffer: node states, pod states (every GPU pod),
scheduling events, workload progress, and from the node stages one :class:`NodeSummary` per node
sample and one :class:`PodUsage` per pod leaving a node. After applying all inputs of one
timestamp it evaluates the cluster at that instant with the scheduler's view (allocatable GPUs
per Ready node minus the requests of the pods bound to it):

- ``pending_gpu``: a GPU pod unscheduled ``pending_after`` after its creation;
- ``fragmentation``: a pending pod that no schedulable node can fit although the free GPUs sum
  to enough, held for ``fragmentation_after``;
- queued demand: a Kueue workload not yet admitted has no pods, so it is pending demand of its
  own (subject kind ``workload``) in both rules and in the capacity figures. Its pods are placed
  first-fit-decreasing on a copy of the free GPUs: "would fit if defragmented" means the free
  GPUs add up to its whole demand but that placement fails. An admitted workload is counted
  through its pods only, and so is a queued one that already has live pods (same owner uid or
  gang, as with Kueue's pod groups): the same demand is never counted twice;
- ``gang_partial``: a gang with members holding GPUs while others wait, for ``gang_after``;
- capacity windows (:class:`ClusterCapacity`): the state at each instant holds until the next
  one, so GPU-seconds integrate exactly; counts are the state at the window's last instant that
  holds for some time (at a replay's end the instant at ``end`` holds for none: no sample stands
  for ``[end, ...)``, so it would read busy 0 — the last window keeps the state before it);
- one :class:`PodLifecycle` per pod when it ends (joined with its :class:`PodUsage`), and for
  every open pod when a replay ends.

State is plain JSON-serialisable data (:meth:`to_dict` / :meth:`from_dict`).
"""

from __future__ import annotations

from typing import Any

from schemas.messages import (
    ClusterCapacity,
    K8sEvent,
    Message,
    NodeState,
    PodLifecycle,
    PodState,
    WorkloadProgress,
    WorkloadState,
)
from stream_jobs import alerts
from stream_jobs.config import EngineConfig
from stream_jobs.internal import NodeSummary, PodUsage, kept
from stream_jobs.mig_rules import MigTracker
from stream_jobs.node_stage import pod_end_reason
from stream_jobs.reorder import ReorderBuffer
from stream_jobs.shared_vram import VramTracker
from stream_jobs.timeutil import EPS, elapsed, epoch, fmt_duration, from_epoch, stable_id, window_start

KINDS: dict[str, tuple[int, type[Message]]] = {
    "node": (0, NodeState),
    "pod": (1, PodState),
    "usage": (2, PodUsage),
    "event": (3, K8sEvent),
    "progress": (4, WorkloadProgress),
    "summary": (5, NodeSummary),
    "workload": (6, WorkloadState),
}
_TYPES = {cls: kind for kind, (_rank, cls) in KINDS.items()}
_MAX_REASONS = 20
_DONE_KEEP = 5000


def _fits(free: dict[str, int], request: dict[str, int]) -> bool:
    return all(free.get(res, 0) >= n for res, n in request.items())


def _places(free: dict[str, dict[str, int]], sets: list[list[Any]]) -> bool:
    """Whether every pod of ``sets`` (``[count, request per pod]``) finds a node: largest pods first,
    first fit over nodes by name (a node takes as many pods of a set as fit before the next)."""
    left = {name: dict(f) for name, f in free.items()}
    for count, request in sorted(sets, key=lambda s: (-sum(s[1].values()), sorted(s[1].items()))):
        remaining = count
        for name in sorted(left):
            if remaining == 0:
                break
            here = min((left[name].get(res, 0) // n for res, n in request.items() if n > 0), default=remaining)
            placed = min(here, remaining)
            for res, n in request.items():
                left[name][res] = left[name].get(res, 0) - n * placed
            remaining -= placed
        if remaining:
            return False
    return True


class ClusterStage:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.wm: float | None = None
        self.buffer = ReorderBuffer()
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}
        self.done: dict[str, float] = {}
        self.early: dict[str, dict[str, Any]] = {}
        self.summaries: dict[str, dict[str, Any]] = {}
        self.pending_alerts: dict[str, dict[str, Any]] = {}
        self.frag: dict[str, dict[str, Any]] = {}
        self.gangs: dict[str, dict[str, Any]] = {}
        self.cap: dict[str, Any] = {"t": None, "snap": None, "windows": {}}
        self.mig = MigTracker()
        self.vram = VramTracker()
        self._end: float | None = None  # set by :meth:`flush` only: the replay's end
        self.counters: dict[str, int] = {"late_inputs": 0, "instants": 0}
        self._out: list[Message] = []

    # ------------------------------------------------------------------ driving

    def submit(self, message: Message) -> None:
        message = kept(message)
        kind = _TYPES.get(type(message))
        if kind is None:
            raise TypeError(f"the cluster stage does not take {type(message).__name__}")
        ts = epoch(message.ts)  # type: ignore[attr-defined]
        if self.wm is not None and ts <= self.wm:
            self.counters["late_inputs"] += 1
            if kind != "summary":
                self._apply(kind, ts, message)  # state is applied; the past is not re-evaluated
            return
        self.buffer.push(ts, KINDS[kind][0], kind, message)

    def advance(self, watermark: float) -> list[Message]:
        current: float | None = None
        for ts, kind, message in self.buffer.pop_until(watermark):
            if current is not None and ts > current:
                self._evaluate(current)
            if current is None or ts > current:
                self._quiet_instants(ts)
            current = ts
            self._apply(kind, ts, message)
        if current is not None:
            self._evaluate(current)
        self._quiet_instants(watermark + EPS)
        if self.wm is None or watermark > self.wm:
            self.wm = watermark
        if self.cap["t"] is not None and self.wm > self.cap["t"]:
            self._integrate_to(self.wm)
        self._close_windows(self.wm, final=False)
        return self.drain()

    def flush(self, end: float) -> list[Message]:
        """End of a replay: close every window at ``end`` and report every pod not yet reported.

        The instant at ``end`` is no tick: it holds for no time, is no window's last state and
        evaluates no alert rule (see :meth:`_evaluate`)."""
        self._end = end
        self._out = self.advance(end)
        for uid in sorted(self.pods, key=lambda u: (self.pods[u]["created"], u)):
            self._emit_lifecycle(self.pods[uid], end)
        self._close_windows(end, final=True)
        return self.drain()

    def drain(self) -> list[Message]:
        out, self._out = self._out, []
        return out

    def _apply(self, kind: str, ts: float, message: Any) -> None:
        getattr(self, f"_on_{kind}")(ts, message)

    # ------------------------------------------------------------------ inputs

    def _on_node(self, ts: float, state: NodeState) -> None:
        node = self.nodes.setdefault(state.node, {})
        node.update(ready=state.ready and not state.deleted, unschedulable=state.unschedulable,
                    deleted=state.deleted, alloc=dict(state.gpu_allocatable or state.gpu_capacity),
                    model=state.gpu_product or node.get("model"))
        if state.deleted:
            for uid in sorted(self.pods):
                pod = self.pods[uid]
                if pod["node"] == state.node and pod["end"] is None:
                    # inferred from the node leaving: the pod's own state at this same instant
                    # (applied after node states) may say it ended otherwise, and then wins
                    pod["end"], pod["end_reason"], pod["end_by_node"] = ts, "Evicted", True
                    self._try_lifecycle(pod)

    def _on_pod(self, ts: float, state: PodState) -> None:
        uid = state.uid
        if uid in self.done:
            return
        pod = self.pods.get(uid)
        if pod is None:
            pod = self.pods[uid] = {
                "uid": uid, "node": None, "scheduled": None, "started": None, "end": None, "end_reason": None,
                "reasons": [], "last_reason": None, "usage": None, "steps": None,
            }
            early = self.early.pop(uid, None)
            if early:
                pod["reasons"] = early.get("reasons", [])
                pod["last_reason"] = early.get("last_reason")
                pod["usage"] = early.get("usage")
                pod["steps"] = early.get("steps")
        pod.update(ns=state.namespace, name=state.name, team=state.team, project=state.project,
                   gang=state.gang_id, owner_uids=sorted(o.uid for o in state.owners if o.uid),
                   requests=dict(state.gpu_requests), gpus=sum(state.gpu_requests.values()),
                   vram_need=state.vram_request_bytes,
                   created=epoch(state.created_at))
        if state.node and pod["node"] is None:
            pod["node"] = state.node
            pod["scheduled"] = epoch(state.scheduled_at) if state.scheduled_at else ts
        if state.started_at and pod["started"] is None:
            pod["started"] = epoch(state.started_at)
        for cond in state.conditions:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.message:
                self._reason(pod, cond.message)
        reason = pod_end_reason(state)
        if reason is not None and (pod["end"] is None or (pod.get("end_by_node") and ts <= pod["end"] + EPS)):
            # a pod that completed or was deleted at the tick its node left is not Evicted
            pod["end"], pod["end_reason"], pod["end_by_node"] = min(ts, pod["end"] or ts), reason, False
        self._try_lifecycle(pod)

    def _reason(self, pod: dict[str, Any], text: str) -> None:
        pod["last_reason"] = text
        if text not in pod["reasons"]:
            pod["reasons"] = (pod["reasons"] + [text])[-_MAX_REASONS:]

    def _target(self, uid: str | None) -> dict[str, Any] | None:
        """The pod record a side input refers to (stashed when the pod is not known yet)."""
        if uid is None or uid in self.done:
            return None
        if uid in self.pods:
            return self.pods[uid]
        return self.early.setdefault(uid, {"reasons": [], "last_reason": None, "usage": None, "steps": None})

    def _on_event(self, ts: float, event: K8sEvent) -> None:
        if event.category != "scheduling_failed" or event.involved_kind != "Pod":
            return
        target = self._target(event.involved_uid)
        if target is not None and event.message:
            self._reason(target, event.message)

    def _on_usage(self, ts: float, usage: PodUsage) -> None:
        target = self._target(usage.pod_uid)
        if target is not None:
            target["usage"] = usage.model_dump(mode="json")
            if usage.pod_uid in self.pods:
                self._try_lifecycle(self.pods[usage.pod_uid])

    def _on_progress(self, ts: float, progress: WorkloadProgress) -> None:
        target = self._target(progress.pod_uid)
        if target is not None and progress.steps_total is not None:
            target["steps"] = max(target["steps"] or 0.0, progress.steps_total)

    def _on_workload(self, ts: float, state: WorkloadState) -> None:
        if state.deleted or state.phase in ("finished", "inactive"):
            if state.uid in self.workloads:  # kept until the rules resolve its alerts
                self.workloads[state.uid]["ended"] = "deleted" if state.deleted else state.phase
            return
        sets = [[s.count, dict(s.gpu_requests_per_pod)] for s in state.pod_sets if s.gpu_requests_per_pod and s.count]
        self.workloads[state.uid] = {
            "uid": state.uid, "ns": state.namespace, "name": state.name, "queue": state.queue_name,
            "team": state.team,
            "gang": state.gang_id, "owner_uids": sorted(o.uid for o in state.owners if o.uid),
            "requests": dict(state.gpu_requests), "gpus": state.gpus, "sets": sets,
            "pods": sum(count for count, _ in sets),
            "created": epoch(state.created_at), "admitted": state.phase == "admitted",
            "last_reason": state.pending_reason, "ended": None,
        }

    def _queued(self, t: float) -> list[dict[str, Any]]:
        """Workloads waiting for admission at ``t`` whose demand no live pod carries yet."""
        if not self.workloads:
            return []
        gangs = {p["gang"] for p in self.pods.values() if p["end"] is None and p["gang"]}
        owners = {uid for p in self.pods.values() if p["end"] is None for uid in p.get("owner_uids", [])}
        return sorted((w for w in self.workloads.values()
                       if not w["admitted"] and not w["ended"] and w["gpus"] > 0 and w["created"] <= t + EPS
                       and w["gang"] not in gangs and not owners.intersection(w["owner_uids"])),
                      key=lambda w: (w["created"], w["uid"]))

    def _on_summary(self, ts: float, summary: NodeSummary) -> None:
        self.summaries[summary.node] = {"ts": ts, "dt": summary.sample_interval_s, "busy": summary.busy,
                                        "idle": summary.idle_allocated}
        self.mig.on_summary(summary.node, summary.mig)
        self.vram.on_summary(summary.node, summary.shared)

    # ------------------------------------------------------------------ lifecycle

    def _try_lifecycle(self, pod: dict[str, Any]) -> None:
        if pod["end"] is not None and (pod["node"] is None or pod["usage"] is not None):
            self._emit_lifecycle(pod, pod["end"])

    def _emit_lifecycle(self, pod: dict[str, Any], now: float) -> None:
        uid = pod["uid"]
        if uid in self.done:
            return
        end = pod["end"] if pod["end"] is not None else now
        scheduled = pod["scheduled"]
        pending_s = max((scheduled if scheduled is not None else end) - pod["created"], 0.0)
        running_s = max(end - scheduled, 0.0) if scheduled is not None else 0.0
        gpu_hours = pod["gpus"] * running_s / 3600.0
        usage = pod["usage"] or {}
        model = usage.get("gpu_model") or (self.nodes.get(pod["node"] or "", {}).get("model"))
        factor = usage["cost_units_s"] / usage["unit_s"] if usage.get("unit_s") else 1.0
        cost = gpu_hours * self.config.price(model) * factor
        steps = pod["steps"]
        reason = pod["end_reason"] or ("Running" if scheduled is not None else "Pending")
        self._out.append(PodLifecycle(
            pod_uid=uid, namespace=pod["ns"], name=pod["name"], team=pod["team"], project=pod["project"],
            node=pod["node"], gpus=pod["gpus"], gpu_model=model, created_at=from_epoch(pod["created"]),
            scheduled_at=from_epoch(scheduled) if scheduled is not None else None,
            started_at=from_epoch(pod["started"]) if pod["started"] is not None else None,
            finished_at=from_epoch(pod["end"]) if pod["end"] is not None else None,
            pending_reasons=list(pod["reasons"]), pending_s=pending_s, running_s=running_s, gpu_hours=gpu_hours,
            idle_gpu_hours=usage.get("idle_s", 0.0) / 3600.0, peak_mem_bytes=usage.get("peak_mem_bytes"),
            avg_sm_util_pct=min(100.0, usage["util_s"] / usage["data_s"]) if usage.get("data_s") else None,
            cost_usd=cost, end_reason=reason,  # type: ignore[arg-type]
            steps=steps, cost_per_step_usd=cost / steps if steps else None,
        ))
        if pod["end"] is not None:
            self.done[uid] = pod["end"]
            del self.pods[uid]
            if len(self.done) > _DONE_KEEP:
                for old in sorted(self.done, key=lambda k: self.done[k])[: len(self.done) - _DONE_KEEP]:
                    del self.done[old]

    # ------------------------------------------------------------------ evaluation

    def _quiet_instants(self, limit: float) -> None:
        """Evaluate on the sampling grid while no input arrives (a fleet with no Ready node sends
        no samples, yet pending timers must fire). With samples flowing, inputs arrive every
        interval and this adds nothing; the instants depend only on the data, not on when the
        watermark moved, so replays through Kafka give the same result."""
        step = self.config.sample_interval_s
        last = self.cap.get("last_instant")
        if last is None or step <= 0:
            return
        while last + step < limit - step / 2:
            last += step
            self._evaluate(last)

    def _evaluate(self, t: float) -> None:
        self.counters["instants"] += 1
        self.cap["last_instant"] = t
        self._integrate_to(t)
        used: dict[str, dict[str, int]] = {}
        for pod in self.pods.values():
            if pod["node"] is not None and pod["end"] is None:
                bucket = used.setdefault(pod["node"], {})
                for res, n in pod["requests"].items():
                    bucket[res] = bucket.get(res, 0) + n
        total = allocated = 0
        parts: list[list[float]] = []
        free: dict[str, dict[str, int]] = {}
        for name in sorted(self.nodes):
            node = self.nodes[name]
            if not node.get("ready") or node.get("deleted"):
                continue
            alloc = node["alloc"]
            here = used.get(name, {})
            total += sum(alloc.values())
            allocated += sum(min(here.get(res, 0), n) for res, n in alloc.items())
            if not node.get("unschedulable"):
                free[name] = {res: max(n - here.get(res, 0), 0) for res, n in alloc.items()}
            summary = self.summaries.get(name)
            if summary and t < summary["ts"] + summary["dt"] - EPS:
                # a sample stands for its own interval only: no sample, no busy/idle figure
                parts.append([summary["busy"], summary["idle"], summary["ts"] + summary["dt"]])
        pending = sorted((p for p in self.pods.values()
                          if p["end"] is None and p["node"] is None and p["gpus"] > 0 and p["created"] <= t + EPS),
                         key=lambda p: (p["created"], p["uid"]))
        queued = self._queued(t)
        free_by_node = {name: sum(f.values()) for name, f in free.items()}
        stranded = 0
        requests = [(p["gpus"], p["created"], p["uid"], p["requests"]) for p in pending]
        requests += [(sum(r.values()), w["created"], w["uid"], r) for w in queued for _, r in w["sets"]]
        if requests:
            smallest = min(requests, key=lambda r: r[:3])[3]
            for f in free.values():
                if not _fits(f, smallest):
                    stranded += sum(f.get(res, 0) for res in smallest)
        busy = int(sum(p[0] for p in parts))
        idle = int(sum(p[1] for p in parts))
        snap = {
            "total": total, "allocated": allocated, "busy": min(busy, allocated), "parts": parts,
            "idle": min(idle, allocated), "free": max(total - allocated, 0), "free_by_node": free_by_node,
            "largest": max(free_by_node.values(), default=0), "stranded": stranded,
            "pending": len(pending), "demand": sum(p["gpus"] for p in pending) + sum(w["gpus"] for w in queued),
            "queued": len(queued), "queued_demand": sum(w["gpus"] for w in queued),
        }
        self.cap["snap"] = snap
        if self._end is not None and t >= self._end - EPS:
            # a replay's end is no tick (FORMAT.md: ticks while t < duration): the instant holds for
            # no time, so the window keeps the state before it, and no alert fires or resolves there
            return
        acc = self._cap_window(window_start(t, self.config.window_s))
        acc["stranded_max"] = max(acc["stranded_max"], stranded)
        acc["last"] = snap

        live = {n for n, node in self.nodes.items() if node.get("ready") and not node.get("deleted")}
        self._out.extend(self.mig.evaluate(t, live, set(free), pending, self.config.thresholds))
        if self.mig.snapshot is not None:
            snap["mig"] = self.mig.snapshot
        self._out.extend(self.vram.evaluate(t, live, set(free), pending, self.config.thresholds))
        if self.vram.snapshot is not None:
            snap["shared"] = self.vram.snapshot
        self._pending_rules(t, pending, free, queued)
        self._gang_rules(t)

    def _pending_rules(self, t: float, pending: list[dict[str, Any]], free: dict[str, dict[str, int]],
                       queued: list[dict[str, Any]]) -> None:
        th = self.config.thresholds
        waiting = {p["uid"] for p in pending} | {w["uid"] for w in queued}
        for pod in [*pending, *queued]:
            request = pod["requests"]
            workload = "sets" in pod
            cluster_free = {res: sum(f.get(res, 0) for f in free.values()) for res in request}
            unfragmented = _fits(cluster_free, request)
            fits_somewhere = _places(free, pod["sets"]) if workload else any(_fits(f, request) for f in free.values())
            largest = max((sum(f.get(res, 0) for res in request) for f in free.values()), default=0)
            free_sum = sum(cluster_free.values())
            uid = pod["uid"]
            subj = alerts.subject("workload" if workload else "pod", pod["ns"], pod["name"])
            if uid not in self.pending_alerts and elapsed(t, pod["created"], th.pending_after):
                details = {"request": request, "gpus": pod["gpus"], "last_scheduler_reason": pod["last_reason"],
                           "would_fit_unfragmented": unfragmented, "free_gpus": free_sum,
                           "largest_free_block": largest, "pending_s": t - pod["created"]}
                reason = pod["last_reason"] or ("no queue reason seen" if workload else "no scheduler reason seen")
                if workload:
                    details |= {"queue": pod["queue"], "pods": pod["pods"], "team": pod["team"]}
                    summary = (f"workload {pod['ns']}/{pod['name']} queued for {fmt_duration(t - pod['created'])}: "
                               f"needs {pod['gpus']} GPU(s) in {pod['pods']} pod(s); {reason}")
                else:
                    summary = (f"{pod['ns']}/{pod['name']} pending for {fmt_duration(t - pod['created'])}: needs "
                               f"{pod['gpus']} GPU(s); {reason}")
                self.pending_alerts[uid], message = alerts.fire("pending_gpu", subj, t, summary, details)
                self._out.append(message)
            condition = unfragmented and not fits_somewhere
            state = self.frag.get(uid)
            if condition:
                if state is None:
                    state = self.frag[uid] = {"since": t, "alert": None}
                if state["alert"] is None and elapsed(t, state["since"], th.fragmentation_after):
                    details = {"request": request, "gpus": pod["gpus"], "free_gpus": free_sum,
                               "largest_free_block": largest,
                               "free_gpus_by_node": {n: sum(f.get(r, 0) for r in request) for n, f in free.items()}}
                    summary = (f"{pod['name']} needs {pod['gpus']} GPUs; {free_sum} are free but at most "
                               f"{largest} on one node")
                    if workload:
                        details["pods"] = pod["pods"]
                        summary = (f"workload {pod['name']} needs {pod['gpus']} GPUs in {pod['pods']} pod(s); "
                                   f"{free_sum} are free but its pods do not fit the nodes (at most {largest} on one)")
                    state["alert"], message = alerts.fire("fragmentation", subj, t, summary, details)
                    self._out.append(message)
            elif state is not None:
                if state["alert"] is not None:
                    self._out.append(alerts.resolve(state["alert"], t, "fits on a node" if fits_somewhere
                                                    else "not enough free GPUs"))
                del self.frag[uid]
        for uid in sorted(set(self.pending_alerts) - waiting):
            self._out.append(alerts.resolve(self.pending_alerts.pop(uid), t, self._why_not_pending(uid)))
        for uid in sorted(set(self.frag) - waiting):
            state = self.frag.pop(uid)
            if state["alert"] is not None:
                self._out.append(alerts.resolve(state["alert"], t, self._why_not_pending(uid)))
        for uid in [uid for uid, w in self.workloads.items() if w["ended"]]:
            del self.workloads[uid]

    def _why_not_pending(self, uid: str) -> str:
        workload = self.workloads.get(uid)
        if workload is not None:
            if workload["ended"]:
                return f"workload {workload['ended']}"
            return "admitted" if workload["admitted"] else "its pods were created"
        pod = self.pods.get(uid)
        if pod is None:
            return "pod ended"
        if pod["end"] is not None:
            return f"pod ended ({pod['end_reason']})"
        return f"scheduled on {pod['node']}" if pod["node"] else "no longer pending"

    def _gang_rules(self, t: float) -> None:
        th = self.config.thresholds
        groups: dict[str, list[dict[str, Any]]] = {}
        for pod in self.pods.values():
            if pod["gang"] and pod["end"] is None and pod["created"] <= t + EPS:
                groups.setdefault(pod["gang"], []).append(pod)
        partial: set[str] = set()
        for gang in sorted(groups):
            members = sorted(groups[gang], key=lambda p: p["name"])
            running = [p for p in members if p["node"] is not None]
            waiting = [p for p in members if p["node"] is None]
            if not (running and waiting):
                continue
            partial.add(gang)
            state = self.gangs.setdefault(gang, {"since": t, "alert": None})
            if state["alert"] is None and elapsed(t, state["since"], th.gang_after):
                namespace, _, group = gang.partition("/") if "/" in gang else (members[0]["ns"], "", gang)
                details = {"running": [p["name"] for p in running], "pending": [p["name"] for p in waiting],
                           "gpus_held": sum(p["gpus"] for p in running),
                           "gpus_waiting": sum(p["gpus"] for p in waiting)}
                summary = (f"gang {group} in {namespace}: {len(running)} of {len(members)} members hold "
                           f"{details['gpus_held']} GPUs while {len(waiting)} wait, for "
                           f"{fmt_duration(t - state['since'])}")
                subj = alerts.subject("gang", namespace, group or gang)
                state["alert"], message = alerts.fire("gang_partial", subj, t, summary, details)
                self._out.append(message)
        for gang in sorted(set(self.gangs) - partial):
            state = self.gangs.pop(gang)
            if state["alert"] is not None:
                members = groups.get(gang, [])
                why = "all members running" if members and all(p["node"] for p in members) else "no member running"
                self._out.append(alerts.resolve(state["alert"], t, why))

    # ------------------------------------------------------------------ capacity windows

    def _cap_window(self, ws: float) -> dict[str, Any]:
        key = repr(ws)
        acc = self.cap["windows"].get(key)
        if acc is None:
            acc = self.cap["windows"][key] = {"ws": ws, "total": 0.0, "allocated": 0.0, "busy": 0.0, "idle": 0.0,
                                              "free": 0.0, "stranded_max": 0, "last": None}
        return acc

    def _integrate_to(self, t: float) -> None:
        start, snap = self.cap["t"], self.cap["snap"]
        if start is None or snap is None:
            self.cap["t"] = t if start is None or t > start else start
            return
        width = self.config.window_s
        while start < t - EPS:
            ws = window_start(start, width)
            seg = min(t, ws + width) - start
            acc = self._cap_window(ws)
            for field in ("total", "allocated", "free"):
                acc[field] += snap[field] * seg
            for busy, idle, until in snap.get("parts", []):
                covered = max(0.0, min(start + seg, until) - start)
                acc["busy"] += busy * covered
                acc["idle"] += idle * covered
            acc["stranded_max"] = max(acc["stranded_max"], snap["stranded"])
            if acc["last"] is None:
                acc["last"] = snap
            start += seg
        self.cap["t"] = max(t, self.cap["t"])

    def _close_windows(self, watermark: float, final: bool) -> None:
        width = self.config.window_s
        for key in sorted(self.cap["windows"], key=lambda k: self.cap["windows"][k]["ws"]):
            acc = self.cap["windows"][key]
            if not final and acc["ws"] + width > watermark + EPS:
                continue
            del self.cap["windows"][key]
            if final and acc["ws"] >= watermark - EPS:
                continue  # starts at the end of a replay: nothing in it
            snap = acc["last"] or {"total": 0, "allocated": 0, "busy": 0, "idle": 0, "free": 0, "free_by_node": {},
                                   "largest": 0, "stranded": 0, "pending": 0, "demand": 0, "queued": 0,
                                   "queued_demand": 0}
            self._out.append(ClusterCapacity(
                window_id=stable_id("capacity", acc["ws"]), window_start=from_epoch(acc["ws"]),
                window_end=from_epoch(acc["ws"] + width), gpus_total=snap["total"],
                gpus_allocated=snap["allocated"], gpus_busy=snap["busy"], gpus_idle_allocated=snap["idle"],
                gpus_free=snap["free"], free_gpus_by_node=snap["free_by_node"], largest_free_block=snap["largest"],
                stranded_gpus=snap["stranded"], pending_pods=snap["pending"], pending_gpu_demand=snap["demand"],
                gpu_s_total=acc["total"], gpu_s_allocated=acc["allocated"], gpu_s_busy=acc["busy"],
                gpu_s_idle_allocated=acc["idle"], gpu_s_free=acc["free"], stranded_gpus_max=acc["stranded_max"],
                queued_workloads=snap.get("queued", 0), queued_gpu_demand=snap.get("queued_demand", 0),
                **snap.get("mig", {}), **snap.get("shared", {}),
            ))

    # ------------------------------------------------------------------ checkpoint

    def to_dict(self) -> dict[str, Any]:
        return {
            "wm": self.wm, "buffer": self.buffer.to_dict(), "nodes": self.nodes, "pods": self.pods,
            "workloads": self.workloads,
            "done": self.done, "early": self.early, "summaries": self.summaries,
            "pending_alerts": self.pending_alerts, "frag": self.frag, "gangs": self.gangs, "cap": self.cap,
            "counters": self.counters, "mig": self.mig.to_dict(), "vram": self.vram.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], config: EngineConfig) -> ClusterStage:
        stage = cls(config)
        stage.wm = data["wm"]
        stage.buffer = ReorderBuffer.from_dict(data["buffer"], {k: v[1] for k, v in KINDS.items()})
        for name in ("nodes", "pods", "done", "early", "summaries", "pending_alerts", "frag", "gangs", "cap",
                     "counters"):
            setattr(stage, name, data[name])
        stage.workloads = data.get("workloads", {})
        stage.mig = MigTracker.from_dict(data.get("mig"))
        stage.vram = VramTracker(data.get("vram"))
        return stage
