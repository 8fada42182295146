"""The real NVML adapter (``PynvmlBackend``) through the real pynvml against a fake libnvidia-ml.so.1.

Every driver generation from R470 on: the values a user sees in a sample come out of the C
library's structs unchanged, processes are listed through whichever call the driver has (with
that driver's struct layout), missing calls and NOT_SUPPORTED fields leave the field absent and
the GPU healthy, a GPU that falls off the bus mid-run is reported lost while the others keep
flowing, and XID 79 reaches the sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pynvml
import pytest

from producers.agent.cgroup import StaticProcessResolver
from producers.agent.fake_kubelet import StaticPodResources
from producers.agent.nvml import PynvmlBackend, _call
from producers.agent.nvml_api import NvmlFunctionNotFound, NvmlLibraryNotFound, NvmlUnavailable
from producers.agent.sampler import NodeSampler
from producers.agent.service import AgentMetrics, AgentService
from schemas.messages import GpuSample
from tests.agent.fakenvml import (
    GIB,
    LIBRARY_NAME,
    MIB,
    VARIANTS,
    Gpu,
    Node,
    Process,
    Xid,
    build,
    gpu_uuid,
    mig_uuid,
    standard_node,
)
from tests.agent.helpers import T0

Start = Callable[[Node], PynvmlBackend]


@pytest.fixture
def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Start]:
    """Load ``node``'s library into pynvml and initialise a backend over it (shut down after)."""
    started: list[PynvmlBackend] = []

    def _start(node: Node) -> PynvmlBackend:
        monkeypatch.setenv("FAKE_NVML_CONFIG", str(node.write(tmp_path / f"node-{len(started)}.conf")))
        backend = PynvmlBackend(xid_wait_ms=20, library_path=str(build(node.variant) / LIBRARY_NAME))
        backend.init()
        started.append(backend)
        return backend

    yield _start
    for backend in started:
        backend.shutdown()


def sampler_over(backend: PynvmlBackend, errors: list[str] | None = None) -> NodeSampler:
    return NodeSampler("node-a", backend, StaticPodResources({}), StaticProcessResolver({}), "boot", 10.0,
                       on_nvml_error=errors.append if errors is not None else None)


def by_uuid(sample: GpuSample) -> dict[str, object]:
    return {g.uuid: g for g in sample.gpus}


@pytest.mark.parametrize("name", VARIANTS)
def test_every_driver_generation_yields_a_full_sample(start: Start, name: str) -> None:
    variant = VARIANTS[name]
    node = standard_node(variant)
    errors: list[str] = []
    sampler = sampler_over(start(node), errors)
    first = sampler.sample(T0)
    second = sampler.sample(T0 + timedelta(seconds=10))

    assert first.errors == [] and errors == []
    assert first.driver_version == variant.driver
    assert first.cuda_driver_version == f"{variant.cuda // 1000}.{variant.cuda % 1000 // 10}"
    gpus = {g.uuid: g for g in second.gpus}
    a100 = gpus[gpu_uuid(0)]
    assert a100.model == "NVIDIA A100-SXM4-80GB" and a100.health == "ok"
    # used as nvidia-smi shows it, without the driver's 616 MiB; R470 has no call that leaves it out
    reserved = 616 * MIB if variant.name == "r470" else 0
    assert (a100.mem_total_bytes, a100.mem_used_bytes) == (80 * GIB, 10 * GIB + reserved)
    assert (a100.gpu_util_pct, a100.mem_util_pct) == (50.0, 20.0)
    assert (a100.power_w, a100.temperature_c, a100.sm_clock_mhz, a100.mem_clock_mhz) == (250.0, 55.0, 1410, 1593)
    assert (a100.pcie_tx_bytes_per_s, a100.pcie_rx_bytes_per_s) == (1000 * 1024.0, 2000 * 1024.0)
    assert (a100.nvlink_tx_bytes_per_s, a100.nvlink_rx_bytes_per_s) == (0.0, 0.0)  # constant counters
    # two processes per GPU: a wrong struct stride would garble the second one
    assert [(p.pid, p.mem_used_bytes, p.sm_util_pct) for p in a100.processes] == [
        (1101, 3 * GIB, 40.0), (1102, 5 * GIB, 10.0)]
    t4 = gpus[gpu_uuid(1)]
    assert t4.model == "Tesla T4" and t4.health == "ok"
    assert t4.nvlink_tx_bytes_per_s is None  # NOT_SUPPORTED on a PCIe card: absent, not an error
    assert [(p.pid, p.mem_used_bytes) for p in t4.processes] == [(1201, 2 * GIB), (1202, None)]
    if variant.name in ("r550", "r580"):
        h100 = gpus[gpu_uuid(2)]
        assert h100.processes == [] and h100.health == "ok"
        slices = {g.uuid: g for g in second.gpus if g.mig_parent_uuid == gpu_uuid(2)}
        assert set(slices) == {mig_uuid(1), mig_uuid(2)}
        big = slices[mig_uuid(1)]
        assert (big.mig_profile, big.gpu_instance_id, big.compute_instance_id) == ("3g.40gb", 1, 0)
        assert (big.mem_total_bytes, big.mem_used_bytes) == (40 * GIB, 12 * GIB)
        assert big.gpu_util_pct is None  # NVML has no utilisation for a MIG device
        assert [(p.pid, p.mem_used_bytes) for p in big.processes] == [(1301, 11 * GIB)]
        assert [p.pid for p in slices[mig_uuid(2)].processes] == [1302]
        # the GPU instance's placement (parent handle -> GPU instance by id -> its info); an agent
        # without the privilege to open GPU instances reports none, and that is no error
        assert big.mig_placement_start == 4
        assert slices[mig_uuid(2)].mig_placement_start is None
        assert not [e for e in second.errors if "placement" in e]
    else:
        assert all(g.mig_parent_uuid is None for g in second.gpus)


