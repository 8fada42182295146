"""Builders shared by the agent tests: a small fake node and a sampler over it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from producers.agent.cgroup import ContainerRef, StaticProcessResolver
from producers.agent.fake_kubelet import StaticPodResources
from producers.agent.fake_nvml import FakeGpu, FakeNvml
from producers.agent.sampler import NodeSampler
from schemas.messages import GpuReading, GpuSample, PodRef

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
GIB = 2**30


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}"


def pod_uid(n: int) -> str:
    return f"{n:08x}-1111-2222-3333-{n:012x}"


def container(n: int, pod: int | None) -> ContainerRef:
    return ContainerRef(container_id=f"{n:02x}" * 32, pod_uid=pod_uid(pod) if pod is not None else None,
                        runtime="containerd")


def ref(pod: str, container_name: str = "main", namespace: str = "team-a", uid: int | None = None) -> PodRef:
    return PodRef(namespace=namespace, pod=pod, container=container_name,
                  pod_uid=pod_uid(uid) if uid is not None else None)


def make_sampler(
    gpus: list[FakeGpu],
    assignments: dict[str, list[PodRef]] | None = None,
    pids: dict[int, ContainerRef] | None = None,
    errors: list[str] | None = None,
) -> tuple[NodeSampler, FakeNvml, StaticPodResources]:
    nvml = FakeNvml(gpus)
    nvml.init()
    pods = StaticPodResources(assignments or {})
    sampler = NodeSampler(
        "node-a", nvml, pods, StaticProcessResolver(pids or {}), boot_id="boot-1", sample_interval_s=10.0,
        on_nvml_error=(errors.append if errors is not None else None),
    )
    return sampler, nvml, pods


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def by_uuid(sample: GpuSample) -> dict[str, GpuReading]:
    return {g.uuid: g for g in sample.gpus}
