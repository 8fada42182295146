"""MIG in the cluster stage: the fleet's MIG layouts, their capacity figures and ``mig_fragmentation``.

The node stages send each node's MIG GPUs with their instances (:class:`NodeSummary.mig`); this
keeps the latest layout per node and, at each instant the cluster stage evaluates, works out with
the placement rules of :mod:`stream_jobs.mig`:

- per GPU: free compute and memory slices (an empty instance's slices count as free), the largest
  profile that can still be created as partitioned and after destroying the empty instances, and
  how long each empty instance has been empty (``mig_unused_slices`` in the report);
- per node and cluster: empty instances by profile, and how many of each profile a re-layout of
  the empty instances could hold;
- ``mig_fragmentation``: a pending pod asks for ``nvidia.com/mig-<profile>``; no schedulable node
  has that many empty instances of the profile, yet free slices exist for it, on one node after a
  re-layout or summed over the fleet. Held for ``mig_fragmentation_after``; the details name the
  GPUs a re-layout could use and the instances it would destroy.

The rule itself is declared in :mod:`stream_jobs.rules` (``MIG_FRAGMENTATION``); this builds its
context. A fleet without MIG GPUs and without MIG requests produces nothing here: no figures, no
alerts. State is plain JSON-serialisable data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schemas.outputs import Alert, MigGpuLayout
from stream_jobs import rules
from stream_jobs.config import Thresholds
from stream_jobs.json_types import JsonDict, JsonValue, as_array, as_object, float_map, optional_object
from stream_jobs.mig import (
    MigInstance,
    MigTable,
    free_slices,
    gpu_figures,
    max_count,
    profile_of_resource,
    relayout_starts,
    table_for,
)
from stream_jobs.state import ClusterPod

_MAX_CANDIDATES = 20


def _table(gpu: MigGpuLayout) -> MigTable | None:
    return table_for(gpu.model, gpu.mem_total_bytes, [i.profile for i in gpu.instances])


def _instances(gpu: MigGpuLayout) -> list[MigInstance]:
    return [MigInstance(i.profile, i.start, i.used) for i in gpu.instances]


def _mig_request(requests: dict[str, int]) -> tuple[str, int] | None:
    """The MIG profile and count a pod asks for (None when it asks for no MIG device)."""
    for resource, count in sorted(requests.items()):
        profile = profile_of_resource(resource)
        if profile is not None and count > 0:
            return profile, count
    return None


@dataclass(frozen=True)
class _Assessment:
    """Where a pending pod's MIG instances could come from (:meth:`MigTracker._assess`)."""

    hostable: bool
    relayout_node: bool
    fleet: bool
    figures: JsonDict
    """Re-layout candidates and slice counts: the alert's details."""


