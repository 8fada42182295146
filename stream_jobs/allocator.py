"""The caching allocator inside each pod, in the node stage: reserved-but-unused VRAM, allocation
retries and OOMs per pod and GPU (``workload.allocator.v1``), and the ``allocator_fragmentation`` rule.

NVML sees what a process reserved; only the process knows how much of it its tensors use. A pod's
report names its devices as the process sees them, so each is mapped to one of the GPUs the
node stage attributes to the pod: by the GPU UUID the process gave (the client sends it when
torch tells it), else by position: device ``n`` is the pod's ``n``-th GPU in NVML index order
(CUDA's order for the devices a container sees under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). A report
for a GPU the stage has not attributed to the pod yet, or for a pod not on this node, is counted
(``allocator_unmapped``) and left out.

``allocator_fragmentation`` (per pod and GPU; declared in :mod:`stream_jobs.rules` as
``ALLOCATOR_FRAGMENTATION``, stepped here), evaluated at each report at ``t``:

- the condition holds while reserved - allocated is at least ``allocator_unused_pct`` % of the GPU's
  memory (its latest sampled ``mem_total_bytes``); ``since`` is the first report of the run;
- *events* are the allocation retries plus OOMs over the last ``allocator_fragmentation_after``:
  the totals now minus those of the earliest report at or after ``t - allocator_fragmentation_after``
  (a total that goes down, a restarted process, starts the count again);
- fires when the condition has held for ``allocator_fragmentation_after`` and events > 0;
  resolves when reserved-but-unused falls below the threshold, when a whole
  ``allocator_fragmentation_after`` passes without an event, or when the pod leaves the node.

Window figures (per pod, GPU and window): reserved and allocated at the window's last report, the
most reserved-but-unused at any report in it, and the retries and OOMs reported in it (growth of
the totals since the previous report; a first report counts its totals). The pod's lifecycle gets
the most reserved-but-unused on one GPU and the retries and OOMs of its life.

State is plain JSON-serialisable data (:meth:`AllocatorTracker.to_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from schemas.messages import AllocatorDevice, GpuReading, WorkloadAllocator
from schemas.outputs import Alert
from stream_jobs import rules
from stream_jobs.config import Thresholds
from stream_jobs.json_types import (
    JsonDict,
    JsonValue,
    as_array,
    as_float,
    as_int,
    as_object,
    float_map,
    int_map,
    optional_int,
    optional_object,
    rebuild,
    record_map,
)
from stream_jobs.timeutil import EPS, window_start


def _key(*parts: str) -> str:
    return "|".join(parts)


@dataclass
class AllocatorWindow:
    """One pod's figures on one GPU in one window (JSON form: its fields, in this order)."""

    ws: float
    """The window's start (epoch seconds)."""
    unused_max: int = 0
    retries: int = 0
    ooms: int = 0
    reserved: int = 0
    """At the window's last report, like ``allocated``."""
    allocated: int = 0


class PodIdentity(NamedTuple):
    """The pod a report is about, as the node stage knows it."""

    uid: str
    namespace: str
    name: str


