"""The cluster stage's queued demand, driven directly: the placement behind "would fit if
defragmented" for workloads with several pods, and state that stays small however many pods a
workload asks for."""

from __future__ import annotations

import time

import orjson
import pytest

from schemas.messages import PodSetDemand, WorkloadState
from schemas.outputs import Alert, ClusterCapacity
from stream_jobs.cluster_stage import ClusterStage, _places
from stream_jobs.config import EngineConfig, Thresholds
from stream_jobs.timeutil import epoch
from tests.stream_jobs.helpers import T0, at, node

GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(("free", "sets", "fits"), [
    ({"a": 4, "b": 4}, [[2, 4]], True),
    ({"a": 4, "b": 3}, [[2, 4]], False),
    ({"a": 8, "b": 2}, [[1, 4], [2, 2]], True),  # 4 + 2 on a, 2 on b
    ({"a": 3, "b": 3, "c": 2}, [[4, 2]], False),  # 8 free, but each node takes one 2-GPU pod (c: one)
    ({"a": 6, "b": 2}, [[4, 2]], True),
    ({"a": 5}, [[0, 4]], True),
])
def test_placement_is_largest_first_first_fit(free: dict[str, int], sets: list[list[int]], fits: bool) -> None:
    assert _places({n: {GPU: f} for n, f in free.items()}, [(c, {GPU: g}) for c, g in sets]) is fits


def workload(count: int, gpus: int, t: float = 0.0, phase: str = "queued") -> WorkloadState:
    return WorkloadState(uid="w1", namespace="ml", name="big", ts=at(t), phase=phase,  # type: ignore[arg-type]
                         pod_sets=[PodSetDemand(name="workers", count=count, gpu_requests_per_pod={GPU: gpus})],
                         gpu_requests={GPU: count * gpus}, gpus=count * gpus, gang_id="ml/big", created_at=T0)


def test_a_huge_workload_keeps_state_small_and_evaluates_fast() -> None:
    stage = ClusterStage(EngineConfig(thresholds=Thresholds(fragmentation_after=10.0)))
    for name in ("n1", "n2"):
        stage.submit(node(name, gpus=8))
    stage.submit(workload(100_000, 8))
    started = time.monotonic()
    out = stage.advance(epoch(T0) + 600)
    assert time.monotonic() - started < 5.0
    assert len(orjson.dumps(stage.to_dict())) < 50_000
    windows = [m for m in out if isinstance(m, ClusterCapacity)]
    assert windows and windows[-1].queued_gpu_demand == 800_000 and windows[-1].queued_workloads == 1
    firing = {(m.type, m.subject.kind) for m in out if isinstance(m, Alert)}
    assert firing == {("pending_gpu", "workload")}  # not enough free GPUs: no fragmentation


def test_admission_resolves_the_workload_alerts() -> None:
    stage = ClusterStage(EngineConfig(thresholds=Thresholds(fragmentation_after=10.0, pending_after=20.0)))
    stage.submit(node("n1", gpus=3))
    stage.submit(node("n2", gpus=3))
    stage.submit(workload(1, 4))
    fired = stage.advance(epoch(T0) + 60)
    assert sorted(m.type for m in fired if isinstance(m, Alert)) == ["fragmentation", "pending_gpu"]
    stage.submit(workload(1, 4, t=70, phase="admitted"))
    resolved = [m for m in stage.advance(epoch(T0) + 120) if isinstance(m, Alert)]
    assert sorted((m.type, m.state, m.details["resolved_reason"]) for m in resolved) == [
        ("fragmentation", "resolved", "admitted"), ("pending_gpu", "resolved", "admitted")]
    assert stage.workloads["w1"].admitted
