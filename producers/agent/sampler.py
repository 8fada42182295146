"""One node sample: every GPU, MIG device and GPU process of the node, attributed to pods.

:class:`NodeSampler` is plain, deterministic Python over three interfaces (NVML, the kubelet's
PodResources, a PID -> container resolver): given the same answers it builds the same
:class:`schemas.messages.GpuSample`, so tests, the fleet simulator and the live agent share it.

What each failure means here (NVML answers field by field; a physical GPU's fields come as one
:class:`producers.agent.nvml_api.PhysicalFields`, each field's error kept beside it, in one call
where the backend can: the fake NVML, so that a fleet replay reads each GPU once per tick):
- a field NVML does not support on this GPU or mode -> that field is absent (None), nothing else;
- any other error on one field -> the field is absent, the GPU is marked ``degraded`` with the
  reason, the sample's ``errors`` name it, and ``on_nvml_error(kind)`` counts it;
- the GPU is lost (fell off the bus) or cannot be opened -> that GPU alone is reported with health
  ``lost`` / ``error`` under its last known identity, the other GPUs keep flowing;
- NVML as a whole is unavailable -> :class:`NvmlUnavailable` propagates: the service re-initialises
  NVML; no sample is produced, because a sample without GPUs would read as "no GPUs" downstream.

DRA: the devices PodResources reports in ``dynamic_resources`` go on the sample as they are
(``dra_allocations``); the node stage resolves them to GPUs (the agent knows no ResourceSlice).

Attribution: each device's ``assigned_to`` comes from PodResources (replica ids ``uuid::n`` of
time-slicing and index ids are normalised to NVML UUIDs); ``shared`` is set when more than one pod
holds the device. Each process carries its container id and pod UID from its cgroup. Pod names are
filled in when the process's pod UID matches an assigned :class:`PodRef` — by its ``pod_uid`` when
the source gives one, otherwise by elimination (exactly one unmatched pod and one unmatched UID on
a device, consistent on every device that UID appears on). On a time-sliced or MPS GPU each pod
therefore gets its own processes' memory and SM utilisation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, TypeGuard, TypeVar

from common.logs import get_logger
from producers.agent.cgroup import ProcessResolver
from producers.agent.nvml_api import (
    Device,
    NvmlBackend,
    NvmlError,
    NvmlGpuLost,
    NvmlNotSupported,
    NvmlUnavailable,
    PhysicalFields,
    ProcessInfo,
    ProcessUtilSample,
    ReadsPhysicalFields,
    XidRecord,
    read_physical,
)
from producers.agent.podresources import PodResourcesAnswer, PodResourcesError, PodResourcesSource
from schemas.messages import GpuReading, GpuSample, PodRef, XidEvent

log = get_logger(__name__)

T = TypeVar("T")

XID_INFO: dict[int, tuple[str, bool]] = {
    13: ("graphics engine exception", False),
    31: ("GPU memory page fault", False),
    43: ("GPU stopped processing", False),
    45: ("preemptive cleanup after a previous error", False),
    48: ("double bit ECC error", True),
    61: ("internal micro-controller breakpoint/warning", True),
    62: ("internal micro-controller halt", True),
    63: ("ECC page retirement or row remapping recorded", False),
    64: ("ECC page retirement or row remapping failure", True),
    74: ("NVLink error", True),
    79: ("GPU has fallen off the bus", True),
    92: ("high single-bit ECC error rate", True),
    94: ("contained ECC error", True),
    95: ("uncontained ECC error", True),
    119: ("GSP RPC timeout", True),
    120: ("GSP error", True),
    140: ("unrecovered ECC error", True),
}
"""XID -> (meaning, critical). Critical means the hardware or driver needs attention (drain,
reset, RMA); the others are usually caused by the application (bad kernel, page fault)."""

_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")


def xid_event(record: XidRecord, default_at: datetime) -> XidEvent:
    meaning, critical = XID_INFO.get(record.xid, (None, False))
    return XidEvent(xid=record.xid, at=record.at or default_at, critical=critical, message=meaning)


def mig_profile(name: str) -> str | None:
    """``"NVIDIA H100 80GB HBM3 MIG 1g.10gb"`` -> ``"1g.10gb"``."""
    match = _MIG_PROFILE.search(name)
    return match.group(1) if match else None


class _ReadingDraft:
    """A reading under construction (GpuReading is immutable). ``uuid`` and ``is_mig`` are fixed
    by the fields it starts with (a reading's identity does not change while it is read)."""

    __slots__ = ("assigned_to", "fields", "is_mig", "issues", "processes", "uuid", "xids")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.uuid = str(fields["uuid"])
        self.is_mig = fields.get("mig_parent_uuid") is not None
        self.processes: list[dict[str, Any]] = []
        self.issues: list[str] = []
        self.xids: list[XidEvent] = []
        self.assigned_to: list[PodRef] = []

    def build(self) -> dict[str, Any]:
        """The reading as :class:`GpuReading`'s fields (the draft's own ``fields``, completed: call
        once): the sample validates every reading with itself, in one call (a model per reading
        built first costs a tenth of a sample)."""
        fields = self.fields
        if self.issues or self.xids:
            issues = self.issues
            if issues and fields.get("health", "ok") == "ok":
                fields["health"] = "degraded"
                fields["health_reason"] = "nvml errors: " + ", ".join(issues)
            critical = [x for x in self.xids if x.critical]
            if critical and fields.get("health", "ok") in ("ok", "degraded"):
                reason = "; ".join(f"xid {x.xid}: {x.message}" for x in critical)
                fields["health"] = "degraded"
                fields["health_reason"] = reason if not issues else f"{reason}; {fields.get('health_reason')}"
        assigned = self.assigned_to
        fields["xids"] = self.xids
        fields["assigned_to"] = assigned
        fields["processes"] = self.processes
        fields["shared"] = len(assigned) > 1 and len({(r.namespace, r.pod) for r in assigned}) > 1
        return fields


def _assignments(devices: list[_ReadingDraft], raw: dict[str, list[PodRef]]) -> dict[str, list[PodRef]]:
    """Device UUID -> the pods the kubelet assigned it, each once: a time-slicing replica
    (``uuid::n``) counts as its GPU, an index (``deviceIDStrategy=index``) as the GPU of that index."""
    by_index: dict[int, str] | None = None
    assigned: dict[str, list[PodRef]] = {}
    for device_id, refs in raw.items():
        base = device_id.split("::", 1)[0] if "::" in device_id else device_id
        if base.isdigit():
            if by_index is None:
                by_index = {d.fields["index"]: d.uuid for d in devices if not d.is_mig}
            base = by_index.get(int(base), base)
        bucket = assigned.setdefault(base, [])
        for ref in refs:
            if ref not in bucket:
                bucket.append(ref)
    return assigned


def _name_processes(devices: list[_ReadingDraft], pod_of_uid: dict[str, tuple[str, str]]) -> None:
    """Each process of a known pod gets the pod's namespace and name, and its container's name where
    one container of that pod holds the device."""
    for device in devices:
        assigned_to = device.assigned_to
        for proc in device.processes:
            uid = proc["pod_uid"]
            pod = pod_of_uid.get(uid) if uid else None
            if pod is None:
                continue
            proc["pod_namespace"], proc["pod_name"] = pod
            containers = {r.container for r in assigned_to if (r.namespace, r.pod) == pod}
            if len(containers) == 1:
                proc["container_name"] = next(iter(containers))


class NodeSampler:
    """Builds one :class:`GpuSample` per call; ``seq`` increments with every sample produced.

    The default :class:`producers.agent.source.SampleSource`: NVML, the kubelet and ``/proc``."""

    name = "nvml"

    def __init__(
        self,
        node_name: str,
        nvml: NvmlBackend,
        pod_resources: PodResourcesSource | None,
        processes: ProcessResolver,
        boot_id: str,
        sample_interval_s: float,
        *,
        on_nvml_error: Callable[[str], None] | None = None,
        on_pod_resources_error: Callable[[], None] | None = None,
        assignments_max_age_samples: int = 3,
    ) -> None:
        self.node_name = node_name
        self.nvml = nvml
        self.pod_resources = pod_resources
        self.processes = processes
        self.boot_id = boot_id
        self.sample_interval_s = sample_interval_s
        self.seq = 0
        self._on_nvml_error = on_nvml_error
        self._on_pod_resources_error = on_pod_resources_error
        self._assignments_max_age = assignments_max_age_samples
        self._identity: dict[int, tuple[str, str]] = {}
        self._versions: tuple[str, str] | None = None
        self._nvlink_prev: dict[str, tuple[datetime, int, int]] = {}
        self._util_since_us: dict[str, int] = {}
        self._last_answer: tuple[int, PodResourcesAnswer] | None = None
        self._physical_fields: Callable[[Device, int], PhysicalFields] = partial(read_physical, nvml)
        self._readings: dict[str, tuple[dict[str, Any], GpuReading]] = {}
        """Each device's reading in the last sample, by UUID: the fields it was validated from and the
        model. A reading whose fields equal its last ones is that model again: validation is a pure
        function of the fields, and pydantic's lax conversions give equal inputs equal outputs (1 and
        1.0 both become the field's type), so the sample is the one a full validation builds, at a
        fraction of its cost (in a steady fleet most readings repeat from one sample to the next)."""

    def init(self) -> None:
        self.nvml.init()

    def shutdown(self) -> None:
        self.nvml.shutdown()

    def reset(self) -> None:
        """Forget what belongs to one NVML session (call after re-initialising NVML)."""
        self._versions = None
        self._nvlink_prev.clear()
        self._util_since_us.clear()

    # ------------------------------------------------------------------ the sample

    def sample(self, ts: datetime) -> GpuSample:
        """Read everything once; raises :class:`NvmlUnavailable` if NVML as a whole is gone."""
        errors: list[str] = []
        nvml = self.nvml
        self._physical_fields = nvml.physical_fields if _reads_physical(nvml) else partial(read_physical, nvml)
        driver, cuda = self._read_versions(errors)
        count = nvml.device_count()
        devices: list[_ReadingDraft] = []
        for index in range(count):
            devices.extend(self._read_gpu(index, ts, errors))
        xids = nvml.drain_xids()
        if xids:
            self._attach_xids(devices, xids, ts, errors)
        answer = self._pod_resources(errors)
        self._attribute(devices, answer.assignments)
        known = self._readings
        built: list[dict[str, Any]] = []
        gpus: list[dict[str, Any] | GpuReading] = []
        for draft in devices:
            fields = draft.build()
            built.append(fields)
            last = known.get(draft.uuid)
            gpus.append(last[1] if last is not None and last[0] == fields else fields)
        sample = GpuSample.model_validate({
            "node": self.node_name,
            "ts": ts,
            "agent_boot_id": self.boot_id,
            "seq": self.seq,
            "sample_interval_s": self.sample_interval_s,
            "driver_version": driver,
            "cuda_driver_version": cuda,
            "gpus": gpus,
            "errors": errors,
            "dra_allocations": answer.dra_allocations,
        })
        self._readings = {draft.uuid: (fields, reading)
                          for draft, fields, reading in zip(devices, built, sample.gpus, strict=True)}
        self.seq += 1
        return sample

    # ------------------------------------------------------------------ NVML reads

    def _report(self, kind: str) -> None:
        if self._on_nvml_error is not None:
            self._on_nvml_error(kind)

    def _read_versions(self, errors: list[str]) -> tuple[str | None, str | None]:
        if self._versions is None:
            try:
                self._versions = (self.nvml.driver_version(), self.nvml.cuda_driver_version())
            except NvmlUnavailable:
                raise
            except NvmlError as exc:
                self._report(exc.kind)
                errors.append(f"driver version: {exc.kind}: {exc}")
                return None, None
        return self._versions

    def _field(self, device: _ReadingDraft, what: str, errors: list[str], call: Callable[..., T],
               *args: Any) -> T | None:
        """``call(*args)``, or None where NVML does not answer it (an error other than unsupported is
        reported, see :meth:`_field_failed`)."""
        try:
            return call(*args)
        except NvmlNotSupported:
            return None
        except (NvmlGpuLost, NvmlUnavailable):
            raise
        except NvmlError as exc:
            self._field_failed(device, what, exc, errors)
            return None

    def _field_failed(self, device: _ReadingDraft, what: str, exc: NvmlError, errors: list[str]) -> None:
        """One reading of one device failed: count it, mark the device, and say so in the sample."""
        self._report(exc.kind)
        device.issues.append(f"{what} ({exc.kind})")
        errors.append(f"gpu {device.fields['index']} {device.uuid}: {what}: {exc.kind}: {exc}")

    def _unreadable(self, index: int, health: str, reason: str) -> _ReadingDraft:
        uuid, model = self._identity.get(index, (f"GPU-unknown-{self.node_name}-{index}", "unknown"))
        return _ReadingDraft({"uuid": uuid, "index": index, "model": model, "health": health, "health_reason": reason})

    def _read_gpu(self, index: int, ts: datetime, errors: list[str]) -> list[_ReadingDraft]:
        nvml = self.nvml
        try:
            handle = nvml.device_by_index(index)
            uuid = nvml.uuid(handle)
        except NvmlUnavailable:
            raise
        except NvmlGpuLost as exc:
            self._report(exc.kind)
            errors.append(f"gpu {index}: lost: {exc}")
            return [self._unreadable(index, "lost", str(exc))]
        except NvmlError as exc:
            self._report(exc.kind)
            errors.append(f"gpu {index}: cannot open: {exc.kind}: {exc}")
            return [self._unreadable(index, "error", f"{exc.kind}: {exc}")]
        known = self._identity.get(index)
        device = _ReadingDraft({"uuid": uuid, "index": index, "model": known[1] if known and known[0] == uuid else ""})
        try:
            return self._read_physical(device, handle, index, ts, errors)
        except NvmlGpuLost as exc:
            self._report(exc.kind)
            errors.append(f"gpu {index} {uuid}: lost: {exc}")
            return [self._unreadable(index, "lost", str(exc))]

    def _read_physical(
        self, device: _ReadingDraft, handle: Device, index: int, ts: datetime, errors: list[str]
    ) -> list[_ReadingDraft]:
        f, uuid = device.fields, device.uuid
        read = self._physical_fields(handle, self._util_since_us.get(uuid, 0))
        if read.failed:
            for what, exc in read.failed:
                self._field_failed(device, what, exc, errors)
        model = f["model"] = read.name or f["model"] or "unknown"
        known = self._identity.get(index)
        if known is None or known[0] != uuid or known[1] != model:
            self._identity[index] = (uuid, model)
        self._gauges(f, read, uuid, ts)
        if read.lost is not None:  # lost during the read: the fields from there on are None
            raise read.lost
        if not read.mig_enabled:
            samples = read.process_samples
            sm_util = None if samples is None else self._sm_util(uuid, samples)
            if read.processes:
                device.processes = self._process_list(read.processes, sm_util)
            return [device]
        readings = [device]
        # MIG: the parent lists no processes of its own; each MIG device is its own reading
        for mig_handle in self._field(device, "mig_devices", errors, self.nvml.mig_devices, handle) or []:
            try:
                readings.append(self._read_mig(device, mig_handle, errors))
            except (NvmlGpuLost, NvmlUnavailable):
                raise
            except NvmlError as exc:
                self._field_failed(device, "mig device", exc, errors)
        return readings

    def _gauges(self, f: dict[str, Any], read: PhysicalFields, uuid: str, ts: datetime) -> None:
        """The reading's gauges from ``read`` into its fields ``f`` (an unread gauge stays as it is)."""
        memory = read.memory
        if memory is not None:
            f["mem_total_bytes"] = memory.total_bytes
            f["mem_used_bytes"] = memory.used_bytes
        util = read.utilization
        if util is not None:
            f["gpu_util_pct"], f["mem_util_pct"] = _pct(util.gpu_pct), _pct(util.mem_pct)
        power = read.power_w
        f["power_w"] = None if power is None else power if power > 0.0 else 0.0  # max(0.0, power), NaN -> 0.0
        f["temperature_c"] = read.temperature_c
        f["sm_clock_mhz"] = read.sm_clock_mhz
        f["mem_clock_mhz"] = read.mem_clock_mhz
        pcie = read.pcie_bytes_per_s
        if pcie is not None:
            f["pcie_tx_bytes_per_s"], f["pcie_rx_bytes_per_s"] = pcie
        nvlink = read.nvlink_bytes_total
        if nvlink is not None:
            f["nvlink_tx_bytes_per_s"], f["nvlink_rx_bytes_per_s"] = self._nvlink_rate(uuid, ts, nvlink)

    def _read_mig(self, parent: _ReadingDraft, handle: Device, errors: list[str]) -> _ReadingDraft:
        nvml = self.nvml
        uuid = nvml.uuid(handle)
        device = _ReadingDraft(
            {
                "uuid": uuid,
                "index": parent.fields["index"],
                "model": parent.fields["model"],
                "mig_parent_uuid": parent.uuid,
            }
        )
        f = device.fields
        name = self._field(device, "name", errors, nvml.name, handle)
        f["mig_profile"] = mig_profile(name) if name else None
        ids = self._field(device, "mig_instance_ids", errors, nvml.mig_instance_ids, handle)
        if ids is not None:
            f["gpu_instance_id"], f["compute_instance_id"] = ids
        f["mig_placement_start"] = self._field(device, "mig_placement", errors, nvml.mig_placement_start, handle)
        memory = self._field(device, "memory", errors, nvml.memory, handle)
        if memory is not None:
            f["mem_total_bytes"], f["mem_used_bytes"] = memory.total_bytes, memory.used_bytes
        util = self._field(device, "utilization", errors, nvml.utilization, handle)
        if util is not None:
            f["gpu_util_pct"], f["mem_util_pct"] = _pct(util.gpu_pct), _pct(util.mem_pct)
        device.processes = self._processes(device, handle, errors)
        return device

    def _nvlink_rate(
        self, uuid: str, ts: datetime, totals: tuple[int, int]
    ) -> tuple[float | None, float | None]:
        tx, rx = totals
        previous = self._nvlink_prev.get(uuid)
        self._nvlink_prev[uuid] = (ts, tx, rx)
        if previous is None:
            return None, None
        seconds = (ts - previous[0]).total_seconds()
        if seconds <= 0 or tx < previous[1] or rx < previous[2]:
            return None, None  # first sample, clock went back, or the counters were reset
        return (tx - previous[1]) / seconds, (rx - previous[2]) / seconds

    def _processes(self, device: _ReadingDraft, handle: Device, errors: list[str]) -> list[dict[str, Any]]:
        """A MIG device's processes (NVML has no per-process utilisation for them)."""
        infos = self._field(device, "processes", errors, self.nvml.compute_processes, handle) or []
        return self._process_list(infos, None)

    def _sm_util(self, uuid: str, samples: list[ProcessUtilSample]) -> dict[int, float]:
        """Each process's mean SM utilisation over ``samples`` (the device's newer than the last read,
        whose clock is kept for the next)."""
        since = self._util_since_us.get(uuid, 0)
        sums: dict[int, list[float]] = {}
        for s in samples:
            values = sums.get(s.pid)
            if values is None:
                sums[s.pid] = [s.sm_util_pct]
            else:
                values.append(s.sm_util_pct)
            if s.timestamp_us > since:
                since = s.timestamp_us
        self._util_since_us[uuid] = since
        return {pid: _pct(sum(v) / len(v)) for pid, v in sums.items()}

    def _process_list(self, infos: list[ProcessInfo], sm_util: dict[int, float] | None) -> list[dict[str, Any]]:
        """The processes as the reading's, by PID; ``sm_util``: None where NVML gave no per-process
        utilisation (a process without a sample since the last read did not run on the SMs: 0)."""
        out = []
        resolve = self.processes.resolve
        for info in sorted(infos, key=_by_pid) if len(infos) > 1 else infos:
            pid = info.pid
            ref = resolve(pid)
            out.append(
                {
                    "pid": pid,
                    "container_id": ref.container_id if ref else None,
                    "pod_uid": ref.pod_uid if ref else None,
                    "mem_used_bytes": info.used_memory_bytes,
                    "sm_util_pct": None if sm_util is None else sm_util.get(pid, 0.0),
                }
            )
        return out

    # ------------------------------------------------------------------ XIDs

    def _attach_xids(
        self, devices: list[_ReadingDraft], records: list[XidRecord], ts: datetime, errors: list[str]
    ) -> None:
        physical = {d.uuid: d for d in devices if not d.is_mig}
        for record in records:
            target = physical.get(record.gpu_uuid or "")
            event = xid_event(record, ts)
            if target is None:
                errors.append(f"xid {record.xid} on unknown device {record.gpu_uuid}")
                continue
            target.xids.append(event)
            if event.critical:
                log.warning("critical xid", node=self.node_name, gpu=target.uuid, xid=record.xid,
                            meaning=event.message)

    # ------------------------------------------------------------------ attribution

    def _pod_resources(self, errors: list[str]) -> PodResourcesAnswer:
        if self.pod_resources is None:
            return PodResourcesAnswer()
        try:
            answer = self.pod_resources.read()
        except PodResourcesError as exc:
            if self._on_pod_resources_error is not None:
                self._on_pod_resources_error()
            errors.append(f"pod resources: {exc}")
            if self._last_answer and self.seq - self._last_answer[0] <= self._assignments_max_age:
                return self._last_answer[1]  # a kubelet restart: keep the recent answer briefly
            return PodResourcesAnswer()
        errors.extend(answer.problems)
        self._last_answer = (self.seq, answer)
        return answer

    def _attribute(self, devices: list[_ReadingDraft], raw: dict[str, list[PodRef]]) -> None:
        """Each device's pods (the kubelet's assignments) and each process's pod and container."""
        assigned = _assignments(devices, raw)
        for device in devices:
            refs_here = assigned.get(device.uuid)
            if refs_here is not None:
                device.assigned_to = refs_here
        pod_of_uid = self._bind_uids(devices)
        if pod_of_uid:
            _name_processes(devices, pod_of_uid)

    @staticmethod
    def _bind_uids(devices: list[_ReadingDraft]) -> dict[str, tuple[str, str]]:
        """Pod UID -> (namespace, pod): from PodRef.pod_uid, then by elimination per device."""
        bound: dict[str, tuple[str, str]] = {}
        for device in devices:
            for ref in device.assigned_to:
                if ref.pod_uid:
                    bound[ref.pod_uid] = (ref.namespace, ref.pod)
        for device in devices:
            for p in device.processes:
                uid = p["pod_uid"]
                if uid and uid not in bound:
                    return bound | NodeSampler._infer_uids(devices, bound)
        return bound  # nothing left to infer (the usual case: the kubelet names every pod's UID)

    @staticmethod
    def _infer_uids(devices: list[_ReadingDraft], bound: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
        """Pod UIDs the kubelet did not name -> (namespace, pod), by elimination per device."""
        known = set(bound)
        inferred: dict[str, tuple[str, str]] = {}
        changed = True
        while changed:
            changed = False
            for device in devices:
                taken = set(bound.values()) | set(inferred.values())
                pods = {(r.namespace, r.pod) for r in device.assigned_to} - taken
                uids = {p["pod_uid"] for p in device.processes if p["pod_uid"]} - known - set(inferred)
                if len(pods) == 1 and len(uids) == 1:
                    inferred[uids.pop()] = pods.pop()
                    changed = True
        # an inferred UID must hold its pod's devices only, wherever it runs
        for uid, pod in list(inferred.items()):
            for device in devices:
                runs_here = any(p["pod_uid"] == uid for p in device.processes)
                if runs_here and pod not in {(r.namespace, r.pod) for r in device.assigned_to}:
                    del inferred[uid]
                    break
        return inferred


_READS_PHYSICAL: dict[type, bool] = {}
"""Backend class -> whether it is a :class:`ReadsPhysicalFields` (a protocol check costs a few
microseconds, and it is asked at every sample)."""


def _reads_physical(backend: object) -> TypeGuard[ReadsPhysicalFields]:
    """Whether a backend reads a GPU in one call (:class:`ReadsPhysicalFields`)."""
    kind = type(backend)
    known = _READS_PHYSICAL.get(kind)
    if known is None:
        known = _READS_PHYSICAL[kind] = issubclass(kind, ReadsPhysicalFields)
    return known


def _pct(value: float) -> float:
    """``value`` within 0..100 (NaN: 0): what ``min(100.0, max(0.0, float(value)))`` gives, in
    comparisons."""
    value = float(value)
    if not value > 0.0:
        return 0.0
    return value if value < 100.0 else 100.0


def _by_pid(process: ProcessInfo) -> int:
    return process.pid
