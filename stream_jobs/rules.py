"""The alert catalogue: every alert type gpulens emits is declared once here (:data:`CATALOGUE`).

A sustained-condition type is one :class:`SustainedRule`: its kind (name and severity), its
condition over a context the stage builds, how long the condition must hold (a typed reference to
a field of :class:`common.settings.Thresholds`), the subject, summary and details of the firing
alert, and why it resolves; :mod:`stream_jobs.rule_engine` (``step`` / ``sweep``, re-exported
here) says *how*, once, for every type. ``gpu_health`` and ``crashloop_gpu`` fire on an event and
clear after a quiet period: they are :class:`EventRule` declarations whose logic is in the node
stage. The severity table (:data:`SEVERITY`), the report order (``alerts.TYPE_ORDER``, the wire
enum's) and the docs section of each type (``AlertKind.docs_anchor``) derive from the catalogue;
``tests/alerts/test_catalogue.py`` fails when a declared type is missing from the wire enum, the
catalogue or docs/alerts.md, or the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from schemas.messages import AllocatorDevice, GpuReading
from schemas.outputs import AlertSubject
from stream_jobs import alerts
from stream_jobs.alerts import AlertKind, IdleCost, OpenAlert
from stream_jobs.alerts import Details as Details
from stream_jobs.attribution import Share
from stream_jobs.config import Thresholds
from stream_jobs.json_types import JsonObject, as_array, as_object
from stream_jobs.rule_engine import Declaration as Declaration
from stream_jobs.rule_engine import EventRule as EventRule
from stream_jobs.rule_engine import Resolution as Resolution
from stream_jobs.rule_engine import RuleState as RuleState
from stream_jobs.rule_engine import RuleTable as RuleTable
from stream_jobs.rule_engine import SustainedRule as SustainedRule
from stream_jobs.rule_engine import close as close
from stream_jobs.rule_engine import restart as restart
from stream_jobs.rule_engine import step as step
from stream_jobs.rule_engine import sweep as sweep
from stream_jobs.rule_engine import table_from_dict as table_from_dict
from stream_jobs.rule_engine import table_to_dict as table_to_dict
from stream_jobs.state import ClusterPod, Workload
from stream_jobs.timeutil import fmt_duration, iso

# ---------------------------------------------------------------------- node rules


@dataclass(slots=True)
class PodGpu:
    """One sample of one pod's share of one GPU on a node (context of the per-pod GPU rules). Made for
    every pod's GPU at every sample, so not frozen (see :class:`stream_jobs.attribution.Share`)."""

    node: str
    namespace: str
    pod: str
    reading: GpuReading
    share: Share
    thresholds: Thresholds

    @property
    def idle(self) -> bool | None:
        util = self.share.util_pct
        return None if util is None else util < self.thresholds.idle_util_pct

    @property
    def mem_used_pct(self) -> float | None:
        total, used = self.reading.mem_total_bytes, self.reading.mem_used_bytes
        return used / total * 100.0 if total and used is not None else None


def _pod_gpu_subject(c: PodGpu) -> AlertSubject:
    return alerts.subject("pod", c.namespace, c.pod, c.node, c.reading.uuid)


def _idle_describe(c: PodGpu, since: float, t: float) -> tuple[str, Details]:
    share, th = c.share, c.thresholds
    held = share.processes > 0 or (share.mem_bytes or 0) > 0
    details: Details = {
        "idle_class": "vram_held" if held else "no_process", "gpu_index": c.reading.index,
        "util_pct": share.util_pct, "threshold_pct": th.idle_util_pct, "mem_used_bytes": share.mem_bytes,
        "processes": share.processes, "idle_since": iso(since),
        "share": share.share, "share_estimated": share.estimated,
    }
    held_text = f"holding {(share.mem_bytes or 0) / 2**30:.1f} GiB VRAM" if held else "no process running"
    summary = (f"{c.namespace}/{c.pod}: GPU {c.reading.index} on {c.node} below "
               f"{th.idle_util_pct:g}% SM for {fmt_duration(t - since)} ({held_text})")
    return summary, details


