"""The cluster agent: the one cluster-inputs partition, running the cluster stages.

When the route's mark and every node partition's copy of it have arrived
(:class:`~stream_jobs.watermark.ClusterGate`), the :class:`ClusterStages` (one ``ClusterStage``
per cluster, ``cluster-stage`` table) apply what the mark covers and advance; after an end mark
it writes a ``done`` marker to the control topic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from common.logs import get_logger
from schemas.codec import MessageError, validate
from schemas.messages import Message
from stream_jobs.clusters import ClusterStages
from stream_jobs.config import EngineConfig
from stream_jobs.delivery import (
    AgentStream,
    Confirmable,
    ConsumedEvent,
    Delivery,
    EventStream,
    Sender,
    offer_forwarded,
    saved_position,
    state_position,
)
from stream_jobs.fleet_metrics import OutputObserver
from stream_jobs.internal import NodeSummary, PodUsage
from stream_jobs.json_types import JsonDict, as_int, int_map, optional_object
from stream_jobs.offset_guard import Consumed
from stream_jobs.state_store import ChunkedStore
from stream_jobs.watermark import (
    ClusterGate,
    ForwardedRecords,
    Mark,
    NodeMark,
    NodeOutputs,
    OtherEnvelope,
    Parked,
    ParkedOutputs,
    decode_envelope,
    done_envelope,
)

log = get_logger(__name__)

_INTERNAL_TYPES: dict[str, type[Message]] = {"summary": NodeSummary, "usage": PodUsage}


@dataclass
class ClusterAgent:
    delivery: Delivery
    config: EngineConfig
    topic_name: str
    control_topic: Sender
    table: ChunkedStore
    durable: Confirmable
    node_partitions: int
    lateness_s: float
    checkpoint_interval_s: float
    observer: OutputObserver | None = None
    gate: ClusterGate[ConsumedEvent] | None = None
    stages: ClusterStages | None = None
    done: dict[str, int] | None = None
    """The stats of the end mark processed, once it was (said again after a restart)."""
    checkpointed_at: float = 0.0

    def __post_init__(self) -> None:
        self.unacked: list[Consumed] = []
        self.futures: list[Awaitable[object]] = []
        self.next_offset: int | None = None
        """The cluster-inputs offset after the last record processed."""

    def saved_position(self, partition: int) -> int | None:
        """The cluster-inputs position the saved state was written at (None: none)."""
        return saved_position(self.table.get("cluster"))

    def _position(self, gate: ClusterGate[ConsumedEvent]) -> int | None:
        """The offset of the first record the stage's state does not hold (:func:`state_position`):
        parked records, node outputs and marks count."""
        return state_position([*(p.token for p in gate.records.values()), *(p.token for p in gate.outputs.values()),
                               *(token for _mark, token in gate.marks.values()),
                               *(token for marks in gate.node_marks.values() for _seq, _stats, token in marks)],
                              self.next_offset)

    def revoke(self) -> None:
        self.gate = None
        self.stages = None
        self.unacked = []
        self.futures = []
        self.next_offset = None

    def _restore(self) -> tuple[ClusterGate[ConsumedEvent], ClusterStages]:
        if self.gate is None or self.stages is None:
            record = optional_object(self.table.get("cluster")) or {}
            meta = optional_object(record.get("progress")) or {}
            saved = optional_object(record.get("stage"))
            applied, done = meta.get("applied"), meta.get("done")
            self.gate = ClusterGate(self.node_partitions, as_int(meta.get("seq", 0)),
                                    None if applied is None else int_map(applied))
            self.stages = ClusterStages.from_dict(saved, self.config) if saved else ClusterStages(self.config)
            self.done = None if done is None else int_map(done)
        return self.gate, self.stages

    async def _offer(self, gate: ClusterGate[ConsumedEvent], event: ConsumedEvent) -> bool | None:
        """Park the event's record(s) or mark; False: a duplicate; None: not a stream-jobs record
        (dead-lettered)."""
        try:
            envelope = decode_envelope(event.value)
            if isinstance(envelope, OtherEnvelope):
                raise ValueError(f"an envelope of kind {envelope.kind!r} on the cluster stage's input")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not what the workers write
            await self.delivery.internal_letter(event, repr(exc))
            return None
        if isinstance(envelope, ForwardedRecords):
            return offer_forwarded(gate, envelope, event)
        if isinstance(envelope, NodeOutputs):
            return gate.offer_output(envelope, event)
        if isinstance(envelope, NodeMark):
            return gate.offer_node_mark(envelope, event)
        mark = envelope
        accepted = gate.offer_mark(mark, event)
        if not accepted and mark.end and self.done is not None:
            # the end was processed before a restart: say done again (the driver waits)
            await self.delivery.send(self.control_topic, None, done_envelope(mark.seq, self.done))
        return accepted

    async def run(self, stream: AgentStream) -> None:
        events = stream.noack()
        delivery, metrics = self.delivery, self.delivery.metrics
        async for event in events.events():
            if not await delivery.admit(event):
                continue
            metrics.record_in(self.topic_name)
            gate, stage = self._restore()
            self.next_offset = event.message.offset + 1
            offered = await self._offer(gate, event)
            if not offered:
                if offered is not None:
                    metrics.duplicates.labels("cluster").inc()
                self.unacked.append(event)  # with the next checkpoint (see NodePartition.unacked)
                continue
            while self.gate is gate and (ready := gate.next_complete()) is not None:
                started = time.perf_counter()
                direct, outs, tokens, stats = gate.complete(ready)
                await self._mark(stage, ready, direct, outs)
                self.unacked.extend([*(p.token for p in direct), *(p.token for p in outs), *tokens])
                if ready.end or time.monotonic() - self.checkpointed_at >= self.checkpoint_interval_s:
                    await self._checkpoint(events, gate, stage, ready if ready.end else None, stats)
                metrics.marks.labels("cluster").inc()
                metrics.stage_seconds.labels("cluster").observe(time.perf_counter() - started)

    async def _mark(self, stage: ClusterStages, mark: Mark, direct: list[Parked[ConsumedEvent]],
                    outs: list[ParkedOutputs[ConsumedEvent]]) -> None:
        for parked in direct:
            message = await self.delivery.released_input(parked, mark)
            if message is not None:
                stage.submit(message, parked.record.source)
        for parked_outputs in outs:
            try:
                internal = [validate(value, _INTERNAL_TYPES[kind]) for kind, value in parked_outputs.envelope.outputs]
            except (MessageError, ValueError, KeyError, TypeError) as exc:  # not what a node stage writes
                await self.delivery.internal_letter(parked_outputs.token, repr(exc))
                continue
            for message in internal:
                stage.submit(message)
        wm = mark.ts if mark.end else mark.ts - self.lateness_s
        outputs = stage.flush(mark.ts) if mark.end else stage.advance(wm)
        await self.delivery.rejected(stage.take_rejected())
        if self.observer is not None:
            self.observer.observe(outputs)
        for m in outputs:
            self.futures.append(await self.delivery.publish(m))
        self.delivery.metrics.watermark_lag.labels("cluster").set(max(0.0, time.time() - wm))

    async def _checkpoint(self, events: EventStream, gate: ClusterGate[ConsumedEvent], stage: ClusterStages,
                          end: Mark | None, stats: dict[str, int]) -> None:
        """As ``NodeAgent._checkpoint`` (nothing written when the partition was revoked meanwhile);
        after an end mark, also say ``done`` on the control topic."""
        futures, self.futures = self.futures, []
        await asyncio.gather(*futures)
        if self.gate is not gate:  # revoked (a new gate is made only for the next event)
            log.info("cluster partition revoked during its checkpoint; state not written")
            return
        progress: JsonDict = {**gate.progress(), "position": self._position(gate)}
        if end is not None:
            self.done = stats
            progress["done"] = stats
        self.table["cluster"] = {"stage": stage.to_dict(), "progress": progress}
        await self.durable.confirm()
        for token in self.unacked:
            await self.delivery.ack(events, token)
        self.unacked = []
        self.checkpointed_at = time.monotonic()
        if end is not None:
            fut = await self.delivery.send(self.control_topic, None, done_envelope(end.seq, stats))
            await fut
            log.info("end of input processed", seq=end.seq, **stats)
