"""Who a GPU's time belongs to, from one sample reading.

Rules (DESIGN.md): a GPU belongs to the pod(s) the kubelet assigned it to (``assigned_to``). On a
shared GPU (time-slicing, MPS) each pod's share comes from its own processes' SM utilisation, else
their memory, else an even split flagged ``estimated``. A MIG device is a unit of its own; its
parent GPU is not an allocation unit. A value NVML did not give stays ``None`` (missing data is
not zero), except that a device with no process and no memory in use is certainly idle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schemas.messages import GpuProcess, GpuReading

_MIG_SLICES = re.compile(r"^(\d+)g\.")
MIG_MAX_SLICES = 7


@dataclass(slots=True)
class Share:
    """One pod's share of one device at one sample. Not frozen: a frozen dataclass sets each field
    through ``object.__setattr__`` and takes four times as long to make, and a worker makes one per
    GPU per sample (like :class:`stream_jobs.rules.PodGpu`); nothing changes a share once made."""

    pod_uid: str
    namespace: str
    pod: str
    share: float
    """Fraction of the device attributed to this pod (1.0 when it holds it alone)."""
    estimated: bool
    util_pct: float | None
    """This pod's SM utilisation of the device; None when NVML gave nothing usable."""
    mem_bytes: int | None
    processes: int


def unit_fraction(reading: GpuReading) -> float:
    """How much of a physical GPU one unit is: 1, or ``g/7`` for a MIG ``<g>g.<mem>`` profile."""
    if reading.mig_parent_uuid is None:
        return 1.0
    match = _MIG_SLICES.match(reading.mig_profile or "")
    if not match:
        return 1.0 / MIG_MAX_SLICES
    return min(1.0, int(match.group(1)) / MIG_MAX_SLICES)


def _device_util(reading: GpuReading) -> float | None:
    if reading.gpu_util_pct is not None:
        return reading.gpu_util_pct
    if not reading.processes and not reading.mem_used_bytes and reading.health == "ok":
        return 0.0  # nothing runs and nothing is held: idle, whatever NVML cannot measure
    return None


def attribute(reading: GpuReading, uid_by_name: dict[tuple[str, str], str]) -> list[Share]:
    """Shares of ``reading`` per assigned pod, in a deterministic order (by pod uid)."""
    pods: dict[str, tuple[str, str]] = {}
    for ref in reading.assigned_to:
        uid = ref.pod_uid or uid_by_name.get((ref.namespace, ref.pod))
        if uid is None:
            uid = f"{ref.namespace}/{ref.pod}"  # unknown pod: keep its time under its name
        pods.setdefault(uid, (ref.namespace, ref.pod))
    if not pods:
        return []
    device_util = _device_util(reading)
    if len(pods) == 1:
        uid, (namespace, name) = next(iter(pods.items()))
        return [Share(uid, namespace, name, 1.0, False, device_util, reading.mem_used_bytes,
                      len(reading.processes))]

    by_pod: dict[str, list[GpuProcess]] = {uid: [] for uid in pods}
    for proc in reading.processes:
        owner = proc.pod_uid
        if owner is None and proc.pod_namespace and proc.pod_name:
            owner = uid_by_name.get((proc.pod_namespace, proc.pod_name))
        if owner in by_pod:
            by_pod[owner].append(proc)
    known_sm = [p.sm_util_pct for procs in by_pod.values() for p in procs if p.sm_util_pct is not None]
    known_mem = [p.mem_used_bytes for procs in by_pod.values() for p in procs if p.mem_used_bytes is not None]
    total_sm = sum(known_sm)
    total_mem = sum(known_mem)
    n = len(pods)
    shares: list[Share] = []
    for uid in sorted(pods):
        namespace, name = pods[uid]
        procs = by_pod[uid]
        pod_sm = sum(p.sm_util_pct for p in procs if p.sm_util_pct is not None)
        pod_mem = sum(p.mem_used_bytes for p in procs if p.mem_used_bytes is not None)
        has_sm = any(p.sm_util_pct is not None for p in procs)
        estimated = False
        if known_sm and total_sm > 0:
            share = pod_sm / total_sm
        elif known_mem and total_mem > 0:
            share = pod_mem / total_mem
        else:
            share, estimated = 1.0 / n, True
        if has_sm or (known_sm and not procs):
            util: float | None = min(100.0, pod_sm)
        elif not procs and device_util is not None:
            util = 0.0 if known_mem or known_sm else device_util * share
        else:
            util = device_util * share if device_util is not None else None
        if known_mem:
            mem: int | None = pod_mem
        elif reading.mem_used_bytes is not None:
            mem = int(reading.mem_used_bytes * share)
        else:
            mem = None
        shares.append(Share(uid, namespace, name, share, estimated, util, mem, len(procs)))
    return shares
