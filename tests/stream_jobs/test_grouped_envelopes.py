"""Forwarded records travel grouped: the route sends one envelope per stage partition, and a stage
acknowledges such an envelope only when the last record in it is done. Acknowledging it at the first
would commit past records still parked for a later mark, which a crash would then lose."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from schemas.codec import encode
from schemas.examples import all_examples, gpu_sample
from stream_jobs.delivery import SharedAck, offer_forwarded, state_position
from stream_jobs.route_agent import RouteAgent, RouteTopics
from stream_jobs.watermark import (
    ForwardedRecords,
    InputGate,
    Mark,
    decode_envelope,
    record_envelope,
    records_envelopes,
)
from tests.stream_jobs.fakes import Committed, Event, Events, Offsets, Stream, Topic, fake_delivery

SAMPLES = "p.gpu.samples.v1"
PROGRESS = "p.workload.progress.v1"


def _sample(offset: int) -> bytes:
    return record_envelope(SAMPLES, "gpu.samples.v1", 0, offset, b'{"x": 1}')


def _forwarded(value: bytes) -> ForwardedRecords:
    envelope = decode_envelope(value)
    assert isinstance(envelope, ForwardedRecords)
    return envelope


def test_a_grouped_envelope_is_acknowledged_with_its_last_record_across_two_marks() -> None:
    offsets, events = Offsets(), Events()
    delivery = fake_delivery(offsets)
    gate: InputGate[Any] = InputGate()
    envelope = Event("p.internal.node-inputs.v1", 2, 40)
    [value] = records_envelopes([_sample(10), _sample(11), _sample(12)])
    assert offer_forwarded(gate, _forwarded(value), envelope)
    assert state_position((p.token for p in gate.records.values()), 41) == 40, "the state does not hold it yet"

    async def scenario() -> None:
        first = gate.release(Mark(1, 100.0, {f"{SAMPLES}:0": 11}))
        assert [p.record.offset for p in first] == [10, 11]
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
    assert not offer_forwarded(applied, _forwarded(value), Event("n", 0, 40)), "all applied: a duplicate"
    partly: InputGate[Any] = InputGate(applied_seq=1, applied={f"{SAMPLES}:0": 10})
    event = Event("n", 0, 40)
    assert offer_forwarded(partly, _forwarded(value), event)
    tokens = {id(p.token) for p in partly.records.values()}
    assert len(partly.records) == 2 and len(tokens) == 1
    token = next(iter(partly.records.values())).token
    assert isinstance(token, SharedAck) and token.left == 2 and token.event is event
    # a single record keeps the event itself as its token (the form written before grouping)
    single: InputGate[Any] = InputGate()
    one = Event("n", 0, 41)
    assert offer_forwarded(single, _forwarded(_sample(13)), one)
    assert next(iter(single.records.values())).token is one


def test_the_route_sends_one_envelope_per_stage_partition_before_the_mark_that_covers_them() -> None:
    sent: list[tuple[str, int | None, bytes]] = []
    node_topic, cluster_topic, control = Topic("node", sent), Topic("cluster", sent), Topic("control", sent)
    topics = RouteTopics(input_names={SAMPLES: "gpu.samples.v1", PROGRESS: "workload.progress.v1"},
                         control_name="p.internal.control.v1", node_topic=node_topic, cluster_topic=cluster_topic,
                         control_topic=control, node_partitions=4,
                         node_partition=lambda key: int(key.decode().rsplit("-", 1)[1]) % 4)
    offsets = Offsets()
    route = RouteAgent(fake_delivery(offsets), topics, Committed())
    inputs = [Event(SAMPLES, 0, i, encode(gpu_sample(gpus=1, node=f"n-{i}"))) for i in range(8)]
    inputs.append(Event(PROGRESS, 0, 0, encode(all_examples()["workload.progress.v1"])))
    inputs.append(Event("p.internal.control.v1", 0, 0, Mark(1, 100.0, {f"{SAMPLES}:0": 7, f"{PROGRESS}:0": 0})
                         .encode()))
    stream = Stream(inputs)
    asyncio.run(route.run(stream))
    records = [(name, partition, orjson.loads(value)) for name, partition, value in sent]  # as on the wire
    grouped = [(name, partition, [r["o"] for r in data["rs"]]) for name, partition, data in records
               if data["k"] == "b"]
    assert sorted(grouped[:4], key=str) == [("node", p, [p, p + 4]) for p in range(4)]
    marks = [(name, partition) for name, partition, data in records if data["k"] == "m"]
    assert marks == [("node", p) for p in range(4)] + [("cluster", None)], "the mark follows the records"
    singles = [data for _name, _partition, data in records if data["k"] == "r"]
    assert len(singles) == 1 and singles[0]["t"] == PROGRESS, "one record alone goes as it is"
    assert [data["k"] for _name, _partition, data in records] == ["b"] * 4 + ["r"] + ["m"] * 5
    assert stream.acks.acked[:9] == inputs[:9], "inputs acknowledged once their copies are delivered"
