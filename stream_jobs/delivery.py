"""The delivery and acknowledgement object every faust agent shares (:class:`Delivery`).

Why: the route, node and cluster agents each admit consumed records through the offset guard,
send records and await their delivery, publish stage outputs to the public topics, dead-letter
inputs out of the event-time bounds, and acknowledge what they finished. One object does those
things for all three, so the exactly-once rules (acknowledge only after delivery and checkpoint,
in offset order) live in one place; the agents only decide *when*.

It takes faust's streams, events and topics as what it uses of them (:class:`AgentStream`,
:class:`ConsumedEvent`, :class:`Sender`) and does not import faust (``stream_jobs.faust_app`` is
the adapter).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

import orjson

from common.letter_budget import LetterBudget
from common.logs import get_logger
from schemas.codec import WIRE_HEADERS, MessageError, encode, validate
from schemas.dead_letters import dead_letter_headers
from schemas.messages import Message, scoped_key
from schemas.outputs import Alert, DeadLetterReason, PodLifecycle, PodWindow
from stream_jobs.config import EngineConfig
from stream_jobs.json_types import JsonValue, as_int, optional_object
from stream_jobs.offset_guard import Consumed, ConsumedRecord, OffsetGuard, WorkerMetrics
from stream_jobs.offsets import EXIT_STALLED, TopicPartition
from stream_jobs.pipeline import INPUT_TOPICS, dead_letter, decode_record, event_time_error, wire_error
from stream_jobs.stage import Rejected
from stream_jobs.timeutil import from_epoch
from stream_jobs.watermark import ForwardedRecords, InputGate, Mark, Parked, ReadRecord

log = get_logger(__name__)

_INPUT_BY_SUFFIX = {spec.suffix: spec for spec in INPUT_TOPICS}


def output_key(message: Message) -> str:
    """The Kafka key of a public output: its pod, its alert id, or its cluster."""
    if isinstance(message, PodWindow | PodLifecycle):
        return scoped_key(message.cluster, message.pod_uid)
    if isinstance(message, Alert):
        return message.id
    return scoped_key(message.cluster, "cluster")


def exit_for_restart(reason: str) -> NoReturn:
    """End the process with ``EXIT_STALLED`` so that it restarts from its checkpoints."""
    log.error("stream jobs exiting to restart from their checkpoints", reason=reason)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STALLED)


class ConsumedEvent(Consumed, Protocol):
    """A consumed event as the agents read it (faust's ``Event``, the runtime's ``DirectEvent``): its
    record and its value (the record's bytes: the worker's topics have no serializer)."""

    @property
    def value(self) -> bytes | None: ...


class EventStream(Protocol):
    """An agent's events as the runtime hands them over, each acknowledged explicitly."""

    def events(self) -> AsyncIterator[ConsumedEvent]: ...

    async def ack(self, event: Consumed) -> None: ...


class AgentStream(Protocol):
    """What an agent's ``run`` is given (the runtime's ``Inbox``, read as faust's stream would be)."""

    def noack(self) -> EventStream: ...


class Sender(Protocol):
    """A topic the worker writes to (``faust_port.DirectSender``): ``send`` hands a record to the
    producer and returns its delivery, a future to await."""

    async def send(self, *, key: bytes | None, value: bytes, partition: int | None = None,
                   headers: list[tuple[str, bytes]] | None = None) -> Awaitable[object]: ...

    def get_topic_name(self) -> str: ...


def state_position(parked: Iterable[Consumed], next_offset: int | None) -> int | None:
    """The offset of the first stage input a checkpoint's state does not hold: the earliest of the
    ``parked`` events (consumed, not applied yet), else ``next_offset`` (after the last event
    processed); None before any. Saved in the state's progress (see :func:`saved_position`)."""
    offsets = [event.message.offset for event in parked]
    if next_offset is not None:
        offsets.append(next_offset)
    return min(offsets, default=None)


