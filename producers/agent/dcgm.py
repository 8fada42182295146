"""The agent's dcgm-exporter source: the node's exporter text -> ``gpu.samples.v1``.

Most GPU clusters already run NVIDIA's dcgm-exporter (the GPU Operator deploys it); a second NVML
poller beside it is redundant and lacks DCGM's profiling fields. With ``--source dcgm-exporter``
the agent scrapes the exporter on its node instead (``--dcgm-url``, default
``http://127.0.0.1:9400/metrics``) and maps what it exposes:

- per device (label ``gpu`` = index, ``UUID``, ``modelName``; MIG instances add ``GPU_I_ID`` and
  ``GPU_I_PROFILE``): utilisation, framebuffer used/free/reserved (MiB -> bytes), power, temperature,
  clocks, the profiling ratios (SM active, SM occupancy, tensor pipe, graphics engine, DRAM; 0-1 ->
  %), PCIe/NVLink byte rates, volatile ECC error counts, clock event (throttle) reasons decoded
  from their bit mask, and the last XID (a change between two scrapes is reported as one XID);
- pod attribution from the labels dcgm-exporter adds with its Kubernetes mapping on
  (``namespace``, ``pod``, ``container``, ``pod_uid`` when set): every pod whose labels a
  device's series carry is in its ``assigned_to`` (several with time-slicing: ``shared``).

A MIG GPU becomes, as with NVML, a reading of the physical GPU (the physical fields: power,
temperature, clocks, ECC, clock reasons, XID) followed by one reading per GPU instance (memory,
profiling ratios, pods) with ``mig_parent_uuid``, ``mig_profile`` and ``gpu_instance_id``;
dcgm-exporter labels an instance with its parent's UUID, so the instance's ``uuid`` is
``MIG-<parent UUID>/<GPU instance id>`` (the GPU-instance part of NVIDIA's pre-R470 MIG device
name), stable for the instance's lifetime.

Not in the exporter's output, so absent (never zero): GPU processes, and the CUDA driver version.
An exporter that is down, answers an error or serves text that is not an exposition raises
:class:`DcgmExporterUnavailable` (the run loop retries with backoff and keeps running).
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from common.metrics import ExpositionError, Sample, parse_exposition
from producers.agent.nvml_api import XidRecord
from producers.agent.sampler import xid_event
from producers.agent.source import SourceUnavailable
from schemas.messages import GpuHealth, GpuReading, GpuSample, PodRef, XidEvent

MIB = 2**20
MAX_BODY_BYTES = 32 * MIB

# dcgm-exporter field -> (GpuReading field, conversion); "ratio" = DCGM's 0-1 ratios, sent as %
_PCT, _RATIO, _FLOAT, _INT = "pct", "ratio", "float", "int"
FIELDS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", _PCT),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", _PCT),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", _FLOAT),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", _FLOAT),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", _INT),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", _INT),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", _RATIO),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy_pct", _RATIO),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active_pct", _RATIO),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active_pct", _RATIO),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active_pct", _RATIO),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_s", _FLOAT),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_s", _FLOAT),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_per_s", _FLOAT),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_per_s", _FLOAT),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe_volatile_total", _INT),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_volatile_total", _INT),
}
FB_FIELDS = {"DCGM_FI_DEV_FB_USED": "used", "DCGM_FI_DEV_FB_FREE": "free", "DCGM_FI_DEV_FB_RESERVED": "reserved",
             "DCGM_FI_DEV_FB_TOTAL": "total"}
CLOCK_REASON_FIELDS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"

PHYSICAL_FIELDS = {"power_w", "temperature_c", "sm_clock_mhz", "mem_clock_mhz", "ecc_sbe_volatile_total",
                   "ecc_dbe_volatile_total", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
                   "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"}
"""Fields of the physical GPU: under MIG they go on the parent's reading, not the instances'."""

CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
"""NVML's clock event (formerly throttle) reason bits, which DCGM reports as one mask."""


class DcgmExporterUnavailable(SourceUnavailable):
    """The exporter could not be scraped or its answer was not usable."""

    kind = "exporter_unreachable"


