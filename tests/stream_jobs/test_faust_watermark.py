"""The watermark gates without Kafka: what a mark releases, in which order, and how redelivered
records and marks are recognised (what makes the faust runtime match the in-process replay)."""

from __future__ import annotations

import orjson

from stream_jobs.json_types import as_int, int_map
from stream_jobs.watermark import (
    ClusterGate,
    ForwardedRecord,
    ForwardedRecords,
    InputGate,
    Mark,
    MarkHold,
    NodeMark,
    NodeOutputs,
    decode_envelope,
    output_envelopes,
    record_envelope,
)

PODS, SAMPLES = "p.k8s.pods.v1", "p.gpu.samples.v1"


def rec(topic: str, partition: int, offset: int) -> ForwardedRecord:
    suffix = topic.split(".", 1)[1]
    envelope = decode_envelope(record_envelope(topic, suffix, partition, offset, b'{"x": 1}'))
    assert isinstance(envelope, ForwardedRecords)
    [record] = envelope.records
    return record


def test_record_envelope_embeds_the_original_json() -> None:
    value = record_envelope(SAMPLES, "gpu.samples.v1", 3, 17, b'{"x": 1}')
    assert orjson.loads(value) == {"k": "r", "t": SAMPLES, "s": "gpu.samples.v1", "p": 3, "o": 17, "v": {"x": 1}}
    assert rec(SAMPLES, 3, 17) == ForwardedRecord(SAMPLES, "gpu.samples.v1", 3, 17, {"x": 1})
    assert Mark.from_dict(orjson.loads(Mark(5, 12.5, {f"{SAMPLES}:3": 17}, end=True).encode())) == \
        Mark(5, 12.5, {f"{SAMPLES}:3": 17}, end=True)


def test_a_mark_releases_only_what_it_covers_in_canonical_order() -> None:
    gate: InputGate[str] = InputGate()
    # arrival order: samples of the next tick first, then pod states, then this tick's sample
    for topic, partition, offset in [(SAMPLES, 0, 5), (PODS, 1, 2), (SAMPLES, 0, 4), (PODS, 0, 9)]:
        assert gate.offer(rec(topic, partition, offset), f"{topic}:{partition}:{offset}")
    mark = Mark(1, 100.0, {f"{SAMPLES}:0": 4, f"{PODS}:0": 9, f"{PODS}:1": 2})
    released = [p.token for p in gate.release(mark)]
    # pod states before samples, then partition and offset; the sample at offset 5 stays parked
    assert released == [f"{PODS}:0:9", f"{PODS}:1:2", f"{SAMPLES}:0:4"]
    assert list(gate.records) == [(SAMPLES, 0, 5)]
    assert gate.applied_seq == 1


def test_marks_release_each_partition_up_to_its_offset_whatever_the_arrival_order() -> None:
    gate: InputGate[str] = InputGate()
    for offset in (7, 3, 9, 5, 4):
        assert gate.offer(rec(SAMPLES, 0, offset), f"s0:{offset}")
    assert gate.offer(rec(SAMPLES, 1, 2), "s1:2")
    # partition 1 is not in the mark: the driver had not written there yet, so it stays parked
    assert [p.token for p in gate.release(Mark(1, 10.0, {f"{SAMPLES}:0": 5}))] == ["s0:3", "s0:4", "s0:5"]
    assert gate.offer(rec(SAMPLES, 0, 6), "s0:6"), "a record between released and parked ones"
    assert not gate.offer(rec(SAMPLES, 0, 4), "again"), "released, so applied"
    assert [p.token for p in gate.release(Mark(2, 20.0, {f"{SAMPLES}:0": 8, f"{SAMPLES}:1": 2}))] == \
        ["s0:6", "s0:7", "s1:2"]
    assert gate.progress() == {"seq": 2, "applied": {f"{SAMPLES}:0": 7, f"{SAMPLES}:1": 2}}
    assert [p.token for p in gate.release(Mark(3, 30.0, None))] == ["s0:9"]
    assert not gate.records


def test_redelivered_records_and_marks_are_recognised() -> None:
    gate: InputGate[int] = InputGate()
    assert gate.offer(rec(SAMPLES, 0, 1), 1)
    assert not gate.offer(rec(SAMPLES, 0, 1), 2), "a duplicate of a parked record"
    gate.release(Mark(7, 10.0, None))  # a clock mark covers everything parked
    progress = gate.progress()
    restored: InputGate[int] = InputGate(as_int(progress["seq"]), int_map(progress["applied"]))
    assert not restored.offer(rec(SAMPLES, 0, 1), 3), "already applied before the restart"
    assert restored.offer(rec(SAMPLES, 0, 2), 4)
    assert not restored.is_new(7) and restored.is_new(8)


