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
from typing import Any

from schemas.messages import GpuReading, NodeState
from schemas.outputs import Alert, SharedGpuState, SharedPodVram
from stream_jobs import rules
from stream_jobs.config import Thresholds
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


def _grew_most(below: Mapping[str, int], mems: Mapping[str, int]) -> list[str | int] | None:
    """Who pushed the GPU over: ``[uid, growth]`` of the tenant that grew most since the last sample
    below the threshold (None when none grew)."""
    grown = [(mem - below.get(uid, 0), uid) for uid, mem in mems.items() if mem > below.get(uid, 0)]
    if not grown:
        return None
    growth, uid = max(grown)
    return [uid, growth]


def _noisy_and_neighbours(noisy: list[str | int] | None, tenants: Sequence[Tenant], pods: Sequence[SharedPodVram]
                          ) -> tuple[tuple[str, str, int | None, int] | None, tuple[dict[str, Any], ...]]:
    """The noisy tenant as ``SharedGpuPressure.noisy`` has it, and the other tenants (JSON form)."""
    named = None
    if noisy is not None:
        uid, growth = noisy
        _, ns, name, mem = next(t for t in tenants if t[0] == uid)
        named = (ns, name, mem, int(growth))
    neighbours = tuple(p.model_dump(mode="json") for (uid, *_), p in zip(tenants, pods, strict=True)
                       if noisy is None or uid != noisy[0])
    return named, neighbours


class NoisyNeighbours:
    """The node stage's view of its shared GPUs."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.gpus: dict[str, dict[str, Any]] = (data or {}).get("gpus", {})

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus}

    def observe(self, ts: float, node: str, reading: GpuReading, tenants: list[Tenant],
                th: Thresholds, table: rules.RuleTable) -> tuple[SharedGpuState | None, list[Alert]]:
        """One shared GPU's reading with its tenants ``(uid, namespace, name, mem_bytes)``; the
        ``noisy_neighbour`` timers and open alerts are in ``table`` (the stage's), keyed by GPU."""
        g = self.gpus.setdefault(reading.uuid, {"peak": {}, "below": None, "noisy": None})
        present = {uid for uid, *_ in tenants}
        g["peak"] = _peaks(g["peak"], tenants)
        total, used = reading.mem_total_bytes, reading.mem_used_bytes
        pods = [SharedPodVram(namespace=ns, name=name, mem_bytes=mem, peak_bytes=g["peak"].get(uid))
                for uid, ns, name, mem in tenants]
        state = SharedGpuState(gpu_uuid=reading.uuid, gpu_index=reading.index, model=reading.model,
                               mem_total_bytes=total, mem_used_bytes=used, pods=pods) if total else None
        out: list[Alert] = []
        if g["noisy"] is not None and g["noisy"][0] not in present:
            out += rules.close(table, reading.uuid, ts, "the pod left the GPU")
            g["noisy"] = None
        pct = used / total * 100.0 if total and used is not None else None
        over = None if pct is None else pct >= th.vram_pressure_pct - 1e-6 and len(tenants) >= 2
        mems = {uid: mem for uid, _ns, _name, mem in tenants if mem is not None}
        if over is False:
            g["below"], g["noisy"] = mems, None
        elif over and g["noisy"] is None and g["below"] is not None:
            g["noisy"] = _grew_most(g["below"], mems)
        noisy, neighbours = _noisy_and_neighbours(g["noisy"], tenants, pods)
        context = rules.SharedGpuPressure(node, reading, pct, over, noisy, neighbours, th)
        out += rules.step(rules.NOISY_NEIGHBOUR, table, reading.uuid, context, ts, th)
        return state, out

    def forget(self, present: set[str], table: rules.RuleTable) -> None:
        """Drop GPUs not in the latest sample (one with an open alert stays until it is seen again)."""
        for uuid in [u for u in self.gpus if u not in present and u not in table]:
            del self.gpus[uuid]


FreeGpu = tuple[str, dict[str, Any], int]
"""A shared GPU with its free VRAM: ``(node, SharedGpuState JSON form, free bytes)``."""


def _figures(free: Sequence[FreeGpu], usable: Sequence[FreeGpu], needs: Sequence[ClusterPod]) -> dict[str, Any]:
    """The fleet's shared-VRAM figures (``ClusterCapacity.fragmentation``): free, largest free, stranded
    (free VRAM on schedulable GPUs below the smallest pending need), pending and each GPU's layout."""
    smallest = min((p.vram_need_bytes or 0 for p in needs), default=None)
    return {
        "shared_gpus": len(free),
        "shared_vram_free_bytes": sum(f for *_, f in free),
        "shared_vram_largest_free_bytes": max((f for *_, f in free), default=0),
        "shared_vram_stranded_bytes": 0 if smallest is None else sum(f for *_, f in usable if f < smallest),
        "shared_vram_pending_bytes": sum(p.vram_need_bytes or 0 for p in needs),
        "shared_gpu_layouts": [{"node": node, "gpu_index": g["gpu_index"], "gpu_uuid": g["gpu_uuid"],
                                "mem_total_bytes": g["mem_total_bytes"], "mem_used_bytes": g["mem_used_bytes"],
                                "free_bytes": f, "pods": g["pods"]} for node, g, f in free],
    }


class VramTracker:
    """The cluster stage's view of the shared GPUs: figures and ``vram_fragmentation``."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        data = data or {}
        self.gpus: dict[str, list[dict[str, Any]]] = data.get("gpus", {})
        self.snapshot: dict[str, Any] | None = data.get("snapshot")

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "snapshot": self.snapshot}

    def on_summary(self, node: str, shared: list[SharedGpuState] | None) -> None:
        if shared:
            self.gpus[node] = [g.model_dump(mode="json") for g in shared]
        else:
            self.gpus.pop(node, None)

    def evaluate(self, t: float, live: set[str], schedulable: set[str], pending: Sequence[ClusterPod],
                 th: Thresholds, table: rules.RuleTable, why_not_pending: Callable[[str], str]) -> list[Alert]:
        """Figures at ``t`` (kept in :attr:`snapshot`) and ``vram_fragmentation``'s transitions (its
        timers and open alerts in ``table``, the stage's)."""
        needs = [p for p in pending if p.vram_need_bytes]
        gpus = [(node, g) for node in sorted(self.gpus) if node in live for g in self.gpus[node]]
        if not gpus and not needs:
            self.snapshot = None
            return rules.sweep(table, (), t, why_not_pending)
        free = [(node, g, max(g["mem_total_bytes"] - (g["mem_used_bytes"] or 0), 0)) for node, g in gpus]
        usable = [(node, g, f) for node, g, f in free if node in schedulable]
        self.snapshot = _figures(free, usable, needs)
        ranked = sorted(usable, key=lambda item: (-item[2], item[0], item[1]["gpu_index"]))[:_MAX_LISTED]
        listed = tuple({"node": node, "gpu_index": g["gpu_index"], "gpu_uuid": g["gpu_uuid"], "free_bytes": f,
                        "pods": g["pods"]} for node, g, f in ranked)
        total_free = sum(f for *_, f in usable)
        largest = max((f for *_, f in usable), default=0)
        out: list[Alert] = []
        for pod in needs:
            context = rules.VramWaiting(pod, pod.vram_need_bytes or 0, total_free, largest, listed, len(usable))
            out += rules.step(rules.VRAM_FRAGMENTATION, table, pod.uid, context, t, th)
        return out + rules.sweep(table, {p.uid for p in needs}, t, why_not_pending)
