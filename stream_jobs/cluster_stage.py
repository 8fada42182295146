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

from collections.abc import Sequence
from dataclasses import replace

from schemas.messages import MAX_USD, K8sEvent, Message, NodeState, PodState, WorkloadProgress, WorkloadState
from schemas.outputs import PodLifecycle
from stream_jobs import rules
from stream_jobs.config import EngineConfig
from stream_jobs.internal import NodeSummary, PodUsage
from stream_jobs.json_types import JsonDict, JsonObject, as_object, float_map, int_map, record_map
from stream_jobs.mig_rules import MigTracker
from stream_jobs.node_stage import pod_end_reason
from stream_jobs.shared_vram import VramTracker
from stream_jobs.stage import Stage
from stream_jobs.state import (
    CapacitySnapshot,
    CapacityState,
    CapacityWindow,
    ClusterNode,
    ClusterPod,
    NodeSampleSummary,
    SamplePart,
    SideInputs,
    Workload,
    records_to_dict,
)
from stream_jobs.timeutil import EPS, epoch, from_epoch, window_start

KINDS: dict[str, tuple[int, type[Message]]] = {
    "node": (0, NodeState),
    "pod": (1, PodState),
    "usage": (2, PodUsage),
    "event": (3, K8sEvent),
    "progress": (4, WorkloadProgress),
    "summary": (5, NodeSummary),
    "workload": (6, WorkloadState),
}
_MAX_REASONS = 20
_DONE_KEEP = 5000
_NO_USAGE = PodUsage(pod_uid="", node="", ts=from_epoch(0.0))
"""The usage of a pod no node stage reported on (it never ran on a sampled node): nothing measured,
so no model, no idle time, a cost factor of 1."""


def _lifecycle_cost(gpus: int, gpu_hours: float, usage: PodUsage, usd_per_gpu_hour: float) -> float:
    """A pod's cost: its GPU-hours at its mean share of the GPUs it was attributed. A pod that holds
    no GPU but was attributed a share of a GPU another pod's demand counts (a DRA claim or device
    several pods share) pays that measured share, as the node stage's windows price it."""
    if not gpus and usage.cost_units_s:
        return usage.cost_units_s / 3600.0 * usd_per_gpu_hour
    factor = usage.cost_units_s / usage.unit_s if usage.unit_s else 1.0
    return gpu_hours * usd_per_gpu_hour * factor


def _fits(free: dict[str, int], request: dict[str, int]) -> bool:
    return all(free.get(res, 0) >= n for res, n in request.items())


def _places(free: dict[str, dict[str, int]], sets: Sequence[tuple[int, dict[str, int]]]) -> bool:
    """Whether every pod of ``sets`` (``[count, request per pod]``) finds a node: largest pods first,
    first fit over nodes by name (a node takes as many pods of a set as fit before the next)."""
    return _placement(free, sets) is not None


def _placement(free: dict[str, dict[str, int]], sets: Sequence[tuple[int, dict[str, int]]]) -> int | None:
    """How many nodes :func:`_places`'s placement of ``sets`` uses, None when it does not place every pod."""
    left = {name: dict(f) for name, f in free.items()}
    used: set[str] = set()
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
            if placed:
                used.add(name)
        if remaining:
            return None
    return len(used)


def _stranded(free: dict[str, dict[str, int]], pending: Sequence[ClusterPod], queued: Sequence[Workload]) -> int:
    """Free GPUs on nodes that cannot fit the smallest waiting request (the oldest among equals)."""
    requests = [(p.gpus, p.created, p.uid, p.requests) for p in pending]
    requests += [(sum(r.values()), w.created, w.uid, r) for w in queued for _, r in w.sets]
    if not requests:
        return 0
    smallest = min(requests, key=lambda r: r[:3])[3]
    return sum(sum(f.get(res, 0) for res in smallest) for f in free.values() if not _fits(f, smallest))


