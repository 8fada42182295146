"""The stages driven directly with schema messages: the timing rule, gaps, late and out-of-order
input, pod usage, checkpoint/resume, and dead-lettering of bad records."""

from __future__ import annotations

import orjson

from schemas.codec import encode
from schemas.messages import K8sEvent, Message
from schemas.outputs import Alert, ClusterCapacity, PodLifecycle, PodWindow
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from simulation.simulator import FleetSimulator
from stream_jobs.cluster_stage import ClusterStage
from stream_jobs.config import EngineConfig, Thresholds
from stream_jobs.internal import NodeSummary, PodUsage
from stream_jobs.node_stage import NodeStage
from stream_jobs.pipeline import LocalPipeline
from stream_jobs.timeutil import epoch
from tests.conftest import REPO_ROOT
from tests.stream_jobs.helpers import T0, at, node, pod, reading, sample

CONFIG = EngineConfig(thresholds=Thresholds(idle_after=60.0))
BASE = epoch(T0)


def _alerts(messages: list[Message]) -> list[tuple[str, str, float]]:
    return [(m.type, m.state, epoch(m.at) - BASE) for m in messages if isinstance(m, Alert)]


def _run_node(inputs: list[Message], until: float, config: EngineConfig = CONFIG) -> tuple[NodeStage, list[Message]]:
    stage = NodeStage("n1", config)
    for message in inputs:
        stage.submit(message)
    return stage, stage.advance(BASE + until)


def _idle_samples(times: list[float], util: float = 1.0) -> list[Message]:
    return [sample(t, [reading(0, util, ["a"]), reading(1, 0.0, [])]) for t in times]


def test_idle_fires_at_the_first_tick_with_duration_elapsed() -> None:
    inputs = [node(), pod("a"), *_idle_samples([float(t) for t in range(0, 100, 10)])]
    _, out = _run_node(inputs, 100)
    assert _alerts(out) == [("idle_gpu", "firing", 60.0)]
    firing = next(m for m in out if isinstance(m, Alert))
    assert firing.details["idle_class"] == "vram_held"
    assert firing.subject.gpu_uuid == "GPU-0"


def test_a_busy_sample_resolves_and_restarts_the_timer() -> None:
    samples = _idle_samples([float(t) for t in range(0, 80, 10)])
    samples += [sample(80, [reading(0, 50.0, ["a"])])]
    samples += _idle_samples([float(t) for t in range(90, 160, 10)])
    _, out = _run_node([node(), pod("a"), *samples], 200)
    assert _alerts(out) == [("idle_gpu", "firing", 60.0), ("idle_gpu", "resolved", 80.0),
                            ("idle_gpu", "firing", 150.0)]


def test_a_gap_resets_the_idle_timer_and_is_not_idle() -> None:
    # samples at 0..20, silence until 70 (> 3 intervals), then 70..140
    times = [0.0, 10.0, 20.0, *[float(t) for t in range(70, 150, 10)]]
    stage, out = _run_node([node(), pod("a"), *_idle_samples(times)], 200)
    assert _alerts(out) == [("idle_gpu", "firing", 130.0)]
    assert stage.counters["gaps"] == 1
    windows = [m for m in out if isinstance(m, PodWindow) and m.pod == "a"]
    assert sum(w.gap_s for w in windows) == 40.0
    assert sum(w.idle_s for w in windows) == 10.0 * len(times)


def test_out_of_order_input_within_the_watermark_gives_the_same_result() -> None:
    inputs = [node(), pod("a"), *_idle_samples([float(t) for t in range(0, 100, 10)])]
    _, in_order = _run_node(inputs, 100)
    _, shuffled = _run_node(list(reversed(inputs)), 100)
    assert [m.model_dump() for m in in_order] == [m.model_dump() for m in shuffled]


def test_late_sample_is_counted_and_dropped_but_late_state_is_applied() -> None:
    stage, _ = _run_node([node(), pod("a"), *_idle_samples([0.0, 10.0, 20.0])], 20)
    stage.submit(_idle_samples([5.0])[0])
    assert stage.counters["late_samples"] == 1
    stage.submit(pod("a", t=15, phase="Succeeded"))
    out = stage.advance(BASE + 30)
    usage = [m for m in out if isinstance(m, PodUsage)]
    assert len(usage) == 1 and usage[0].unit_s == 30.0
    assert stage.counters["late_states"] == 1


def test_pod_end_reports_usage_and_resolves_its_alerts() -> None:
    inputs = [node(), pod("a"), *_idle_samples([float(t) for t in range(0, 100, 10)]),
              pod("a", t=100, deleted=True)]
    _, out = _run_node(inputs, 100)
    assert _alerts(out)[-1] == ("idle_gpu", "resolved", 100.0)
    [usage] = [m for m in out if isinstance(m, PodUsage)]
    assert (usage.unit_s, usage.idle_s, usage.samples) == (100.0, 100.0, 10)