IDLE_GPU: SustainedRule[PodGpu] = SustainedRule(
    kind=AlertKind("idle_gpu", "warning"),
    after=lambda th: th.idle_after,
    condition=lambda c: c.idle,
    subject=_pod_gpu_subject,
    describe=_idle_describe,
    resolution=lambda c, _alert, _t: Resolution("busy again", {"util_pct": c.share.util_pct}),
)
"""SM utilisation below ``idle_util_pct`` at every sample for ``idle_after``."""


def _vram_pressure(c: PodGpu) -> bool | None:
    pct = c.mem_used_pct
    # bytes are whole: 45.6 of 48 GiB reads 94.9999999992 %, which is 95 %
    return None if pct is None else pct >= c.thresholds.vram_pressure_pct - 1e-6


def _vram_describe(c: PodGpu, since: float, t: float) -> tuple[str, Details]:
    pct = c.mem_used_pct or 0.0
    total = c.reading.mem_total_bytes or 0
    details: Details = {"gpu_index": c.reading.index, "mem_used_bytes": c.reading.mem_used_bytes,
                        "mem_total_bytes": total, "mem_used_pct": round(pct, 2),
                        "threshold_pct": c.thresholds.vram_pressure_pct}
    summary = (f"{c.namespace}/{c.pod}: GPU {c.reading.index} on {c.node} at {pct:.1f}% "
               f"of {total / 2**30:.0f} GiB VRAM for {fmt_duration(t - since)}")
    return summary, details


VRAM_PRESSURE: SustainedRule[PodGpu] = SustainedRule(
    kind=AlertKind("vram_pressure", "warning"),
    after=lambda th: th.vram_pressure_after,
    condition=_vram_pressure,
    subject=_pod_gpu_subject,
    describe=_vram_describe,
    resolution=lambda c, _alert, _t: Resolution("below threshold", {"mem_used_pct": round(c.mem_used_pct or 0.0, 2)}),
)
"""Device memory at or above ``vram_pressure_pct`` for ``vram_pressure_after``."""

POD_GPU_RULES: tuple[SustainedRule[PodGpu], ...] = (IDLE_GPU, VRAM_PRESSURE)
"""Evaluated in this order for every pod's share of every GPU at every sample (subject key
``pod_uid|gpu_uuid``)."""


@dataclass(slots=True)
class IdleNode:
    """One sample of a node: whether it is Ready and holds no GPU pod, and what it costs (made at
    every sample: not frozen, see :class:`stream_jobs.attribution.Share`)."""

    node: str
    ready: bool
    units: int
    physical_gpus: int
    holds: bool
    usd_per_hour: float
    gpu_model: str | None


def _idle_node_describe(c: IdleNode, since: float, t: float) -> tuple[str, Details]:
    burned = c.usd_per_hour * (t - since) / 3600.0
    details: Details = {"gpus": c.physical_gpus, "idle_since": iso(since), "cost_usd_burned": round(burned, 4),
                        "usd_per_hour": round(c.usd_per_hour, 4), "gpu_model": c.gpu_model}
    summary = (f"{c.node}: none of its {c.physical_gpus} GPUs allocated for "
               f"{fmt_duration(t - since)} (${burned:.2f} burned) - scale-to-zero candidate")
    return summary, details


def idle_node_burned(record: OpenAlert, t: float) -> float:
    """USD an ``idle_node`` alert's node burned from its idle start to ``t``."""
    cost = record.cost
    return 0.0 if cost is None else round(cost.usd_per_hour * (t - cost.since_ts) / 3600.0, 4)