class ClusterStage(Stage):
    KINDS = KINDS
    NAME = "cluster stage"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.nodes: dict[str, ClusterNode] = {}
        self.pods: dict[str, ClusterPod] = {}
        """Live GPU pods (and ended ones until their usage arrives), by uid."""
        self.workloads: dict[str, Workload] = {}
        self.done: dict[str, float] = {}
        """Uids of pods reported (their end time), the last ``_DONE_KEEP``."""
        self.early: dict[str, SideInputs] = {}
        """Side inputs of pods whose state has not arrived yet, by uid."""
        self.summaries: dict[str, NodeSampleSummary] = {}
        self.alerting: dict[str, rules.RuleTable] = {rule.alert_type: {} for rule in rules.CLUSTER_RULES}
        """Timers and open alerts of the sustained-condition rules, by alert type then subject key."""
        self.cap = CapacityState()
        self.mig = MigTracker()
        """The fleet's MIG layouts, their figures and mig_fragmentation."""
        self.vram = VramTracker()
        """The shared GPUs' free VRAM, its figures and vram_fragmentation."""
        self._end: float | None = None  # set by :meth:`flush` only: the replay's end
        self.counters: dict[str, int] = {"late_inputs": 0, "instants": 0}
        self._current: float | None = None  # the instant being applied during :meth:`advance`

    # ------------------------------------------------------------------ driving (stage.Stage hooks)

    def _late(self, kind: str, ts: float, message: Message) -> None:
        self.counters["late_inputs"] += 1
        if kind != "summary":
            self._apply(kind, ts, message)  # state is applied; the past is not re-evaluated

    def _before(self, ts: float) -> None:
        """The cluster is evaluated once per instant, after every input of that instant."""
        current = self._current
        if current is not None and ts > current:
            self._evaluate(current)
        if current is None or ts > current:
            self._quiet_instants(ts)
        self._current = ts

    def _caught_up(self, watermark: float) -> None:
        if self._current is not None:
            self._evaluate(self._current)
            self._current = None
        self._quiet_instants(watermark + EPS)

    def _watermark_moved(self, watermark: float) -> None:
        if self.cap.integrated_to is not None and watermark > self.cap.integrated_to:
            self._integrate_to(watermark)
        self._close_windows(watermark, final=False)

    def _flushing(self, end: float) -> None:
        """The instant at ``end`` is no tick: it holds for no time, is no window's last state and
        evaluates no alert rule (see :meth:`_evaluate`)."""
        self._end = end

    def _finish(self, end: float) -> None:
        """Report every pod not yet reported and close every window at ``end``."""
        for uid in sorted(self.pods, key=lambda u: (self.pods[u].created, u)):
            self._emit_lifecycle(self.pods[uid], end)
        self._close_windows(end, final=True)

    # ------------------------------------------------------------------ inputs

    def _on_node(self, ts: float, state: NodeState) -> None:
        node = self.nodes.setdefault(state.node, ClusterNode())
        node.ready, node.unschedulable, node.deleted = state.ready and not state.deleted, state.unschedulable, \
            state.deleted
        node.allocatable = dict(state.gpu_allocatable or state.gpu_capacity)
        node.gpu_product = state.gpu_product or node.gpu_product
        if state.deleted:
            for uid in sorted(self.pods):
                pod = self.pods[uid]
                if pod.node == state.node and pod.end is None:
                    # inferred from the node leaving: the pod's own state at this same instant
                    # (applied after node states) may say it ended otherwise, and then wins
                    pod.end, pod.end_reason, pod.end_by_node = ts, "Evicted", True
                    self._try_lifecycle(pod)

    def _on_pod(self, ts: float, state: PodState) -> None:
        uid = state.uid
        if uid in self.done:
            return
        pod = self.pods.get(uid)
        if pod is None:
            pod = self.pods[uid] = ClusterPod(uid=uid)
            early = self.early.pop(uid, None)
            if early is not None:
                pod.reasons, pod.last_reason, pod.usage, pod.steps = (early.reasons, early.last_reason, early.usage,
                                                                      early.steps)
        pod.namespace, pod.name, pod.team, pod.project = state.namespace, state.name, state.team, state.project
        pod.gang, pod.owner_uids = state.gang_id, sorted(o.uid for o in state.owners if o.uid)
        pod.requests, pod.gpus = dict(state.gpu_requests), sum(state.gpu_requests.values())
        pod.created = epoch(state.created_at)
        pod.vram_need_bytes = state.vram_request_bytes
        if state.node and pod.node is None:
            pod.node = state.node
            pod.scheduled = epoch(state.scheduled_at) if state.scheduled_at else ts
        if state.started_at and pod.started is None:
            pod.started = epoch(state.started_at)
        for cond in state.conditions:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.message:
                self._reason(pod, cond.message)
        reason = pod_end_reason(state)
        if reason is not None and (pod.end is None or (pod.end_by_node and ts <= pod.end + EPS)):
            # a pod that completed or was deleted at the tick its node left is not Evicted
            pod.end, pod.end_reason, pod.end_by_node = min(ts, pod.end or ts), reason, False
        self._try_lifecycle(pod)

    def _reason(self, pod: SideInputs, text: str) -> None:
        pod.last_reason = text
        if text not in pod.reasons:
            pod.reasons = [*pod.reasons, text][-_MAX_REASONS:]

    def _target(self, uid: str | None) -> SideInputs | None:
        """The pod record a side input refers to (stashed when the pod is not known yet)."""
        if uid is None or uid in self.done:
            return None
        if uid in self.pods:
            return self.pods[uid]
        return self.early.setdefault(uid, SideInputs())

    def _on_event(self, ts: float, event: K8sEvent) -> None:
        if event.category != "scheduling_failed" or event.involved_kind != "Pod":
            return
        target = self._target(event.involved_uid)
        if target is not None and event.message:
            self._reason(target, event.message)

    def _on_usage(self, ts: float, usage: PodUsage) -> None:
        target = self._target(usage.pod_uid)
        if target is not None:
            target.usage = usage.model_dump(mode="json")
            if usage.pod_uid in self.pods:
                self._try_lifecycle(self.pods[usage.pod_uid])

    def _on_progress(self, ts: float, progress: WorkloadProgress) -> None:
        target = self._target(progress.pod_uid)
        if target is not None and progress.steps_total is not None:
            target.steps = max(target.steps or 0.0, progress.steps_total)

    def _on_workload(self, ts: float, state: WorkloadState) -> None:
        if state.deleted or state.phase in ("finished", "inactive"):
            if state.uid in self.workloads:  # kept until the rules resolve its alerts
                self.workloads[state.uid].ended = "deleted" if state.deleted else state.phase
            return
        sets = [(s.count, dict(s.gpu_requests_per_pod)) for s in state.pod_sets if s.gpu_requests_per_pod and s.count]
        self.workloads[state.uid] = Workload(
            uid=state.uid, namespace=state.namespace, name=state.name, queue=state.queue_name, team=state.team,
            gang=state.gang_id, owner_uids=sorted(o.uid for o in state.owners if o.uid),
            requests=dict(state.gpu_requests), gpus=state.gpus, sets=sets, pods=sum(count for count, _ in sets),
            created=epoch(state.created_at), admitted=state.phase == "admitted", last_reason=state.pending_reason,
        )

    def _queued(self, t: float) -> list[Workload]:
        """Workloads waiting for admission at ``t`` whose demand no live pod carries yet."""
        if not self.workloads:
            return []
        gangs = {p.gang for p in self.pods.values() if p.end is None and p.gang}
        owners = {uid for p in self.pods.values() if p.end is None for uid in p.owner_uids}
        return sorted((w for w in self.workloads.values()
                       if not w.admitted and not w.ended and w.gpus > 0 and w.created <= t + EPS
                       and w.gang not in gangs and not owners.intersection(w.owner_uids)),
                      key=lambda w: (w.created, w.uid))

    def _on_summary(self, ts: float, summary: NodeSummary) -> None:
        self.summaries[summary.node] = NodeSampleSummary(ts=ts, interval_s=summary.sample_interval_s,
                                                         busy_gpus=summary.busy, idle_gpus=summary.idle_allocated)
        self.mig.on_summary(summary.node, summary.mig)
        self.vram.on_summary(summary.node, summary.shared)

    # ------------------------------------------------------------------ lifecycle

    def _try_lifecycle(self, pod: ClusterPod) -> None:
        if pod.end is not None and (pod.node is None or pod.usage is not None):
            self._emit_lifecycle(pod, pod.end)

    def _emit_lifecycle(self, pod: ClusterPod, now: float) -> None:
        uid = pod.uid
        if uid in self.done:
            return
        end = pod.end if pod.end is not None else now
        scheduled = pod.scheduled
        pending_s = max((scheduled if scheduled is not None else end) - pod.created, 0.0)
        running_s = max(end - scheduled, 0.0) if scheduled is not None else 0.0
        gpu_hours = pod.gpus * running_s / 3600.0
        usage = _NO_USAGE if pod.usage is None else PodUsage.model_validate(pod.usage)
        node = self.nodes.get(pod.node or "")
        model = usage.gpu_model or (node.gpu_product if node is not None else None)
        cost = _lifecycle_cost(pod.gpus, gpu_hours, usage, self.config.price(model))
        steps = pod.steps
        reason = pod.end_reason or ("Running" if scheduled is not None else "Pending")
        self._out.append(PodLifecycle(
            pod_uid=uid, namespace=pod.namespace, name=pod.name, team=pod.team, project=pod.project,
            node=pod.node, gpus=pod.gpus, gpu_model=model, created_at=from_epoch(pod.created),
            scheduled_at=from_epoch(scheduled) if scheduled is not None else None,
            started_at=from_epoch(pod.started) if pod.started is not None else None,
            finished_at=from_epoch(pod.end) if pod.end is not None else None,
            pending_reasons=list(pod.reasons), pending_s=pending_s, running_s=running_s, gpu_hours=gpu_hours,
            idle_gpu_hours=usage.idle_s / 3600.0, peak_mem_bytes=usage.peak_mem_bytes,
            avg_sm_util_pct=min(100.0, usage.util_s / usage.data_s) if usage.data_s else None,
            cost_usd=min(cost, MAX_USD), end_reason=reason,  # type: ignore[arg-type]
            steps=steps, cost_per_step_usd=cost / steps if steps else None,
            max_reserved_unused_bytes=usage.max_reserved_unused_bytes, alloc_retries=usage.alloc_retries,
            alloc_ooms=usage.alloc_ooms,
        ))
        if pod.end is not None:
            self.done[uid] = pod.end
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
        last = self.cap.last_instant
        if last is None or step <= 0:
            return
        while last + step < limit - step / 2:
            last += step
            self._evaluate(last)

    def _evaluate(self, t: float) -> None:
        self.counters["instants"] += 1
        self.cap.last_instant = t
        self._integrate_to(t)
        used = self._used_by_node()  # once per instant: the free GPUs and the snapshot both read it
        free = self._free_by_node(used)
        pending = sorted((p for p in self.pods.values()
                          if p.end is None and p.node is None and p.gpus > 0 and p.created <= t + EPS),
                         key=lambda p: (p.created, p.uid))
        queued = self._queued(t)
        snap = self._snapshot(t, free, pending, queued, used)
        self.cap.snapshot = snap
        if self._end is not None and t >= self._end - EPS:
            # a replay's end is no tick (FORMAT.md: ticks while t < duration): the instant holds for
            # no time, so the window keeps the state before it, and no alert fires or resolves there
            return
        acc = self._cap_window(window_start(t, self.config.window_s))
        acc.stranded_max = max(acc.stranded_max, snap.stranded)
        acc.last = snap

        live = {n for n, node in self.nodes.items() if node.ready and not node.deleted}
        th = self.config.thresholds
        self._out += self.mig.evaluate(t, live, set(free), pending, th, self.alerting["mig_fragmentation"],
                                       self._why_not_pending)
        self._out += self.vram.evaluate(t, live, set(free), pending, th, self.alerting["vram_fragmentation"],
                                        self._why_not_pending)
        figures = (self.mig.snapshot or {}) | (self.vram.snapshot or {})
        if figures:  # MIG and shared-VRAM figures: only on a fleet with such GPUs
            self.cap.snapshot = acc.last = replace(snap, fragmentation=figures)
        self._pending_rules(t, pending, free, queued)
        self._gang_rules(t)

    def _used_by_node(self) -> dict[str, dict[str, int]]:
        """GPUs the live bound pods request, by node then resource (the scheduler's view)."""
        used: dict[str, dict[str, int]] = {}
        for pod in self.pods.values():
            if pod.node is not None and pod.end is None:
                bucket = used.setdefault(pod.node, {})
                for res, n in pod.requests.items():
                    bucket[res] = bucket.get(res, 0) + n
        return used

    def _free_by_node(self, used: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        """Free GPUs of the schedulable Ready nodes, by node (sorted) then resource (``used``:
        :meth:`_used_by_node`)."""
        return {name: {res: max(n - used.get(name, {}).get(res, 0), 0) for res, n in node.allocatable.items()}
                for name, node in sorted(self.nodes.items())
                if node.ready and not node.deleted and not node.unschedulable}

    def _snapshot(self, t: float, free: dict[str, dict[str, int]], pending: list[ClusterPod],
                  queued: list[Workload], used: dict[str, dict[str, int]]) -> CapacitySnapshot:
        """The cluster's capacity at ``t``: totals over the Ready nodes, the busy / idle figures of the
        samples that stand for ``t``, and the free GPUs no waiting request fits (stranded); ``used``:
        :meth:`_used_by_node`."""
        total = allocated = 0
        parts: list[SamplePart] = []
        for name in sorted(self.nodes):
            node = self.nodes[name]
            if not node.ready or node.deleted:
                continue
            here = used.get(name, {})
            total += sum(node.allocatable.values())
            allocated += sum(min(here.get(res, 0), n) for res, n in node.allocatable.items())
            summary = self.summaries.get(name)
            if summary and t < summary.ts + summary.interval_s - EPS:
                # a sample stands for its own interval only: no sample, no busy/idle figure
                parts.append(SamplePart(summary.busy_gpus, summary.idle_gpus, summary.ts + summary.interval_s))
        free_by_node = {name: sum(f.values()) for name, f in free.items()}
        busy = int(sum(p.busy_gpus for p in parts))
        idle = int(sum(p.idle_gpus for p in parts))
        return CapacitySnapshot(
            total=total, allocated=allocated, busy=min(busy, allocated), parts=tuple(parts),
            idle=min(idle, allocated), free=max(total - allocated, 0), free_by_node=free_by_node,
            largest_free_block=max(free_by_node.values(), default=0), stranded=_stranded(free, pending, queued),
            pending_pods=len(pending), pending_demand=sum(p.gpus for p in pending) + sum(w.gpus for w in queued),
            queued_workloads=len(queued), queued_demand=sum(w.gpus for w in queued),
        )

    def _pending_rules(self, t: float, pending: list[ClusterPod], free: dict[str, dict[str, int]],
                       queued: list[Workload]) -> None:
        th = self.config.thresholds
        waiting = {p.uid for p in pending} | {w.uid for w in queued}
        records: list[ClusterPod | Workload] = [*pending, *queued]
        for pod in records:
            request = pod.requests
            cluster_free = {res: sum(f.get(res, 0) for f in free.values()) for res in request}
            nodes = (_placement(free, pod.sets) if isinstance(pod, Workload)
                     else 1 if any(_fits(f, request) for f in free.values()) else None)
            context = rules.Waiting(
                record=pod, unfragmented=_fits(cluster_free, request), fits_somewhere=nodes is not None,
                fits_on_nodes=nodes or 0,
                largest=max((sum(f.get(res, 0) for res in request) for f in free.values()), default=0),
                free_sum=sum(cluster_free.values()),
                free_by_node={n: sum(f.get(r, 0) for r in request) for n, f in free.items()},
            )
            for rule in rules.WAITING_RULES:
                self._out += rules.step(rule, self.alerting[rule.alert_type], pod.uid, context, t, th)
        for rule in rules.WAITING_RULES:
            self._out += rules.sweep(self.alerting[rule.alert_type], waiting, t, self._why_not_pending)
        for uid in [uid for uid, w in self.workloads.items() if w.ended]:
            del self.workloads[uid]

    def _why_not_pending(self, uid: str) -> str:
        workload = self.workloads.get(uid)
        if workload is not None:
            if workload.ended:
                return f"workload {workload.ended}"
            return "admitted" if workload.admitted else "its pods were created"
        pod = self.pods.get(uid)
        if pod is None:
            return "pod ended"
        if pod.end is not None:
            return f"pod ended ({pod.end_reason})"
        return f"scheduled on {pod.node}" if pod.node else "no longer pending"

    def _gang_rules(self, t: float) -> None:
        groups: dict[str, list[ClusterPod]] = {}
        for pod in self.pods.values():
            if pod.gang and pod.end is None and pod.created <= t + EPS:
                groups.setdefault(pod.gang, []).append(pod)
        table = self.alerting["gang_partial"]
        partial: set[str] = set()
        for gang in sorted(groups):
            context = rules.Gang(gang_id=gang, members=tuple(sorted(groups[gang], key=lambda p: p.name)))
            if rules.GANG_PARTIAL.condition(context):
                # a gang no longer partial resolves in the sweep below, after every firing
                partial.add(gang)
                self._out += rules.step(rules.GANG_PARTIAL, table, gang, context, t, self.config.thresholds)
        self._out += rules.sweep(table, partial, t, lambda gang: rules.gang_resolved_reason(groups.get(gang, [])))

    # ------------------------------------------------------------------ capacity windows

    def _cap_window(self, ws: float) -> CapacityWindow:
        key = repr(ws)
        acc = self.cap.windows.get(key)
        if acc is None:
            acc = self.cap.windows[key] = CapacityWindow(window_start=ws)
        return acc

    def _integrate_to(self, t: float) -> None:
        start, snap = self.cap.integrated_to, self.cap.snapshot
        if start is None or snap is None:
            self.cap.integrated_to = t if start is None or t > start else start
            return
        width = self.config.window_s
        self.cap.integrated_to = max(t, start)
        while start < t - EPS:
            ws = window_start(start, width)
            seg = min(t, ws + width) - start
            self._cap_window(ws).add(snap, start, seg)
            start += seg

    def _close_windows(self, watermark: float, final: bool) -> None:
        width = self.config.window_s
        for key in sorted(self.cap.windows, key=lambda k: self.cap.windows[k].window_start):
            acc = self.cap.windows[key]
            if not final and acc.window_start + width > watermark + EPS:
                continue
            del self.cap.windows[key]
            if final and acc.window_start >= watermark - EPS:
                continue  # starts at the end of a replay: nothing in it
            self._out.append(acc.message(width))

    # ------------------------------------------------------------------ checkpoint

    def to_dict(self) -> JsonDict:
        return {
            **self._driving_dict(), "nodes": records_to_dict(self.nodes), "pods": records_to_dict(self.pods),
            "workloads": records_to_dict(self.workloads),
            "done": self.done, "early": records_to_dict(self.early), "summaries": records_to_dict(self.summaries),
            "alerting": {name: rules.table_to_dict(table) for name, table in self.alerting.items()},
            "cap": self.cap.to_dict(),
            "counters": self.counters, "mig": self.mig.to_dict(), "vram": self.vram.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: JsonObject, config: EngineConfig) -> ClusterStage:
        stage = cls(config)
        stage._restore_driving(data)
        stage.cap = CapacityState.from_dict(as_object(data["cap"]))
        stage.nodes = record_map(data["nodes"], ClusterNode.from_dict)
        stage.pods = record_map(data["pods"], ClusterPod.from_dict)
        stage.early = record_map(data["early"], SideInputs.from_dict)
        stage.summaries = record_map(data["summaries"], NodeSampleSummary.from_dict)
        stage.done, stage.counters = float_map(data["done"]), int_map(data["counters"])
        stage.alerting |= record_map(data["alerting"], rules.table_from_dict)
        stage.workloads = record_map(data.get("workloads", {}), Workload.from_dict)
        stage.mig = MigTracker.from_dict(data.get("mig"))
        stage.vram = VramTracker(data.get("vram"))
        return stage
