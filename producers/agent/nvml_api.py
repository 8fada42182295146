"""What the sampler needs from NVML, without pynvml: the :class:`NvmlBackend` protocol (one method per
NVML call, each field asked on its own), the plain records it returns, and the errors pynvml's are
translated into (:class:`NvmlNotSupported`, :class:`NvmlGpuLost`, :class:`NvmlUnavailable`, ...).
:class:`producers.agent.nvml.PynvmlBackend` is the real backend (the only module that imports
pynvml); ``fake_nvml.FakeNvml`` behaves the same way without a GPU.

A physical GPU's gauges are read as one :class:`PhysicalFields`, with each field's error kept
beside it: :func:`read_physical` asks the per-field methods of any backend, and a backend that can
answer them all at once (:class:`ReadsPhysicalFields`, the fake NVML: the fleet simulator reads
every GPU of a fleet each tick) gives the same record in one call."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

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


# The records of a reading below are not frozen: a frozen dataclass sets each field through
# ``object.__setattr__`` and takes four times as long to make, and a sampler makes several per GPU at
# every sample (the fleet simulator: for every GPU of a fleet at every tick). Nothing changes one
# once made.


@dataclass(slots=True)
class MemoryInfo:
    total_bytes: int
    used_bytes: int


@dataclass(slots=True)
class Utilization:
    gpu_pct: float
    mem_pct: float


@dataclass(slots=True)
class ProcessInfo:
    """One compute process on a device (from the newest running-processes call the driver has)."""

    pid: int
    used_memory_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(slots=True)
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


@dataclass(slots=True)
class PhysicalFields:
    """The gauges of one physical GPU, read in one pass. A field is None where the GPU does not answer
    it: unsupported (nothing else to say), or failed with another error, listed in ``failed`` as
    (the sampler's label for the field, the error), in reading order. ``lost``: the GPU fell off the
    bus after its first field was asked (the fields from there on are None). A GPU lost at its first
    field raises :class:`NvmlGpuLost` (nothing was read), as NVML as a whole gone raises
    :class:`NvmlUnavailable`."""

    name: str | None
    memory: MemoryInfo | None
    utilization: Utilization | None
    power_w: float | None
    temperature_c: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    pcie_bytes_per_s: tuple[float, float] | None
    nvlink_bytes_total: tuple[int, int] | None
    mig_enabled: bool | None
    processes: list[ProcessInfo] | None = None
    """Asked only outside MIG mode (a MIG GPU's processes are its MIG devices')."""
    process_samples: list[ProcessUtilSample] | None = None
    """Per-process utilisation samples newer than the caller's ``since_us``: asked only when
    ``processes`` lists some."""
    failed: tuple[tuple[str, NvmlError], ...] = ()
    lost: NvmlGpuLost | None = None


PHYSICAL_READS: tuple[tuple[str, str, str, tuple[Any, ...]], ...] = (
    ("name", "name", "name", ()),
    ("memory", "memory", "memory", ()),
    ("utilization", "utilization", "utilization", ()),
    ("power_w", "power", "power_w", ()),
    ("temperature_c", "temperature", "temperature_c", ()),
    ("sm_clock_mhz", "sm_clock", "clock_mhz", ("sm",)),
    ("mem_clock_mhz", "mem_clock", "clock_mhz", ("mem",)),
    ("pcie_bytes_per_s", "pcie_throughput", "pcie_throughput_bytes_per_s", ()),
    ("nvlink_bytes_total", "nvlink_throughput", "nvlink_bytes_total", ()),
    ("mig_enabled", "mig_mode", "mig_enabled", ()),
)
""":class:`PhysicalFields`' gauges in reading order: (the field; the sampler's label for it, in its
errors and health reasons; the :class:`NvmlBackend` method; the method's arguments after the device).
Outside MIG mode the processes follow (``"processes"``, then ``"process_utilization"`` where there
are some)."""


def read_physical(nvml: NvmlBackend, device: Device, since_us: int) -> PhysicalFields:
    """A physical GPU's :class:`PhysicalFields` through the backend's per-field methods, in
    :data:`PHYSICAL_READS` order, then its processes (any backend; the per-field errors are the
    methods' own)."""
    values: dict[str, Any] = {}
    failed: list[tuple[str, NvmlError]] = []

    def ask(label: str, method: str, *args: Any) -> Any:
        try:
            return getattr(nvml, method)(device, *args)
        except NvmlNotSupported:
            return None
        except NvmlGpuLost:
            raise
        except NvmlUnavailable:
            raise
        except NvmlError as exc:
            failed.append((label, exc))
            return None

    try:
        for name, label, method, args in PHYSICAL_READS:
            values[name] = ask(label, method, *args)
        if values["mig_enabled"]:
            return PhysicalFields(**values, failed=tuple(failed))
        processes = ask("processes", "compute_processes")
        samples = ask("process_utilization", "process_utilization", since_us) if processes else None
        return PhysicalFields(**values, processes=processes, process_samples=samples, failed=tuple(failed))
    except NvmlGpuLost as exc:
        if not values:
            raise
        gauges = dict.fromkeys(name for name, *_ in PHYSICAL_READS) | values  # from the lost one on: None
        return PhysicalFields(**gauges, failed=tuple(failed), lost=exc)


@runtime_checkable
class ReadsPhysicalFields(Protocol):
    """A backend that reads a physical GPU's gauges and processes in one call, with what
    :func:`read_physical` gives for the same device."""

    def physical_fields(self, device: Device, since_us: int) -> PhysicalFields: ...