class MigTracker:
    def __init__(self) -> None:
        self.layouts: dict[str, list[MigGpuLayout]] = {}
        self._layout_docs: dict[str, list[JsonDict]] = {}
        """The layouts' JSON form (checkpoints), written once per summary."""
        self.idle_since: dict[str, float] = {}
        self.snapshot: JsonDict | None = None

    def on_summary(self, node: str, layouts: list[MigGpuLayout] | None) -> None:
        if layouts:
            self.layouts[node] = list(layouts)
            self._layout_docs[node] = [g.model_dump(mode="json") for g in layouts]
        else:
            self.layouts.pop(node, None)
            self._layout_docs.pop(node, None)

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, t: float, live: set[str], schedulable: set[str], pending: Sequence[ClusterPod],
                 thresholds: Thresholds, table: rules.RuleTable, why_not_pending: Callable[[str], str]) -> list[Alert]:
        """Figures at ``t`` (kept in :attr:`snapshot`) and ``mig_fragmentation``'s transitions (its
        timers and open alerts in ``table``, the stage's). ``live``: Ready nodes; ``schedulable``:
        those that take new pods; ``pending``: unscheduled pods; ``why_not_pending(uid)``: why a pod
        that waited no longer does."""
        demand: dict[str, int] = {}
        for pod in pending:
            want = _mig_request(pod.requests)
            if want is not None:
                demand[want[0]] = demand.get(want[0], 0) + want[1]
        gpus = [(node, gpu) for node in sorted(self.layouts) if node in live for gpu in self.layouts[node]]
        self._track_idle(t, gpus)
        if not gpus and not demand:
            self.snapshot = None
        else:
            self.snapshot = self._figures(t, gpus, demand)
        return self._rule(t, [(n, g) for n, g in gpus if n in schedulable], pending, thresholds, table,
                          why_not_pending)

    def _track_idle(self, t: float, gpus: list[tuple[str, MigGpuLayout]]) -> None:
        seen = set()
        for node, gpu in gpus:
            for inst in gpu.instances:
                key = f"{node}/{gpu.gpu_uuid}/{inst.profile}@{inst.start}"
                seen.add(key)
                if inst.used:
                    self.idle_since.pop(key, None)
                else:
                    self.idle_since.setdefault(key, t)
        for key in set(self.idle_since) - seen:
            del self.idle_since[key]

    def _figures(self, t: float, gpus: list[tuple[str, MigGpuLayout]], demand: dict[str, int]) -> JsonDict:
        free_c = free_m = 0
        free_by_profile: dict[str, int] = {}
        relayout: dict[str, int] = {}
        by_node: dict[str, dict[str, int]] = {}
        windows: list[JsonDict] = []
        for node, gpu in gpus:
            table = _table(gpu)
            if table is None:
                continue
            fig = gpu_figures(table, _instances(gpu))
            free_c += fig.free_compute_slices
            free_m += fig.free_memory_slices
            here = by_node.setdefault(node, {})
            for profile, n in fig.empty_instances.items():
                free_by_profile[profile] = free_by_profile.get(profile, 0) + n
                here[profile] = here.get(profile, 0) + n
            for profile, n in fig.relayout_counts.items():
                relayout[profile] = relayout.get(profile, 0) + n
            instances: list[JsonDict] = []
            for inst in gpu.instances:
                since = self.idle_since.get(f"{node}/{gpu.gpu_uuid}/{inst.profile}@{inst.start}")
                instances.append({"profile": inst.profile, "start": inst.start, "used": inst.used,
                                  "uuid": inst.uuid, "idle_s": None if since is None else t - since})
            windows.append({
                "node": node, "gpu_index": gpu.gpu_index, "gpu_uuid": gpu.gpu_uuid, "profile_table": table.name,
                "instances": instances, "free_compute_slices": fig.free_compute_slices,
                "free_memory_slices": fig.free_memory_slices, "largest_creatable_profile": fig.largest_creatable,
                "largest_after_relayout": fig.largest_after_relayout,
            })
        return {
            "mig_gpus": len(windows), "mig_free_compute_slices": free_c, "mig_free_memory_slices": free_m,
            "mig_free_instances_by_profile": dict(sorted(free_by_profile.items())),
            "mig_relayout_capacity_by_profile": dict(sorted(relayout.items())),
            "mig_free_by_node": {n: dict(sorted(p.items())) for n, p in by_node.items() if p},
            "mig_pending_by_profile": dict(sorted(demand.items())), "mig_layouts": windows,
        }

    # ------------------------------------------------------------------ mig_fragmentation

    def _assess(self, gpus: list[tuple[str, MigGpuLayout]], profile: str, count: int) -> _Assessment:
        """Where ``count`` instances of ``profile`` could come from: empty ones now, re-layouts per
        node, and the free slices summed over the fleet's GPUs of a table that has the profile."""
        empty_by_node: dict[str, int] = {}
        relayout_by_node: dict[str, int] = {}
        candidates: list[JsonDict] = []
        free_c = free_m = 0
        need_c = need_m = 0
        for node, gpu in gpus:
            table = _table(gpu)
            wanted = table.profile(profile) if table else None
            if table is None or wanted is None:
                continue
            need_c, need_m = wanted.compute_slices * count, wanted.memory_slices * count
            instances = _instances(gpu)
            empty_by_node[node] = empty_by_node.get(node, 0) + sum(
                1 for i in instances if not i.used and i.profile == profile)
            c, m = free_slices(table, instances)
            free_c, free_m = free_c + c, free_m + m
            starts = relayout_starts(table, instances, profile)
            if starts:
                fits = max_count(table, [i for i in instances if i.used], profile)
                relayout_by_node[node] = relayout_by_node.get(node, 0) + fits
                span = set(range(starts[0], starts[0] + wanted.memory_slices))
                destroy = [f"{i.profile}@{i.start}" for i in instances if not i.used
                           and span & set(range(i.start, i.start + (table.profile(i.profile) or wanted).memory_slices))]
                candidates.append({"node": node, "gpu_index": gpu.gpu_index, "gpu_uuid": gpu.gpu_uuid,
                                   "start": starts[0], "destroy": destroy, "free_compute_slices": c,
                                   "free_memory_slices": m})
        return _Assessment(hostable=any(n >= count for n in empty_by_node.values()),
                           relayout_node=any(n >= count for n in relayout_by_node.values()),
                           fleet=need_c > 0 and free_c >= need_c and free_m >= need_m,
                           figures={"relayout_candidates": candidates[:_MAX_CANDIDATES],
                                    "free_compute_slices": free_c, "free_memory_slices": free_m,
                                    "need_compute_slices": need_c, "need_memory_slices": need_m})

    def _rule(self, t: float, gpus: list[tuple[str, MigGpuLayout]], pending: Sequence[ClusterPod],
              th: Thresholds, table: rules.RuleTable, why_not_pending: Callable[[str], str]) -> list[Alert]:
        out: list[Alert] = []
        waiting: set[str] = set()
        for pod in pending:
            want = _mig_request(pod.requests)
            if want is None:
                continue
            profile, count = want
            waiting.add(pod.uid)
            found = self._assess(gpus, profile, count)
            context = rules.MigWaiting(pod, profile, count, found.hostable, found.relayout_node, found.fleet,
                                       found.figures)
            out += rules.step(rules.MIG_FRAGMENTATION, table, pod.uid, context, t, th)
        return out + rules.sweep(table, waiting, t, why_not_pending)

    # ------------------------------------------------------------------ checkpoint

    def to_dict(self) -> JsonDict:
        return {"layouts": self._layout_docs, "idle_since": self.idle_since, "snapshot": self.snapshot}

    @classmethod
    def from_dict(cls, value: JsonValue) -> MigTracker:
        tracker = cls()
        data = optional_object(value)
        if data:
            for node, docs in as_object(data.get("layouts", {})).items():
                tracker._layout_docs[node] = [dict(as_object(doc)) for doc in as_array(docs)]
                tracker.layouts[node] = [MigGpuLayout.model_validate(doc) for doc in tracker._layout_docs[node]]
            tracker.idle_since = float_map(data.get("idle_since", {}))
            snapshot = optional_object(data.get("snapshot"))
            tracker.snapshot = None if snapshot is None else dict(snapshot)
        return tracker