def saved_position(state: JsonValue, name: str = "position") -> int | None:
    """The :func:`state_position` a saved stage state was written at (None: none saved); ``name``:
    which of its input topics' positions (``position``: the stage's internal topic)."""
    progress = optional_object((optional_object(state) or {}).get("progress")) or {}
    position = progress.get(name)
    return None if position is None else as_int(position)


class SharedAck:
    """A consumed envelope holding several forwarded records, each parked on its own: the envelope
    is acknowledged when the last of them is done (acknowledging it at the first could commit past
    records still parked, which a crash would then lose)."""

    def __init__(self, event: ConsumedEvent) -> None:
        self.event = event
        self.left = 0

    @property
    def message(self) -> ConsumedRecord:
        return self.event.message

    @property
    def value(self) -> bytes | None:
        return self.event.value


def offer_forwarded(gate: InputGate[ConsumedEvent], envelope: ForwardedRecords, event: ConsumedEvent) -> bool:
    """Park the forwarded records of an envelope (``r``: one, ``b``: several); False when every
    one of them was applied or is parked already (a duplicate: acknowledge the event now)."""
    records = envelope.records
    if len(records) == 1:
        return gate.offer(records[0], event)
    shared = SharedAck(event)
    shared.left = sum(gate.offer(record, shared) for record in records)
    return shared.left > 0


class Confirmable(Protocol):
    """A table whose changelog writes can be awaited (``faust_app.DurableTable``)."""

    async def confirm(self) -> None: ...


