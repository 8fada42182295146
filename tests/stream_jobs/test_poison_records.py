"""A record never ends a worker (issue 49), in process and in the agents over fakes: numbers the
JSON readers do not agree on, a sample whose key is another node's, a cluster outside the
allow-list, a record a stage fails to apply, a checkpoint that no longer restores, garbage on the
internal topics; each becomes a dead letter with its reason code and the stream goes on. The
dead letters a worker writes are bounded (a token bucket), what is cut is counted."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.letter_budget import LetterBudget
from common.settings import WorkerSettings, load_settings
from schemas.codec import decode
from schemas.messages import GpuSample, PodState, WorkloadProgress
from schemas.outputs import DeadLetter, DeadLetterReason
from simulation.replay import run_in_process
from simulation.scenario import PoisonSpec
from stream_jobs.cluster_stage import ClusterStage
from stream_jobs.config import EngineConfig
from stream_jobs.delivery import Delivery
from stream_jobs.node_agent import NodeAgent
from stream_jobs.node_stage import NodeStage
from stream_jobs.pipeline import wire_error
from stream_jobs.state_store import ChunkedStore
from stream_jobs.watermark import Mark, record_envelope
from tests.stream_jobs.fakes import Event, Metrics, Offsets, Stream, Topic
from tests.stream_jobs.test_poison_findings import T0, scenario


def test_accept_clusters_setting_takes_a_comma_or_json_list_of_dns_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    for given, wanted in (("prod-eu-1, prod-us-2", {"prod-eu-1", "prod-us-2"}), ('["a", "b"]', {"a", "b"}),
                          ("", None)):
        monkeypatch.setenv("GPULENS_ACCEPT_CLUSTERS", given)
        assert load_settings(WorkerSettings).accepted_clusters() == (None if wanted is None else frozenset(wanted))
    monkeypatch.setenv("GPULENS_ACCEPT_CLUSTERS", "prod,Not_A_Label")
    with pytest.raises(Exception, match=r"GPULENS_ACCEPT_CLUSTERS.*Not_A_Label"):
        load_settings(WorkerSettings)
    monkeypatch.delenv("GPULENS_ACCEPT_CLUSTERS")
    assert load_settings(WorkerSettings).accepted_clusters() is None


def test_the_stream_check_holds_without_the_contracts_bounds() -> None:
    """Defence in depth: whatever bounds the models declare, a number orjson would read otherwise
    (or not at all) never goes on into the stages or the route's copies."""
    at = datetime(2026, 1, 5, 9, tzinfo=UTC)
    inf = WorkloadProgress.model_construct(pod_uid="p", namespace="a", pod="b", ts=at, steps_total=math.inf)
    error = wire_error("workload.progress.v1", b'{"steps_total": 1e309}', inf)
    assert error is not None and error.code == DeadLetterReason.OUT_OF_RANGE
    big = PodState.model_construct(uid="x", namespace="a", name="b", ts=at, phase="Pending", created_at=at,
                                   gpu_requests={"nvidia.com/gpu": 10**20})
    error = wire_error("k8s.pods.v1", b'{"gpu_requests": {"nvidia.com/gpu": 1e20}}', big)
    assert error is not None and error.code == DeadLetterReason.OUT_OF_RANGE and error.field_path.startswith("gpu_req")
    fine = PodState.model_construct(uid="x", namespace="a", name="b", ts=at, phase="Pending", created_at=at,
                                    gpu_requests={"nvidia.com/gpu": 2**64 - 1})
    assert wire_error("k8s.pods.v1", b'{"gpu_requests": {"nvidia.com/gpu": 18446744073709551615}}', fine) is None
    nan = wire_error("k8s.pods.v1", b'{"restarts": NaN}', fine)
    assert nan is not None and nan.code == DeadLetterReason.OUT_OF_RANGE, "orjson refuses NaN: the route must too"


def test_a_record_a_stage_fails_to_apply_is_dead_lettered_and_the_stream_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = scenario(tmp_path)
    expected = run_in_process(sc).report
    original = ClusterStage._on_progress  # type: ignore[attr-defined]

    def failing(self: ClusterStage, ts: float, message: Any) -> None:
        if message.pod_uid == "crash":
            raise ZeroDivisionError("a bug the record finds")
        original(self, ts, message)

    monkeypatch.setattr(ClusterStage, "_on_progress", failing)
    crash = ('{"pod_uid":"crash","namespace":"a","pod":"b","ts":"2026-01-05T09:03:00Z","steps_total":5}')
    result = run_in_process(replace(sc, poison=(PoisonSpec(180.0, "workload.progress.v1", crash),)))
    (letter,) = result.deadletters
    assert letter.reason == DeadLetterReason.UNAPPLIABLE and "ZeroDivisionError: a bug the record finds" in letter.error
    assert letter.source_topic == "gpulens.workload.progress.v1" and letter.payload_text is not None
    assert result.report["stream"]["deadletters"] == 1
    assert result.report["alerts"] == expected["alerts"] and result.report["pods"] == expected["pods"]


