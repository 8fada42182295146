"""Right-sizing and packing, pure: what a pod needs (its observed peaks plus headroom), the MIG
profile it would fit, and first-fit-decreasing packing of the pods' GPU fractions onto whole GPUs.
:mod:`reports.advise` reads the evidence and turns these figures into advice."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from common.settings import AdviseThresholds
from reports.reader import Rows

GIB = 1024**3
EPS = 1e-9


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute_slices: int
    memory_slices: int
    compute_of: int
    memory_of: int

    @property
    def gpu_fraction(self) -> float:
        """The share of the GPU the profile takes when packed: the larger of its compute and memory shares."""
        return max(self.compute_slices / self.compute_of, self.memory_slices / self.memory_of)

    def memory_bytes(self, gpu_memory_bytes: float) -> float:
        return gpu_memory_bytes * self.memory_slices / self.memory_of


_MIG_7 = ((1, 1), (1, 2), (2, 2), (3, 4), (4, 4), (7, 8))
"""(compute slices of 7, memory slices of 8) of the A100/H100/H200/B200 family's MIG profiles."""
_MIG_4 = ((1, 1), (2, 2), (4, 4))
"""(compute slices of 4, memory slices of 4) of the A30's MIG profiles."""

MIG_FAMILIES: tuple[tuple[str, tuple[tuple[int, int], ...], int, int], ...] = (
    ("A30", _MIG_4, 4, 4),
    ("A100", _MIG_7, 7, 8), ("A800", _MIG_7, 7, 8), ("H100", _MIG_7, 7, 8), ("H800", _MIG_7, 7, 8),
    ("H200", _MIG_7, 7, 8), ("H20", _MIG_7, 7, 8), ("GB200", _MIG_7, 7, 8), ("B200", _MIG_7, 7, 8),
)
"""Model-name substring -> MIG profile shapes (compute slices, memory slices, of how many); first match wins."""


def mig_table(model: str, gpu_memory_bytes: float) -> list[MigProfile]:
    """The MIG profiles of a GPU model, smallest first, named like NVIDIA's (``1g.10gb`` on an 80 GB GPU:
    1 compute slice, one eighth of the memory); empty for models without MIG."""
    for family, shapes, compute_of, memory_of in MIG_FAMILIES:
        if family in model:
            gb = gpu_memory_bytes / GIB
            return [MigProfile(f"{c}g.{math.floor(gb * m / memory_of + 0.5)}gb", c, m, compute_of, memory_of)
                    for c, m in shapes]
    return []


@dataclass
class Demand:
    """What one pod needs per time bucket: whole GPUs, or a fraction of one GPU."""

    whole_gpus: int = 0
    fraction: float = 0.0


@dataclass
class PodEvidence:
    pod_uid: str
    namespace: str
    pod: str
    team: str
    project: str
    node: str
    pool: str
    gpu_model: str
    owner: str
    gang: str
    gpus: int
    share: float
    gpu_memory_bytes: float | None
    usd_per_gpu_hour: float
    active_s: float = 0.0
    active_windows: int = 0
    gpu_uuids: list[str] = field(default_factory=list)
    """The pod's GPUs (device UUIDs), in the order of the per-GPU lists below: by GPU index, then UUID."""
    gpu_indexes: list[int | None] = field(default_factory=list)
    """Per GPU: its index on the node (NVML's), None when no sample of it names one."""
    sm_pct: list[float | None] = field(default_factory=list)
    """Per GPU: the percentile of the per-window SM peaks over the pod's active windows (None: no reading)."""
    peak_sm_pct: float | None = None
    peak_mem_bytes: list[int] = field(default_factory=list)
    """Per GPU: the peak VRAM over the pod's active windows."""
    pct_mem_bytes: float = 0.0
    last_busy: str | None = None


