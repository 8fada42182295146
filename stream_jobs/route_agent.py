"""The route agent: decodes the input topics, forwards records to the stages, forwards marks.

It consumes the input topics but ``gpu.samples.v1`` (each node partition reads its own samples,
:mod:`stream_jobs.node_agent`) and the internal control topic. Every record is decoded
(undecodable or invalid -> ``deadletter.v1`` with the reason and source position as headers; the
stream goes on), valid ones go to ``internal.node-inputs.v1`` (the partition of their node, per
:func:`stream_jobs.pipeline.route`) and/or ``internal.cluster-inputs.v1``, grouped into one envelope
per stage partition each time the route settles, and each watermark mark is held until the inputs
it covers are consumed (:class:`~stream_jobs.watermark.MarkHold`), then forwarded in-band to every
node-inputs partition and to cluster-inputs. The watcher's state marks (``schemas.control``) are held
the same way and go to the node-inputs partitions only.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from common.logs import get_logger
from schemas.codec import MessageError
from stream_jobs.delivery import AgentStream, ConsumedEvent, Delivery, EventStream, Sender, exit_for_restart
from stream_jobs.pipeline import TombstoneSkipped, decode_record, route
from stream_jobs.watermark import Mark, MarkHold, decode_envelope, record_envelope, records_envelopes

log = get_logger(__name__)

ROUTE_BATCH = 256
"""Routed records the route forwards together (also at each control record and every 0.5 s): one
envelope per stage partition (``records_envelopes``)."""

MAX_IN_FLIGHT = 8
"""Forwarded batches whose delivery the route does not wait for before reading on; with more, it
waits for the oldest (memory stays bounded when the broker is slow)."""


@dataclass
class InFlight:
    """Forwarded copies (and marks) on their way: what to count consumed and acknowledge once they
    are delivered."""

    delivered: asyncio.Future[list[object]]
    records: list[tuple[ConsumedEvent, str, int, int]]
    """The routed input records: (event, topic, partition, offset)."""
    marks: list[ConsumedEvent]
    """The control records of the forwarded marks."""


class CommittedOffsets(Protocol):
    """The consumer group's committed offsets (``topic:partition`` -> next offset to read)."""

    def local_committed(self) -> dict[str, int]:
        """What this consumer committed (and knows without asking the broker)."""

    async def group_committed(self, keys: list[str]) -> dict[str, int]:
        """What the group committed for ``keys``, whichever consumer owns them."""


@dataclass
class RouteTopics:
    """The names and topics the route reads and writes."""

    input_names: dict[str, str]
    """Input topic name -> its suffix (``gpu.samples.v1``...)."""
    control_name: str
    node_topic: Sender
    cluster_topic: Sender
    control_topic: Sender
    node_partitions: int
    node_partition: Callable[[bytes], int]
    """The node-inputs partition of a node key (the producer's own partitioner: a node's records
    stay where its stage state is)."""


