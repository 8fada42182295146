"""Bounded state: no state record above the size limit (and a crash mid-write restores the previous
document whole), labels never kept by the stages, inputs dated far ahead of or behind the stream's
clock dead-lettered with their reason (never held for ever, never dropped silently)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from schemas.codec import encode
from schemas.messages import MAX_GANG_CHARS, MAX_LABEL_VALUE_CHARS, MAX_LABELS, MAX_QUALIFIED_NAME_CHARS, MAX_TAG_CHARS
from schemas.topics import GPU_SAMPLES, K8S_PODS
from simulation.fleet_state import SimulatedRecord
from simulation.replay import engine_config, feed_tick
from simulation.scenario import load_scenario
from simulation.simulator import FleetSimulator
from stream_jobs.cluster_stage import ClusterStage
from stream_jobs.config import EngineConfig
from stream_jobs.internal import MAX_NAME_CHARS
from stream_jobs.pipeline import INPUT_TOPICS, LocalPipeline
from stream_jobs.state_store import ChunkedStore
from stream_jobs.timeutil import epoch
from tests.conftest import SHARED_SCENARIOS
from tests.stream_jobs.helpers import at, node, pod


class CrashingTable(dict[bytes, Any]):
    """A table whose process dies (raises) after ``writes`` more writes or deletions."""

    writes: int | None = None

    def _step(self) -> None:
        if self.writes is not None:
            if self.writes == 0:
                raise RuntimeError("SIGKILL")
            self.writes -= 1

    def __setitem__(self, key: bytes, value: Any) -> None:
        self._step()
        super().__setitem__(key, value)

    def __delitem__(self, key: bytes) -> None:
        self._step()
        super().__delitem__(key)


def _document(size: int, tag: str) -> dict[str, Any]:
    return {"tag": tag, "labels": ["x" * 1000] * (size // 1000)}


def test_a_large_document_is_split_under_the_record_limit_and_read_back_whole() -> None:
    table = CrashingTable()
    store = ChunkedStore(table, max_record_bytes=64 * 1024)
    big = _document(1_000_000, "big")
    store["cluster"] = big
    assert max(len(v) for v in table.values()) <= 64 * 1024
    assert len(table) > 15
    assert store.get("cluster") == big
    store["cluster"] = {"tag": "small"}  # the chunks go once nothing refers to them
    assert list(table) == [b"cluster"] and store.get("cluster") == {"tag": "small"}
    assert store.get("other") is None


@pytest.mark.parametrize("crash_after", [0, 1, 7, 16, 17, 18, 30])
def test_a_crash_in_the_middle_of_a_write_restores_one_whole_document(crash_after: int) -> None:
    table = CrashingTable()
    store = ChunkedStore(table, max_record_bytes=64 * 1024)
    old, new = _document(1_000_000, "old"), _document(1_100_000, "new")
    store["cluster"] = old
    table.writes = crash_after
    with contextlib.suppress(RuntimeError):
        store["cluster"] = new
    table.writes = None
    assert store.get("cluster") in (old, new)
    restored = ChunkedStore(dict(table), max_record_bytes=64 * 1024)  # a restart reads the changelog
    assert restored.get("cluster") in (old, new)


def test_documents_written_before_chunking_existed_are_read() -> None:
    table = {b"p3": orjson.dumps({"progress": {"seq": 4}})}
    assert ChunkedStore(table).get("p3") == {"progress": {"seq": 4}}


def test_stages_keep_no_labels_and_cut_long_names() -> None:
    stage = ClusterStage(EngineConfig())
    labels = {f"{'k' * (MAX_QUALIFIED_NAME_CHARS - 3)}{j:03d}": "v" * MAX_LABEL_VALUE_CHARS for j in range(MAX_LABELS)}
    gang = "g" * MAX_GANG_CHARS
    stage.submit(node(t=0))
    for i in range(50):
        stage.submit(pod(f"p{i}", t=i, labels=labels, team="t" * MAX_TAG_CHARS, gang_id=gang))
    state = orjson.dumps(stage.to_dict())
    assert len(state) < 100_000, "50 pods with 97 KB of labels each (the contract's largest)"
    stage.advance(epoch(at(100)))
    kept = stage.pods["uid-p1"]
    assert kept.team == "t" * MAX_TAG_CHARS
    assert kept.gang == gang[:MAX_NAME_CHARS]


def _dated(ts: datetime) -> list[SimulatedRecord]:
    sample = orjson.loads(encode(pod("dated", t=0)))
    sample["ts"] = ts.isoformat()
    return [SimulatedRecord(K8S_PODS.suffix, "uid-dated", orjson.dumps(sample))]


def test_records_far_ahead_or_behind_the_clock_are_dead_lettered_with_their_reason() -> None:
    scenario = load_scenario(SHARED_SCENARIOS / "idle-notebook.yaml")
    pipeline = LocalPipeline(engine_config(scenario))
    for i, tick in enumerate(FleetSimulator(scenario).run()):
        feed_tick(pipeline, tick)
        if i == 5:
            for ts in (datetime(1970, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)):
                for record in _dated(ts):
                    pipeline.feed(record.topic, record.value, at=tick.ts)
            skew = tick.ts.timestamp() + 601
            sample = next(r for r in tick.records if r.topic == GPU_SAMPLES.suffix)
            assert sample.value is not None
            ahead = orjson.loads(sample.value)
            ahead["ts"] = datetime.fromtimestamp(skew, UTC).isoformat()
            pipeline.feed(GPU_SAMPLES.suffix, orjson.dumps(ahead), at=tick.ts)
        pipeline.advance(epoch(tick.ts) - 30)
    reasons = sorted(letter.error for letter in pipeline.deadletters)
    assert len(reasons) == 3
    assert "behind the stream's clock" in reasons[0] and "1970-01-01" in reasons[0]
    assert all("ahead of the stream's clock" in r for r in reasons[1:])
    assert any("2100-01-01" in r for r in reasons) and any("(max_skew_s)" in r for r in reasons)
    assert pipeline.stats()["deadletters"] == 3
    assert not any(p.name == "dated" for p in pipeline.cluster.pods.values())


def test_compacted_inputs_keep_every_state_for_the_horizon() -> None:
    compacted = [spec for spec in INPUT_TOPICS if spec.cleanup_policy == "compact"]
    assert {spec.suffix for spec in compacted} == {K8S_PODS.suffix, "k8s.nodes.v1", "k8s.workloads.v1"}
    for spec in compacted:
        assert int(spec.kafka_config()["min.compaction.lag.ms"]) >= EngineConfig().horizon_s * 1000