def fetch_text(url: str, timeout_s: float) -> str:
    """GET the exporter's ``/metrics``; raises :class:`DcgmExporterUnavailable` with the reason."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise DcgmExporterUnavailable(f"dcgm-exporter at {url} answered HTTP {exc.code}",
                                      kind="exporter_http_error") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise DcgmExporterUnavailable(f"dcgm-exporter at {url} unreachable: {reason}") from None
    if len(body) > MAX_BODY_BYTES:
        raise DcgmExporterUnavailable(f"dcgm-exporter at {url}: answer larger than {MAX_BODY_BYTES // MIB} MiB",
                                      kind="exporter_bad_text")
    return body.decode("utf-8", errors="replace")


def clock_event_reasons(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


@dataclass
class _DcgmDevice:
    """What one scrape says of a GPU, or of a MIG instance (``instance_id`` set; ``uuid`` its parent's)."""

    index: int
    uuid: str
    model: str
    instance_id: int | None = None
    profile: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    """GpuReading field -> value, converted (the first series of a field wins)."""
    fb: dict[str, float] = field(default_factory=dict)
    """Framebuffer ``used``/``free``/``reserved``/``total``, MiB."""
    pods: dict[tuple[str, str, str], str | None] = field(default_factory=dict)
    """(namespace, pod, container) -> pod uid, of every pod whose labels its series carry."""
    clock_mask: int | None = None
    last_xid: int | None = None

    @property
    def key(self) -> str:
        return self.uuid if self.instance_id is None else f"MIG-{self.uuid}/{self.instance_id}"

    def add_pod(self, labels: dict[str, str]) -> None:
        pod = labels.get("pod", "")
        if pod:
            ref = (labels.get("namespace", ""), pod, labels.get("container", ""))
            self.pods.setdefault(ref, labels.get("pod_uid") or None)

    def add_value(self, name: str, value: float) -> None:
        """One series' value (a finite number); series of other names are ignored."""
        if name in FIELDS:
            reading_field, how = FIELDS[name]
            self.fields.setdefault(reading_field, _convert(value, how))
        elif name in FB_FIELDS:
            self.fb.setdefault(FB_FIELDS[name], max(0.0, value))
        elif name in CLOCK_REASON_FIELDS and self.clock_mask is None:
            self.clock_mask = int(value)
        elif name == XID_FIELD and self.last_xid is None:
            self.last_xid = int(value)


def _convert(value: float, how: str) -> float | int:
    if how == _PCT:
        return min(100.0, max(0.0, value))
    if how == _RATIO:
        return round(min(100.0, max(0.0, value * 100.0)), 4)
    if how == _INT:
        return max(0, round(value))
    return max(0.0, value)


@dataclass
class ExporterReadings:
    gpus: list[GpuReading]
    driver_version: str | None
    errors: list[str]


_DeviceKey = tuple[int, int | None]
"""(GPU index, GPU instance id or None for the physical GPU)."""


def _device_for(series: Sample, devices: dict[_DeviceKey, _DcgmDevice], errors: list[str]) -> _DcgmDevice | None:
    labels = series.labels
    try:
        index = int(labels["gpu"])
        uuid = labels["UUID"]
        instance = int(labels["GPU_I_ID"]) if labels.get("GPU_I_ID", "") != "" else None
    except (KeyError, ValueError):
        problem = f"dcgm-exporter series {series.name} without a usable gpu/UUID/GPU_I_ID label skipped"
        if problem not in errors:
            errors.append(problem)
        return None
    device = devices.get((index, instance))
    if device is None:
        device = devices[(index, instance)] = _DcgmDevice(index, uuid, labels.get("modelName") or "unknown",
                                                       instance, labels.get("GPU_I_PROFILE") or None)
    return device


def readings_from_exposition(text: str, last_xids: dict[str, int] | None = None,
                             at: datetime | None = None) -> ExporterReadings:
    """Map one scrape of dcgm-exporter into readings (physical GPUs, then their MIG instances).

    ``last_xids`` (device key -> last XID value) is updated in place; an XID value that differs
    from the previous scrape's becomes one :class:`XidEvent` at ``at``. Raises
    :class:`DcgmExporterUnavailable` when the text is not an exposition or has no DCGM series."""
    try:
        samples = parse_exposition(text)
    except ExpositionError as exc:
        raise DcgmExporterUnavailable(f"dcgm-exporter: {exc}", kind="exporter_bad_text") from None
    errors: list[str] = []
    devices: dict[_DeviceKey, _DcgmDevice] = {}
    driver: str | None = None
    for series in samples:
        device = _device_for(series, devices, errors) if series.name.startswith("DCGM_FI_") else None
        if device is None:
            continue
        driver = driver or series.labels.get("DCGM_FI_DRIVER_VERSION") or None
        device.add_pod(series.labels)
        if math.isfinite(series.value):
            device.add_value(series.name, series.value)
    if not devices:
        raise DcgmExporterUnavailable("dcgm-exporter answered, but with no DCGM series with a gpu label",
                                      kind="exporter_no_gpus")
    last_xids = {} if last_xids is None else last_xids
    gpus: list[GpuReading] = []
    for index in sorted({i for i, _ in devices}):
        instances = sorted((d for (i, gi), d in devices.items() if i == index and gi is not None),
                           key=lambda d: d.instance_id or 0)
        physical = devices.get((index, None)) or _mig_physical(instances[0])
        gpus.append(_reading(physical, None if instances else physical, last_xids, at))
        gpus.extend(_reading(instance, physical, last_xids, at) for instance in instances)
    return ExporterReadings(gpus, driver, errors)


def _mig_physical(first: _DcgmDevice) -> _DcgmDevice:
    """A MIG GPU's physical device: its physical fields come with each instance's series."""
    return _DcgmDevice(first.index, first.uuid, first.model, clock_mask=first.clock_mask, last_xid=first.last_xid,
                       fields={k: v for k, v in first.fields.items() if k in PHYSICAL_FIELDS})


def _reading(device: _DcgmDevice, parent: _DcgmDevice | None, last_xids: dict[str, int],
             at: datetime | None) -> GpuReading:
    """``parent`` is None for a MIG GPU's physical reading, the device itself for a plain GPU, and
    the physical GPU for a MIG instance."""
    mig = device.instance_id is not None
    fields = _own_fields(device, parent)
    xids: list[XidEvent] = []
    if not mig:
        if device.clock_mask is not None:
            fields["clock_event_reasons"] = clock_event_reasons(device.clock_mask)
        xids = _new_xids(device, last_xids, at)
    pods = [PodRef(namespace=ns, pod=pod, container=container, pod_uid=uid)
            for (ns, pod, container), uid in sorted(device.pods.items())]
    health, health_reason = _health(xids)
    return GpuReading(
        uuid=device.key, index=device.index, model=device.model,
        mig_parent_uuid=device.uuid if mig else None, mig_profile=device.profile if mig else None,
        gpu_instance_id=device.instance_id,
        **fields, health=health, health_reason=health_reason, xids=xids, assigned_to=pods if parent is not None else [],
        shared=len({(p.namespace, p.pod) for p in pods}) > 1 and parent is not None,
    )


def _own_fields(device: _DcgmDevice, parent: _DcgmDevice | None) -> dict[str, Any]:
    """The device's fields for its own reading: a MIG instance without the physical ones, a MIG
    GPU's physical reading only those; memory on every reading but a MIG GPU's physical one."""
    if device.instance_id is not None:
        fields = {k: v for k, v in device.fields.items() if k not in PHYSICAL_FIELDS}
    elif parent is None:
        fields = {k: v for k, v in device.fields.items() if k in PHYSICAL_FIELDS}
    else:
        fields = dict(device.fields)
    fb = device.fb
    if parent is not None and "used" in fb:
        fields["mem_used_bytes"] = round(fb["used"] * MIB)
        total = fb.get("total") or (fb["used"] + fb["free"] + fb.get("reserved", 0.0) if "free" in fb else None)
        if total:
            fields["mem_total_bytes"] = round(total * MIB)
    return fields


def _new_xids(device: _DcgmDevice, last_xids: dict[str, int], at: datetime | None) -> list[XidEvent]:
    """The device's XID as an event when it differs from the previous scrape's (remembered in ``last_xids``)."""
    if device.last_xid is None:
        return []
    previous = last_xids.get(device.key)
    last_xids[device.key] = device.last_xid
    if previous is not None and device.last_xid != previous and device.last_xid > 0 and at is not None:
        return [xid_event(XidRecord(device.uuid, device.last_xid, at), at)]
    return []


def _health(xids: list[XidEvent]) -> tuple[GpuHealth, str | None]:
    """``health`` and ``health_reason``: degraded by a critical XID of this scrape, else ok."""
    critical = [x for x in xids if x.critical]
    if not critical:
        return "ok", None
    return "degraded", "; ".join(f"xid {x.xid}: {x.message}" for x in critical)


class DcgmExporterSource:
    """:class:`producers.agent.source.SampleSource` over the node's dcgm-exporter."""

    name = "dcgm-exporter"

    def __init__(self, node_name: str, url: str, boot_id: str, sample_interval_s: float, timeout_s: float = 5.0,
                 fetch: Callable[[str, float], str] = fetch_text) -> None:
        self.node_name = node_name
        self.url = url
        self.boot_id = boot_id
        self.sample_interval_s = sample_interval_s
        self.timeout_s = timeout_s
        self.fetch = fetch
        self.seq = 0
        self._last_xids: dict[str, int] = {}

    def init(self) -> None:
        """One scrape, to tell at start (and after a failure) whether the exporter is usable."""
        readings_from_exposition(self.fetch(self.url, self.timeout_s), dict(self._last_xids))

    def shutdown(self) -> None:
        return None

    def reset(self) -> None:
        return None

    def sample(self, ts: datetime) -> GpuSample:
        found = readings_from_exposition(self.fetch(self.url, self.timeout_s), self._last_xids, ts)
        sample = GpuSample(node=self.node_name, ts=ts, agent_boot_id=self.boot_id, seq=self.seq,
                           sample_interval_s=self.sample_interval_s, driver_version=found.driver_version,
                           gpus=found.gpus, errors=found.errors)
        self.seq += 1
        return sample