IDLE_NODE: SustainedRule[IdleNode] = SustainedRule(
    kind=AlertKind("idle_node", "info"),
    after=lambda th: th.idle_node_after,
    condition=lambda c: c.ready and c.units > 0 and not c.holds,
    subject=lambda c: alerts.subject("node", None, c.node, c.node),
    describe=_idle_node_describe,
    resolution=lambda c, alert, t: Resolution("gpu allocated" if c.ready else "node not ready",
                                              {"cost_usd_burned": idle_node_burned(alert, t)}),
    remember=lambda c, since: IdleCost(since, c.usd_per_hour),
)
"""A Ready node with GPUs none of which a pod holds, for ``idle_node_after``; its resolution says
what the idle node cost (:func:`idle_node_burned`)."""


GPU_HEALTH = EventRule(kind=AlertKind("gpu_health", "critical"), quiet=lambda th: th.gpu_health_clear_after)
"""A critical XID, or the GPU lost / in error: fires at once; resolves after ``gpu_health_clear_after``
healthy (the node stage's ``_health``)."""

CRASHLOOP_GPU = EventRule(kind=AlertKind("crashloop_gpu", "critical"), quiet=lambda th: th.crashloop_window)
"""A GPU pod restarting ``crashloop_restarts`` times within ``crashloop_window``: fires at once; resolves
after ``crashloop_window`` without a restart (the node stage's ``_check_crashloop``)."""


# ---------------------------------------------------------------------- cluster rules


@dataclass(frozen=True)
class Waiting:
    """A pending GPU pod or a queued workload at one cluster instant, with the free GPUs it sees."""

    record: ClusterPod | Workload
    unfragmented: bool
    """The cluster's free GPUs add up to its request."""
    fits_somewhere: bool
    """It can be placed on the schedulable nodes as they are."""
    fits_on_nodes: int
    """How many nodes that placement uses (a pod: 1; a workload: its pods placed largest first, first
    fit over the nodes by name); 0 when it does not fit."""
    largest: int
    free_sum: int
    free_by_node: Mapping[str, int]

    @property
    def workload(self) -> bool:
        return isinstance(self.record, Workload)


def _waiting_subject(c: Waiting) -> AlertSubject:
    return alerts.subject("workload" if c.workload else "pod", c.record.namespace, c.record.name)


def _pending_describe(c: Waiting, since: float, t: float) -> tuple[str, Details]:
    p = c.record
    details: Details = {"request": p.requests, "gpus": p.gpus, "last_scheduler_reason": p.last_reason,
                        "would_fit_unfragmented": c.unfragmented, "free_gpus": c.free_sum,
                        "largest_free_block": c.largest, "pending_s": t - p.created}
    if isinstance(p, Workload):
        reason = p.last_reason or "no queue reason seen"
        details |= {"queue": p.queue, "pods": p.pods, "team": p.team}
        summary = (f"workload {p.namespace}/{p.name} queued for {fmt_duration(t - p.created)}: "
                   f"needs {p.gpus} GPU(s) in {p.pods} pod(s); {reason}")
    else:
        reason = p.last_reason or "no scheduler reason seen"
        summary = (f"{p.namespace}/{p.name} pending for {fmt_duration(t - p.created)}: needs "
                   f"{p.gpus} GPU(s); {reason}")
    return summary, details


PENDING_GPU: SustainedRule[Waiting] = SustainedRule(
    kind=AlertKind("pending_gpu", "warning"),
    after=lambda th: th.pending_after,
    condition=lambda c: True,
    subject=_waiting_subject,
    describe=_pending_describe,
    resolution=lambda c, _alert, _t: Resolution("no longer pending"),  # never used: it ends by a sweep
    since=lambda c: c.record.created,
)
"""A GPU pod unscheduled (a workload not admitted) ``pending_after`` after its creation; it
resolves when it stops waiting (the cluster stage's sweep says why)."""


