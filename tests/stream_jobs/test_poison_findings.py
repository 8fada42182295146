"""Issue 49's findings in process: records that once ended ``gpulens replay`` or were taken
silently (an integer above 2^64 on ``k8s.pods.v1``, ``1e400`` on ``workload.progress.v1``, a sample
keyed by another node, a cluster outside the allow-list) are dead-lettered with their reason code
and the replay finishes. The same records through Kafka: ``test_poison_kafka.py``."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import orjson

from schemas.codec import encode
from schemas.messages import GpuSample, PodState
from simulation.replay import run_in_process
from simulation.scenario import PoisonSpec, Scenario, load_scenario
from stream_jobs.config import EngineConfig
from stream_jobs.pipeline import LocalPipeline

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

SCENARIO = """name: poison-numbers
start: "2026-01-05T09:00:00Z"
duration: 12m
nodes:
  - {name: gpu-a, gpus: 2}
  - {name: gpu-b, gpus: 2}
pods:
  - {name: notebook, namespace: research, gpus: 1, util: 0, memory_gib: 4}
  - {name: trainer, namespace: research, gpus: 2, util: 90, memory_gib: 60}
"""

BIG_INT_POD = ('{"schema_version":2,"cluster":"default","uid":"poison-pod","namespace":"a","name":"b",'
               '"phase":"Pending","ts":"2026-01-05T09:02:00Z","created_at":"2026-01-05T09:02:00Z",'
               '"gpu_requests":{"nvidia.com/gpu":100000000000000000000}}')
"""Finding 1: an integer above 2^64 on k8s.pods.v1."""
INFINITE_PROGRESS = ('{"pod_uid":"p","namespace":"a","pod":"b","ts":"2026-01-05T09:03:00Z",'
                     '"steps_total":1e400}')
"""Finding 2: a float that overflows on workload.progress.v1."""


def scenario(tmp_path: Path, *poison: PoisonSpec) -> Scenario:
    path = tmp_path / "poison.yaml"
    path.write_text(SCENARIO)
    return replace(load_scenario(path), poison=tuple(poison))


def sample_of(node: str, at: datetime, cluster: str = "default") -> bytes:
    return encode(GpuSample(cluster=cluster, node=node, ts=at, agent_boot_id="boot", seq=1, sample_interval_s=10.0))


def misattributed_sample() -> PoisonSpec:
    """Finding 7: a sample keyed ``gpu-a`` that claims node ``gpu-b``."""
    return PoisonSpec(240.0, "gpu.samples.v1", sample_of("gpu-b", datetime(2026, 1, 5, 9, 4, tzinfo=UTC)).decode(),
                      "gpu-a")


def other_cluster_pod() -> PoisonSpec:
    pod = PodState(cluster="elsewhere", uid="other-pod", namespace="a", name="b", phase="Pending",
                   ts=datetime(2026, 1, 5, 9, 5, tzinfo=UTC), created_at=datetime(2026, 1, 5, 9, 5, tzinfo=UTC))
    return PoisonSpec(300.0, "k8s.pods.v1", encode(pod).decode(), "elsewhere/other-pod")


def test_an_integer_beyond_64_bits_is_dead_lettered_and_the_report_is_written(tmp_path: Path) -> None:
    result = run_in_process(scenario(tmp_path, PoisonSpec(120.0, "k8s.pods.v1", BIG_INT_POD, "poison-pod")))
    orjson.dumps(result.report)  # `gpulens replay --json` once died here: "Integer exceeds 64-bit range"
    assert result.report["stream"]["deadletters"] == 1
    (letter,) = result.deadletters
    assert (letter.reason, letter.source_topic) == ("out_of_range", "gpulens.k8s.pods.v1")
    assert "gpu_requests" in letter.error
    assert [p["seen"] for p in result.report["pods"]] == [True, True]


def test_an_infinite_float_is_dead_lettered_not_accepted(tmp_path: Path) -> None:
    result = run_in_process(scenario(tmp_path, PoisonSpec(180.0, "workload.progress.v1", INFINITE_PROGRESS)))
    assert result.report["stream"]["deadletters"] == 1
    assert [letter.reason for letter in result.deadletters] == ["out_of_range"]


def test_a_sample_keyed_by_another_node_is_inconsistent(tmp_path: Path) -> None:
    result = run_in_process(scenario(tmp_path, misattributed_sample()))
    assert result.report["stream"]["deadletters"] == 1
    (letter,) = result.deadletters
    assert letter.reason == "inconsistent" and "gpu-a" in letter.error and "gpu-b" in letter.error
    pipeline = LocalPipeline(EngineConfig())
    at = datetime(2026, 1, 5, 9, 4, tzinfo=UTC)
    pipeline.feed("gpu.samples.v1", sample_of("gpu-b", at), at, key="gpu-b")
    pipeline.feed("gpu.samples.v1", sample_of("gpu-b", at, "east"), at, key=b"east/gpu-b")
    pipeline.feed("gpu.samples.v1", sample_of("gpu-b", at, "east"), at, key=b"gpu-b")  # the bare node name
    pipeline.feed("gpu.samples.v1", sample_of("gpu-b", at, "east"), at, key=b"west/gpu-b")
    assert [letter.reason for letter in pipeline.deadletters] == ["inconsistent"]


def test_a_cluster_outside_the_allow_list_is_dead_lettered(tmp_path: Path) -> None:
    sc = scenario(tmp_path, other_cluster_pod())
    open_door = run_in_process(sc)
    assert open_door.report["stream"]["deadletters"] == 0, "unset: every cluster is taken"
    guarded = run_in_process(sc, accept_clusters=frozenset({"default"}))
    assert [(d.reason, d.source_topic) for d in guarded.deadletters] == [
        ("unknown_cluster", "gpulens.k8s.pods.v1")]
    assert guarded.report["pods"] == open_door.report["pods"]
