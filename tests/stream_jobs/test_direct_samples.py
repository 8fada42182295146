"""A node partition reads its own ``gpu.samples.v1`` partition (the route no longer copies samples):
a mark waits until the partition's samples are read up to what it covers, a restarted stage does
not apply a redelivered sample twice, and a sample that is invalid, or on a partition its node key
does not hash to, is dead-lettered with the reason while the rest goes on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import orjson

from schemas.codec import encode
from schemas.messages import GpuSample
from schemas.topics import key_partition
from stream_jobs.config import EngineConfig
from stream_jobs.delivery import Delivery
from stream_jobs.node_agent import NodeAgent
from stream_jobs.state_store import ChunkedStore
from stream_jobs.watermark import Mark
from tests.stream_jobs.fakes import Event, Metrics, Offsets, Stream, Topic

NODE_INPUTS = "p.internal.node-inputs.v1"
SAMPLES = "p.gpu.samples.v1"
T0 = 1_800_000_000.0


class _Durable:
    async def confirm(self) -> None:
        pass


def _sample(offset: int, node: str = "gpu-a", partition: int = 0) -> Event:
    sample = GpuSample(node=node, ts=datetime.fromtimestamp(T0 + 10 * offset, UTC), agent_boot_id="boot", seq=offset,
                       sample_interval_s=10.0)
    return Event(SAMPLES, partition, offset, encode(sample), key=node.encode())


def _mark(offset: int, seq: int, last_sample: int, partition: int = 0) -> Event:
    mark = Mark(seq, T0 + 10 * last_sample, {f"{SAMPLES}:{partition}": last_sample})
    return Event(NODE_INPUTS, partition, offset, mark.encode())


class _Node:
    """A node agent over fakes, with what it sent (cluster-inputs, dead letters)."""

    def __init__(self, table: dict[bytes, Any], partitioner: Any = lambda key: 0,
                 read_ahead_bytes: int = 16 * 1024 * 1024) -> None:
        self.sent: list[tuple[str, int | None, bytes]] = []
        self.offsets = Offsets()
        delivery = Delivery(EngineConfig(), Metrics(), self.offsets, Topic("p.deadletter.v1", self.sent), {},  # type: ignore[arg-type]
                            set())
        self.agent = NodeAgent(delivery, EngineConfig(), NODE_INPUTS, Topic("p.internal.cluster-inputs.v1", self.sent),
                               ChunkedStore(table), _Durable(), 30.0, 0.0, samples_topic=SAMPLES,  # type: ignore[arg-type]
                               partitioner=partitioner, read_ahead_bytes=read_ahead_bytes)

    def run(self, events: list[Event]) -> list[int]:
        """Feed ``events``; the offsets of the samples acknowledged."""
        stream = Stream(events)
        asyncio.run(self.agent.run(stream))
        return [e.message.offset for e in stream.acks.acked if e.message.topic == SAMPLES]

    def node_marks(self) -> list[int]:
        return [orjson.loads(value)["seq"] for _topic, _p, value in self.sent if orjson.loads(value).get("k") == "nm"]

    def dead_letters(self) -> list[dict[str, Any]]:
        return [orjson.loads(value) for topic, _p, value in self.sent if topic == "p.deadletter.v1"]

    def applied_ts(self, node: str = "gpu-a") -> float | None:
        return self.agent.parts[0].sample_ts.get(node)


def test_a_mark_waits_for_the_samples_it_covers() -> None:
    node = _Node({})
    node.run([_mark(0, 1, last_sample=1), _sample(0)])
    assert node.node_marks() == [], "the mark covers sample 1, not read yet"
    assert node.applied_ts() is None

    acked = node.run([_sample(1), _sample(2)])
    assert node.node_marks() == [1], "sample 1 read: the mark is applied"
    assert node.applied_ts() == T0 + 10, "samples 0 and 1 applied; sample 2 waits for a later mark"
    assert acked == [0, 1], "sample 2 is not acknowledged before a checkpoint holds it"
    assert node.agent.saved_sample_position(0) == 2, "a restart reads the samples again from sample 2"
    assert node.agent.saved_position(0) == 1

    node.run([_mark(1, 2, last_sample=2)])
    assert node.node_marks() == [1, 2] and node.applied_ts() == T0 + 20


def test_a_clock_mark_releases_the_samples_read() -> None:
    node = _Node({})
    node.run([_sample(0), Event(NODE_INPUTS, 0, 0, Mark(1, T0 + 5, None).encode())])
    assert node.node_marks() == [1] and node.applied_ts() == T0


def test_a_restarted_stage_does_not_apply_a_redelivered_sample_twice() -> None:
    table: dict[bytes, Any] = {}
    first = _Node(table)
    first.run([_sample(0), _sample(1), _mark(0, 1, last_sample=1), _sample(2)])
    stage = first.agent.parts[0].stages["gpu-a"]
    applied = stage.to_dict()

    restarted = _Node(table)  # the same table: a restart restores the checkpoint
    acked = restarted.run([_sample(1), _mark(0, 1, last_sample=1), _sample(2)])  # read again from the commit
    assert restarted.node_marks() == [], "mark 1 was applied before the restart: nothing is sent again"
    assert restarted.agent.parts[0].stages["gpu-a"].to_dict() == applied, "sample 1 is not applied twice"
    assert acked == [], "duplicates are acknowledged with the next checkpoint"

    acked = restarted.run([_mark(1, 2, last_sample=2)])
    assert restarted.node_marks() == [2] and restarted.applied_ts() == T0 + 20
    assert acked == [1, 2]


def test_an_invalid_sample_is_dead_lettered_and_the_rest_applied() -> None:
    node = _Node({})
    bad = Event(SAMPLES, 0, 1, b"not json at all", key=b"gpu-a")
    node.run([_sample(0), bad, _sample(2), _mark(0, 1, last_sample=2)])
    letters = node.dead_letters()
    assert len(letters) == 1 and letters[0]["source_offset"] == 1 and "JSON" in letters[0]["error"]
    assert node.applied_ts() == T0 + 20


def test_a_sample_on_another_partition_than_its_node_key_is_dead_lettered() -> None:
    partitions = 12
    other = next(f"gpu-{i}" for i in range(100) if key_partition(f"gpu-{i}".encode(), partitions) != 0)
    node = _Node({}, partitioner=lambda key: key_partition(key, partitions))
    home = next(f"gpu-{i}" for i in range(100) if key_partition(f"gpu-{i}".encode(), partitions) == 0)
    node.run([_sample(0, node=home), _sample(1, node=other), _mark(0, 1, last_sample=1)])
    letters = node.dead_letters()
    assert [letter["source_offset"] for letter in letters] == [1]
    assert f"partition {key_partition(other.encode(), partitions)}" in letters[0]["error"]
    assert node.applied_ts(home) == T0 and node.applied_ts(other) is None


def test_samples_read_far_ahead_of_the_marks_pause_until_a_mark_needs_more() -> None:
    """The marks come through the route, which may lag far behind the samples (a worker catching
    up a backlog). Above ``read_ahead_bytes`` parked, the partition stops fetching its samples; a
    mark that waits for samples not read yet resumes it. What is applied is what an unbounded
    partition applies."""
    size = len(_sample(0).value)
    node = _Node({}, read_ahead_bytes=int(3.5 * size))
    tp = (SAMPLES, 0)
    node.run([_sample(0), _sample(1), _sample(2)])
    assert node.offsets.flow == [], "three samples parked: under the bound"
    node.run([_sample(3)])
    assert node.offsets.flow == [("pause", tp)]
    assert node.agent.parts[0].read_ahead_bytes == 4 * size

    node.run([_mark(0, 1, last_sample=1)])
    assert node.node_marks() == [1] and node.applied_ts() == T0 + 10
    assert node.offsets.flow == [("pause", tp)], "two samples still parked: more than half the bound"

    node.run([_mark(1, 2, last_sample=5)])
    assert node.offsets.flow == [("pause", tp), ("resume", tp)], "mark 2 waits for samples 4 and 5"
    node.run([_sample(4), _sample(5)])
    assert node.node_marks() == [1, 2] and node.applied_ts() == T0 + 50
    assert node.agent.parts[0].read_ahead_bytes == 0

    unbounded = _Node({})
    unbounded.run([*(_sample(i) for i in range(4)), _mark(0, 1, last_sample=1), _mark(1, 2, last_sample=5),
                   _sample(4), _sample(5)])
    assert unbounded.offsets.flow == []
    assert unbounded.agent.parts[0].stages["gpu-a"].to_dict() == node.agent.parts[0].stages["gpu-a"].to_dict()
    assert unbounded.sent == node.sent


def test_a_paused_partition_resumes_once_marks_release_half_of_what_it_holds() -> None:
    size = len(_sample(0).value)
    node = _Node({}, read_ahead_bytes=int(3.5 * size))
    tp = (SAMPLES, 0)
    node.run([*(_sample(i) for i in range(5)), _mark(0, 1, last_sample=0)])
    assert node.offsets.flow[-1] == ("pause", tp), "four samples left parked"
    node.run([_mark(1, 2, last_sample=3)])
    assert node.offsets.flow[-1] == ("resume", tp), "one sample left parked"
    assert node.node_marks() == [1, 2]


def test_a_clock_mark_releases_a_paused_partition() -> None:
    size = len(_sample(0).value)
    node = _Node({}, read_ahead_bytes=int(1.5 * size))
    node.run([_sample(0), _sample(1), Event(NODE_INPUTS, 0, 0, Mark(1, T0 + 15, None).encode())])
    assert node.offsets.flow == [("pause", (SAMPLES, 0)), ("resume", (SAMPLES, 0))]
    assert node.node_marks() == [1] and node.agent.parts[0].read_ahead_bytes == 0
