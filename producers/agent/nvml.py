"""The NVML adapter: the only module that imports pynvml (nvidia-ml-py).

Why an interface this fine-grained: NVML answers field by field, and any single field can be
unsupported on a given GPU or mode (utilisation under MIG is the known case), a GPU can fall off
the bus between two calls, and the whole library can go away (driver reload). The sampler must
keep every answer it can get, so it asks one field at a time and decides what each failure means.
:class:`NvmlBackend` therefore mirrors the NVML calls the sampler needs, with pynvml's error
classes translated into the few that matter here (:class:`NvmlNotSupported`,
:class:`NvmlGpuLost`, :class:`NvmlUnavailable`, ...). :class:`PynvmlBackend` is the real thing;
``fake_nvml.FakeNvml`` behaves the same way without a GPU.

Driver generations differ in the calls they export (R470 has no ``_v2``/``_v3`` process list, R550+
has ``nvmlDeviceGetRunningProcessDetailList``): a call the driver lacks is
:class:`NvmlFunctionNotFound`, a kind of "not supported" for that one field, and the process list
falls back to the newest call the driver has, with that driver's struct layout (docs/agent.md).

XID errors arrive through an NVML event set; :class:`PynvmlBackend` waits on it on a background
thread (so an event is timestamped when it happens, not when the next sample is taken) and keeps
a bounded buffer that :meth:`NvmlBackend.drain_xids` empties once per sample.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, TypeVar

import pynvml

from common.logs import get_logger
from producers.agent.nvml_api import (
    Clock,
    Device,
    MemoryInfo,
    NvmlError,
    NvmlFunctionNotFound,
    NvmlGpuLost,
    NvmlLibraryNotFound,
    NvmlNoPermission,
    NvmlNotSupported,
    NvmlUnavailable,
    ProcessInfo,
    ProcessUtilSample,
    Utilization,
    XidRecord,
)

log = get_logger(__name__)


# --------------------------------------------------------------------------- errors


# --------------------------------------------------------------------------- plain records


# --------------------------------------------------------------------------- the real backend

_T = TypeVar("_T")

_UNAVAILABLE_CODES = {
    pynvml.NVML_ERROR_UNINITIALIZED: "uninitialized",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver_version_mismatch",
}

_VERSION_MISMATCH = "argument_version_mismatch"
"""A versioned call was given a struct version this driver does not take."""

_KIND_BY_CODE = {
    pynvml.NVML_ERROR_TIMEOUT: "timeout",
    pynvml.NVML_ERROR_NOT_FOUND: "not_found",
    pynvml.NVML_ERROR_INSUFFICIENT_POWER: "insufficient_power",
    pynvml.NVML_ERROR_IRQ_ISSUE: "irq_issue",
    pynvml.NVML_ERROR_CORRUPTED_INFOROM: "corrupted_inforom",
    pynvml.NVML_ERROR_RESET_REQUIRED: "reset_required",
    pynvml.NVML_ERROR_MEMORY: "memory",
    pynvml.NVML_ERROR_UNKNOWN: "unknown",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "invalid_argument",
    getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25): _VERSION_MISMATCH,
}

_NVLINK_ALL_LINKS = 0xFFFFFFFF
"""Field-value scope id meaning "summed over every link" for the NVLink throughput counters."""
_NO_INSTANCE = 0xFFFFFFFF
_MEMORY_V2 = "nvmlDeviceGetMemoryInfo_v2"
_MEMORY_V2_VERSION: int = getattr(pynvml, "nvmlMemory_v2", 0x02000028)
"""``sizeof(nvmlMemory_v2_t) | 2 << 24``, as NVML's header defines it (pynvml names it from 11.510)."""