def _fragmentation_describe(c: Waiting, since: float, t: float) -> tuple[str, Details]:
    p = c.record
    details: Details = {"request": p.requests, "gpus": p.gpus, "free_gpus": c.free_sum,
                        "largest_free_block": c.largest, "free_gpus_by_node": dict(c.free_by_node)}
    summary = f"{p.name} needs {p.gpus} GPUs; {c.free_sum} are free but at most {c.largest} on one node"
    if isinstance(p, Workload):
        details["pods"] = p.pods
        summary = (f"workload {p.name} needs {p.gpus} GPUs in {p.pods} pod(s); "
                   f"{c.free_sum} are free but its pods do not fit the nodes (at most {c.largest} on one)")
    return summary, details


FRAGMENTATION: SustainedRule[Waiting] = SustainedRule(
    kind=AlertKind("fragmentation", "warning"),
    after=lambda th: th.fragmentation_after,
    condition=lambda c: c.unfragmented and not c.fits_somewhere,
    subject=_waiting_subject,
    describe=_fragmentation_describe,
    resolution=lambda c, _alert, _t: Resolution(_fits_text(c)),
)
"""A waiting pod or workload no node fits although the free GPUs add up, for ``fragmentation_after``.
It resolves while still waiting when it fits as the nodes are (on a node, or a workload's pods across
N nodes) or when the free GPUs no longer add up; when it stops waiting, the sweep says why (scheduled
on a node, admitted, ended)."""


def _fits_text(c: Waiting) -> str:
    if not c.fits_somewhere:
        return "not enough free GPUs"
    return "fits on a node" if c.fits_on_nodes <= 1 else f"fits across {c.fits_on_nodes} nodes"

WAITING_RULES: tuple[SustainedRule[Waiting], ...] = (PENDING_GPU, FRAGMENTATION)
"""Evaluated in this order for every pending pod, then every queued workload, at every instant."""


@dataclass(frozen=True)
class Gang:
    """A gang at one cluster instant: its live members, sorted by name."""

    gang_id: str
    members: tuple[ClusterPod, ...]

    @property
    def running(self) -> list[ClusterPod]:
        return [p for p in self.members if p.node is not None]

    @property
    def waiting(self) -> list[ClusterPod]:
        return [p for p in self.members if p.node is None]

    @property
    def namespace_and_group(self) -> tuple[str, str]:
        if "/" in self.gang_id:
            namespace, _, group = self.gang_id.partition("/")
            return namespace, group
        return self.members[0].namespace, ""


def gang_resolved_reason(members: Iterable[ClusterPod]) -> str:
    """Why a gang's ``gang_partial`` resolves, from its live members (none when it is gone)."""
    members = list(members)
    return "all members running" if members and all(p.node for p in members) else "no member running"


def _gang_describe(c: Gang, since: float, t: float) -> tuple[str, Details]:
    running, waiting = c.running, c.waiting
    namespace, group = c.namespace_and_group
    details: Details = {"running": [p.name for p in running], "pending": [p.name for p in waiting],
                        "gpus_held": sum(p.gpus for p in running),
                        "gpus_waiting": sum(p.gpus for p in waiting)}
    summary = (f"gang {group} in {namespace}: {len(running)} of {len(c.members)} members hold "
               f"{details['gpus_held']} GPUs while {len(waiting)} wait, for {fmt_duration(t - since)}")
    return summary, details


def _gang_subject(c: Gang) -> AlertSubject:
    namespace, group = c.namespace_and_group
    return alerts.subject("gang", namespace, group or c.gang_id)


GANG_PARTIAL: SustainedRule[Gang] = SustainedRule(
    kind=AlertKind("gang_partial", "warning"),
    after=lambda th: th.gang_after,
    condition=lambda c: bool(c.running and c.waiting),
    subject=_gang_subject,
    describe=_gang_describe,
    resolution=lambda c, _alert, _t: Resolution(gang_resolved_reason(c.members)),
)
"""A gang with members holding GPUs while others wait, for ``gang_after``; the cluster stage steps
it for partial gangs only and sweeps the others after all fired (the order of transitions)."""