@dataclass
class RouteAgent:
    delivery: Delivery
    topics: RouteTopics
    committed_offsets: CommittedOffsets
    hold: MarkHold[ConsumedEvent] = field(init=False)
    state_hold: MarkHold[ConsumedEvent] = field(init=False)
    """State marks (``schemas.control``), held like marks until the pod and node records they
    cover are consumed, then forwarded to every node-inputs partition."""
    _events: EventStream | None = None
    _forward_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _pending: list[tuple[ConsumedEvent, str, int, int]] = field(default_factory=list)
    """Routed input records whose forwarded copies are not yet known to be delivered."""
    _outbox: dict[int | None, list[bytes]] = field(default_factory=dict)
    """Forwarded copies of the pending records not sent yet, by node-inputs partition (None:
    cluster-inputs)."""
    _marks_pending: list[tuple[list[Awaitable[object]], ConsumedEvent]] = field(default_factory=list)
    """Forwarded marks (their copies' deliveries, the control record) not yet acknowledged."""
    _in_flight: deque[InFlight] = field(default_factory=deque)
    """Sent batches, oldest first, not yet counted consumed (:meth:`_settle`)."""
    _wake_task: asyncio.Future[None] | None = None
    _group_committed: dict[str, int] = field(default_factory=dict)
    """Committed offsets (next to read) of the group's input partitions, ``topic:partition``."""

    def __post_init__(self) -> None:
        self.hold, self.state_hold = self._holds()

    def _holds(self) -> tuple[MarkHold[ConsumedEvent], MarkHold[ConsumedEvent]]:
        """Marks and state marks wait for the inputs this route reads (not the samples: each node
        partition reads its own and holds a mark until it has)."""
        topics = frozenset(self.topics.input_names)
        return MarkHold(topics=topics), MarkHold(topics=topics)

    def revoke_control(self) -> None:
        self._marks_pending = []
        # the held marks are unacknowledged: their new owner reads them again
        self.hold, self.state_hold = self._holds()

    async def clock(self) -> None:
        """A clock mark (live mode)."""
        now = time.time()
        await self.delivery.send(self.topics.control_topic, None, Mark(seq=int(now * 1e6), ts=now).encode())

    def committed(self) -> dict[str, int]:
        out = dict(self._group_committed)
        for key, off in self.committed_offsets.local_committed().items():
            out[key] = max(out.get(key, 0), off)
        return out

    async def refresh_and_release(self) -> None:
        """The timer of the route: read the group's committed offsets of the input partitions the
        held marks (and state marks) still miss (other worker processes consume them: their commits come
        after the records they forwarded are delivered), then forward what is ready."""
        await self._settle()
        committed = self.committed()
        missing = {tp: off for hold in (self.hold, self.state_hold) if hold.held
                   for tp, off in hold.missing(hold.held[-1][0], committed).items()}
        if missing:
            try:
                found = await asyncio.wait_for(self.committed_offsets.group_committed(sorted(missing)), 10.0)
            except Exception as exc:  # the broker may be away: the next round asks again
                log.warning("committed offsets not read", error=str(exc))
            else:
                for key, off in found.items():
                    self._group_committed[key] = max(self._group_committed.get(key, 0), off)
        await self._release_marks()

    async def run(self, stream: AgentStream) -> None:
        events = self._events = stream.noack()
        delivery = self.delivery
        async for event in events.events():
            if not await delivery.admit(event):
                continue
            message = event.message
            topic, partition, offset = message.topic, message.partition, message.offset
            delivery.metrics.record_in(topic)
            if topic == self.topics.control_name:
                try:
                    envelope = decode_envelope(event.value)
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    log.warning("bad control record ignored", offset=offset, error=str(exc))
                    await delivery.ack(events, event)
                else:
                    if isinstance(envelope, Mark):
                        (self.state_hold if envelope.state else self.hold).hold(envelope, event)
                    else:  # the cluster stage's done, records of no kind the route reads
                        await delivery.ack(events, event)
            else:
                await self._route_record(topic, partition, offset, message.key, event.value)
                self._pending.append((event, topic, partition, offset))
                if len(self._pending) < ROUTE_BATCH:
                    continue
            await self._settle()
            await self._release_marks()

    async def _settle(self) -> None:
        """Send the forwarded copies of the routed records; once they are delivered, count those
        records consumed and acknowledge them (so committed), with the forwarded marks. faust's
        flush before a commit does not fail on a send that failed (the broker away too long):
        acknowledging at hand-over could commit an input whose copy was lost. A failed delivery
        ends the worker (exit 70; it reads them again).

        The route reads on while a batch travels (waiting for each batch's round trip to the
        broker held up the stages behind it); a batch delivered releases the marks it completes at
        once (:meth:`_on_delivered`)."""
        pending, self._pending = self._pending, []
        marks, self._marks_pending = self._marks_pending, []
        if (pending or marks) and self._events is not None:
            sent = await self._send_outbox()
            delivered = asyncio.gather(*sent, *(future for futures, _token in marks for future in futures))
            delivered.add_done_callback(self._on_delivered)
            self._in_flight.append(InFlight(delivered, pending, [token for _futures, token in marks]))
        await self._count_delivered(wait=len(self._in_flight) > MAX_IN_FLIGHT)

    async def _count_delivered(self, wait: bool) -> None:
        """Count consumed and acknowledge the delivered batches, oldest first (``wait``: wait for
        the oldest one)."""
        events = self._events
        if events is None:  # nothing was sent yet
            return
        while self._in_flight and (wait or self._in_flight[0].delivered.done()):
            batch = self._in_flight.popleft()
            wait = False
            try:
                await batch.delivered
            except Exception as exc:
                exit_for_restart(f"a forwarded input record or mark was not delivered: {exc!r}")
            for event, topic, partition, offset in batch.records:
                self.hold.consume(topic, partition, offset)
                self.state_hold.consume(topic, partition, offset)
                await self.delivery.ack(events, event)
            for token in batch.marks:
                await self.delivery.ack(events, token)

    def _on_delivered(self, _delivered: asyncio.Future[list[object]]) -> None:
        """A batch arrived: forward the marks it completes now, not when the next record comes."""
        waking = self._wake_task is not None and not self._wake_task.done()
        if waking or not self._marks_held():
            return
        self._wake_task = asyncio.ensure_future(self._wake())

    async def _wake(self) -> None:
        try:
            while True:
                await self._count_delivered(wait=False)
                await self._release_marks()
                if not (self._in_flight and self._in_flight[0].delivered.done()
                        and self._marks_held()):
                    return
        except Exception as exc:  # a task of its own: nobody else would see it
            exit_for_restart(f"forwarding marks failed: {exc!r}")

    def _marks_held(self) -> bool:
        return bool(self.hold.held or self.state_hold.held)

    async def _send_outbox(self) -> list[Awaitable[object]]:
        """Send the forwarded copies of the pending records, grouped per stage partition."""
        outbox, self._outbox = self._outbox, {}
        futures = []
        for partition, records in outbox.items():
            for envelope in records_envelopes(records):
                if partition is None:
                    futures.append(await self.delivery.send(self.topics.cluster_topic, "cluster", envelope))
                else:
                    futures.append(await self.delivery.send(self.topics.node_topic, None, envelope,
                                                            partition=partition))
        return futures

    async def _release_marks(self) -> None:
        """Forward the held marks whose inputs are consumed (after each input record, and on a
        timer: commits made after the last record can complete a mark too)."""
        if not self._marks_held() or self._events is None:
            return
        async with self._forward_lock:  # marks leave in order
            committed = self.committed()
            for mark, token in self.hold.ready(committed):
                self._pend_mark(await self._forward_mark(mark), token)
            for mark, token in self.state_hold.ready(committed):
                self._pend_mark(await self._forward_mark(mark, cluster=False), token)

    def _pend_mark(self, deliveries: list[Awaitable[object]], token: ConsumedEvent) -> None:
        """Queue a forwarded mark for acknowledgement once its copies are delivered. Appended after
        the forwarding await, never to a list looked up before it: :meth:`_settle` may have taken
        that list meanwhile, and a mark added to it would never be acknowledged (its partition's
        commits would stop there for good)."""
        self._marks_pending.append((deliveries, token))

    async def _route_record(self, topic: str, partition: int, offset: int, key: bytes | None,
                            value: bytes | None) -> None:
        """Decode an input record and put its forwarded copies in the outbox (none for a tombstone
        or a dead letter, which is delivered already)."""
        suffix = self.topics.input_names[topic]
        try:
            targets = route(decode_record(suffix, value, key, self.delivery.config.accept_clusters))
        except TombstoneSkipped:
            return
        except MessageError as exc:
            await self.delivery.dead_letter(topic, partition, offset, key, value, str(exc), exc.code)
            return
        envelope = record_envelope(topic, suffix, partition, offset, value or b"")
        for stage, node in targets:
            target = None if stage == "cluster" else self.topics.node_partition(str(node).encode())
            self._outbox.setdefault(target, []).append(envelope)

    async def _forward_mark(self, mark: Mark, cluster: bool = True) -> list[Awaitable[object]]:
        """Send the mark to every node-inputs partition and (``cluster``) to cluster-inputs; the
        deliveries."""
        value = mark.encode()
        futures = [await self.delivery.send(self.topics.node_topic, None, value, partition=partition)
                   for partition in range(self.topics.node_partitions)]
        if cluster:
            futures.append(await self.delivery.send(self.topics.cluster_topic, "cluster", value))
        return futures