def iso_utc(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class RightSize:
    demand: Demand
    recommendation: str
    kind: str
    """``fewer_gpus``, ``mig`` or ``time_slice``."""
    confidence: str


def right_size(ev: PodEvidence, cfg: AdviseThresholds) -> RightSize | None:
    """A smaller unit for the pod, or None (too little evidence, a gang member, or nothing smaller fits)."""
    if ev.gang or ev.active_s + EPS < cfg.min_evidence_s:
        return None
    confidence = "high" if ev.active_s >= 4 * cfg.min_evidence_s else "medium"
    headroom = 1 + cfg.headroom_pct / 100
    used = sum(1 for sm, mem in zip(ev.sm_pct, ev.peak_mem_bytes, strict=True)
               if mem > 0 or (sm is not None and sm >= cfg.idle_util_pct))
    if ev.gpus > 1:
        keep = max(used, 1)
        if keep < ev.gpus:
            return RightSize(Demand(whole_gpus=keep), f"{keep} GPU{'s' if keep > 1 else ''} instead of {ev.gpus}",
                             "fewer_gpus", confidence)
        return None
    sm = ev.sm_pct[0]
    if sm is None or ev.gpu_memory_bytes is None:
        return None  # no SM reading (MIG device, no process stats) or unknown memory: no fractional advice
    need_mem = ev.peak_mem_bytes[0] * headroom
    need_sm = min(sm * headroom / 100, 1.0)
    for profile in mig_table(ev.gpu_model, ev.gpu_memory_bytes):
        fits = (profile.memory_bytes(ev.gpu_memory_bytes) + EPS >= need_mem
                and profile.compute_slices / profile.compute_of + EPS >= need_sm)
        if fits and profile.gpu_fraction < ev.share - EPS:
            return RightSize(Demand(fraction=profile.gpu_fraction),
                             f"MIG {profile.name} instead of a whole GPU", "mig", confidence)
        if fits:
            return None
    if mig_table(ev.gpu_model, ev.gpu_memory_bytes):
        return None
    share = math.ceil(max(need_mem / ev.gpu_memory_bytes, need_sm) * 20 - EPS) / 20
    if share < ev.share - EPS:
        return RightSize(Demand(fraction=share),
                         f"a {share:.0%} time-sliced share instead of {ev.share:.0%} of a GPU", "time_slice",
                         confidence)
    return None


def first_fit_decreasing(fractions: list[tuple[float, float, str]]) -> list[tuple[float, float, list[str]]]:
    """Pack (fraction of a GPU, seconds present, pod) items onto GPUs, largest first, each into the first
    GPU with room; returns the GPUs as (fraction used, seconds needed = longest item present, pods)."""
    bins: list[tuple[float, float, list[str]]] = []
    for fraction, present_s, pod in sorted(fractions, key=lambda item: (-item[0], item[2])):
        for i, (used, seconds, pods) in enumerate(bins):
            if used + fraction <= 1 + EPS:
                bins[i] = (used + fraction, max(seconds, present_s), [*pods, pod])
                break
        else:
            bins.append((fraction, present_s, [pod]))
    return bins


def reclaimable_by_pod(pods: dict[str, PodEvidence], per_pod: dict[str, dict[int, dict[str, float]]],
             cfg: AdviseThresholds) -> tuple[Rows, set[tuple[str, int]]]:
    rows: Rows = []
    reclaimed: set[tuple[str, int]] = set()
    step = int(cfg.bucket_s)
    for uid, by_bucket in per_pod.items():
        ev = pods[uid]
        runs: list[list[int]] = []
        for b in sorted(by_bucket):
            if by_bucket[b]["busy_s"] > 0:
                continue
            if runs and runs[-1][-1] + step == b:
                runs[-1].append(b)
            else:
                runs.append([b])
        taken = [b for run in runs if sum(by_bucket[b]["present_s"] for b in run) + EPS >= cfg.idle_stretch_s
                 for b in run]
        if not taken:
            continue
        reclaimed.update((uid, b) for b in taken)
        hours = sum(by_bucket[b]["held_s"] for b in taken) / 3600
        vram = max(by_bucket[b]["peak_mem"] for b in taken)
        rows.append({
            "namespace": ev.namespace, "pod": ev.pod, "owner": ev.owner, "team": ev.team, "node": ev.node,
            "gpus": ev.gpus, "idle_class": "vram_held" if vram > 0 else "no_process", "idle_vram_bytes": vram,
            "idle_since": iso_utc(datetime.fromtimestamp(min(taken), UTC)), "last_busy": ev.last_busy,
            "gpu_hours": hours, "cost_usd": hours * ev.usd_per_gpu_hour,
        })
    rows.sort(key=lambda r: (-r["gpu_hours"], r["namespace"], r["pod"]))
    return rows, reclaimed


def pod_demand(ev: PodEvidence, rs: RightSize | None) -> Demand:
    if rs is not None:
        return rs.demand
    if ev.share < 1 - EPS and ev.gpus == 1:
        return Demand(fraction=ev.share)
    return Demand(whole_gpus=ev.gpus)


def pack_pods(pods: dict[str, PodEvidence], per_pod: dict[str, dict[int, dict[str, float]]],
          reclaimed: set[tuple[str, int]], sized: dict[str, RightSize], cfg: AdviseThresholds,
          ) -> tuple[Rows, Rows, dict[str, float]]:
    freed_by_pod: dict[str, float] = defaultdict(float)
    pools: dict[str, dict[str, Any]] = {}
    held_h = held_usd = 0.0
    items: dict[tuple[str, int], list[tuple[str, float, float, Demand]]] = defaultdict(list)
    for uid, by_bucket in per_pod.items():
        ev = pods[uid]
        demand = pod_demand(ev, sized.get(uid))
        for b, figures in by_bucket.items():
            held_h += figures["held_s"] / 3600
            held_usd += figures["held_s"] / 3600 * ev.usd_per_gpu_hour
            if (uid, b) in reclaimed:
                continue
            items[(ev.pool, b)].append((uid, figures["held_s"], figures["present_s"], demand))
    for (pool, _b), entries in sorted(items.items()):
        acc = pools.setdefault(pool, {"held_s": 0.0, "right_size_s": 0.0, "needed_s": 0.0, "usd": 0.0,
                                      "pods": set(), "packed": set()})
        fractions = []
        for uid, held_s, present_s, demand in entries:
            ev = pods[uid]
            acc["held_s"] += held_s
            acc["pods"].add(uid)
            acc["usd"] = ev.usd_per_gpu_hour
            if demand.whole_gpus:
                freed = held_s * (ev.gpus - demand.whole_gpus) / ev.gpus if demand.whole_gpus < ev.gpus else 0.0
                freed_by_pod[uid] += freed
                acc["right_size_s"] += freed
                acc["needed_s"] += demand.whole_gpus * present_s
            else:
                fractions.append((demand.fraction, present_s, uid))
        for _used, seconds, members in first_fit_decreasing(fractions):
            acc["needed_s"] += seconds
            if len(members) > 1:
                acc["packed"].update(members)
    right_rows: Rows = []
    for uid, rs in sorted(sized.items(), key=lambda kv: (pods[kv[0]].namespace, pods[kv[0]].pod)):
        ev = pods[uid]
        freed = freed_by_pod.get(uid, 0.0) / 3600
        right_rows.append({
            "namespace": ev.namespace, "pod": ev.pod, "owner": ev.owner, "team": ev.team, "node": ev.node,
            "gpu_model": ev.gpu_model, "gpus": ev.gpus, "recommendation": rs.recommendation, "kind": rs.kind,
            "unit_gpus": rs.demand.whole_gpus or rs.demand.fraction,
            "evidence_hours": ev.active_s / 3600, "evidence_windows": ev.active_windows,
            "percentile": cfg.percentile,
            "percentile_sm_pct_per_gpu": [{"gpu_index": i, "gpu_uuid": u, "percentile_sm_pct": sm}
                                          for i, u, sm in zip(ev.gpu_indexes, ev.gpu_uuids, ev.sm_pct, strict=True)],
            "peak_sm_pct": ev.peak_sm_pct,
            "peak_vram_bytes_per_gpu": [{"gpu_index": i, "gpu_uuid": u, "peak_vram_bytes": mem} for i, u, mem
                                        in zip(ev.gpu_indexes, ev.gpu_uuids, ev.peak_mem_bytes, strict=True)],
            "percentile_vram_bytes": ev.pct_mem_bytes,
            "gpu_memory_bytes": ev.gpu_memory_bytes, "confidence": rs.confidence,
            "freed_gpu_hours": freed, "freed_cost_usd": freed * ev.usd_per_gpu_hour,
            "freed_in": "right_size" if rs.demand.whole_gpus else "pack",
        })
    right_rows.sort(key=lambda r: (-r["freed_gpu_hours"], r["namespace"], r["pod"]))
    pack_rows = []
    for pool, acc in sorted(pools.items()):
        freed_h = max(0.0, acc["held_s"] - acc["right_size_s"] - acc["needed_s"]) / 3600
        pack_rows.append({
            "pool": pool, "pods": len(acc["pods"]),
            "held_gpu_hours": acc["held_s"] / 3600, "right_size_gpu_hours": acc["right_size_s"] / 3600,
            "needed_gpu_hours": acc["needed_s"] / 3600, "freed_gpu_hours": freed_h,
            "freed_cost_usd": freed_h * acc["usd"],
            "packed_pods": sorted(f"{pods[u].namespace}/{pods[u].pod}" for u in acc["packed"]),
        })
    pack_rows.sort(key=lambda r: (-r["freed_gpu_hours"], r["pool"]))
    return right_rows, pack_rows, {"held_gpu_hours": held_h, "held_cost_usd": held_usd}
