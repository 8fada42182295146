"""Forwarded records travel grouped: the route sends one envelope per stage partition, and a stage
acknowledges such an envelope only when the last record in it is done. Acknowledging it at the first
would commit past records still parked for a later mark, which a crash would then lose."""

from __future__ import annotations

import asyncio
from typing import Any

from schemas.codec import encode
from schemas.examples import all_examples, gpu_sample
from stream_jobs.config import EngineConfig
from stream_jobs.delivery import Delivery, SharedAck, offer_forwarded, state_position
from stream_jobs.route_agent import RouteAgent, RouteTopics
from stream_jobs.watermark import InputGate, Mark, decode_envelope, record_envelope, records_envelopes

SAMPLES = "p.gpu.samples.v1"
PROGRESS = "p.workload.progress.v1"


class _Message:
    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None = None) -> None:
        self.topic, self.partition, self.offset, self.key = topic, partition, offset, key
        self.tp = (topic, partition)
        self.timestamp = None


class _Event:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes = b"", key: bytes | None = None) -> None:
        self.message = _Message(topic, partition, offset, key)
        self.value = value


class _Offsets:
    """The offset guard as far as acknowledgements go: everything done is acknowledgeable."""

    def __init__(self) -> None:
        self.done_calls: list[Any] = []

    def done(self, tp: Any, offset: int, token: Any) -> list[Any]:
        self.done_calls.append(token)
        return [token]

    async def admit(self, *args: Any) -> bool:
        return True


class _Counter:
    def labels(self, *args: Any) -> _Counter:
        return self

    def inc(self, *args: Any) -> None:
        pass


class _Metrics:
    def __getattr__(self, name: str) -> _Counter:
        return _Counter()


class _Events:
    def __init__(self) -> None:
        self.acked: list[Any] = []

    async def ack(self, event: Any) -> None:
        self.acked.append(event)


def _delivery(offsets: _Offsets) -> Delivery:
    return Delivery(EngineConfig(), _Metrics(), offsets, None, {}, set())  # type: ignore[arg-type]


def _sample(offset: int) -> bytes:
    return record_envelope(SAMPLES, "gpu.samples.v1", 0, offset, b'{"x": 1}')


def test_a_grouped_envelope_is_acknowledged_with_its_last_record_across_two_marks() -> None:
    offsets, events = _Offsets(), _Events()
    delivery = _delivery(offsets)
    gate: InputGate[Any] = InputGate()
    envelope = _Event("p.internal.node-inputs.v1", 2, 40)
    [value] = records_envelopes([_sample(10), _sample(11), _sample(12)])
    assert offer_forwarded(gate, decode_envelope(value), envelope)
    assert state_position((p.token for p in gate.records.values()), 41) == 40, "the state does not hold it yet"

    async def scenario() -> None:
        first = gate.release(Mark(1, 100.0, {f"{SAMPLES}:0": 11}))
        assert [p.data["o"] for p in first] == [10, 11]
        for parked in first:
            await delivery.ack(events, parked.token)
        assert events.acked == [] and offsets.done_calls == [], "offset 12 is still parked"
        assert state_position((p.token for p in gate.records.values()), 41) == 40
        [last] = gate.release(Mark(2, 110.0, {f"{SAMPLES}:0": 12}))
        await delivery.ack(events, last.token)
        assert events.acked == [envelope] and offsets.done_calls == [envelope]

    asyncio.run(scenario())


def test_a_redelivered_envelope_parks_only_what_was_not_applied() -> None:
    [value] = records_envelopes([_sample(10), _sample(11), _sample(12)])
    applied: InputGate[Any] = InputGate(applied_seq=2, applied={f"{SAMPLES}:0": 12})
    assert not offer_forwarded(applied, decode_envelope(value), _Event("n", 0, 40)), "all applied: a duplicate"
    partly: InputGate[Any] = InputGate(applied_seq=1, applied={f"{SAMPLES}:0": 10})
    event = _Event("n", 0, 40)
    assert offer_forwarded(partly, decode_envelope(value), event)
    tokens = {id(p.token) for p in partly.records.values()}
    assert len(partly.records) == 2 and len(tokens) == 1
    token = next(iter(partly.records.values())).token
    assert isinstance(token, SharedAck) and token.left == 2 and token.event is event
    # a single record keeps the event itself as its token (the form written before grouping)
    single: InputGate[Any] = InputGate()
    one = _Event("n", 0, 41)
    assert offer_forwarded(single, decode_envelope(_sample(13)), one)
    assert next(iter(single.records.values())).token is one


class _Topic:
    def __init__(self, name: str, log: list[tuple[str, int | None, bytes]]) -> None:
        self.name, self.log = name, log

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, key: bytes | None, value: bytes, partition: int | None, headers: Any) -> Any:
        self.log.append((self.name, partition, value))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class _Committed:
    def local_committed(self) -> dict[str, int]:
        return {}

    async def group_committed(self, keys: list[str]) -> dict[str, int]:
        return {}


class _Stream:
    def __init__(self, events: list[_Event]) -> None:
        self.events_list, self.acks = events, _Events()

    def noack(self) -> _Stream:
        return self

    async def events(self) -> Any:
        for event in self.events_list:
            yield event

    async def ack(self, event: Any) -> None:
        await self.acks.ack(event)


def test_the_route_sends_one_envelope_per_stage_partition_before_the_mark_that_covers_them() -> None:
    sent: list[tuple[str, int | None, bytes]] = []
    node_topic, cluster_topic, control = _Topic("node", sent), _Topic("cluster", sent), _Topic("control", sent)
    topics = RouteTopics(input_names={SAMPLES: "gpu.samples.v1", PROGRESS: "workload.progress.v1"},
                         control_name="p.internal.control.v1", node_topic=node_topic, cluster_topic=cluster_topic,
                         control_topic=control, node_partitions=4,
                         node_partition=lambda key: int(key.decode().rsplit("-", 1)[1]) % 4)
    offsets = _Offsets()
    route = RouteAgent(_delivery(offsets), topics, _Committed())
    inputs = [_Event(SAMPLES, 0, i, encode(gpu_sample(gpus=1, node=f"n-{i}"))) for i in range(8)]
    inputs.append(_Event(PROGRESS, 0, 0, encode(all_examples()["workload.progress.v1"])))
    inputs.append(_Event("p.internal.control.v1", 0, 0, Mark(1, 100.0, {f"{SAMPLES}:0": 7, f"{PROGRESS}:0": 0})
                         .encode()))
    stream = _Stream(inputs)
    asyncio.run(route.run(stream))
    records = [(name, partition, decode_envelope(value)) for name, partition, value in sent]
    grouped = [(name, partition, [r["o"] for r in data["rs"]]) for name, partition, data in records
               if data["k"] == "b"]
    assert sorted(grouped[:4], key=str) == [("node", p, [p, p + 4]) for p in range(4)]
    marks = [(name, partition) for name, partition, data in records if data["k"] == "m"]
    assert marks == [("node", p) for p in range(4)] + [("cluster", None)], "the mark follows the records"
    singles = [data for _name, _partition, data in records if data["k"] == "r"]
    assert len(singles) == 1 and singles[0]["t"] == PROGRESS, "one record alone goes as it is"
    assert [data["k"] for _name, _partition, data in records] == ["b"] * 4 + ["r"] + ["m"] * 5
    assert stream.acks.acked[:9] == inputs[:9], "inputs acknowledged once their copies are delivered"