@dataclass
class Delivery:
    """Admit, send, publish, dead-letter and acknowledge, for every agent of one worker."""

    config: EngineConfig
    metrics: WorkerMetrics
    offsets: OffsetGuard
    deadletter_topic: Sender
    out_topics: dict[type[Message], Sender]
    """Public output topic by message class."""
    compacted: set[str]
    """Input topics that are compacted (their offsets may have holes)."""
    budget: LetterBudget = field(default_factory=LetterBudget)
    """How many dead letters this worker writes a second (:class:`LetterBudget`)."""

    async def admit(self, event: ConsumedEvent) -> bool:
        """Whether to process a consumed event (:class:`OffsetGuard`)."""
        message = event.message
        return await self.offsets.admit(message.tp, message.offset, message.topic in self.compacted, event,
                                        message.timestamp)

    def pause(self, tp: TopicPartition) -> None:
        """Stop fetching the consumed partition ``tp`` (:meth:`OffsetGuard.pause`)."""
        self.offsets.pause(tp)

    async def resume(self, tp: TopicPartition) -> None:
        """Fetch ``tp`` again from the next record to admit (:meth:`OffsetGuard.resume`)."""
        await self.offsets.resume(tp)

    async def ack(self, events: EventStream, event: Consumed) -> None:
        """The event is done; acknowledge it and what waited for it (offset order, see AckOrder).
        A :class:`SharedAck` is one of its envelope's records: the envelope is done with the last."""
        if isinstance(event, SharedAck):
            event.left -= 1
            if event.left > 0:
                return
            event = event.event
        for ready in self.offsets.done(event.message.tp, event.message.offset, event):
            await events.ack(ready)

    async def send(self, topic: Sender, key: str | None, value: bytes, partition: int | None = None,
                   headers: list[tuple[str, bytes]] | None = None) -> Awaitable[object]:
        """Hand a record to the producer; returns its delivery (a future to await)."""
        fut = await topic.send(key=key.encode() if key is not None else None, value=value, partition=partition,
                               headers=headers)
        self.metrics.record_out(topic.get_topic_name())
        return fut

    async def publish(self, message: Message) -> Awaitable[object]:
        """Send a stage output to its public topic; returns its delivery."""
        return await self.send(self.out_topics[type(message)], output_key(message), encode(message),
                               headers=list(WIRE_HEADERS))

    async def dead_letter(self, topic: str, partition: int, offset: int, key: bytes | None,
                          value: bytes | None, error: str,
                          reason: DeadLetterReason = DeadLetterReason.INVALID) -> None:
        """Write the dead letter of a record the stream cannot use (within :attr:`budget`; beyond it
        the letter is counted and summarised in the log, not written) and go on."""
        reason = DeadLetterReason(reason)
        if not self.budget.allow(topic, reason.value):
            self.metrics.deadletters_suppressed.labels(topic, reason.value).inc()
            self.budget.say()
            return
        letter = dead_letter(error, topic, value, from_epoch(time.time()), partition, offset, reason)
        headers = [*WIRE_HEADERS, *((name, text if isinstance(text, bytes) else (text or "").encode())
                                    for name, text in dead_letter_headers(letter))]
        fut = await self.deadletter_topic.send(key=key, value=encode(letter), headers=headers)
        await fut  # rare: make it durable before the stream moves on
        self.metrics.deadletters.labels(topic, reason.value).inc()
        self.metrics.record_out(self.deadletter_topic.get_topic_name())
        log.warning("dead letter", topic=topic, partition=partition, offset=offset, reason=reason.value,
                    error=letter.error[:500])
        self.budget.say()

    async def internal_letter(self, event: ConsumedEvent, error: str) -> None:
        """Dead-letter a record of an internal topic (node-inputs, cluster-inputs) the stage cannot
        read: none the workers write, so a writer with access to the topic (or a bug) put it there."""
        message = event.message
        await self.dead_letter(message.topic, message.partition, message.offset, message.key, event.value,
                               f"not a stream-jobs record: {error}")

    async def rejected(self, rejected: Iterable[Rejected]) -> None:
        """Dead-letter the inputs a stage did not apply (:class:`~stream_jobs.stage.Rejected`); one
        with no source (an internal input) was logged by the stage."""
        for r in rejected:
            if r.source is not None:
                topic, partition, offset = r.source[0], r.source[1], r.source[2]
                await self.dead_letter(str(topic), as_int(partition), as_int(offset), None, r.value, r.error, r.reason)

    async def released_input(self, parked: Parked[ConsumedEvent], mark: Mark) -> Message | None:
        """An input record a mark released, or None when it is dead-lettered: invalid (a record the
        stage read itself, :class:`~stream_jobs.watermark.ReadRecord`, decoded as the route decodes; a forwarded one
        validated again from its copy, which the route made sure reads the same) or with its event
        time out of the bounds of the mark's clock (by both stages when it went to both, with the
        same source headers; ``replay --kafka`` counts letters once per source)."""
        record = parked.record
        topic, partition, offset = record.topic, record.partition, record.offset
        raw: bytes | None = None
        try:
            if isinstance(record, ReadRecord):
                raw = record.raw
                message = decode_record(record.suffix, raw, record.key, self.config.accept_clusters)
            else:
                spec = _INPUT_BY_SUFFIX.get(record.suffix)
                if spec is None:
                    raise MessageError(f"not an input topic of the stream jobs: {record.suffix}")
                message = validate(record.value, spec.message)
                raw = orjson.dumps(record.value)
                problem = wire_error(spec.suffix, raw, message)
                if problem is not None:
                    raise problem
                if self.config.accept_clusters is not None and message.cluster not in self.config.accept_clusters:
                    raise MessageError(f"cluster {message.cluster!r} is not one this worker accepts", "cluster",
                                       DeadLetterReason.UNKNOWN_CLUSTER)
        except MessageError as exc:
            if isinstance(record, ReadRecord):
                await self.dead_letter(topic, partition, offset, record.key, record.raw, str(exc), exc.code)
            else:
                await self.dead_letter(topic, partition, offset, None, _copy_bytes(record.value), str(exc), exc.code)
            return None
        error = event_time_error(message, mark.ts, self.config)
        if error is None:
            return message
        await self.dead_letter(topic, partition, offset, None, raw, str(error), error.code)
        return None


def _copy_bytes(value: dict[str, object]) -> bytes | None:
    """A forwarded record's copy as JSON again, for its dead letter (never raises)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return repr(value).encode()
