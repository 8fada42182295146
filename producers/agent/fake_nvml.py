"""A fake NVML that behaves like the real one, for tests, the fleet simulator and ``--simulate``.

Faithful where it matters to the sampler:
- calls before ``init`` (or after the "driver" goes away) raise :class:`NvmlUnavailable`;
- a field listed in ``FakeGpu.unsupported`` raises :class:`NvmlNotSupported` for that field only;
- in MIG mode, device utilisation and per-process utilisation are not supported (on the parent
  and on MIG devices), the parent lists no compute processes (they are listed per MIG device),
  and MIG devices answer only memory, processes and identity — as NVML does;
- a lost GPU (``lost=True``) raises :class:`NvmlGpuLost` on every call, including on its MIG
  devices, while the other GPUs keep answering;
- XIDs injected with :meth:`FakeNvml.inject_xid` are returned once by ``drain_xids``;
- per-process utilisation samples carry a microsecond clock and only samples newer than the
  caller's ``since_us`` come back, like ``nvmlDeviceGetProcessUtilization``;
- ``physical_fields`` answers a GPU's gauges in one call (the simulator reads every GPU of a fleet
  each tick), with exactly what the per-field methods answer.

Everything is mutable: the simulator changes utilisation, memory and processes between samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from producers.agent.nvml_api import (
    Clock,
    Device,
    MemoryInfo,
    NvmlError,
    NvmlGpuLost,
    NvmlNotSupported,
    NvmlUnavailable,
    PhysicalFields,
    ProcessInfo,
    ProcessUtilSample,
    Utilization,
    XidRecord,
    read_physical,
)

FIELDS = (
    "name",
    "memory",
    "utilization",
    "power_w",
    "temperature_c",
    "clock_mhz",
    "pcie_throughput_bytes_per_s",
    "nvlink_bytes_total",
    "compute_processes",
    "process_utilization",
    "mig_enabled",
)
"""Field names accepted in ``FakeGpu.unsupported`` / ``FakeGpu.failing`` (the backend method names)."""

_PHYSICAL_ORDER = ("name", "memory", "utilization", "power_w", "temperature_c", "sm_clock_mhz", "mem_clock_mhz",
                   "pcie_bytes_per_s", "nvlink_bytes_total", "mig_enabled", "processes", "process_samples")
"""The order :meth:`FakeNvml.physical_fields` passes :class:`PhysicalFields`' fields in (positionally)."""
if tuple(f.name for f in fields(PhysicalFields))[:len(_PHYSICAL_ORDER)] != _PHYSICAL_ORDER:
    raise ImportError("PhysicalFields' fields were reordered: update fake_nvml._PHYSICAL_ORDER and physical_fields")


@dataclass
class FakeProcess:
    pid: int
    used_gpu_memory_bytes: int | None = None
    sm_util_pct: float | None = None
    """None: this process has no utilisation sample (idle, or the GPU does not report it)."""
    mem_util_pct: float = 0.0


@dataclass
class FakeMigDevice:
    uuid: str
    profile: str = "1g.10gb"
    gpu_instance_id: int = 0
    compute_instance_id: int = 0
    mem_total_bytes: int = 10 * 2**30
    mem_used_bytes: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    parent: FakeGpu | None = field(default=None, repr=False, compare=False)
    placement_start: int | None = None
    """The GPU instance's first memory slice; None: NVML does not tell (as for an unprivileged agent)."""


@dataclass
class FakeGpu:
    uuid: str
    index: int
    model: str = "NVIDIA H100 80GB HBM3"
    mem_total_bytes: int = 80 * 2**30
    gpu_util_pct: float = 0.0
    mem_util_pct: float = 0.0
    mem_used_bytes: int = 0
    power_w: float = 70.0
    temperature_c: float = 35.0
    processes: list[FakeProcess] = field(default_factory=list)
    lost: bool = False
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    pcie_tx_bytes_per_s: float = 0.0
    pcie_rx_bytes_per_s: float = 0.0
    nvlink_tx_bytes_total: int = 0
    nvlink_rx_bytes_total: int = 0
    mig_devices: list[FakeMigDevice] = field(default_factory=list)
    """Non-empty means MIG mode is enabled with these devices."""
    unsupported: set[str] = field(default_factory=set)
    """Fields (see :data:`FIELDS`) that raise NotSupported on this GPU."""
    failing: dict[str, str] = field(default_factory=dict)
    """Fields that raise a generic NVML error of the given kind (e.g. ``{"power_w": "unknown"}``)."""

    @property
    def mig_mode(self) -> bool:
        return bool(self.mig_devices)


