"""A stage acknowledges a duplicate (a record or mark it applied before, sent again by a restarted
route) with its next checkpoint, not at once. Acknowledged at once, the committed offset passed the
position the last checkpoint saved, and a restart took the saved state for one older than the
commits: a false "restored state is older than the committed offset" and a needless re-read."""

from __future__ import annotations

import asyncio
from typing import Any

from stream_jobs.cluster_agent import ClusterAgent
from stream_jobs.config import EngineConfig
from stream_jobs.node_agent import NodeAgent
from stream_jobs.state_store import ChunkedStore
from stream_jobs.watermark import Mark
from tests.stream_jobs.fakes import Event, Offsets, Stream, Topic, fake_delivery

NODE_INPUTS = "p.internal.node-inputs.v1"
CLUSTER_INPUTS = "p.internal.cluster-inputs.v1"


class _Durable:
    async def confirm(self) -> None:
        pass


def _acked_offsets(stream: Stream) -> list[int]:
    return [event.message.offset for event in stream.acks.acked]


def test_a_node_partition_acknowledges_a_duplicate_mark_with_its_next_checkpoint() -> None:
    table: dict[bytes, Any] = {}
    sent: list[tuple[str, int | None, bytes]] = []
    agent = NodeAgent(fake_delivery(Offsets()), EngineConfig(), NODE_INPUTS, Topic(CLUSTER_INPUTS, sent),
                      ChunkedStore(table), _Durable(), 30.0, 0.0)  # type: ignore[arg-type]
    first = Stream([Event(NODE_INPUTS, 0, 0, Mark(1, 100.0, {}).encode()),
                    Event(NODE_INPUTS, 0, 1, Mark(1, 100.0, {}).encode())])  # the route sent it again
    asyncio.run(agent.run(first))
    assert _acked_offsets(first) == [0], "the duplicate waits for the next checkpoint"
    assert agent.saved_position(0) == 1, "so the commit (offset 1) stays within the saved state"

    second = Stream([Event(NODE_INPUTS, 0, 2, Mark(2, 110.0, {}).encode())])
    asyncio.run(agent.run(second))
    assert _acked_offsets(second) == [1, 2]
    assert agent.saved_position(0) == 3


def test_the_cluster_stage_acknowledges_a_duplicate_mark_with_its_next_checkpoint() -> None:
    table: dict[bytes, Any] = {}
    sent: list[tuple[str, int | None, bytes]] = []
    agent = ClusterAgent(fake_delivery(Offsets()), EngineConfig(), CLUSTER_INPUTS, Topic("p.control", sent),
                         ChunkedStore(table), _Durable(), 0, 30.0, 0.0)  # type: ignore[arg-type]
    first = Stream([Event(CLUSTER_INPUTS, 0, 0, Mark(1, 100.0, {}).encode()),
                    Event(CLUSTER_INPUTS, 0, 1, Mark(1, 100.0, {}).encode())])
    asyncio.run(agent.run(first))
    assert _acked_offsets(first) == [0], "the duplicate waits for the next checkpoint"
    assert agent.saved_position(0) == 1

    second = Stream([Event(CLUSTER_INPUTS, 0, 2, Mark(2, 110.0, {}).encode())])
    asyncio.run(agent.run(second))
    assert _acked_offsets(second) == [1, 2]
    assert agent.saved_position(0) == 3