@pytest.mark.parametrize("name", VARIANTS)
def test_processes_come_from_the_newest_call_the_driver_has(start: Start, name: str) -> None:
    variant = VARIANTS[name]
    backend = start(standard_node(variant))
    handle = backend.device_by_index(0)
    procs = backend.compute_processes(handle)
    assert [(p.pid, p.used_memory_bytes) for p in procs] == [(1101, 3 * GIB), (1102, 5 * GIB)]
    newer = [c for c in ("nvmlDeviceGetRunningProcessDetailList", "nvmlDeviceGetComputeRunningProcesses_v3",
                         "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses")]
    expected_missing = set(newer[: newer.index(variant.process_call)])
    assert backend._missing == expected_missing


def test_pynvmls_own_wrapper_fails_on_r470_and_the_adapter_calls_that_unsupported(start: Start) -> None:
    backend = start(standard_node(VARIANTS["r470"]))
    handle = backend.device_by_index(0)
    # routed to _v3, which R470 lacks: NVMLLibraryMismatchError (a plain Exception) from recent
    # nvidia-ml-py, FUNCTION_NOT_FOUND from 12.535.77; either way one unsupported field, not "NVML down"
    with pytest.raises(NvmlFunctionNotFound):
        _call(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
    assert [p.pid for p in backend.compute_processes(handle)] == [1101, 1102]


def test_not_supported_fields_are_absent_and_the_gpu_stays_healthy(start: Start) -> None:
    unsupported = ("power", "temperature", "clock", "pcie", "nvlink", "utilization", "process_utilization",
                   "events")
    node = Node(VARIANTS["r550"], [Gpu(gpu_uuid(0), unsupported=unsupported), Gpu(gpu_uuid(1))],
                processes=[Process(7, gpu_uuid(0), GIB, sm_pct=90)])
    errors: list[str] = []
    sample = sampler_over(start(node), errors).sample(T0)
    gpu = sample.gpus[0]
    assert gpu.health == "ok" and sample.errors == [] and errors == []
    assert gpu.mem_used_bytes == 10 * GIB
    for name in ("power_w", "temperature_c", "sm_clock_mhz", "mem_clock_mhz", "pcie_tx_bytes_per_s",
                 "nvlink_tx_bytes_per_s", "gpu_util_pct"):
        assert getattr(gpu, name) is None, name
    assert [(p.pid, p.mem_used_bytes, p.sm_util_pct) for p in gpu.processes] == [(7, GIB, None)]
    assert sample.gpus[1].power_w == 250.0


def test_used_memory_falls_back_to_the_unversioned_call_on_a_device_without_v2(start: Start) -> None:
    reserved = 616 * MIB
    node = Node(VARIANTS["r580"], [Gpu(gpu_uuid(0), mem_reserved=reserved, unsupported=("memory_v2",)),
                                   Gpu(gpu_uuid(1), mem_reserved=reserved)])
    backend = start(node)
    sampler = sampler_over(backend)
    for _ in range(2):  # a device without _v2 takes the unversioned figure; the others keep _v2
        used = [g.mem_used_bytes for g in sampler.sample(T0).gpus]
        assert used == [10 * GIB + reserved, 10 * GIB]
    assert "nvmlDeviceGetMemoryInfo_v2" not in backend._missing


def test_a_memory_struct_the_adapter_does_not_know_is_not_asked_for_again(start: Start) -> None:
    reserved = 616 * MIB
    mismatch = start(Node(VARIANTS["r580"], [Gpu(gpu_uuid(0), mem_reserved=reserved,
                                                 unsupported=("memory_v2_version",))]))
    errors: list[str] = []
    sample = sampler_over(mismatch, errors).sample(T0)
    assert sample.gpus[0].mem_used_bytes == 10 * GIB + reserved and sample.errors == [] and errors == []
    assert "nvmlDeviceGetMemoryInfo_v2" in mismatch._missing


def test_a_driver_without_any_process_call_still_samples(start: Start) -> None:
    node = Node(VARIANTS["r580"], [Gpu(gpu_uuid(0), unsupported=("processes",))],
                processes=[Process(7, gpu_uuid(0), GIB)])
    sample = sampler_over(start(node)).sample(T0)
    assert sample.gpus[0].health == "ok" and sample.gpus[0].processes == []
    assert sample.gpus[0].mem_used_bytes == 10 * GIB


@pytest.mark.parametrize("name", ["r470", "r550"])
def test_a_gpu_falling_off_the_bus_mid_run_is_lost_with_its_xid_79_and_the_others_keep_flowing(
    start: Start, name: str
) -> None:
    node = Node(VARIANTS[name], [Gpu(gpu_uuid(0), lost_after=3), Gpu(gpu_uuid(1))],
                processes=[Process(11, gpu_uuid(0), GIB), Process(12, gpu_uuid(1), 2 * GIB)],
                xids=[Xid(79, gpu_uuid(0), after=4)])
    backend = start(node)  # registering for XID events opens each handle once
    errors: list[str] = []
    sampler = sampler_over(backend, errors)
    metrics = AgentMetrics()
    ticks = iter(range(100))
    service = AgentService(sampler, _ListSink(), metrics, clock=lambda: T0.timestamp() + 10 * next(ticks))
    service.nvml_ready = True
    samples = [service.step() for _ in range(3)]
    # the event is raised while sample 3 opens the GPU; the XID thread delivers it to sample 3 or 4
    _wait_until(lambda: len(backend._xids) > 0 or any(g.xids for g in samples[2].gpus))  # type: ignore[union-attr]
    samples.append(service.step())
    assert all(s is not None for s in samples)
    healthy, falling, lost, after = (s for s in samples if s is not None)
    assert [g.health for g in healthy.gpus] == ["ok", "ok"]
    assert [g.health for g in falling.gpus] == ["ok", "ok"]
    for sample in (lost, after):
        gpu0, gpu1 = sample.gpus
        assert gpu0.uuid == gpu_uuid(0) and gpu0.health == "lost" and gpu0.model == "NVIDIA A100-SXM4-80GB"
        assert gpu1.health == "ok" and [p.pid for p in gpu1.processes] == [12]
    xids = [x for s in samples if s is not None for g in s.gpus for x in g.xids]
    assert [(x.xid, x.critical) for x in xids] == [(79, True)]
    assert (lost.gpus[0].xids + after.gpus[0].xids) == xids and xids[0].at is not None and xids[0].at > T0
    assert "gpu_lost" in errors


class _ListSink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, key: str, payload: bytes) -> bool:
        self.sent.append(payload)
        return True

    def poll(self) -> None:
        return None

    def queue_depth(self) -> int:
        return 0

    def close(self, timeout_s: float = 10.0) -> int:
        return 0