class FakeNvml:
    """An in-memory NVML with the semantics of the real library (see module docstring)."""

    def __init__(
        self, gpus: list[FakeGpu], driver_version: str = "550.54.15", cuda_driver_version: str = "12.4"
    ) -> None:
        self.gpus = gpus
        self.driver = driver_version
        self.cuda = cuda_driver_version
        self.initialised = False
        self.init_failures = 0
        """The next ``init_failures`` calls to ``init`` fail (driver not loaded yet)."""
        self.init_calls = 0
        self.shutdown_calls = 0
        self.driver_gone = False
        """True: every call fails as if the driver was unloaded (NVML must be re-initialised)."""
        self._xids: list[XidRecord] = []
        self._clock_us = 1_000_000

    # -- fault injection

    def inject_xid(self, gpu_uuid: str, xid: int) -> None:
        self._xids.append(XidRecord(gpu_uuid=gpu_uuid, xid=xid))

    def gpu(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise KeyError(uuid)

    # -- lifecycle

    def init(self) -> None:
        self.init_calls += 1
        if self.init_failures > 0:
            self.init_failures -= 1
            raise NvmlUnavailable("Driver Not Loaded", kind="driver_not_loaded")
        self.initialised = True
        self.driver_gone = False

    def shutdown(self) -> None:
        self.shutdown_calls += 1
        self.initialised = False

    def _ready(self) -> None:
        if not self.initialised:
            raise NvmlUnavailable("Uninitialized: call init() first, as with nvmlInit()", kind="uninitialized")
        if self.driver_gone:
            raise NvmlUnavailable("Driver Not Loaded", kind="driver_not_loaded")

    def _gpu_of(self, device: Device) -> FakeGpu:
        if not self.initialised or self.driver_gone:
            self._ready()
        gpu = device.parent if isinstance(device, FakeMigDevice) else device
        assert isinstance(gpu, FakeGpu), f"not a fake device handle: {device!r}"
        if gpu.lost:
            raise NvmlGpuLost("GPU is lost")
        return gpu

    def _check(self, device: Device, name: str, physical_only: bool = False) -> FakeGpu:
        """The device's GPU, after the errors NVML gives for field ``name`` in this order: not
        initialised, GPU lost, unsupported, injected failure, and (``physical_only``) a MIG device.
        The simulator reads every field of every GPU each tick: this is one call, not four."""
        if not self.initialised or self.driver_gone:
            self._ready()
        mig = isinstance(device, FakeMigDevice)
        gpu = device.parent if mig else device
        assert isinstance(gpu, FakeGpu), f"not a fake device handle: {device!r}"
        if gpu.lost:
            raise NvmlGpuLost("GPU is lost")
        if gpu.unsupported and name in gpu.unsupported:
            raise NvmlNotSupported("Not Supported")
        if gpu.failing and name in gpu.failing:
            raise NvmlError(f"injected {gpu.failing[name]} error", kind=gpu.failing[name])
        if physical_only and mig:
            raise NvmlNotSupported("Not Supported")
        return gpu

    # -- system

    def driver_version(self) -> str:
        self._ready()
        return self.driver

    def cuda_driver_version(self) -> str:
        self._ready()
        return self.cuda

    def device_count(self) -> int:
        self._ready()
        return len(self.gpus)

    def device_by_index(self, index: int) -> Device:
        if not self.initialised or self.driver_gone:
            self._ready()
        for gpu in self.gpus:
            if gpu.index == index:
                for mig in gpu.mig_devices:
                    mig.parent = gpu
                return gpu
        raise NvmlError(f"no GPU with index {index}", kind="invalid_argument")

    def drain_xids(self) -> list[XidRecord]:
        records, self._xids = self._xids, []
        return records

    # -- per device

    def uuid(self, device: Device) -> str:
        # what _gpu_of checks, in one expression for a physical GPU that answers (the common case)
        if type(device) is not FakeGpu or device.lost or not self.initialised or self.driver_gone:
            self._gpu_of(device)  # raises what NVML raises for it, if anything
        return str(device.uuid)

    def name(self, device: Device) -> str:
        gpu = self._check(device, "name")
        if isinstance(device, FakeMigDevice):
            return f"{gpu.model} MIG {device.profile}"
        return gpu.model

    def memory(self, device: Device) -> MemoryInfo:
        self._check(device, "memory")
        if isinstance(device, FakeMigDevice):
            return MemoryInfo(device.mem_total_bytes, device.mem_used_bytes)
        return self._physical_memory(device)

    @staticmethod
    def _physical_memory(gpu: FakeGpu) -> MemoryInfo:
        if gpu.mig_mode:  # the parent reports the sum over its MIG devices
            return MemoryInfo(gpu.mem_total_bytes, sum(m.mem_used_bytes for m in gpu.mig_devices))
        return MemoryInfo(gpu.mem_total_bytes, gpu.mem_used_bytes)

    def utilization(self, device: Device) -> Utilization:
        gpu = self._check(device, "utilization", physical_only=True)
        if gpu.mig_mode:
            raise NvmlNotSupported("Not Supported")
        return Utilization(gpu.gpu_util_pct, gpu.mem_util_pct)

    def power_w(self, device: Device) -> float:
        gpu = self._check(device, "power_w", physical_only=True)
        return gpu.power_w

    def temperature_c(self, device: Device) -> float:
        gpu = self._check(device, "temperature_c", physical_only=True)
        return gpu.temperature_c

    def clock_mhz(self, device: Device, clock: Clock) -> int:
        gpu = self._check(device, "clock_mhz", physical_only=True)
        return gpu.sm_clock_mhz if clock == "sm" else gpu.mem_clock_mhz

    def pcie_throughput_bytes_per_s(self, device: Device) -> tuple[float, float]:
        gpu = self._check(device, "pcie_throughput_bytes_per_s", physical_only=True)
        return gpu.pcie_tx_bytes_per_s, gpu.pcie_rx_bytes_per_s

    def nvlink_bytes_total(self, device: Device) -> tuple[int, int]:
        gpu = self._check(device, "nvlink_bytes_total", physical_only=True)
        return gpu.nvlink_tx_bytes_total, gpu.nvlink_rx_bytes_total

    def compute_processes(self, device: Device) -> list[ProcessInfo]:
        gpu = self._check(device, "compute_processes")
        if isinstance(device, FakeMigDevice):
            return [
                ProcessInfo(p.pid, p.used_gpu_memory_bytes, device.gpu_instance_id, device.compute_instance_id)
                for p in device.processes
            ]
        if gpu.mig_mode:
            return []
        return self._processes(gpu)

    @staticmethod
    def _processes(gpu: FakeGpu) -> list[ProcessInfo]:
        return [ProcessInfo(p.pid, p.used_gpu_memory_bytes, None, None) for p in gpu.processes]

    def process_utilization(self, device: Device, since_us: int) -> list[ProcessUtilSample]:
        gpu = self._check(device, "process_utilization", physical_only=True)
        if gpu.mig_mode:
            raise NvmlNotSupported("Not Supported")
        return self._process_samples(gpu, since_us)

    def _process_samples(self, gpu: FakeGpu, since_us: int) -> list[ProcessUtilSample]:
        self._clock_us += 1_000_000
        if self._clock_us <= since_us:
            return []
        return [
            ProcessUtilSample(p.pid, self._clock_us, p.sm_util_pct, p.mem_util_pct)
            for p in gpu.processes
            if p.sm_util_pct is not None
        ]

    def physical_fields(self, device: Device, since_us: int) -> PhysicalFields:
        """What :func:`read_physical` gives through the per-field methods, in one call when no field of
        the GPU is unsupported or failing (the per-field methods then give each field's error)."""
        answers = type(device) is FakeGpu and not device.lost and self.initialised and not self.driver_gone
        gpu = device if answers else self._gpu_of(device)  # _gpu_of's checks, in one expression where they pass
        if gpu.unsupported or gpu.failing or device is not gpu:
            return read_physical(self, device, since_us)
        # positional, in _PHYSICAL_ORDER (checked at import): keywords triple the cost of making the record
        if gpu.mig_devices:
            return PhysicalFields(
                gpu.model, self._physical_memory(gpu), None, gpu.power_w, gpu.temperature_c,
                gpu.sm_clock_mhz, gpu.mem_clock_mhz, (gpu.pcie_tx_bytes_per_s, gpu.pcie_rx_bytes_per_s),
                (gpu.nvlink_tx_bytes_total, gpu.nvlink_rx_bytes_total), True, None, None,
            )
        processes = [ProcessInfo(p.pid, p.used_gpu_memory_bytes, None, None) for p in gpu.processes]
        return PhysicalFields(
            gpu.model, MemoryInfo(gpu.mem_total_bytes, gpu.mem_used_bytes),
            Utilization(gpu.gpu_util_pct, gpu.mem_util_pct), gpu.power_w, gpu.temperature_c,
            gpu.sm_clock_mhz, gpu.mem_clock_mhz, (gpu.pcie_tx_bytes_per_s, gpu.pcie_rx_bytes_per_s),
            (gpu.nvlink_tx_bytes_total, gpu.nvlink_rx_bytes_total), False,
            processes, self._process_samples(gpu, since_us) if processes else None,
        )

    def mig_enabled(self, device: Device) -> bool:
        gpu = self._check(device, "mig_enabled", physical_only=True)
        return gpu.mig_mode

    def mig_devices(self, device: Device) -> list[Device]:
        gpu = self._gpu_of(device)
        for mig in gpu.mig_devices:
            mig.parent = gpu
        return list(gpu.mig_devices)

    def mig_instance_ids(self, mig_device: Device) -> tuple[int, int]:
        self._gpu_of(mig_device)
        if not isinstance(mig_device, FakeMigDevice):
            raise NvmlError("not a MIG device", kind="invalid_argument")
        return mig_device.gpu_instance_id, mig_device.compute_instance_id

    def mig_placement_start(self, mig_device: Device) -> int:
        self._gpu_of(mig_device)
        if not isinstance(mig_device, FakeMigDevice):
            raise NvmlError("not a MIG device", kind="invalid_argument")
        if mig_device.placement_start is None:
            raise NvmlNotSupported("GPU instance placement not readable")
        return mig_device.placement_start
