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


def _assigned_pods(reading: GpuReading, uid_by_name: dict[tuple[str, str], str]) -> dict[str, tuple[str, str]]:
    """The pods ``reading`` is assigned to: uid -> (namespace, name), the first of each uid."""
    pods: dict[str, tuple[str, str]] = {}
    for ref in reading.assigned_to:
        uid = ref.pod_uid or uid_by_name.get((ref.namespace, ref.pod))
        if uid is None:
            uid = f"{ref.namespace}/{ref.pod}"  # unknown pod: keep its time under its name
        pods.setdefault(uid, (ref.namespace, ref.pod))
    return pods


def _processes_by_pod(reading: GpuReading, pods: dict[str, tuple[str, str]],
                      uid_by_name: dict[tuple[str, str], str]) -> dict[str, list[GpuProcess]]:
    """The processes of ``reading`` under the assigned pod that owns each (others are left out)."""
    by_pod: dict[str, list[GpuProcess]] = {uid: [] for uid in pods}
    for proc in reading.processes:
        owner = proc.pod_uid
        if owner is None and proc.pod_namespace and proc.pod_name:
            owner = uid_by_name.get((proc.pod_namespace, proc.pod_name))
        if owner in by_pod:
            by_pod[owner].append(proc)
    return by_pod


@dataclass(slots=True)
class _Device:
    """What the shares of one reading are taken from: the device's figures and its processes'."""

    pods: int
    util_pct: float | None
    mem_used_bytes: int | None
    known_sm: bool
    """Some process of an assigned pod has an SM figure."""
    known_mem: bool
    """Some process of an assigned pod has a memory figure."""
    total_sm: float
    total_mem: int

    def share(self, pod_sm: float, pod_mem: int) -> tuple[float, bool]:
        """The pod's fraction of the device (by SM, else by memory, else an even split) and
        whether it is an estimate (the even split)."""
        if self.known_sm and self.total_sm > 0:
            return pod_sm / self.total_sm, False
        if self.known_mem and self.total_mem > 0:
            return pod_mem / self.total_mem, False
        return 1.0 / self.pods, True

    def util(self, procs: list[GpuProcess], pod_sm: float, share: float) -> float | None:
        """The pod's utilisation %: its processes' SM, else its share of the device's."""
        if any(p.sm_util_pct is not None for p in procs) or (self.known_sm and not procs):
            return min(100.0, pod_sm)
        if not procs and self.util_pct is not None:
            return 0.0 if self.known_mem or self.known_sm else self.util_pct * share
        return self.util_pct * share if self.util_pct is not None else None

    def mem(self, pod_mem: int, share: float) -> int | None:
        """The pod's memory: its processes', else its share of the device's."""
        if self.known_mem:
            return pod_mem
        if self.mem_used_bytes is not None:
            return int(self.mem_used_bytes * share)
        return None


def attribute(reading: GpuReading, uid_by_name: dict[tuple[str, str], str]) -> list[Share]:
    """Shares of ``reading`` per assigned pod, in a deterministic order (by pod uid)."""
    assigned = reading.assigned_to
    if not assigned:
        return []
    if len(assigned) == 1:  # a device of one pod (nearly every one): its share without the tables below
        ref = assigned[0]
        uid = ref.pod_uid or uid_by_name.get((ref.namespace, ref.pod))
        if uid is None:
            uid = f"{ref.namespace}/{ref.pod}"
        return [Share(uid, ref.namespace, ref.pod, 1.0, False, _device_util(reading), reading.mem_used_bytes,
                      len(reading.processes))]
    pods = _assigned_pods(reading, uid_by_name)
    if not pods:
        return []
    device_util = _device_util(reading)
    if len(pods) == 1:
        uid, (namespace, name) = next(iter(pods.items()))
        return [Share(uid, namespace, name, 1.0, False, device_util, reading.mem_used_bytes,
                      len(reading.processes))]

    by_pod = _processes_by_pod(reading, pods, uid_by_name)
    known_sm = [p.sm_util_pct for procs in by_pod.values() for p in procs if p.sm_util_pct is not None]
    known_mem = [p.mem_used_bytes for procs in by_pod.values() for p in procs if p.mem_used_bytes is not None]
    device = _Device(pods=len(pods), util_pct=device_util, mem_used_bytes=reading.mem_used_bytes,
                     known_sm=bool(known_sm), known_mem=bool(known_mem), total_sm=sum(known_sm),
                     total_mem=sum(known_mem))
    shares: list[Share] = []
    for uid in sorted(pods):
        namespace, name = pods[uid]
        procs = by_pod[uid]
        pod_sm = sum(p.sm_util_pct for p in procs if p.sm_util_pct is not None)
        pod_mem = sum(p.mem_used_bytes for p in procs if p.mem_used_bytes is not None)
        share, estimated = device.share(pod_sm, pod_mem)
        shares.append(Share(uid, namespace, name, share, estimated, device.util(procs, pod_sm, share),
                            device.mem(pod_mem, share), len(procs)))
    return shares