@dataclass(frozen=True)
class AllocatorGpu:
    """One caching-allocator report of one pod's GPU (:mod:`stream_jobs.allocator` builds it)."""

    node: str
    namespace: str
    pod: str
    gpu_uuid: str
    gpu_index: int | None
    device: AllocatorDevice
    gpu_mem_total_bytes: int | None
    reserved_unused_bytes: int
    reserved_unused_pct: float | None
    """None: the GPU's memory is not known (no sample gave it)."""
    over_since: float | None
    """The first report of the current run at or above ``allocator_unused_pct`` (the rule's timer)."""
    alloc_retries: int
    """Retries in the window: the total now minus that of the window's earliest report."""
    alloc_ooms: int
    thresholds: Thresholds

    @property
    def over(self) -> bool:
        return self.reserved_unused_pct is not None and \
            self.reserved_unused_pct >= self.thresholds.allocator_unused_pct - 1e-6


def _allocator_condition(c: AllocatorGpu) -> bool | None:
    if c.reserved_unused_pct is None:
        return None
    return c.over and c.alloc_retries + c.alloc_ooms > 0


def _allocator_describe(c: AllocatorGpu, since: float, t: float) -> tuple[str, Details]:
    after = c.thresholds.allocator_fragmentation_after
    total = c.gpu_mem_total_bytes or 0
    pct = c.reserved_unused_pct or 0.0
    details: Details = {
        "gpu_index": c.gpu_index, "device": c.device.device, "reserved_bytes": c.device.reserved_bytes,
        "allocated_bytes": c.device.allocated_bytes, "reserved_unused_bytes": c.reserved_unused_bytes,
        "reserved_unused_pct": round(pct, 2), "gpu_mem_total_bytes": total,
        "alloc_retries": c.alloc_retries, "alloc_ooms": c.alloc_ooms,
        "max_reserved_bytes": c.device.max_reserved_bytes, "threshold_pct": c.thresholds.allocator_unused_pct,
        "window_s": after, "since": iso(since),
    }
    summary = (f"{c.namespace}/{c.pod}: the caching allocator on GPU {c.gpu_index} on {c.node} holds "
               f"{c.reserved_unused_bytes / 2**30:.1f} GiB reserved but unused ({pct:.0f}% of {total / 2**30:.0f} "
               f"GiB) for {fmt_duration(t - since)}, with {c.alloc_retries} allocation retries and {c.alloc_ooms} "
               f"OOMs in {fmt_duration(after)}")
    return summary, details


def _allocator_resolution(c: AllocatorGpu, _alert: OpenAlert, _t: float) -> Resolution:
    if not c.over:
        return Resolution(f"reserved but unused below {c.thresholds.allocator_unused_pct:g}% of the GPU",
                          {"reserved_unused_pct": round(c.reserved_unused_pct or 0.0, 2)})
    return Resolution(f"no allocation retry or OOM for {fmt_duration(c.thresholds.allocator_fragmentation_after)}")


ALLOCATOR_FRAGMENTATION: SustainedRule[AllocatorGpu] = SustainedRule(
    kind=AlertKind("allocator_fragmentation", "warning"),
    after=lambda th: th.allocator_fragmentation_after,
    condition=_allocator_condition,
    subject=lambda c: alerts.subject("pod", c.namespace, c.pod, c.node, c.gpu_uuid),
    describe=_allocator_describe,
    resolution=_allocator_resolution,
    since=lambda c: c.over_since if c.over_since is not None else 0.0,
)
"""A pod's caching allocator holds ``allocator_unused_pct`` of the GPU reserved but unused since a
report ``allocator_fragmentation_after`` ago (the timer runs from the data: the run above the share,
not the retries), with allocation retries or OOMs within that window. Stepped at each allocator
report by :class:`stream_jobs.allocator.AllocatorTracker`, which keeps its table."""

# --------------------------------------------------------------------------- MIG and shared-GPU VRAM
# (stream_jobs.mig_rules and stream_jobs.shared_vram work out the figures these contexts carry)


