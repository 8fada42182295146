"""The route reads on while its forwarded batches travel to the broker, and still counts an input
consumed, acknowledges it and forwards a mark that covers it only once its copy is delivered.
Waiting for each batch's round trip held up the stages behind the route; acknowledging or
forwarding the mark before the delivery would let a crash lose the records (the mark would reach a
stage before them)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from schemas.codec import encode
from schemas.examples import gpu_sample
from stream_jobs.route_agent import MAX_IN_FLIGHT, ROUTE_BATCH, RouteAgent, RouteTopics
from stream_jobs.watermark import Mark
from tests.stream_jobs.fakes import Committed, Event, Offsets, Stream, fake_delivery

SAMPLES = "p.gpu.samples.v1"
CONTROL = "p.internal.control.v1"


class SlowTopic:
    """A topic whose deliveries complete when the test says so."""

    def __init__(self, name: str, log: list[tuple[str, int | None, bytes, asyncio.Future[None]]]) -> None:
        self.name, self.log = name, log

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes | None, value: bytes, partition: int | None = None, headers: Any = None) -> Any:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.log.append((self.name, partition, value, future))
        return future


def _route(sent: list[tuple[str, int | None, bytes, asyncio.Future[None]]]) -> RouteAgent:
    topics = RouteTopics(input_names={SAMPLES: "gpu.samples.v1"}, control_name=CONTROL,
                         node_topic=SlowTopic("node", sent), cluster_topic=SlowTopic("cluster", sent),
                         control_topic=SlowTopic("control", sent), node_partitions=2,
                         node_partition=lambda key: int(key.decode().rsplit("-", 1)[1]) % 2)
    return RouteAgent(fake_delivery(Offsets()), topics, Committed())


def _kinds(sent: list[tuple[str, int | None, bytes, asyncio.Future[None]]]) -> list[str]:
    return [orjson.loads(value)["k"] for _name, _partition, value, _future in sent]


def test_the_route_reads_on_while_a_batch_travels_and_forwards_the_mark_once_it_is_delivered() -> None:
    sent: list[tuple[str, int | None, bytes, asyncio.Future[None]]] = []
    route = _route(sent)
    inputs = [Event(SAMPLES, 0, i, encode(gpu_sample(gpus=1, node=f"n-{i}"))) for i in range(4)]
    inputs.append(Event(CONTROL, 0, 0, Mark(1, 100.0, {f"{SAMPLES}:0": 3}).encode()))
    stream = Stream(inputs)

    async def scenario() -> None:
        await asyncio.wait_for(route.run(stream), 5)  # does not wait for the deliveries
        assert _kinds(sent) == ["b", "b"], "the records left, the mark waits for them"
        assert stream.acks.acked == [], "nothing is acknowledged before its copy is delivered"
        for *_rest, future in sent:
            future.set_result(None)
        for _ in range(10):  # no further record comes: the delivery itself forwards the mark
            await asyncio.sleep(0)
        assert _kinds(sent) == ["b", "b", "m", "m", "m"]
        assert stream.acks.acked == inputs[:4]
        for *_rest, future in sent[2:]:
            future.set_result(None)
        for _ in range(2):  # the timer's rounds: the mark's copies are counted delivered, then acknowledged
            await route._settle()
            await asyncio.sleep(0)
        assert stream.acks.acked == inputs

    asyncio.run(scenario())


def test_the_route_waits_for_the_oldest_batch_when_too_many_travel() -> None:
    sent: list[tuple[str, int | None, bytes, asyncio.Future[None]]] = []
    route = _route(sent)
    count = ROUTE_BATCH * (MAX_IN_FLIGHT + 2)
    stream = Stream([Event(SAMPLES, 0, i, encode(gpu_sample(gpus=1, node=f"n-{i}"))) for i in range(count)])

    async def scenario() -> None:
        run = asyncio.ensure_future(route.run(stream))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not run.done(), "with every batch still travelling the route stops reading"
        assert len(route._in_flight) == MAX_IN_FLIGHT, "(the oldest is taken out and awaited)"
        for *_rest, future in sent:
            future.set_result(None)
        await asyncio.wait_for(run, 5)

    asyncio.run(scenario())


class GatedTopic(SlowTopic):
    """A topic whose ``send`` itself waits (a full producer queue) until the test opens the gate."""

    def __init__(self, name: str, log: list[tuple[str, int | None, bytes, asyncio.Future[None]]],
                 gate: asyncio.Event) -> None:
        super().__init__(name, log)
        self.gate = gate

    async def send(self, *, key: bytes | None, value: bytes, partition: int | None = None, headers: Any = None) -> Any:
        await self.gate.wait()
        return await super().send(key=key, value=value, partition=partition, headers=headers)


def test_a_mark_forwarded_while_the_timer_settles_is_still_acknowledged() -> None:
    """The timer's round may take the marks awaiting acknowledgement while a mark is being forwarded
    (its send waits for the producer): that mark must still be acknowledged, or the control
    partition's commits stop there for good and the group's lag never returns to 0."""
    sent: list[tuple[str, int | None, bytes, asyncio.Future[None]]] = []

    async def scenario() -> None:
        gate = asyncio.Event()
        topics = RouteTopics(input_names={SAMPLES: "gpu.samples.v1"}, control_name=CONTROL,
                             node_topic=GatedTopic("node", sent, gate), cluster_topic=GatedTopic("cluster", sent, gate),
                             control_topic=SlowTopic("control", sent), node_partitions=2,
                             node_partition=lambda key: 0)
        route = RouteAgent(fake_delivery(Offsets()), topics, Committed())
        inputs = [Event(CONTROL, 0, 0, Mark(1, 100.0, None).encode())]
        stream = Stream(inputs)
        run = asyncio.ensure_future(route.run(stream))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not run.done() and sent == [], "the mark is being forwarded: its send waits"
        await route._settle()  # the timer's round, meanwhile
        gate.set()
        await asyncio.wait_for(run, 5)
        assert _kinds(sent) == ["m", "m", "m"]
        for *_rest, future in sent:
            future.set_result(None)
        for _ in range(3):
            await route._settle()
            await asyncio.sleep(0)
        assert stream.acks.acked == inputs, "the forwarded mark is acknowledged"

    asyncio.run(scenario())