def translate(exc: pynvml.NVMLError) -> NvmlError:
    """Map a pynvml error to the adapter's error classes."""
    code = getattr(exc, "value", None)
    text = str(exc)
    if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
        return NvmlNotSupported(text)
    if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
        return NvmlFunctionNotFound(text)
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        return NvmlGpuLost(text)
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return NvmlNoPermission(text)
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return NvmlLibraryNotFound(text)
    if code in _UNAVAILABLE_CODES:
        return NvmlUnavailable(text, kind=_UNAVAILABLE_CODES[code])
    return NvmlError(text, kind=_KIND_BY_CODE.get(code, "unknown"))


_LibraryMismatch: type[Exception] = getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError)
"""What pynvml raises (a plain ``Exception``) when an unversioned wrapper's newest symbol is missing."""


@contextmanager
def _nvml_errors() -> Iterator[None]:
    try:
        yield
    except pynvml.NVMLError as exc:
        raise translate(exc) from None
    except _LibraryMismatch as exc:
        raise NvmlFunctionNotFound(str(exc)) from None


def _call(func: Callable[..., _T], *args: Any) -> _T:
    with _nvml_errors():
        return func(*args)


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t: the unversioned call, every driver (the only one up to R470)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t (R510-R530, and ``_v3`` outside 535.43-535.97)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessInfoV3Cc(ctypes.Structure):
    """nvmlProcessInfo_v3_t of 535.43-535.97, which is also nvmlProcessDetail_v1_t (R550+)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
        ("usedGpuCcProtectedMemory", ctypes.c_ulonglong),
    ]


class _ProcessDetailList(ctypes.Structure):
    """nvmlProcessDetailList_v1_t for nvmlDeviceGetRunningProcessDetailList."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("mode", ctypes.c_uint),
        ("numProcArrayEntries", ctypes.c_uint),
        ("procArray", ctypes.POINTER(_ProcessInfoV3Cc)),
    ]