@dataclass(frozen=True)
class MigWaiting:
    """A pending pod asking for ``count`` MIG devices of ``profile``, and where they could come from."""

    pod: ClusterPod
    profile: str
    count: int
    hostable: bool
    """A schedulable node has that many empty instances of the profile."""
    relayout_node: bool
    """Destroying the empty instances of one node's GPUs would make room for all of them."""
    fleet: bool
    """The free compute and memory slices of the fleet's GPUs add up to them."""
    figures: JsonObject
    """Candidates and slice counts for the details (``mig_rules``)."""


def _mig_describe(c: MigWaiting, since: float, t: float) -> tuple[str, Details]:
    candidates = as_array(c.figures.get("relayout_candidates") or [])
    first = as_object(candidates[0]) if candidates else {}
    where = (f"a re-layout of {first['node']} GPU {first['gpu_index']} could host it"
             if c.relayout_node and candidates else
             f"{c.figures['free_compute_slices']} compute and {c.figures['free_memory_slices']} memory slices are "
             f"free across the fleet")
    summary = (f"{c.pod.namespace}/{c.pod.name} needs {c.count} x MIG {c.profile}; none is free as partitioned "
               f"for {fmt_duration(t - since)}, but {where}")
    details: Details = {"profile": c.profile, "count": c.count, "request": c.pod.requests,
                        "fits_after_relayout_on_one_node": c.relayout_node, "fits_fleet_free_slices": c.fleet,
                        **c.figures}
    return summary, details


MIG_FRAGMENTATION: SustainedRule[MigWaiting] = SustainedRule(
    kind=AlertKind("mig_fragmentation", "warning"),
    after=lambda th: th.mig_fragmentation_after,
    condition=lambda c: not c.hostable and (c.relayout_node or c.fleet),
    subject=lambda c: alerts.subject("pod", c.pod.namespace, c.pod.name),
    describe=_mig_describe,
    resolution=lambda c, _alert, _t: Resolution(f"an empty {c.profile} exists" if c.hostable
                                                else f"not enough free slices for {c.profile}"),
)
"""A pod's MIG profile has no empty instance while free slices exist for it, for ``mig_fragmentation_after``."""


@dataclass(frozen=True)
class VramWaiting:
    """A pending pod that declares the VRAM it needs, and the free VRAM of the schedulable shared GPUs."""

    pod: ClusterPod
    need_bytes: int
    free_bytes: int
    largest_free_bytes: int
    gpus: tuple[JsonObject, ...]
    """The shared GPUs with the most free VRAM, with their tenants (for the details)."""
    shared_gpus: int


def _vram_frag_describe(c: VramWaiting, since: float, t: float) -> tuple[str, Details]:
    gib = 2**30
    summary = (f"{c.pod.namespace}/{c.pod.name} needs {c.need_bytes / gib:.1f} GiB of VRAM on a shared GPU; "
               f"{c.free_bytes / gib:.1f} GiB are free over {c.shared_gpus} shared GPUs but at most "
               f"{c.largest_free_bytes / gib:.1f} GiB on one, for {fmt_duration(t - since)}")
    details: Details = {"need_bytes": c.need_bytes, "free_vram_bytes": c.free_bytes,
                        "largest_free_bytes": c.largest_free_bytes, "shared_gpus": c.shared_gpus,
                        "gpus": list(c.gpus)}
    return summary, details


VRAM_FRAGMENTATION: SustainedRule[VramWaiting] = SustainedRule(
    kind=AlertKind("vram_fragmentation", "warning"),
    after=lambda th: th.vram_fragmentation_after,
    condition=lambda c: c.largest_free_bytes < c.need_bytes <= c.free_bytes,
    subject=lambda c: alerts.subject("pod", c.pod.namespace, c.pod.name),
    describe=_vram_frag_describe,
    resolution=lambda c, _alert, _t: Resolution("a GPU has room for it" if c.largest_free_bytes >= c.need_bytes
                                                else "not enough free VRAM in total"),
)
"""A declared VRAM need fits the shared GPUs' free VRAM in total but no single GPU, for ``vram_fragmentation_after``."""


