"""A fragmentation alert that resolves while its pod or workload still waits says how it now fits: on a
node, or a workload's pods across N nodes (the cluster stage driven directly). When it stops waiting,
the sweep says why (scheduled on a node, admitted)."""

from __future__ import annotations

import pytest

from schemas.messages import PodSetDemand, WorkloadState
from schemas.outputs import Alert
from stream_jobs.cluster_stage import ClusterStage, _placement
from stream_jobs.config import EngineConfig, Thresholds
from stream_jobs.timeutil import epoch
from tests.stream_jobs.helpers import T0, at, node

GPU = "nvidia.com/gpu"


def workload(count: int, gpus: int) -> WorkloadState:
    return WorkloadState(uid="w1", namespace="ml", name="big", ts=at(0), phase="queued",  # type: ignore[arg-type]
                         pod_sets=[PodSetDemand(name="workers", count=count, gpu_requests_per_pod={GPU: gpus})],
                         gpu_requests={GPU: count * gpus}, gpus=count * gpus, gang_id="ml/big", created_at=T0)


@pytest.mark.parametrize(("free", "sets", "nodes"), [
    ({"a": 4, "b": 4}, [[2, 4]], 2),
    ({"a": 8, "b": 4}, [[2, 4]], 1),
    ({"a": 4, "b": 3}, [[2, 4]], None),
    ({"a": 8, "b": 2}, [[1, 4], [2, 2]], 1),  # 4 + 2 + 2 on a
    ({"a": 6, "b": 2}, [[4, 2]], 2),
])
def test_the_placement_counts_the_nodes_it_uses(free: dict[str, int], sets: list[list[int]],
                                                nodes: int | None) -> None:
    assert _placement({n: {GPU: f} for n, f in free.items()}, [(c, {GPU: g}) for c, g in sets]) == nodes


@pytest.mark.parametrize(("count", "gpus", "new_node_gpus", "reason"), [
    (2, 3, 3, "fits across 2 nodes"),  # a: 5 free takes one pod, b: 2 none; c: 3 takes the other
    (1, 6, 8, "fits on a node"),  # no node has 6 of the 7 free; c has 8
])
def test_a_workload_fragmentation_alert_says_how_it_fits(count: int, gpus: int, new_node_gpus: int,
                                                         reason: str) -> None:
    stage = ClusterStage(EngineConfig(thresholds=Thresholds(fragmentation_after=10.0, pending_after=600.0)))
    stage.submit(node("a", gpus=5))
    stage.submit(node("b", gpus=2))
    stage.submit(workload(count, gpus))
    fired = [m for m in stage.advance(epoch(T0) + 60) if isinstance(m, Alert)]
    assert [(m.type, m.state) for m in fired] == [("fragmentation", "firing")]
    stage.submit(node("c", gpus=new_node_gpus, t=70))
    resolved = [m for m in stage.advance(epoch(T0) + 120) if isinstance(m, Alert)]
    assert [(m.type, m.state, m.details["resolved_reason"]) for m in resolved] == [
        ("fragmentation", "resolved", reason)]
    assert resolved[0].summary.startswith(f"resolved ({reason}): workload big needs {count * gpus} GPUs")