class AllocatorTracker:
    """One node's allocator figures and rule state; the node stage drives it."""

    def __init__(self, node: str, thresholds: Thresholds, window_s: float) -> None:
        self.node = node
        self.thresholds = thresholds
        self.window_s = window_s
        self.gpus: dict[str, dict[str, list[int | None]]] = {}
        """pod uid -> GPU uuid -> [NVML index, memory total bytes] from the samples."""
        self.last: dict[str, list[int]] = {}
        """pod|gpu -> [retries total, OOMs total] of the previous report."""
        self.windows: dict[str, AllocatorWindow] = {}
        self.marks: dict[str, list[list[float]]] = {}
        """pod|gpu -> [time, retries total, OOMs total] of the reports within the rule's window."""
        self.over_since: dict[str, float] = {}
        """pod|gpu -> first report of the current run at or above the share."""
        self.rules: rules.RuleTable = {}
        """pod|gpu -> the rule's timer and open alert (:data:`stream_jobs.rules.ALLOCATOR_FRAGMENTATION`)."""
        self.life: dict[str, dict[str, int]] = {}
        self.counters: dict[str, int] = {"allocator_reports": 0, "allocator_unmapped": 0}

    # ------------------------------------------------------------------ inputs

    def saw(self, pod_uid: str, reading: GpuReading) -> None:
        """A sample attributed ``reading`` to the pod: remember the GPU, its index and memory."""
        gpus = self.gpus.get(pod_uid)
        if gpus is None:
            gpus = self.gpus[pod_uid] = {}
        known = gpus.get(reading.uuid)
        total = reading.mem_total_bytes if reading.mem_total_bytes is not None else (known[1] if known else None)
        if known is None or known[0] != reading.index or known[1] != total:  # else as it was (every sample)
            gpus[reading.uuid] = [reading.index, total]

    def _gpu_of(self, pod_uid: str, device: AllocatorDevice) -> str | None:
        gpus = self.gpus.get(pod_uid, {})
        if device.gpu_uuid is not None:
            return device.gpu_uuid if device.gpu_uuid in gpus else None
        ordered = sorted(gpus, key=lambda uuid: (gpus[uuid][0] if gpus[uuid][0] is not None else 1 << 30, uuid))
        return ordered[device.device] if device.device < len(ordered) else None

    def report(self, ts: float, message: WorkloadAllocator, pod: PodIdentity | None) -> list[Alert]:
        """Apply one report of ``pod`` (None: not a pod of this node)."""
        self.counters["allocator_reports"] += 1
        if pod is None:
            self.counters["allocator_unmapped"] += len(message.devices)
            return []
        out: list[Alert] = []
        for device in message.devices:
            gpu = self._gpu_of(pod.uid, device)
            if gpu is None:
                self.counters["allocator_unmapped"] += 1
                continue
            retries, ooms = self._count(ts, pod.uid, gpu, device)
            out.extend(self._rule(ts, pod, gpu, device, retries, ooms))
        return out

    def _count(self, ts: float, uid: str, gpu: str, device: AllocatorDevice) -> tuple[int, int]:
        """Window and lifetime figures; returns the totals (retries, OOMs) of this report."""
        retries, ooms = device.alloc_retries_total or 0, device.ooms_total or 0
        prev = self.last.get(_key(uid, gpu))
        new_retries = retries - prev[0] if prev is not None and retries >= prev[0] else retries
        new_ooms = ooms - prev[1] if prev is not None and ooms >= prev[1] else ooms
        self.last[_key(uid, gpu)] = [retries, ooms]
        unused = max(device.reserved_bytes - device.allocated_bytes, 0)
        ws = window_start(ts, self.window_s)
        w = self.windows.setdefault(_key(uid, gpu, repr(ws)), AllocatorWindow(ws))
        w.reserved, w.allocated = device.reserved_bytes, device.allocated_bytes
        w.unused_max = max(w.unused_max, unused)
        w.retries += new_retries
        w.ooms += new_ooms
        life = self.life.setdefault(uid, {"unused_max": 0, "retries": 0, "ooms": 0})
        life["unused_max"] = max(life["unused_max"], unused)
        life["retries"] += new_retries
        life["ooms"] += new_ooms
        return retries, ooms

    # ------------------------------------------------------------------ the rule

    def _rule(self, ts: float, pod: PodIdentity, gpu: str, device: AllocatorDevice, retries: int,
              ooms: int) -> list[Alert]:
        th = self.thresholds
        key = _key(pod.uid, gpu)
        index, total = self.gpus[pod.uid][gpu]
        marks = self.marks.setdefault(key, [])
        if marks and (retries < marks[-1][1] or ooms < marks[-1][2]):
            marks.clear()  # the process restarted: its totals count from zero again
        marks.append([ts, retries, ooms])
        while marks and marks[0][0] < ts - th.allocator_fragmentation_after - EPS:
            marks.pop(0)
        unused = max(device.reserved_bytes - device.allocated_bytes, 0)
        pct = unused / total * 100.0 if total else None
        if pct is not None and pct >= th.allocator_unused_pct - 1e-6:
            self.over_since.setdefault(key, ts)
        elif pct is not None:
            self.over_since.pop(key, None)
        context = rules.AllocatorGpu(
            node=self.node, namespace=pod.namespace, pod=pod.name, gpu_uuid=gpu, gpu_index=index, device=device,
            gpu_mem_total_bytes=total, reserved_unused_bytes=unused, reserved_unused_pct=pct,
            over_since=self.over_since.get(key), alloc_retries=int(retries - marks[0][1]),
            alloc_ooms=int(ooms - marks[0][2]), thresholds=th)
        return rules.step(rules.ALLOCATOR_FRAGMENTATION, self.rules, key, context, ts, th)

    # ------------------------------------------------------------------ outputs

    def window_figures(self, pod_uid: str, gpu: str, ws: float) -> dict[str, int]:
        """The ``PodWindow`` fields of one window (empty: no report in it); forgets them."""
        if not self.windows:  # no report in any open window (a node without allocator reports)
            return {}
        w = self.windows.pop(_key(pod_uid, gpu, repr(ws)), None)
        if w is None:
            return {}
        return {"alloc_reserved_bytes": w.reserved, "alloc_allocated_bytes": w.allocated,
                "max_reserved_unused_bytes": w.unused_max, "alloc_retries": w.retries, "alloc_ooms": w.ooms}

    def forget_windows(self, before: float) -> None:
        """Drop figures of windows ending at or before ``before`` that no sampled window took."""
        for key in [k for k, w in self.windows.items() if w.ws + self.window_s <= before + EPS]:
            del self.windows[key]

    def end_pod(self, pod_uid: str, ts: float, why: str) -> list[Alert]:
        """The pod left the node (after its ``PodUsage`` took :meth:`usage`): its open alerts resolve
        and its state is forgotten."""
        out: list[Alert] = []
        for key in sorted(k for k in self.rules if k.startswith(pod_uid + "|")):
            out += rules.close(self.rules, key, ts, why)
        for table in (self.last, self.marks, self.over_since):
            for key in [k for k in table if k.startswith(pod_uid + "|")]:
                del table[key]
        self.gpus.pop(pod_uid, None)
        self.life.pop(pod_uid, None)
        return out

    def usage(self, pod_uid: str) -> dict[str, int]:
        """The pod's ``PodUsage`` fields (empty: it reported no allocator figures)."""
        life = self.life.get(pod_uid)
        if life is None:
            return {}
        return {"max_reserved_unused_bytes": life["unused_max"], "alloc_retries": life["retries"],
                "alloc_ooms": life["ooms"]}

    # ------------------------------------------------------------------ checkpoint

    def to_dict(self) -> JsonDict:
        return {"gpus": self.gpus, "last": self.last, "windows": {key: vars(w) for key, w in self.windows.items()},
                "marks": self.marks, "over_since": self.over_since, "rules": rules.table_to_dict(self.rules),
                "life": self.life, "counters": self.counters}

    @classmethod
    def from_dict(cls, value: JsonValue, node: str, thresholds: Thresholds, window_s: float) -> AllocatorTracker:
        tracker = cls(node, thresholds, window_s)
        data = optional_object(value) or {}
        if "gpus" in data:
            tracker.gpus = {uid: {uuid: [optional_int(item) for item in as_array(known)]
                                  for uuid, known in as_object(gpus).items()}
                            for uid, gpus in as_object(data["gpus"]).items()}
        if "last" in data:
            tracker.last = {key: [as_int(total) for total in as_array(totals)]
                            for key, totals in as_object(data["last"]).items()}
        if "windows" in data:
            tracker.windows = record_map(data["windows"], lambda w: rebuild(AllocatorWindow, w))
        if "marks" in data:
            tracker.marks = {key: [[as_float(item) for item in as_array(mark)] for mark in as_array(marks)]
                             for key, marks in as_object(data["marks"]).items()}
        if "over_since" in data:
            tracker.over_since = float_map(data["over_since"])
        if "rules" in data:
            tracker.rules = rules.table_from_dict(as_object(data["rules"]))
        if "life" in data:
            tracker.life = record_map(data["life"], int_map)
        if "counters" in data:
            tracker.counters = int_map(data["counters"])
        return tracker