def test_window_ids_are_deterministic_per_pod_gpu_and_start() -> None:
    inputs = [node(), pod("a"), *_idle_samples([float(t) for t in range(0, 130, 10)])]
    _, first = _run_node(inputs, 130)
    _, second = _run_node(inputs, 130)
    ids = [m.window_id for m in first if isinstance(m, PodWindow)]
    assert ids == [m.window_id for m in second if isinstance(m, PodWindow)]
    assert len(ids) == len(set(ids)) == 2  # two complete 1-minute windows for pod a's GPU


def test_cluster_stage_pending_fragmentation_and_lifecycle() -> None:
    config = EngineConfig(thresholds=Thresholds(pending_after=60.0, fragmentation_after=30.0))
    stage = ClusterStage(config)
    for name in ("n1", "n2"):
        stage.submit(node(name, gpus=4))
    stage.submit(pod("x", node_name="n1", gpus=3))
    stage.submit(pod("y", node_name="n2", gpus=3))
    stage.submit(pod("w", node_name=None, gpus=2, phase="Pending", scheduled=None))
    stage.submit(K8sEvent(uid="e1", ts=at(0), category="scheduling_failed", reason="FailedScheduling",
                          message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", involved_kind="Pod",
                          involved_uid="uid-w", involved_name="w"))
    for t in range(0, 100, 10):
        for name in ("n1", "n2"):
            stage.submit(NodeSummary(node=name, ts=at(t), sample_interval_s=10, gpus=4, allocated=3, busy=3,
                                     idle_allocated=0))
    stage.submit(pod("w", t=90, node_name=None, gpus=2, phase="Pending", scheduled=None, deleted=True))
    out = stage.advance(BASE + 200)
    assert sorted(_alerts(out), key=lambda a: (a[2], a[0])) == [
                            ("fragmentation", "firing", 30.0), ("pending_gpu", "firing", 60.0),
                            ("fragmentation", "resolved", 90.0), ("pending_gpu", "resolved", 90.0)]
    pending = next(m for m in out if isinstance(m, Alert) and m.type == "pending_gpu")
    assert pending.details["last_scheduler_reason"].startswith("0/2 nodes")
    [life] = [m for m in out if isinstance(m, PodLifecycle)]
    assert (life.name, life.end_reason, life.pending_s, life.running_s) == ("w", "Deleted", 90.0, 0.0)
    capacity = [m for m in out if isinstance(m, ClusterCapacity)]
    assert capacity[0].stranded_gpus_max == 2 and capacity[0].gpu_s_total == 8 * 60


def _checkpointed_replay(path: str, cut_tick: int) -> dict[str, object]:
    from datetime import timedelta

    from simulation.replay import build_report, engine_config, feed_tick

    scenario = load_scenario(path)
    config = engine_config(scenario)
    simulator = FleetSimulator(scenario)
    pipeline = LocalPipeline(config)
    outputs: list[Message] = []
    for i, tick in enumerate(simulator.run()):
        feed_tick(pipeline, tick)
        pipeline.advance(epoch(tick.ts) - 30)
        if i == cut_tick:  # a worker restart: state survives only as JSON
            outputs += pipeline.outputs
            state = orjson.loads(orjson.dumps(pipeline.to_dict()))
            pipeline = LocalPipeline.from_dict(state, config)
    pipeline.flush(epoch(scenario.start + timedelta(seconds=scenario.end_offset_s)))
    outputs += pipeline.outputs
    return build_report(scenario, outputs, simulator.pod_uids(), {})


def test_state_restored_from_json_mid_scenario_gives_the_same_report() -> None:
    for name in ("crashloop", "gang-partial", "sample-gaps"):
        path = str(REPO_ROOT / "simulation" / "scenarios" / f"{name}.yaml")
        full = run_in_process(load_scenario(path)).report
        resumed = _checkpointed_replay(path, 37)
        assert resumed.pop("stream") == {k: v for k, v in full.pop("stream").items()
                                         if k in ("pod_windows", "capacity_windows")}
        assert resumed == full


def test_poison_records_are_dead_lettered_with_reason_and_position() -> None:
    pipeline = LocalPipeline(CONFIG)
    pipeline.feed("gpu.samples.v1", b"\xff\xfe not json", at=T0, partition=3, offset=41)
    pipeline.feed("k8s.pods.v1", b'{"uid": "x"}', at=T0, partition=0, offset=7)
    pipeline.feed("k8s.pods.v1", None, at=T0)  # a tombstone is not an error
    pipeline.feed("k8s.nodes.v1", encode(node()), at=T0)
    assert pipeline.counters == {"records": 4, "tombstones": 1, "deadletters": 2}
    first, second = pipeline.deadletters
    assert first.source_topic == "gpulens.gpu.samples.v1" and (first.source_partition, first.source_offset) == (3, 41)
    assert "not valid JSON" in first.error and first.payload_b64 is not None
    assert second.error.startswith(("namespace", "name", "ts", "phase", "created_at"))
    assert second.payload_text == '{"uid": "x"}'
    assert "n1" in pipeline.nodes
