"""What the sampler needs from NVML, without pynvml: the :class:`NvmlBackend` protocol (one method per
NVML call, each field asked on its own), the plain records it returns, and the errors pynvml's are
translated into (:class:`NvmlNotSupported`, :class:`NvmlGpuLost`, :class:`NvmlUnavailable`, ...).
:class:`producers.agent.nvml.PynvmlBackend` is the real backend (the only module that imports
pynvml); ``fake_nvml.FakeNvml`` behaves the same way without a GPU."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from common.errors import PermanentError
from producers.agent.source import SourceError, SourceUnavailable

Device = Any
"""An opaque device handle (a physical GPU or a MIG device) returned by the backend."""


Clock = Literal["sm", "mem"]


class NvmlError(SourceError):
    """An NVML call failed; ``kind`` is a short stable label (metrics, logs)."""


class NvmlNotSupported(NvmlError, PermanentError):
    """This field is not available on this GPU or in this mode: report it absent, nothing else."""

    kind = "not_supported"


class NvmlGpuLost(NvmlError, PermanentError):
    """The GPU fell off the bus or stopped answering: report this GPU as lost, keep the others."""

    kind = "gpu_lost"


class NvmlFunctionNotFound(NvmlNotSupported):
    """This driver does not have the call (an older driver generation): the field is unsupported here."""

    kind = "function_not_found"


class NvmlNoPermission(NvmlError, PermanentError):
    kind = "no_permission"


class NvmlUnavailable(NvmlError, SourceUnavailable):
    """NVML as a whole is unusable (library missing, driver not loaded, not initialised)."""

    kind = "unavailable"


class NvmlLibraryNotFound(NvmlUnavailable):
    """No libnvidia-ml on this machine: retrying in-process cannot help."""

    kind = "library_not_found"


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class Utilization:
    gpu_pct: float
    mem_pct: float


@dataclass(frozen=True)
class ProcessInfo:
    """One compute process on a device (from the newest running-processes call the driver has)."""

    pid: int
    used_memory_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class ProcessUtilSample:
    """One per-process utilisation sample (nvmlDeviceGetProcessUtilization)."""

    pid: int
    timestamp_us: int
    sm_util_pct: float
    mem_util_pct: float


@dataclass(frozen=True)
class XidRecord:
    """An XID error NVML reported for a GPU; ``at`` is None when the source has no clock (fakes)."""

    gpu_uuid: str | None
    xid: int
    at: datetime | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class NvmlBackend(Protocol):
    """What the sampler needs from NVML. Every device method may raise :class:`NvmlError`."""

    def init(self) -> None:
        """Initialise NVML (and start XID collection). Raises :class:`NvmlUnavailable`."""

    def shutdown(self) -> None:
        """Release NVML; never raises. ``init`` may be called again afterwards."""

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports, as ``"12.4"``."""

    def device_count(self) -> int: ...

    def device_by_index(self, index: int) -> Device: ...

    def uuid(self, device: Device) -> str: ...

    def name(self, device: Device) -> str:
        """Product name; for a MIG device NVML appends the profile (``"... MIG 1g.10gb"``)."""

    def memory(self, device: Device) -> MemoryInfo: ...

    def utilization(self, device: Device) -> Utilization: ...

    def power_w(self, device: Device) -> float: ...

    def temperature_c(self, device: Device) -> float: ...

    def clock_mhz(self, device: Device, clock: Clock) -> int: ...

    def pcie_throughput_bytes_per_s(self, device: Device) -> tuple[float, float]:
        """(tx, rx) over NVML's last ~20 ms window."""

    def nvlink_bytes_total(self, device: Device) -> tuple[int, int]:
        """Cumulative NVLink (tx, rx) data bytes over all links; the sampler turns them into rates."""

    def compute_processes(self, device: Device) -> list[ProcessInfo]: ...

    def process_utilization(self, device: Device, since_us: int) -> list[ProcessUtilSample]:
        """Per-process samples newer than ``since_us`` (NVML's own microsecond clock); may be empty."""

    def mig_enabled(self, device: Device) -> bool: ...

    def mig_devices(self, device: Device) -> list[Device]: ...

    def mig_instance_ids(self, mig_device: Device) -> tuple[int, int]:
        """(GPU instance id, compute instance id) of a MIG device."""

    def mig_placement_start(self, mig_device: Device) -> int:
        """A MIG device's first memory slice on its parent (its GPU instance's placement start).
        Raises :class:`NvmlNotSupported` when it cannot be read (GPU instance calls need privileges)."""

    def drain_xids(self) -> list[XidRecord]:
        """XID events seen since the previous call, oldest first."""
