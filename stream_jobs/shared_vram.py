"""VRAM on shared GPUs (time-slicing, MPS): free memory per GPU, its tenants, and two alerts.

Time-slicing and MPS share a GPU's memory without isolation, and Kubernetes has no memory
resource for a GPU. So memory can fragment across shared GPUs (40 GiB free over four GPUs, none
with the 20 GiB a new pod needs) and a tenant can be starved by a neighbour growing.

- Node stage (:class:`NoisyNeighbours`): per shared GPU and sample, its free VRAM and the pods on
  it with their memory now and their peak there (:class:`SharedGpuState`, sent to the cluster
  stage in ``NodeSummary.shared``); and ``noisy_neighbour``: the GPU's memory reaches
  ``vram_pressure_pct`` and one of its pods grew since the last sample below it (the one that grew
  the most is named), held for ``vram_pressure_after``.
- Cluster stage (:class:`VramTracker`): fleet figures (free, largest free, stranded VRAM) and
  ``vram_fragmentation``: a pending pod's memory need (``PodState.vram_request_bytes``) fits the
  free VRAM of the schedulable shared GPUs in total but no single one, for
  ``vram_fragmentation_after``.

A GPU is shared when its node advertises more ``nvidia.com/gpu`` units than it has GPUs
(time-slicing replicas) or the agent saw more than one pod on it (``GpuReading.shared``). Nothing
here happens on a fleet without shared GPUs. The two rules are declared in :mod:`stream_jobs.rules`
(``NOISY_NEIGHBOUR``, keyed by GPU, and ``VRAM_FRAGMENTATION``); this builds their contexts and
keeps what they need between samples (peaks, the last memory below the threshold, who grew).
State is plain JSON-serialisable data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from schemas.messages import GpuReading, NodeState
from schemas.outputs import Alert, SharedGpuState, SharedPodVram
from stream_jobs import rules
from stream_jobs.config import Thresholds
from stream_jobs.json_types import (
    JsonDict,
    JsonObject,
    JsonValue,
    as_array,
    as_int,
    as_object,
    as_str,
    int_map,
    optional_object,
    record_map,
)
from stream_jobs.state import ClusterPod

GIB = 2**30
_MAX_LISTED = 20


def replicas_per_gpu(state: NodeState) -> float:
    """``nvidia.com/gpu`` (or ``.shared``) units advertised per physical GPU (1 when unknown)."""
    units = max((n for res, n in state.gpu_allocatable.items() if res in ("nvidia.com/gpu", "nvidia.com/gpu.shared")),
                default=0)
    gpus = state.gpu_count_label
    return units / gpus if gpus else 1.0


Tenant = tuple[str, str, str, int | None]
"""A pod on a shared GPU: ``(uid, namespace, name, its memory on the GPU in bytes or None)``."""


def _peaks(peaks: dict[str, int], tenants: Sequence[Tenant]) -> dict[str, int]:
    """Each present tenant's peak memory on the GPU, with this reading."""
    present = {uid for uid, *_ in tenants}
    out = {uid: p for uid, p in peaks.items() if uid in present}
    for uid, _ns, _name, mem in tenants:
        if mem is not None:
            out[uid] = max(out.get(uid, 0), mem)
    return out


def _grew_most(below: Mapping[str, int], mems: Mapping[str, int]) -> tuple[str, int] | None:
    """Who pushed the GPU over: ``(uid, growth)`` of the tenant that grew most since the last sample
    below the threshold (None when none grew)."""
    grown = [(mem - below.get(uid, 0), uid) for uid, mem in mems.items() if mem > below.get(uid, 0)]
    if not grown:
        return None
    growth, uid = max(grown)
    return uid, growth


def _noisy_and_neighbours(noisy: tuple[str, int] | None, tenants: Sequence[Tenant], pods: Sequence[SharedPodVram]
                          ) -> tuple[tuple[str, str, int | None, int] | None, tuple[JsonDict, ...]]:
    """The noisy tenant as ``SharedGpuPressure.noisy`` has it, and the other tenants (JSON form)."""
    named = None
    if noisy is not None:
        uid, growth = noisy
        _, ns, name, mem = next(t for t in tenants if t[0] == uid)
        named = (ns, name, mem, growth)
    neighbours = tuple(p.model_dump(mode="json") for (uid, *_), p in zip(tenants, pods, strict=True)
                       if noisy is None or uid != noisy[0])
    return named, neighbours