def test_a_buffered_record_that_no_longer_restores_is_dead_lettered() -> None:
    """A checkpoint written before a bound existed holds a record the bound refuses: the stage
    restores without it and says so (once a crash loop on every restart)."""
    stage = NodeStage("gpu-a", EngineConfig())
    stage.submit(GpuSample(node="gpu-a", ts=T0, agent_boot_id="boot", seq=1, sample_interval_s=10.0),
                 ["p.gpu.samples.v1", 3, 41])
    saved = orjson.loads(orjson.dumps(stage.to_dict()))
    saved["buffer"]["items"][0][4]["sample_interval_s"] = -1.0  # what today's contract refuses
    restored = NodeStage.from_dict(saved, EngineConfig())
    (rejected,) = restored.take_rejected()
    assert (rejected.source, rejected.reason) == (["p.gpu.samples.v1", 3, 41], DeadLetterReason.INVALID)
    assert len(restored.buffer) == 0


# --------------------------------------------------------------------------- the agents over fakes

NODE_INPUTS = "p.internal.node-inputs.v1"
SAMPLES = "p.gpu.samples.v1"
PODS = "p.k8s.pods.v1"


class _Durable:
    async def confirm(self) -> None:
        pass


def _node_agent(sent: list[tuple[str, int | None, bytes]], config: EngineConfig | None = None) -> NodeAgent:
    delivery = Delivery(config or EngineConfig(), Metrics(), Offsets(), Topic("p.deadletter.v1", sent), {},  # type: ignore[arg-type]
                        set())
    return NodeAgent(delivery, config or EngineConfig(), NODE_INPUTS, Topic("p.internal.cluster-inputs.v1", sent),
                     ChunkedStore({}), _Durable(), 30.0, 0.0, samples_topic=SAMPLES,  # type: ignore[arg-type]
                     partitioner=lambda key: 0)


def test_garbage_on_node_inputs_and_a_forwarded_copy_that_does_not_validate_are_dead_lettered() -> None:
    """What no worker writes (a writer with access to the internal topic, a bug) is a dead letter
    naming the internal topic's position; the partition goes on to apply the next mark."""
    sent: list[tuple[str, int | None, bytes]] = []
    agent = _node_agent(sent)
    ts = T0.timestamp()
    pod = orjson.dumps({"uid": "u", "namespace": "a", "name": "b", "node": "gpu-a", "phase": "Running",
                        "ts": "2026-01-05T09:00:00Z", "gpu_requests": {"nvidia.com/gpu": "lots"}})
    events = [Event(NODE_INPUTS, 0, 0, b"{not json"),
              Event(NODE_INPUTS, 0, 1, b'{"k": "b", "rs": [{"t": 1}]}'),
              Event(NODE_INPUTS, 0, 2, record_envelope(PODS, "k8s.pods.v1", 0, 7, pod)),
              Event(NODE_INPUTS, 0, 3, Mark(1, ts + 60, {f"{PODS}:0": 7}).encode())]
    stream = Stream(events)
    asyncio.run(agent.run(stream))
    letters = [(letter.source_topic, letter.source_offset, letter.reason)
               for letter in (decode(v, DeadLetter) for topic, _p, v in sent if topic == "p.deadletter.v1")]
    assert letters == [(NODE_INPUTS, 0, "invalid"), (NODE_INPUTS, 1, "invalid"), (PODS, 7, "invalid")]
    marks = [orjson.loads(v)["seq"] for _t, _p, v in sent if orjson.loads(v).get("k") == "nm"]
    assert marks == [1], "the mark after them is applied"
    assert len(stream.acks.acked) == 4
    metrics = agent.delivery.metrics
    assert metrics.deadletters.labels(PODS, "invalid")._value.get() == 1


def test_dead_letters_beyond_the_budget_are_counted_not_written() -> None:
    now = [0.0]
    sent: list[tuple[str, int | None, bytes]] = []
    delivery = Delivery(EngineConfig(), Metrics(), Offsets(), Topic("p.deadletter.v1", sent), {}, set(),  # type: ignore[arg-type]
                        budget=LetterBudget(rate=2.0, burst=3.0, clock=lambda: now[0]))

    async def letters(count: int) -> None:
        for i in range(count):
            await delivery.dead_letter(PODS, 0, i, None, b"x" * 100_000, "bad", DeadLetterReason.TOO_LARGE)

    asyncio.run(letters(5))
    assert len(sent) == 3, "the burst"
    metrics = delivery.metrics
    assert metrics.deadletters_suppressed.labels(PODS, "too_large")._value.get() == 2
    assert metrics.deadletters.labels(PODS, "too_large")._value.get() == 3
    now[0] = 1.0  # two more tokens a second later
    asyncio.run(letters(3))
    assert len(sent) == 5
    assert metrics.deadletters_suppressed.labels(PODS, "too_large")._value.get() == 3
    letter = orjson.loads(sent[0][2])
    assert len(letter["payload_text"]) == 65536, "the record kept in a letter is capped (MAX_PAYLOAD_BYTES)"
    assert delivery.budget.summary(force=True) == {f"{PODS}/too_large": 3}