def _wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _wait_for_xids(backend: PynvmlBackend, count: int) -> list[object]:
    deadline = time.monotonic() + 5
    seen: list[object] = []
    while time.monotonic() < deadline and len(seen) < count:
        seen += backend.drain_xids()
        time.sleep(0.02)
    return seen


def test_xid_events_carry_the_gpu_and_a_timestamp(start: Start) -> None:
    node = Node(VARIANTS["r535"], [Gpu(gpu_uuid(0)), Gpu(gpu_uuid(1))],
                xids=[Xid(13, gpu_uuid(1), after=2), Xid(48, gpu_uuid(1), after=2)])
    backend = start(node)
    for index in range(2):
        backend.uuid(backend.device_by_index(index))  # second open queues both events
    records = _wait_for_xids(backend, 2)
    assert [(r.gpu_uuid, r.xid) for r in records] == [(gpu_uuid(1), 13), (gpu_uuid(1), 48)]  # type: ignore[attr-defined]
    assert all(r.at is not None and r.gpu_instance_id is None for r in records)  # type: ignore[attr-defined]


def test_init_failures_say_what_is_wrong(start: Start, tmp_path: Path) -> None:
    with pytest.raises(NvmlUnavailable) as failed:
        start(Node(VARIANTS["r550"], [Gpu(gpu_uuid(0))], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert failed.value.kind == "driver_not_loaded"
    with pytest.raises(NvmlLibraryNotFound, match="cannot load NVML"):
        PynvmlBackend(library_path=str(tmp_path / "missing" / LIBRARY_NAME)).init()


def test_reinitialising_reads_the_node_again(start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = start(Node(VARIANTS["r580"], [Gpu(gpu_uuid(0))]))
    assert backend.device_count() == 1
    backend.shutdown()
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(Node(VARIANTS["r580"], [Gpu(gpu_uuid(0)), Gpu(gpu_uuid(1))])
                                              .write(tmp_path / "two.conf")))
    backend.init()
    assert backend.device_count() == 2
    assert [backend.uuid(backend.device_by_index(i)) for i in range(2)] == [gpu_uuid(0), gpu_uuid(1)]