@dataclass
class SharedGpuTrack:
    """What the node stage keeps of one shared GPU between samples (JSON form: its fields, ``noisy``
    as ``[uid, growth]``)."""

    peak: dict[str, int] = field(default_factory=dict)
    """Each present tenant's peak memory on the GPU (bytes) by pod uid."""
    below: dict[str, int] | None = None
    """Each tenant's memory at the last sample below ``vram_pressure_pct`` (None: none seen yet)."""
    noisy: tuple[str, int] | None = None
    """``(uid, growth in bytes)`` of the tenant that pushed the GPU over, while it stays over."""

    def to_dict(self) -> JsonDict:
        return {"peak": self.peak, "below": self.below, "noisy": None if self.noisy is None else list(self.noisy)}

    @classmethod
    def from_dict(cls, data: JsonObject) -> SharedGpuTrack:
        below, noisy = data["below"], data["noisy"]
        if noisy is not None:
            uid, growth = as_array(noisy)
        return cls(peak=int_map(data["peak"]), below=None if below is None else int_map(below),
                   noisy=None if noisy is None else (as_str(uid), as_int(growth)))


class NoisyNeighbours:
    """The node stage's view of its shared GPUs."""

    def __init__(self, data: JsonValue = None) -> None:
        state = optional_object(data) or {}
        self.gpus: dict[str, SharedGpuTrack] = record_map(state.get("gpus", {}), SharedGpuTrack.from_dict)

    def to_dict(self) -> JsonDict:
        return {"gpus": {uuid: track.to_dict() for uuid, track in self.gpus.items()}}

    def observe(self, ts: float, node: str, reading: GpuReading, tenants: list[Tenant],
                th: Thresholds, table: rules.RuleTable) -> tuple[SharedGpuState | None, list[Alert]]:
        """One shared GPU's reading with its tenants ``(uid, namespace, name, mem_bytes)``; the
        ``noisy_neighbour`` timers and open alerts are in ``table`` (the stage's), keyed by GPU."""
        g = self.gpus.setdefault(reading.uuid, SharedGpuTrack())
        present = {uid for uid, *_ in tenants}
        g.peak = _peaks(g.peak, tenants)
        total, used = reading.mem_total_bytes, reading.mem_used_bytes
        pods = [SharedPodVram(namespace=ns, name=name, mem_bytes=mem, peak_bytes=g.peak.get(uid))
                for uid, ns, name, mem in tenants]
        state = SharedGpuState(gpu_uuid=reading.uuid, gpu_index=reading.index, model=reading.model,
                               mem_total_bytes=total, mem_used_bytes=used, pods=pods) if total else None
        out: list[Alert] = []
        if g.noisy is not None and g.noisy[0] not in present:
            out += rules.close(table, reading.uuid, ts, "the pod left the GPU")
            g.noisy = None
        pct = used / total * 100.0 if total and used is not None else None
        over = None if pct is None else pct >= th.vram_pressure_pct - 1e-6 and len(tenants) >= 2
        mems = {uid: mem for uid, _ns, _name, mem in tenants if mem is not None}
        if over is False:
            g.below, g.noisy = mems, None
        elif over and g.noisy is None and g.below is not None:
            g.noisy = _grew_most(g.below, mems)
        noisy, neighbours = _noisy_and_neighbours(g.noisy, tenants, pods)
        context = rules.SharedGpuPressure(node, reading, pct, over, noisy, neighbours, th)
        out += rules.step(rules.NOISY_NEIGHBOUR, table, reading.uuid, context, ts, th)
        return state, out

    def forget(self, present: set[str], table: rules.RuleTable) -> None:
        """Drop GPUs not in the latest sample (one with an open alert stays until it is seen again)."""
        for uuid in [u for u in self.gpus if u not in present and u not in table]:
            del self.gpus[uuid]


@dataclass(frozen=True)
class FreeGpu:
    """A shared GPU with its free VRAM."""

    node: str
    gpu: SharedGpuState
    pods: JsonValue
    """Its tenants' JSON form (for the figures and the details)."""
    free_bytes: int