@dataclass(frozen=True)
class SharedGpuPressure:
    """A shared GPU's memory at one sample, and the pod whose growth took it to the threshold."""

    node: str
    reading: GpuReading
    mem_used_pct: float | None
    over: bool | None
    """At or above ``vram_pressure_pct`` (None: no memory figure)."""
    noisy: tuple[str, str, int | None, int] | None
    """``(namespace, name, memory now, growth since the last sample below)`` of the pod that grew most."""
    neighbours: tuple[JsonObject, ...]
    thresholds: Thresholds


def _noisy_describe(c: SharedGpuPressure, since: float, t: float) -> tuple[str, Details]:
    assert c.noisy is not None
    namespace, name, mem, growth = c.noisy
    total = c.reading.mem_total_bytes or 0
    pct = c.mem_used_pct or 0.0
    details: Details = {"gpu_index": c.reading.index, "mem_used_bytes": c.reading.mem_used_bytes,
                        "mem_total_bytes": total, "mem_used_pct": round(pct, 2),
                        "threshold_pct": c.thresholds.vram_pressure_pct, "growth_bytes": growth,
                        "pod_mem_bytes": mem, "neighbours": list(c.neighbours)}
    summary = (f"{namespace}/{name} grew by {growth / 2**30:.1f} GiB and pushed shared GPU {c.reading.index} on "
               f"{c.node} to {pct:.1f}% of {total / 2**30:.0f} GiB VRAM for {fmt_duration(t - since)}; "
               f"{len(c.neighbours)} neighbour(s) share it")
    return summary, details


NOISY_NEIGHBOUR: SustainedRule[SharedGpuPressure] = SustainedRule(
    kind=AlertKind("noisy_neighbour", "warning"),
    after=lambda th: th.vram_pressure_after,
    condition=lambda c: None if c.over is None else c.over and c.noisy is not None,
    subject=lambda c: alerts.subject("pod", c.noisy[0] if c.noisy else None, c.noisy[1] if c.noisy else None,
                                     c.node, c.reading.uuid),
    describe=_noisy_describe,
    resolution=lambda c, _alert, _t: Resolution("below threshold", {"mem_used_pct": round(c.mem_used_pct or 0.0, 2)}),
)
"""A pod's growth takes a GPU it shares to ``vram_pressure_pct``, for ``vram_pressure_after`` (keyed by GPU)."""

NODE_RULES: tuple[Declaration, ...] = (*POD_GPU_RULES, IDLE_NODE, NOISY_NEIGHBOUR)
"""The node stage's sustained rules (it keeps one :data:`RuleTable` per rule)."""

CLUSTER_RULES: tuple[Declaration, ...] = (*WAITING_RULES, GANG_PARTIAL, MIG_FRAGMENTATION, VRAM_FRAGMENTATION)
"""The cluster stage's sustained rules (it keeps one :data:`RuleTable` per rule)."""

# ---------------------------------------------------------------------- the catalogue

CATALOGUE: tuple[Declaration, ...] = (
    IDLE_GPU, VRAM_PRESSURE, GPU_HEALTH, PENDING_GPU, FRAGMENTATION, GANG_PARTIAL, CRASHLOOP_GPU, IDLE_NODE,
    ALLOCATOR_FRAGMENTATION, MIG_FRAGMENTATION, VRAM_FRAGMENTATION, NOISY_NEIGHBOUR,
)
"""Every alert type gpulens emits, one declaration each, in the order of ``schemas.outputs.AlertType``
(the wire names; ``tests/alerts/test_catalogue.py`` ties the two and the docs sections together)."""

SEVERITY: dict[str, str] = {rule.kind.name: rule.kind.severity for rule in CATALOGUE}
"""Severity by alert type."""
