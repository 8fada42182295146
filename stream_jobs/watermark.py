"""Watermark marks and the gates that make the Kafka runtime apply inputs exactly as in-process.

The five input topics are consumed independently, so arrival order says nothing about event
time: a burst replay can deliver every sample before any pod state. Progress is therefore made
explicit with *marks*. A mark says "every input up to these offsets has been written, and event
time has reached ``ts``" (a replay driver writes one after each tick; a live worker writes them
from its wall clock, without offsets). The route stage holds a mark until it has consumed every
input partition it reads up to the mark's offsets and then forwards it *in-band* to every partition
of the node-inputs topic and to the cluster-inputs topic, behind the records it forwarded. A node
partition reads its own samples partition and holds the mark until it has read that far there too.

A stage never applies a record when it arrives. It parks it in a gate; when a mark comes, the gate
releases exactly the records the mark covers (source offset <= the mark's offset for its input
partition), in a canonical order (input topic, partition, offset), and the stage then advances its
watermark to ``mark.ts - lateness`` — the same inputs, order and watermarks as ``run_in_process``
whatever the consumption timing. Records a later mark covers stay parked.

Every gate also makes redelivery harmless (at-least-once transport): a record whose source offset
was already applied, a node output of an already applied mark, or a mark already applied is
recognised and dropped. Everything here is plain data so it lives in the stages' tables.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Generic, TypeGuard, TypeVar

import orjson

from schemas.control import STATE_MARK_KIND
from schemas.messages import DEFAULT_CLUSTER
from schemas.topics import GPU_SAMPLES, K8S_EVENTS, K8S_NODES, K8S_PODS, WORKLOAD_PROGRESS
from stream_jobs.json_types import JsonDict, JsonObject, as_float, as_int, as_object

T = TypeVar("T")

# canonical release order of the input topics: states before derived inputs before samples
TOPIC_RANK: dict[str, int] = {spec.suffix: i for i, spec in enumerate(
    (K8S_NODES, K8S_PODS, K8S_EVENTS, WORKLOAD_PROGRESS, GPU_SAMPLES))}


def node_watermark(base: float, now: float, sample_ts: float | None, state_ts: float | None) -> float:
    """A live node stage's watermark at a clock mark (event time per node).

    ``base`` is the mark's time less the allowed lateness: what every node reaches. A node goes
    further, up to its own latest sample (``sample_ts``: its agent sends in order, so nothing older
    is still to come from it), as far as the pod and node state is known complete (``state_ts``: the
    latest state mark of its cluster), never past the mark's own time ``now``: an on-time node's
    alerts do not wait for other nodes' lateness, and its rules never run on pod state older than
    its samples. Without a state mark (no watcher writes them) every node stays at ``base``."""
    if sample_ts is None or state_ts is None:
        return base
    return max(base, min(now, sample_ts, state_ts))


def tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


@dataclass(frozen=True)
class Mark:
    """Event-time progress. ``offsets`` maps ``topic:partition`` to the last offset the driver
    wrote there (None: a clock mark, which covers whatever has arrived). ``end``: the input is
    complete — stages flush at ``ts``.

    ``state``: a state mark (``schemas.control``, the cluster watcher's): the pod and node changes
    of ``cluster`` observed before ``ts`` are at or below ``offsets``. It releases nothing; it only
    tells live node stages how far pod state is complete."""

    seq: int
    ts: float
    offsets: dict[str, int] | None = None
    end: bool = False
    state: bool = False
    cluster: str | None = None

    def to_dict(self) -> JsonDict:
        if self.state:
            return {"k": STATE_MARK_KIND, "seq": self.seq, "ts": self.ts, "cluster": self.cluster, "off": self.offsets}
        return {"k": "m", "seq": self.seq, "ts": self.ts, "off": self.offsets, "end": self.end}

    def encode(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: JsonObject) -> Mark:
        off = data.get("off")
        state = data.get("k") == STATE_MARK_KIND
        return cls(seq=as_int(data["seq"]), ts=float(as_float(data["ts"])),
                   offsets=None if off is None else {str(k): as_int(v) for k, v in as_object(off).items()},
                   end=bool(data.get("end", False)), state=state,
                   cluster=str(data.get("cluster") or DEFAULT_CLUSTER) if state else None)


@dataclass(slots=True)
class SourceRecord:
    """An input record as a stage parks it, with where it was read (``t``, ``s``, ``p``, ``o`` on the
    wire): the input topic, its registry suffix, the partition and the offset."""

    topic: str
    suffix: str
    partition: int
    offset: int

    @property
    def source(self) -> list[str | int]:
        """Where it came from as the stages name it in a dead letter: ``[topic, partition, offset]``."""
        return [self.topic, self.partition, self.offset]


@dataclass(slots=True)
class ForwardedRecord(SourceRecord):
    """An input record the route forwarded (``k`` ``r``): ``value`` is its JSON, validated by the route."""

    value: dict[str, object]


@dataclass(slots=True)
class ReadRecord(SourceRecord):
    """A record a stage read from an input topic itself (a node partition's samples), as read: it is
    validated when a mark releases it."""

    key: bytes | None
    raw: bytes | None


InputRecord = ForwardedRecord | ReadRecord


@dataclass(frozen=True, slots=True)
class ForwardedRecords:
    """An envelope of forwarded records: one (``k`` ``r``) or several (``b``, in ``rs``)."""

    records: list[ForwardedRecord]


@dataclass(frozen=True, slots=True)
class NodeOutputs:
    """A node stage's outputs of mark ``seq`` (``k`` ``o``): envelope ``index`` (``i``) of node-inputs
    partition ``partition`` (``P``), each output ``(kind, JSON data)`` (``outs``)."""

    partition: int
    seq: int
    index: int
    outputs: list[tuple[str, dict[str, object]]]

    @property
    def order(self) -> tuple[int, int, int]:
        """Where it goes among a mark's outputs: by mark, partition and index."""
        return (self.seq, self.partition, self.index)


@dataclass(frozen=True, slots=True)
class NodeMark:
    """A node partition (``P``) has applied mark ``seq`` (``k`` ``nm``); ``stats``: its counters."""

    partition: int
    seq: int
    stats: dict[str, int]


@dataclass(frozen=True, slots=True)
class OtherEnvelope:
    """An envelope of a kind the stages do not read (the cluster stage's ``done``, say)."""

    kind: str


Envelope = Mark | ForwardedRecords | NodeOutputs | NodeMark | OtherEnvelope
"""An internal record as the stages read it (:func:`decode_envelope`)."""


def record_envelope(topic: str, suffix: str, partition: int, offset: int, value: bytes) -> bytes:
    """A forwarded input record; ``value`` is the original JSON (already validated), embedded as is."""
    head = orjson.dumps({"k": "r", "t": topic, "s": suffix, "p": partition, "o": offset})
    return head[:-1] + b',"v":' + value + b"}"


ENVELOPE_BYTES = 256 * 1024
"""Records grouped into one envelope come to about this size at most (a record alone may be more).
The route forwards input records, and a node stage sends its outputs of a mark, in one envelope per
stage partition on a normal fleet instead of one per record: most of a stage's reading was faust's
work per record."""


def chunked(items: list[bytes], limit: int = ENVELOPE_BYTES) -> list[list[bytes]]:
    """``items`` in order, in runs of at most ``limit`` bytes (a longer item alone)."""
    runs: list[list[bytes]] = []
    run: list[bytes] = []
    size = 0
    for item in items:
        if run and size + len(item) > limit:
            runs.append(run)
            run, size = [], 0
        run.append(item)
        size += len(item) + 1
    if run:
        runs.append(run)
    return runs


def records_envelopes(records: list[bytes], limit: int = ENVELOPE_BYTES) -> list[bytes]:
    """Forwarded input records for one stage partition, each as :func:`record_envelope` writes it,
    grouped into envelopes (``b``; a record alone goes as it is)."""
    return [run[0] if len(run) == 1 else b'{"k":"b","rs":[' + b",".join(run) + b"]}" for run in chunked(records, limit)]


def _forwarded_records(data: dict[str, object]) -> ForwardedRecords:
    """The forwarded records an envelope holds: several (``b``) or one (``r``). Raises
    :class:`ValueError` when one is not a forwarded record (the route writes none such)."""
    records = data.get("rs") if data["k"] == "b" else [data]
    if not isinstance(records, list):
        raise ValueError("an envelope of records without its list of records")
    out = []
    for record in records:
        if not isinstance(record, dict):
            raise ValueError("a forwarded record without its topic, partition, offset and value")
        topic, suffix, partition, offset, value = (record.get(key) for key in ("t", "s", "p", "o", "v"))
        if not (isinstance(topic, str) and isinstance(suffix, str) and _is_int(partition) and _is_int(offset)
                and isinstance(value, dict)):
            raise ValueError("a forwarded record without its topic, partition, offset and value")
        out.append(ForwardedRecord(topic, suffix, partition, offset, value))
    return ForwardedRecords(out)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def output_envelopes(partition: int, seq: int, outputs: list[tuple[str, bytes]],
                     limit: int = ENVELOPE_BYTES) -> list[bytes]:
    """A node stage's outputs of mark ``seq`` for the cluster stage, ``(kind, JSON)`` each, in
    envelopes numbered within the mark (``i``) and holding whole outputs (``outs``)."""
    items = [b'["' + kind.encode() + b'",' + value + b"]" for kind, value in outputs]
    return [orjson.dumps({"k": "o", "P": partition, "seq": seq, "i": index})[:-1]
            + b',"outs":[' + b",".join(run) + b"]}"
            for index, run in enumerate(chunked(items, limit))]


def _node_outputs(data: dict[str, object]) -> NodeOutputs:
    """An output envelope; one holding a single output in the form written before outputs were
    grouped (``c`` and ``v``) reads as well."""
    outs = data["outs"] if "outs" in data else [[data["c"], data["v"]]]
    if not isinstance(outs, list):
        raise ValueError("an output envelope without its list of outputs")
    outputs = [(str(kind), value) for kind, value in outs if isinstance(value, dict)]
    if len(outputs) < len(outs):
        raise ValueError("an output that is not a JSON object")
    partition, seq, index = data["P"], data["seq"], data["i"]
    if not (_is_int(partition) and _is_int(seq) and _is_int(index)):
        raise ValueError("an output envelope without its partition, mark and index")
    return NodeOutputs(partition=partition, seq=seq, index=index, outputs=outputs)


def node_mark_envelope(partition: int, mark: Mark, stats: dict[str, int]) -> bytes:
    return orjson.dumps(mark.to_dict() | {"k": "nm", "P": partition, "stats": stats})


def done_envelope(seq: int, stats: dict[str, int]) -> bytes:
    return orjson.dumps({"k": "done", "seq": seq, "stats": stats})


def decode_envelope(value: bytes | None) -> Envelope:
    """An internal record as the stages read it, by its kind (``k``). Raises :class:`ValueError`,
    :class:`KeyError` or :class:`TypeError` for what no worker writes."""
    if value is None:
        raise ValueError("a record without a value (a tombstone)")
    data = orjson.loads(value)
    if not isinstance(data, dict) or "k" not in data:
        raise ValueError("not a stream-jobs envelope")
    kind = data["k"]
    if kind in ("r", "b"):
        return _forwarded_records(data)
    if kind == "o":
        return _node_outputs(data)
    if kind == "nm":
        return NodeMark(partition=int(data["P"]), seq=int(data["seq"]),
                        stats={str(name): int(count) for name, count in (data.get("stats") or {}).items()})
    if kind in ("m", STATE_MARK_KIND):
        return Mark.from_dict(data)
    return OtherEnvelope(str(kind))


# --------------------------------------------------------------------------- route: holding marks


@dataclass
class MarkHold(Generic[T]):
    """The route stage's marks, held until the inputs they cover have been consumed, each with its
    token (the control record to acknowledge once it is forwarded)."""

    consumed: dict[str, int] = field(default_factory=dict)
    held: list[tuple[Mark, T]] = field(default_factory=list)
    topics: frozenset[str] | None = None
    """The input topics whose partitions a mark waits for (None: every one it names). The route
    does not read ``gpu.samples.v1``: each node partition waits for its own samples."""

    def consume(self, topic: str, partition: int, offset: int) -> None:
        key = tp_key(topic, partition)
        if offset > self.consumed.get(key, -1):
            self.consumed[key] = offset

    def hold(self, mark: Mark, token: T) -> None:
        self.held.append((mark, token))

    def missing(self, mark: Mark, committed: dict[str, int]) -> dict[str, int]:
        """Input partitions not yet consumed up to the mark: ``{tp: offset wanted}``. ``committed``
        holds the next offset to read per partition as committed before a restart (what was
        consumed then is not consumed again)."""
        if mark.offsets is None:
            return {}
        return {tp: off for tp, off in mark.offsets.items()
                if max(self.consumed.get(tp, -1), committed.get(tp, 0) - 1) < off
                and (self.topics is None or tp.rpartition(":")[0] in self.topics)}

    def ready(self, committed: dict[str, int]) -> list[tuple[Mark, T]]:
        """Marks now released, in order (a mark never overtakes an earlier one)."""
        out = []
        while self.held and not self.missing(self.held[0][0], committed):
            out.append(self.held.pop(0))
        return out


# --------------------------------------------------------------------------- stages: gates


@dataclass(slots=True)
class Parked(Generic[T]):
    """An input record parked in a gate, with the token acknowledged once it is applied."""

    order: tuple[int, str, int, int]
    """Its place in the canonical release order: topic rank, topic, partition, offset."""
    record: InputRecord
    token: T


@dataclass(slots=True)
class ParkedOutputs(Generic[T]):
    """A node stage's output envelope parked in the cluster gate."""

    envelope: NodeOutputs
    token: T


class InputGate(Generic[T]):
    """Records parked until a mark releases them, for one input stream of a stage (one
    node-inputs partition, or the cluster stage's single partition).

    ``applied_seq`` and ``applied`` (highest source offset applied per input partition) are the
    stage's progress: they are saved with the stage state, so redelivered records and marks are
    recognised after a restart.
    """

    def __init__(self, applied_seq: int = 0, applied: dict[str, int] | None = None) -> None:
        self.applied_seq = applied_seq
        self.applied: dict[str, int] = dict(applied or {})
        self.records: dict[tuple[str, int, int], Parked[T]] = {}
        self._parked_offsets: dict[tuple[str, int], list[int]] = {}
        """The offsets in ``records`` per source partition, ascending: a mark releases a prefix of
        each (scanning every parked record at each mark cost a worker catching up on a backlog,
        whose gates park thousands, a twentieth of its CPU)."""

    def offer(self, record: InputRecord, token: T) -> bool:
        """Park an input record; False when it was already applied or is parked (a duplicate)."""
        topic, partition, offset = record.topic, record.partition, record.offset
        if offset <= self.applied.get(tp_key(topic, partition), -1):
            return False
        key = (topic, partition, offset)
        if key in self.records:
            return False
        self.records[key] = Parked((TOPIC_RANK.get(record.suffix, 99), topic, partition, offset), record, token)
        bisect.insort(self._parked_offsets.setdefault((topic, partition), []), offset)
        return True

    def is_new(self, seq: int) -> bool:
        return seq > self.applied_seq

    def release(self, mark: Mark) -> list[Parked[T]]:
        """The parked records ``mark`` covers, in canonical order; records progress to the mark."""
        out: list[Parked[T]] = []
        for source, offsets in list(self._parked_offsets.items()):
            key = tp_key(*source)
            if mark.offsets is None:
                covered = len(offsets)
            else:
                # a partition the driver had not written yet: its records come after this mark
                # (they are checked against the clock of the mark that covers them, as in-process)
                last = mark.offsets.get(key)
                covered = 0 if last is None else bisect.bisect_right(offsets, last)
            if not covered:
                continue
            topic, partition = source
            out.extend(self.records.pop((topic, partition, offset)) for offset in offsets[:covered])
            if offsets[covered - 1] > self.applied.get(key, -1):
                self.applied[key] = offsets[covered - 1]
            del offsets[:covered]
            if not offsets:
                del self._parked_offsets[source]
        out.sort(key=lambda p: p.order)
        self.applied_seq = max(self.applied_seq, mark.seq)
        return out

    def progress(self) -> JsonDict:
        return {"seq": self.applied_seq, "applied": dict(self.applied)}


class ClusterGate(InputGate[T]):
    """The cluster stage's gate: direct records and marks from the route, plus node-stage outputs
    and marks from every node-inputs partition. Mark ``k`` is complete when the route's mark ``k``
    and every node partition's mark ``k`` have arrived; it then releases the direct records it
    covers (first) and the node outputs produced at marks ``<= k`` (in mark, partition, index
    order), as the in-process pipeline submits them."""

    def __init__(self, node_partitions: int, applied_seq: int = 0, applied: dict[str, int] | None = None) -> None:
        super().__init__(applied_seq, applied)
        self.node_partitions = node_partitions
        self.marks: dict[int, tuple[Mark, T]] = {}
        self.outputs: dict[tuple[int, int, int], ParkedOutputs[T]] = {}
        self.node_marks: dict[int, list[tuple[int, dict[str, int], T]]] = {}

    def offer_mark(self, mark: Mark, token: T) -> bool:
        if not self.is_new(mark.seq) or mark.seq in self.marks:
            return False
        self.marks[mark.seq] = (mark, token)
        return True

    def offer_output(self, envelope: NodeOutputs, token: T) -> bool:
        if not self.is_new(envelope.seq) or envelope.order in self.outputs:
            return False
        self.outputs[envelope.order] = ParkedOutputs(envelope, token)
        return True

    def offer_node_mark(self, node_mark: NodeMark, token: T) -> bool:
        seq = node_mark.seq
        if not self.is_new(seq):
            return False
        entries = self.node_marks.setdefault(node_mark.partition, [])
        if any(s == seq for s, _stats, _t in entries):
            return False
        entries.append((seq, dict(node_mark.stats), token))
        return True

    def next_complete(self) -> Mark | None:
        if not self.marks:
            return None
        seq = min(self.marks)
        for partition in range(self.node_partitions):
            if not any(s >= seq for s, _stats, _t in self.node_marks.get(partition, [])):
                return None
        return self.marks[seq][0]

    def complete(self, mark: Mark) -> tuple[list[Parked[T]], list[ParkedOutputs[T]], list[T], dict[str, int]]:
        """Release mark ``mark.seq``: (direct records, node outputs, tokens of the marks consumed,
        node-stage counters summed over partitions as of this mark)."""
        direct = self.release(mark)
        outs = sorted((p for key, p in self.outputs.items() if key[0] <= mark.seq), key=lambda p: p.envelope.order)
        for p in outs:
            del self.outputs[p.envelope.order]
        tokens: list[T] = [self.marks.pop(mark.seq)[1]]
        stats: dict[str, int] = {}
        for partition, entries in self.node_marks.items():
            keep = []
            best: tuple[int, dict[str, int]] | None = None
            for seq, counters, token in entries:
                if seq <= mark.seq:
                    tokens.append(token)
                    if best is None or seq > best[0]:
                        best = (seq, counters)
                else:
                    keep.append((seq, counters, token))
            self.node_marks[partition] = keep
            if best is not None:
                for name, value in best[1].items():
                    stats[name] = stats.get(name, 0) + value
        for seq in [s for s in self.marks if s <= mark.seq]:  # earlier marks cannot linger, but be safe
            tokens.append(self.marks.pop(seq)[1])
        return direct, outs, tokens, stats