_DETAIL_LIST = "nvmlDeviceGetRunningProcessDetailList"
_PROCESS_CALLS = (
    _DETAIL_LIST,
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
"""Newest first; the first one the driver exports answers."""
_PROCESS_DETAIL_LIST_V1 = ctypes.sizeof(_ProcessDetailList) | (1 << 24)
_PROCESS_MODE_COMPUTE = 0
_NOT_AVAILABLE_ULL = 2**64 - 1


def _v3_has_cc_memory(driver: str) -> bool:
    """535.43 to 535.97 filled ``_v3`` with the 32-byte struct (``usedGpuCcProtectedMemory``)."""
    parts = driver.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return False
    return major == 535 and 43 <= minor < 98


def _process_info(raw: Any) -> ProcessInfo:
    gi = getattr(raw, "gpuInstanceId", _NO_INSTANCE)
    ci = getattr(raw, "computeInstanceId", _NO_INSTANCE)
    used = int(raw.usedGpuMemory)
    return ProcessInfo(
        pid=int(raw.pid),
        used_memory_bytes=None if used == _NOT_AVAILABLE_ULL else used,
        gpu_instance_id=None if gi == _NO_INSTANCE else int(gi),
        compute_instance_id=None if ci == _NO_INSTANCE else int(ci),
    )


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def format_cuda_version(version: int) -> str:
    """NVML encodes the CUDA driver version as 1000*major + 10*minor (12040 -> "12.4")."""
    return f"{version // 1000}.{(version % 1000) // 10}"


class PynvmlBackend:
    """NVML through pynvml, with XID events collected on a background thread."""

    XID_BUFFER = 1024

    def __init__(self, xid_wait_ms: int = 500, library_path: str | None = None) -> None:
        self._xid_wait_ms = xid_wait_ms
        self._library_path = library_path
        self._missing: set[str] = set()
        self._uuids: dict[int | None, str] = {}
        self._v3_struct: type[ctypes.Structure] | None = None
        self._xids: deque[XidRecord] = deque(maxlen=self.XID_BUFFER)
        self._xid_lock = threading.Lock()
        self._xid_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._event_set: Any = None
        self._initialised = False

    # -- lifecycle

    def init(self) -> None:
        self._missing.clear()
        self._uuids.clear()
        self._v3_struct = None
        if self._library_path is not None:
            self._load_library(self._library_path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            err = translate(exc)
            if isinstance(err, NvmlLibraryNotFound):
                raise NvmlLibraryNotFound(
                    "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver is visible to this "
                    "process. Run the agent on a GPU node with the NVIDIA container runtime, or use "
                    "--simulate."
                ) from None
            if isinstance(err, NvmlUnavailable):
                raise err from None
            raise NvmlUnavailable(str(err), kind=err.kind) from None
        except OSError as exc:  # a broken library file
            raise NvmlUnavailable(f"cannot load NVML: {exc}", kind="library_not_found") from None
        self._initialised = True
        self._start_xid_watch()

    @staticmethod
    def _load_library(path: str) -> None:
        """Use the NVML library at ``path`` instead of the ``libnvidia-ml.so.1`` on the loader's path."""
        try:
            library = ctypes.CDLL(path)
        except OSError as exc:
            raise NvmlLibraryNotFound(f"cannot load NVML from {path}: {exc}") from None
        with pynvml.libLoadLock:
            pynvml.nvmlLib = library
            pynvml._nvmlGetFunctionPointer_cache.clear()

    def shutdown(self) -> None:
        self._stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=self._xid_wait_ms / 1000 + 2)
            self._xid_thread = None
        if self._event_set is not None:
            with suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        if self._initialised:
            with suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            self._initialised = False

    def _start_xid_watch(self) -> None:
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
            registered = 0
            for index in range(pynvml.nvmlDeviceGetCount()):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
                    registered += 1
                except pynvml.NVMLError as exc:
                    log.warning("xid events unavailable for gpu", index=index, error=str(exc))
        except pynvml.NVMLError as exc:
            log.warning("xid event set unavailable", error=str(exc))
            return
        if not registered:
            return
        self._stop.clear()
        self._xid_thread = threading.Thread(target=self._watch_xids, name="nvml-xid", daemon=True)
        self._xid_thread.start()

    def _watch_xids(self) -> None:
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, self._xid_wait_ms)
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("xid event wait failed", error=str(exc))
                self._stop.wait(1.0)
                continue
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            uuid = self._uuids.get(_address(data.device))  # a GPU that fell off the bus no longer answers
            if uuid is None:
                with suppress(pynvml.NVMLError):
                    uuid = str(pynvml.nvmlDeviceGetUUID(data.device))
            record = XidRecord(
                gpu_uuid=uuid,
                xid=int(data.eventData),
                at=datetime.now(UTC),
                gpu_instance_id=None if data.gpuInstanceId == _NO_INSTANCE else int(data.gpuInstanceId),
                compute_instance_id=None if data.computeInstanceId == _NO_INSTANCE else int(data.computeInstanceId),
            )
            with self._xid_lock:
                self._xids.append(record)

    def drain_xids(self) -> list[XidRecord]:
        with self._xid_lock:
            records = list(self._xids)
            self._xids.clear()
        return records

    # -- system

    def driver_version(self) -> str:
        return str(_call(pynvml.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> str:
        return format_cuda_version(int(_call(pynvml.nvmlSystemGetCudaDriverVersion_v2)))

    def device_count(self) -> int:
        return int(_call(pynvml.nvmlDeviceGetCount))

    def device_by_index(self, index: int) -> Device:
        return _call(pynvml.nvmlDeviceGetHandleByIndex, index)

    # -- per device

    def uuid(self, device: Device) -> str:
        value = str(_call(pynvml.nvmlDeviceGetUUID, device))
        self._uuids[_address(device)] = value
        return value

    def name(self, device: Device) -> str:
        return str(_call(pynvml.nvmlDeviceGetName, device))

    def memory(self, device: Device) -> MemoryInfo:
        """Used memory as nvidia-smi shows it: without what the driver reserves for itself.

        The unversioned call counts the driver's reservation as used (616 MiB on an idle H200 with
        580.159.04, where nvidia-smi showed 0 MiB used); ``_v2`` (R510+) reports it apart. Older
        drivers, or a device ``_v2`` does not support, get the unversioned figure.
        """
        if _MEMORY_V2 not in self._missing:
            try:
                info = _call(pynvml.nvmlDeviceGetMemoryInfo, device, _MEMORY_V2_VERSION)
                return MemoryInfo(total_bytes=int(info.total), used_bytes=int(info.used))
            except NvmlError as exc:
                if isinstance(exc, NvmlFunctionNotFound) or exc.kind == _VERSION_MISMATCH:
                    self._missing.add(_MEMORY_V2)  # not in this driver, or another struct: never asked again
                elif not isinstance(exc, NvmlNotSupported):  # not on this device: asked again for the next
                    raise
        info = _call(pynvml.nvmlDeviceGetMemoryInfo, device)
        return MemoryInfo(total_bytes=int(info.total), used_bytes=int(info.used))

    def utilization(self, device: Device) -> Utilization:
        rates = _call(pynvml.nvmlDeviceGetUtilizationRates, device)
        return Utilization(gpu_pct=float(rates.gpu), mem_pct=float(rates.memory))

    def power_w(self, device: Device) -> float:
        return int(_call(pynvml.nvmlDeviceGetPowerUsage, device)) / 1000.0  # milliwatts

    def temperature_c(self, device: Device) -> float:
        return float(_call(pynvml.nvmlDeviceGetTemperature, device, pynvml.NVML_TEMPERATURE_GPU))

    def clock_mhz(self, device: Device, clock: Clock) -> int:
        kind = pynvml.NVML_CLOCK_SM if clock == "sm" else pynvml.NVML_CLOCK_MEM
        return int(_call(pynvml.nvmlDeviceGetClockInfo, device, kind))

    def pcie_throughput_bytes_per_s(self, device: Device) -> tuple[float, float]:
        tx_kb = _call(pynvml.nvmlDeviceGetPcieThroughput, device, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx_kb = _call(pynvml.nvmlDeviceGetPcieThroughput, device, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        return float(tx_kb) * 1024.0, float(rx_kb) * 1024.0  # NVML reports KB/s

    def nvlink_bytes_total(self, device: Device) -> tuple[int, int]:
        fields = [
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _NVLINK_ALL_LINKS),
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _NVLINK_ALL_LINKS),
        ]
        values = _call(pynvml.nvmlDeviceGetFieldValues, device, fields)
        out: list[int] = []
        for value in values:
            if value.nvmlReturn != pynvml.NVML_SUCCESS:
                raise translate(pynvml.NVMLError(value.nvmlReturn))
            out.append(int(value.value.ullVal) * 1024)  # KiB counters
        return out[0], out[1]

    def compute_processes(self, device: Device) -> list[ProcessInfo]:
        """Compute processes through the newest call this driver has (detail list, v3, v2, v1).

        The structs are this module's own, chosen per call and driver version, rather than
        pynvml's: pynvml's unversioned wrapper calls only ``_v3`` (an older driver then fails the
        whole field) and its struct for ``_v3`` follows one driver release, not the node's.
        """
        for symbol in _PROCESS_CALLS:
            if symbol in self._missing:
                continue
            try:
                if symbol == _DETAIL_LIST:
                    return self._process_detail_list(device)
                return self._process_array(device, symbol, self._process_struct(symbol))
            except NvmlFunctionNotFound:
                self._missing.add(symbol)
        raise NvmlFunctionNotFound("this driver has no running-processes call")

    def _process_struct(self, symbol: str) -> type[ctypes.Structure]:
        if symbol.endswith("_v3"):
            if self._v3_struct is None:
                self._v3_struct = _ProcessInfoV3Cc if _v3_has_cc_memory(self.driver_version()) else _ProcessInfoV2
            return self._v3_struct
        return _ProcessInfoV2 if symbol.endswith("_v2") else _ProcessInfoV1

    def _process_array(self, device: Device, symbol: str, struct: type[ctypes.Structure]) -> list[ProcessInfo]:
        fn = _call(pynvml._nvmlGetFunctionPointer, symbol)
        count = ctypes.c_uint(0)
        ret = fn(device, ctypes.byref(count), None)
        if ret == pynvml.NVML_SUCCESS:
            return []
        if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise translate(pynvml.NVMLError(ret))
        count.value = count.value * 2 + 5  # processes may start between the two calls
        array = (struct * count.value)()
        ret = fn(device, ctypes.byref(count), array)
        if ret != pynvml.NVML_SUCCESS:
            raise translate(pynvml.NVMLError(ret))
        return [_process_info(array[i]) for i in range(count.value)]

    def _process_detail_list(self, device: Device) -> list[ProcessInfo]:
        fn = _call(pynvml._nvmlGetFunctionPointer, _DETAIL_LIST)
        listing = _ProcessDetailList(version=_PROCESS_DETAIL_LIST_V1, mode=_PROCESS_MODE_COMPUTE)
        ret = fn(device, ctypes.byref(listing))
        if ret == pynvml.NVML_SUCCESS:
            return []
        if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise translate(pynvml.NVMLError(ret))
        listing.numProcArrayEntries = listing.numProcArrayEntries * 2 + 5
        array = (_ProcessInfoV3Cc * listing.numProcArrayEntries)()
        listing.procArray = ctypes.cast(array, ctypes.POINTER(_ProcessInfoV3Cc))
        ret = fn(device, ctypes.byref(listing))
        if ret != pynvml.NVML_SUCCESS:
            raise translate(pynvml.NVMLError(ret))
        return [_process_info(array[i]) for i in range(listing.numProcArrayEntries)]

    def process_utilization(self, device: Device, since_us: int) -> list[ProcessUtilSample]:
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(device, since_us)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) == pynvml.NVML_ERROR_NOT_FOUND:
                return []  # no sample newer than since_us: nothing ran
            raise translate(exc) from None
        return [
            ProcessUtilSample(
                pid=int(s.pid),
                timestamp_us=int(s.timeStamp),
                sm_util_pct=float(s.smUtil),
                mem_util_pct=float(s.memUtil),
            )
            for s in samples
        ]

    def mig_enabled(self, device: Device) -> bool:
        current, _pending = _call(pynvml.nvmlDeviceGetMigMode, device)
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def mig_devices(self, device: Device) -> list[Device]:
        count = int(_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, device))
        found = []
        for index in range(count):
            try:
                found.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, index))
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) == pynvml.NVML_ERROR_NOT_FOUND:
                    continue  # an unused slot
                raise translate(exc) from None
        return found

    def mig_instance_ids(self, mig_device: Device) -> tuple[int, int]:
        gi = int(_call(pynvml.nvmlDeviceGetGpuInstanceId, mig_device))
        ci = int(_call(pynvml.nvmlDeviceGetComputeInstanceId, mig_device))
        return gi, ci

    def mig_placement_start(self, mig_device: Device) -> int:
        try:
            parent = _call(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, mig_device)
            gi_id = int(_call(pynvml.nvmlDeviceGetGpuInstanceId, mig_device))
            instance = _call(pynvml.nvmlDeviceGetGpuInstanceById, parent, gi_id)
            return int(_call(pynvml.nvmlGpuInstanceGetInfo, instance).placement.start)
        except NvmlNoPermission as exc:
            # an unprivileged agent cannot open GPU instances: the placement is absent, not an error
            raise NvmlNotSupported(str(exc)) from None