def _figures(free: Sequence[FreeGpu], usable: Sequence[FreeGpu], needs: Sequence[ClusterPod]) -> JsonDict:
    """The fleet's shared-VRAM figures (``ClusterCapacity.fragmentation``): free, largest free, stranded
    (free VRAM on schedulable GPUs below the smallest pending need), pending and each GPU's layout."""
    smallest = min((p.vram_need_bytes or 0 for p in needs), default=None)
    return {
        "shared_gpus": len(free),
        "shared_vram_free_bytes": sum(f.free_bytes for f in free),
        "shared_vram_largest_free_bytes": max((f.free_bytes for f in free), default=0),
        "shared_vram_stranded_bytes": 0 if smallest is None else sum(f.free_bytes for f in usable
                                                                     if f.free_bytes < smallest),
        "shared_vram_pending_bytes": sum(p.vram_need_bytes or 0 for p in needs),
        "shared_gpu_layouts": [{"node": f.node, "gpu_index": f.gpu.gpu_index, "gpu_uuid": f.gpu.gpu_uuid,
                                "mem_total_bytes": f.gpu.mem_total_bytes, "mem_used_bytes": f.gpu.mem_used_bytes,
                                "free_bytes": f.free_bytes, "pods": f.pods} for f in free],
    }


class VramTracker:
    """The cluster stage's view of the shared GPUs: figures and ``vram_fragmentation``."""

    def __init__(self, data: JsonValue = None) -> None:
        state = optional_object(data) or {}
        self._gpu_docs: dict[str, list[JsonDict]] = {
            node: [dict(as_object(doc)) for doc in as_array(docs)]
            for node, docs in as_object(state.get("gpus", {})).items()}
        """The shared GPUs' JSON form (checkpoints), written once per summary."""
        self.gpus: dict[str, list[SharedGpuState]] = {
            node: [SharedGpuState.model_validate(doc) for doc in docs] for node, docs in self._gpu_docs.items()}
        snapshot = optional_object(state.get("snapshot"))
        self.snapshot: JsonDict | None = None if snapshot is None else dict(snapshot)

    def to_dict(self) -> JsonDict:
        return {"gpus": self._gpu_docs, "snapshot": self.snapshot}

    def on_summary(self, node: str, shared: list[SharedGpuState] | None) -> None:
        if shared:
            self.gpus[node] = list(shared)
            self._gpu_docs[node] = [g.model_dump(mode="json") for g in shared]
        else:
            self.gpus.pop(node, None)
            self._gpu_docs.pop(node, None)

    def evaluate(self, t: float, live: set[str], schedulable: set[str], pending: Sequence[ClusterPod],
                 th: Thresholds, table: rules.RuleTable, why_not_pending: Callable[[str], str]) -> list[Alert]:
        """Figures at ``t`` (kept in :attr:`snapshot`) and ``vram_fragmentation``'s transitions (its
        timers and open alerts in ``table``, the stage's)."""
        needs = [p for p in pending if p.vram_need_bytes]
        gpus = [(node, g, doc["pods"]) for node in sorted(self.gpus) if node in live
                for g, doc in zip(self.gpus[node], self._gpu_docs[node], strict=True)]
        if not gpus and not needs:
            self.snapshot = None
            return rules.sweep(table, (), t, why_not_pending)
        free = [FreeGpu(node, g, pods, max(g.mem_total_bytes - (g.mem_used_bytes or 0), 0)) for node, g, pods in gpus]
        usable = [f for f in free if f.node in schedulable]
        self.snapshot = _figures(free, usable, needs)
        ranked = sorted(usable, key=lambda f: (-f.free_bytes, f.node, f.gpu.gpu_index))[:_MAX_LISTED]
        listed: tuple[JsonObject, ...] = tuple(
            {"node": f.node, "gpu_index": f.gpu.gpu_index, "gpu_uuid": f.gpu.gpu_uuid, "free_bytes": f.free_bytes,
             "pods": f.pods} for f in ranked)
        total_free = sum(f.free_bytes for f in usable)
        largest = max((f.free_bytes for f in usable), default=0)
        out: list[Alert] = []
        for pod in needs:
            context = rules.VramWaiting(pod, pod.vram_need_bytes or 0, total_free, largest, listed, len(usable))
            out += rules.step(rules.VRAM_FRAGMENTATION, table, pod.uid, context, t, th)
        return out + rules.sweep(table, {p.uid for p in needs}, t, why_not_pending)