def test_cluster_gate_waits_for_every_node_partition() -> None:
    gate: ClusterGate[str] = ClusterGate(node_partitions=2)
    assert gate.offer_mark(Mark(1, 10.0, {f"{PODS}:0": 0}), "m1")
    assert gate.offer(rec(PODS, 0, 0), "pod")
    assert gate.offer(rec(SAMPLES, 0, 0), "sample written after mark 1")
    assert gate.offer_output(NodeOutputs(1, 1, 0, [("summary", {})]), "o1-1-0")
    assert gate.offer_output(NodeOutputs(0, 2, 0, [("summary", {})]), "o2-0-0")
    assert gate.offer_node_mark(NodeMark(1, 1, {"sample_gaps": 1}), "nm1-1")
    assert gate.next_complete() is None, "partition 0 has not passed mark 1 yet"
    assert gate.offer_node_mark(NodeMark(0, 1, {"sample_gaps": 2}), "nm1-0")
    mark = gate.next_complete()
    assert mark is not None and mark.seq == 1
    direct, outs, tokens, stats = gate.complete(mark)
    assert [p.token for p in direct] == ["pod"], "a partition the mark does not name is not covered"
    assert [p.token for p in outs] == ["o1-1-0"], "outputs of mark 2 wait for mark 2"
    assert sorted(tokens) == ["m1", "nm1-0", "nm1-1"]
    assert stats == {"sample_gaps": 3}
    assert not gate.offer_output(NodeOutputs(0, 1, 5, [("usage", {})]), "late dup")


def test_a_marks_outputs_travel_in_few_envelopes_in_order_none_oversized() -> None:
    outputs = [("summary" if i % 3 == 0 else "usage", orjson.dumps({"n": i, "pad": "x" * (i % 50)}))
               for i in range(300)]
    one = output_envelopes(2, 9, outputs)
    assert len(one) == 1, "a partition's outputs of one mark are one record on a normal fleet"
    small = output_envelopes(2, 9, outputs, limit=2_000)
    assert len(small) > 5 and all(len(e) <= 2_000 + 200 for e in small)
    for envelopes in (one, small):
        decoded = [decode_envelope(e) for e in envelopes]
        assert all(isinstance(d, NodeOutputs) for d in decoded)
        assert [(d.partition, d.seq, d.index) for d in decoded if isinstance(d, NodeOutputs)] == \
            [(2, 9, i) for i in range(len(envelopes))]
        got = [item for d in decoded if isinstance(d, NodeOutputs) for item in d.outputs]
        assert got == [(kind, orjson.loads(value)) for kind, value in outputs]
    assert output_envelopes(0, 1, []) == [], "no outputs, no envelope (the node mark still goes)"
    # an envelope written before outputs were grouped (one output each) still reads
    old = orjson.dumps({"k": "o", "P": 0, "seq": 1, "i": 4, "c": "usage", "v": {"a": 1}})
    assert decode_envelope(old) == NodeOutputs(0, 1, 4, [("usage", {"a": 1})])


def test_route_holds_a_mark_until_its_offsets_are_consumed() -> None:
    hold: MarkHold[str] = MarkHold()
    hold.hold(Mark(1, 0.0, {f"{SAMPLES}:0": 3, f"{PODS}:2": 0}), "m1")
    hold.hold(Mark(2, 10.0, {f"{SAMPLES}:0": 5}), "m2")
    hold.consume(SAMPLES, 0, 3)
    assert hold.ready({}) == []
    assert hold.missing(hold.held[0][0], {}) == {f"{PODS}:2": 0}
    # after a restart, what was committed before is not consumed again: it counts as consumed
    assert [t for _m, t in hold.ready({f"{PODS}:2": 1})] == ["m1"]
    hold.consume(SAMPLES, 0, 5)
    assert [t for _m, t in hold.ready({})] == ["m2"]


def test_route_does_not_hold_a_mark_for_the_samples_it_does_not_read() -> None:
    """Each node partition reads its samples and holds the mark there; the route waits for its own inputs."""
    hold: MarkHold[str] = MarkHold(topics=frozenset({PODS}))
    hold.hold(Mark(1, 0.0, {f"{SAMPLES}:0": 3, f"{PODS}:2": 0}), "m1")
    assert hold.missing(hold.held[0][0], {}) == {f"{PODS}:2": 0}
    hold.consume(PODS, 2, 0)
    assert [t for _m, t in hold.ready({})] == ["m1"], "no sample was consumed by the route, none is waited for"
