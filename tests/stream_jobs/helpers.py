"""Builders of schema messages for the stage unit tests (no simulator involved)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from schemas.messages import GpuProcess, GpuReading, GpuSample, NodeState, PodRef, PodState

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
GIB = 2**30


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def node(name: str = "n1", gpus: int = 2, ready: bool = True, deleted: bool = False, t: float = 0) -> NodeState:
    return NodeState(node=name, ts=at(t), gpu_capacity={"nvidia.com/gpu": gpus},
                     gpu_allocatable={"nvidia.com/gpu": gpus}, ready=ready, deleted=deleted)


def pod(name: str, t: float = 0, node_name: str | None = "n1", gpus: int = 1, phase: str = "Running",
        created: float = 0, scheduled: float | None = 0, **extra: Any) -> PodState:
    return PodState(uid=f"uid-{name}", namespace="ns", name=name, ts=at(t), node=node_name,
                    phase=phase,  # type: ignore[arg-type]
                    gpu_requests={"nvidia.com/gpu": gpus} if gpus else {}, created_at=at(created),
                    scheduled_at=at(scheduled) if scheduled is not None and node_name else None, **extra)


def reading(index: int, util: float | None, owners: list[str] = (), mem_gib: float = 1.0,  # type: ignore[assignment]
            processes: list[GpuProcess] | None = None, **extra: Any) -> GpuReading:
    refs = [PodRef(namespace="ns", pod=o, container="main", pod_uid=f"uid-{o}") for o in owners]
    if processes is None:
        processes = [GpuProcess(pid=100 + index, pod_uid=f"uid-{o}") for o in owners]
    return GpuReading(uuid=f"GPU-{index}", index=index, model="NVIDIA H100 80GB HBM3", gpu_util_pct=util,
                      mem_used_bytes=int(mem_gib * GIB) if owners else 0, mem_total_bytes=80 * GIB,
                      assigned_to=refs, processes=processes if owners else [], shared=len(refs) > 1, **extra)


def sample(t: float, readings: list[GpuReading], name: str = "n1", interval: float = 10.0) -> GpuSample:
    return GpuSample(node=name, ts=at(t), agent_boot_id="boot", seq=int(t // interval), sample_interval_s=interval,
                     driver_version="550.54.15", cuda_driver_version="12.4", gpus=readings)
