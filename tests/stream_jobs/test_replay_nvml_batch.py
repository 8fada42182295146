"""The fake NVML's one-call read of a GPU (what the fleet simulator, and so every replay, reads
through) gives the sampler exactly what the per-field NVML calls give: the same readings, errors,
health and per-process figures, sample after sample, with faults (unsupported and failing fields,
a GPU lost before or while it is read, MIG, no per-process statistics)."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from producers.agent.cgroup import ContainerRef, StaticProcessResolver
from producers.agent.fake_kubelet import StaticPodResources
from producers.agent.fake_nvml import FIELDS, FakeGpu, FakeMigDevice, FakeNvml, FakeProcess
from producers.agent.nvml_api import (
    NvmlGpuLost,
    PhysicalFields,
    ReadsPhysicalFields,
    read_physical,
)
from producers.agent.sampler import NodeSampler
from schemas.messages import PodRef

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


class PerFieldOnly:
    """A backend with the per-field calls only (as the real one): the sampler reads it through
    :func:`read_physical`. ``lose_at``: the method that finds GPU-2 lost (mid-read)."""

    def __init__(self, nvml: FakeNvml, lose_at: str | None = None) -> None:
        self._nvml = nvml
        self._lose_at = lose_at

    def __getattr__(self, name: str) -> Any:
        if name == "physical_fields":
            raise AttributeError(name)
        method = getattr(self._nvml, name)
        if name != self._lose_at:
            return method

        def lost(device: Any, *args: Any) -> Any:
            if getattr(device, "uuid", None) == "GPU-2":
                raise NvmlGpuLost("GPU is lost")
            return method(device, *args)
        return lost


def _gpus(variant: str) -> list[FakeGpu]:
    gpus = []
    for i in range(3):
        procs = [FakeProcess(pid=1000 + 10 * i + j, used_gpu_memory_bytes=(j + 1) * 2**30, sm_util_pct=20.0 * j + i)
                 for j in range(i)]  # GPU 0: no process
        gpus.append(FakeGpu(uuid=f"GPU-{i}", index=i, gpu_util_pct=30.0 + i, mem_used_bytes=i * 2**30,
                            processes=procs, nvlink_tx_bytes_total=100 * i, nvlink_rx_bytes_total=50 * i))
    if variant == "mig":
        gpus[1].mig_devices = [FakeMigDevice(uuid=f"MIG-1-{k}", gpu_instance_id=k, mem_used_bytes=k * 2**29,
                                             processes=[FakeProcess(pid=5000 + k, used_gpu_memory_bytes=2**28)])
                               for k in range(2)]
    elif variant == "lost":
        gpus[2].lost = True
    elif variant.startswith("unsupported:"):
        gpus[1].unsupported.add(variant.split(":", 1)[1])
    elif variant.startswith("failing:"):
        gpus[2].failing[variant.split(":", 1)[1]] = "unknown"
    return gpus


def _sampler(backend: Any) -> NodeSampler:
    pids = {1000 + 10 * i + j: ContainerRef(f"{i}{j}" * 32, f"uid-{i}", "containerd")
            for i in range(3) for j in range(3)}
    assignments = {f"GPU-{i}": [PodRef(namespace="ns", pod=f"pod-{i}", container="main", pod_uid=f"uid-{i}")]
                   for i in range(3)}
    return NodeSampler("node-a", backend, StaticPodResources(assignments), StaticProcessResolver(pids),
                       boot_id="boot", sample_interval_s=10.0)


VARIANTS = ["plain", "mig", "lost", *(f"unsupported:{f}" for f in FIELDS), *(f"failing:{f}" for f in FIELDS)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_sampler_reads_the_same_through_one_call_as_through_each_field(variant: str) -> None:
    batch = FakeNvml(_gpus(variant))
    per_field = copy.deepcopy(batch)
    batch.init()
    per_field.init()
    assert isinstance(batch, ReadsPhysicalFields) and not isinstance(PerFieldOnly(per_field), ReadsPhysicalFields)
    one, each = _sampler(batch), _sampler(PerFieldOnly(per_field))
    for tick in range(3):
        ts = T0 + timedelta(seconds=10 * tick)
        batch.gpus[0].gpu_util_pct = per_field.gpus[0].gpu_util_pct = 10.0 * tick
        assert one.sample(ts).model_dump() == each.sample(ts).model_dump()


def _plain(fields: PhysicalFields) -> dict[str, Any]:
    data = {f.name: getattr(fields, f.name) for f in dataclasses.fields(fields)}
    data |= {"failed": [(label, type(exc), str(exc), exc.kind) for label, exc in fields.failed]}
    return data | {"lost": None if fields.lost is None else str(fields.lost)}


@pytest.mark.parametrize("variant", ["plain", "mig", *(f"failing:{f}" for f in FIELDS)])
def test_one_call_gives_what_read_physical_gives(variant: str) -> None:
    batch = FakeNvml(_gpus(variant))
    per_field = copy.deepcopy(batch)
    batch.init()
    per_field.init()
    for index in range(3):
        since = 500 * index
        got = batch.physical_fields(batch.device_by_index(index), since)
        want = read_physical(per_field, per_field.device_by_index(index), since)
        assert _plain(got) == _plain(want)


@pytest.mark.parametrize("lose_at", ["memory", "mig_enabled", "compute_processes", "process_utilization"])
def test_a_gpu_lost_while_it_is_read_keeps_what_was_read_before(lose_at: str) -> None:
    """Fields before the loss are kept (the name names the GPU), the rest are None; a GPU lost at its
    first field raises, as nothing was read."""
    nvml = FakeNvml(_gpus("plain"))
    nvml.init()
    fields = read_physical(PerFieldOnly(nvml, lose_at), nvml.device_by_index(2), 0)
    assert isinstance(fields.lost, NvmlGpuLost)
    assert fields.name == "NVIDIA H100 80GB HBM3"
    assert fields.process_samples is None
    if lose_at == "memory":
        assert fields.memory is None and fields.mig_enabled is None
    with pytest.raises(NvmlGpuLost):
        read_physical(PerFieldOnly(nvml, "name"), nvml.device_by_index(2), 0)
    sample = _sampler(PerFieldOnly(nvml, lose_at)).sample(T0)
    lost = [g for g in sample.gpus if g.index == 2]
    assert [g.health for g in lost] == ["lost"] and lost[0].uuid == "GPU-2"
