"""A stage whose partition is revoked while its checkpoint waits for output deliveries writes no
state: its new owner restored the last checkpoint and goes on from there, and a late write of the
old owner's state could land after the new owner's checkpoints, so that the next restore takes the
older state while the inputs in between are committed (a chaos run lost a pod's samples so)."""

from __future__ import annotations

import asyncio
from typing import Any

from stream_jobs.cluster_agent import ClusterAgent
from stream_jobs.config import EngineConfig
from stream_jobs.node_agent import NodeAgent
from stream_jobs.state_store import ChunkedStore
from stream_jobs.watermark import ForwardedRecord

NODE_INPUTS = "p.internal.node-inputs.v1"


class _Event:
    """A consumed record as an agent holds it (its offset is what the state's position needs)."""

    value: bytes | None = None

    def __init__(self, offset: int) -> None:
        self.message = type("Message", (), {"offset": offset, "topic": NODE_INPUTS})()


class _Durable:
    def __init__(self) -> None:
        self.confirms = 0

    async def confirm(self) -> None:
        self.confirms += 1


class _Delivery:
    """The acknowledgements an agent makes (the rest of Delivery is not reached here)."""

    def __init__(self) -> None:
        self.acked: list[Any] = []

    async def ack(self, events: Any, token: Any) -> None:
        self.acked.append(token)


def _node_agent(table: dict[bytes, Any], durable: _Durable, delivery: _Delivery) -> NodeAgent:
    return NodeAgent(delivery, EngineConfig(), NODE_INPUTS, None,  # type: ignore[arg-type]
                     ChunkedStore(table), durable, 30.0, 1.0)


def _cluster_agent(table: dict[bytes, Any], durable: _Durable, delivery: _Delivery) -> ClusterAgent:
    return ClusterAgent(delivery, EngineConfig(), "p.internal.cluster-inputs.v1", None,  # type: ignore[arg-type]
                        ChunkedStore(table), durable, 12, 30.0, 1.0)


def _node_checkpoint(revoke: bool) -> tuple[dict[bytes, Any], _Durable, _Delivery]:
    table: dict[bytes, Any] = {}
    durable, delivery = _Durable(), _Delivery()
    agent = _node_agent(table, durable, delivery)

    async def scenario() -> None:
        part = agent._part(3)
        output: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        part.futures, part.unacked = [output], ["input record"]  # type: ignore[list-item]
        part.next_offset = 42
        part.gate.offer(ForwardedRecord("p.k8s.pods.v1", "k8s.pods.v1", 0, 7, {}), _Event(40))  # parked
        checkpoint = asyncio.ensure_future(agent._checkpoint(None, 3, part))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        if revoke:
            agent.revoke(3)  # a rebalance while the output's delivery is awaited
        output.set_result(None)
        await checkpoint

    asyncio.run(scenario())
    return table, durable, delivery


def test_a_node_partition_revoked_during_its_checkpoint_writes_no_state() -> None:
    table, durable, delivery = _node_checkpoint(revoke=False)
    assert list(table) == [b"p3"] and durable.confirms == 1 and delivery.acked == ["input record"]
    saved = _node_agent(table, durable, delivery).saved_position(3)
    assert saved == 40, "the state's position: its earliest parked record, not the next offset (42)"
    table, durable, delivery = _node_checkpoint(revoke=True)
    assert table == {} and durable.confirms == 0 and delivery.acked == []


def _cluster_checkpoint(revoke: bool) -> tuple[dict[bytes, Any], _Durable, _Delivery]:
    table: dict[bytes, Any] = {}
    durable, delivery = _Durable(), _Delivery()
    agent = _cluster_agent(table, durable, delivery)

    async def scenario() -> None:
        gate, stages = agent._restore()
        output: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        agent.futures, agent.unacked = [output], ["node output"]  # type: ignore[list-item]
        agent.next_offset = 12
        checkpoint = asyncio.ensure_future(agent._checkpoint(None, gate, stages, None, {}))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        if revoke:
            agent.revoke()
            agent._restore()  # the partition comes back; its state is read again from the table
            new_output: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            agent.futures.append(new_output)
        output.set_result(None)
        await checkpoint
        if revoke:
            assert agent.futures == [new_output], "the new assignment's deliveries are still awaited"

    asyncio.run(scenario())
    return table, durable, delivery


def test_a_cluster_partition_revoked_during_its_checkpoint_writes_no_state() -> None:
    table, durable, delivery = _cluster_checkpoint(revoke=False)
    assert list(table) == [b"cluster"] and durable.confirms == 1 and delivery.acked == ["node output"]
    assert _cluster_agent(table, durable, delivery).saved_position(0) == 12
    table, durable, delivery = _cluster_checkpoint(revoke=True)
    assert table == {} and durable.confirms == 0 and delivery.acked == []
