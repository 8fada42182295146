"""The node agent: one stream over the node-inputs partitions and the ``gpu.samples.v1``
partitions, running the node stages.

Partition ``p`` of both topics holds the same nodes: samples are keyed by node key and the route
forwards a node's pod and node states to the node-inputs partition of that key
(:func:`schemas.topics.key_partition`; the topics have one partition count). The stage reads its
samples itself: the route does not copy them (about half a worker's bytes) nor validate them twice.
A mark arrives in-band on node-inputs behind the states it covers; it waits until the partition's
samples are read up to the mark's offset for them (its samples partition), so it releases what
in-process would. A sample on a partition its node is not keyed to (a producer with another
partitioner or key) is dead-lettered with the reason: its node's state is elsewhere.

Per partition, records wait in a gate (:class:`~stream_jobs.watermark.InputGate`) until a mark
releases them; then the partition's :class:`NodeStage` s (one per node, kept in the
``node-stages`` table) apply them and advance to ``mark.ts - lateness`` (or flush at an end mark);
at a live clock mark each node goes as far as its own latest sample and its cluster's latest state
mark allow (:func:`~stream_jobs.watermark.node_watermark`).
Public outputs go to their topics; :class:`NodeSummary` / :class:`PodUsage` go to cluster-inputs
in envelopes numbered by (partition, mark, index); then the mark itself, with the partition's counters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from common.logs import get_logger
from schemas.codec import encode
from schemas.messages import DEFAULT_CLUSTER, GpuSample, Message
from schemas.topics import GPU_SAMPLES
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
from stream_jobs.json_types import JsonDict, as_int, as_object, int_map, optional_object
from stream_jobs.node_stage import NodeStage
from stream_jobs.offset_guard import Consumed
from stream_jobs.offsets import TopicPartition
from stream_jobs.reorder import Source
from stream_jobs.scoping import node_key
from stream_jobs.state_store import ChunkedStore
from stream_jobs.watermark import (
    ForwardedRecords,
    InputGate,
    Mark,
    Parked,
    ReadRecord,
    decode_envelope,
    node_mark_envelope,
    node_watermark,
    output_envelopes,
    tp_key,
)

log = get_logger(__name__)


def state_key(partition: int) -> str:
    """The ``node-stages`` table key of a node-inputs partition's state."""
    return f"p{partition}"


def node_state_partition(key: bytes) -> int:
    """The partition whose state a ``node-stages`` record holds (its key: :func:`state_key`, or a
    chunk of it, ``<key>#<generation>#<i>``): its changelog partition."""
    return int(key.split(b"#", 1)[0][1:])


@dataclass
class NodePartition:
    """One node-inputs partition: its gate and the stages of the nodes keyed to it."""

    gate: InputGate[ConsumedEvent]
    stages: dict[str, NodeStage] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    unacked: list[Consumed] = field(default_factory=list)
    """Events processed since the last checkpoint, acknowledged when it is written: those applied,
    and also state marks and duplicates (a record or mark applied before). Acknowledged at once, a
    duplicate would let the committed offset pass the position the last checkpoint saved, and a
    restart would take the saved state for one older than the commits (a false "restored state is
    older" and a needless re-read)."""
    futures: list[Awaitable[object]] = field(default_factory=list)
    """Deliveries of outputs sent since the last checkpoint."""
    checkpointed_at: float = 0.0
    next_offset: int | None = None
    """The node-inputs offset after the last record processed."""
    next_sample_offset: int | None = None
    """The samples offset after the last sample read."""
    waiting: list[tuple[Mark, ConsumedEvent]] = field(default_factory=list)
    """Marks (with their events) waiting for the partition's samples they cover, in order."""
    state_ts: dict[str, float] = field(default_factory=dict)
    """Per cluster: pod and node state is complete up to here (the latest state mark's time)."""
    sample_ts: dict[str, float] = field(default_factory=dict)
    """Per node key: the time of the node's latest sample applied (a node's agent sends in order)."""
    samples_tp: TopicPartition | None = None
    """The samples partition as the consumer names it (its records' ``message.tp``), once one is read."""
    read_ahead_bytes: int = 0
    """Bytes of the samples parked in the gate: read, not yet released by a mark."""
    paused: bool = False
    """Fetching the samples is paused (:meth:`NodeAgent._flow`)."""

    def positions(self, node_topic: str) -> tuple[int | None, int | None]:
        """Per topic read, node-inputs (``node_topic``) and samples: the offset of its first record
        the stages' state does not hold (:func:`state_position`), in one pass over what waits."""
        node: list[Consumed] = []
        samples: list[Consumed] = []
        for token in (*(parked.token for parked in self.gate.records.values()), *(e for _mark, e in self.waiting)):
            (node if token.message.topic == node_topic else samples).append(token)
        return state_position(node, self.next_offset), state_position(samples, self.next_sample_offset)

    def samples_read(self, mark: Mark, tp: str) -> bool:
        """Whether this partition's samples are read (or applied) up to what ``mark`` covers of them
        (``tp``: the samples partition); a clock mark covers what has arrived."""
        wanted = None if mark.offsets is None else mark.offsets.get(tp)
        read = -1 if self.next_sample_offset is None else self.next_sample_offset - 1
        return wanted is None or max(read, self.gate.applied.get(tp, -1)) >= wanted

    def stage(self, key: str, node: str, cluster: str, config: EngineConfig) -> NodeStage:
        """The stage of ``node`` of ``cluster`` (``key``: their node key)."""
        stage = self.stages.get(key)
        if stage is None:
            stage = self.stages[key] = NodeStage(node, config, cluster)
        return stage


@dataclass
class NodeAgent:
    delivery: Delivery
    config: EngineConfig
    topic_name: str
    cluster_topic: Sender
    table: ChunkedStore
    durable: Confirmable
    lateness_s: float
    checkpoint_interval_s: float
    observer: OutputObserver | None = None
    samples_topic: str = ""
    """``gpu.samples.v1`` (prefixed), read by this agent partition by partition."""
    partitioner: Callable[[bytes], int] | None = None
    """The partition of a node key (``key_partition`` over the topics' partition count)."""
    read_ahead_bytes: int = 16 * 1024 * 1024
    """``WorkerSettings.read_ahead_bytes``: sample bytes a partition parks before it pauses its samples."""
    parts: dict[int, NodePartition] = field(default_factory=dict)

    def saved_position(self, partition: int) -> int | None:
        """The node-inputs position the partition's saved state was written at (None: none)."""
        return saved_position(self.table.get(state_key(partition)))

    def saved_sample_position(self, partition: int) -> int | None:
        """The samples position the partition's saved state was written at (None: none)."""
        return saved_position(self.table.get(state_key(partition)), "sample_position")

    def revoke(self, partition: int) -> None:
        log.info("node partition revoked", partition=partition)
        self.parts.pop(partition, None)

    def _part(self, partition: int) -> NodePartition:
        part = self.parts.get(partition)
        if part is None:
            saved = optional_object(self.table.get(state_key(partition))) or {}
            progress = as_object(saved.get("progress", {}))
            applied = progress.get("applied")
            gate: InputGate[ConsumedEvent] = InputGate(as_int(progress.get("seq", 0)),
                                                       None if applied is None else int_map(applied))
            part = NodePartition(gate, stats=int_map(saved.get("stats", {})))
            for node, state in as_object(saved.get("stages", {})).items():
                part.stages[node] = NodeStage.from_dict(as_object(state), self.config)
            self.parts[partition] = part
        return part

    async def run(self, stream: AgentStream) -> None:
        events = stream.noack()
        delivery, metrics = self.delivery, self.delivery.metrics
        async for event in events.events():
            if not await delivery.admit(event):
                continue
            message = event.message
            partition = message.partition
            metrics.record_in(message.topic)
            if partition not in self.parts:
                part = self._part(partition)
                log.info("node partition resumed", partition=partition, topic=message.topic, offset=message.offset,
                         seq=part.gate.applied_seq, applied=part.gate.applied, nodes=sorted(part.stages))
            part = self._part(partition)
            if message.topic == self.samples_topic:
                part.next_sample_offset = message.offset + 1
                part.samples_tp = message.tp
                record = ReadRecord(message.topic, GPU_SAMPLES.suffix, partition, message.offset, message.key,
                                    event.value)
                if part.gate.offer(record, event):
                    part.read_ahead_bytes += len(event.value or b"")
                else:
                    metrics.duplicates.labels("node").inc()
                    part.unacked.append(event)
                if part.waiting:
                    await self._release(events, partition, part)
                if part.paused or part.read_ahead_bytes > self.read_ahead_bytes:
                    await self._flow(partition, part)
                continue
            part.next_offset = message.offset + 1
            try:
                envelope = decode_envelope(event.value)
                if not isinstance(envelope, Mark | ForwardedRecords):
                    raise ValueError(f"a {type(envelope).__name__} envelope on a node stage's input")
            except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not what the workers write
                await delivery.internal_letter(event, repr(exc))
                part.unacked.append(event)
                continue
            if isinstance(envelope, ForwardedRecords):
                if not offer_forwarded(part.gate, envelope, event):
                    metrics.duplicates.labels("node").inc()
                    part.unacked.append(event)
                continue
            if envelope.state:
                cluster = envelope.cluster or DEFAULT_CLUSTER
                part.state_ts[cluster] = max(part.state_ts.get(cluster, envelope.ts), envelope.ts)
                part.unacked.append(event)
                continue
            mark = envelope
            if not part.gate.is_new(mark.seq) or any(mark.seq == other.seq for other, _event in part.waiting):
                metrics.duplicates.labels("node").inc()
                part.unacked.append(event)
                continue
            part.waiting.append((mark, event))
            await self._release(events, partition, part)
            if part.paused:
                await self._flow(partition, part)

    async def _flow(self, partition: int, part: NodePartition) -> None:
        """Back-pressure on the partition's samples. They are read ahead of the marks that release
        them (a mark comes through the route, which may lag far behind: a worker catching up a
        backlog read every sample before the route's first mark). Above ``read_ahead_bytes`` parked
        and with no mark waiting for more samples, fetching them pauses; it resumes when a mark
        waits for samples not read yet, or when marks have released half of what was parked. The
        marks come on node-inputs, which never pauses, so a paused partition is always woken."""
        metrics = self.delivery.metrics
        if part.samples_tp is None:  # no sample read yet: nothing to pause or resume
            return
        if part.read_ahead_bytes > self.read_ahead_bytes and not part.waiting:
            metrics.read_ahead.labels(str(partition)).set(part.read_ahead_bytes)
            if not part.paused:
                part.paused = True
                metrics.pauses.inc()
                log.info("samples read ahead of the marks; pausing them", partition=partition,
                         read_ahead_bytes=part.read_ahead_bytes, next_offset=part.next_sample_offset)
            self.delivery.pause(part.samples_tp)  # again each time: a rebalance's recovery resumes all
        elif part.paused and (part.waiting or 2 * part.read_ahead_bytes <= self.read_ahead_bytes):
            part.paused = False
            log.info("samples resumed", partition=partition, read_ahead_bytes=part.read_ahead_bytes,
                     waiting_marks=len(part.waiting))
            await self.delivery.resume(part.samples_tp)

    async def _release(self, events: EventStream, partition: int, part: NodePartition) -> None:
        """Process the waiting marks whose samples are read, in order."""
        metrics = self.delivery.metrics
        tp = tp_key(self.samples_topic, partition)
        while part.waiting and part.samples_read(part.waiting[0][0], tp) and self.parts.get(partition) is part:
            mark, event = part.waiting.pop(0)
            started = time.perf_counter()
            released = part.gate.release(mark)
            part.read_ahead_bytes -= sum(len(parked.record.raw or b"") for parked in released
                                         if isinstance(parked.record, ReadRecord))
            metrics.read_ahead.labels(str(partition)).set(part.read_ahead_bytes)
            await self._mark(partition, part, mark, released)
            part.unacked.extend([*(parked.token for parked in released), event])
            if mark.end or time.monotonic() - part.checkpointed_at >= self.checkpoint_interval_s:
                await self._checkpoint(events, partition, part)
            metrics.marks.labels("node").inc()
            metrics.stage_seconds.labels("node").observe(time.perf_counter() - started)

    def _submit(self, part: NodePartition, key: str, stage: NodeStage, message: Message,
                source: Source | None) -> None:
        """Apply one released input to its node's stage, counting late samples and DRA allocations
        not resolved to a GPU, and noting the node's newest sample."""
        metrics = self.delivery.metrics
        late, unresolved = stage.counters["late_samples"], stage.counters.get("dra_unresolved", 0)
        stage.submit(message, source)
        if stage.counters.get("dra_unresolved", 0) > unresolved:
            metrics.dra_unresolved.inc(stage.counters["dra_unresolved"] - unresolved)
        if stage.counters["late_samples"] > late:
            metrics.late_samples.inc()
        elif isinstance(message, GpuSample):
            sample_ts = message.ts.timestamp()
            if sample_ts > part.sample_ts.get(key, sample_ts - 1):
                part.sample_ts[key] = sample_ts

    async def _mark(self, partition: int, part: NodePartition, mark: Mark,
                    released: list[Parked[ConsumedEvent]]) -> None:
        metrics = self.delivery.metrics
        for parked in released:
            message = await self.delivery.released_input(parked, mark)
            if message is None:
                continue
            node = getattr(message, "node", None)
            if not node:
                continue
            key = node_key(message.cluster, node)
            if isinstance(parked.record, ReadRecord) and not await self._on_its_partition(partition, key,
                                                                                           parked.record):
                continue
            self._submit(part, key, part.stage(key, node, message.cluster, self.config), message, parked.record.source)
        outputs: list[Message] = []
        wm = mark.ts if mark.end else mark.ts - self.lateness_s
        for node in sorted(part.stages):  # the in-process pipeline's order
            stage = part.stages[node]
            if mark.end:
                outputs.extend(stage.flush(mark.ts))
            elif mark.offsets is None:  # live: each node as far as its own samples and the pod state
                outputs.extend(stage.advance(node_watermark(wm, mark.ts, part.sample_ts.get(node),
                                                            part.state_ts.get(stage.cluster))))
            else:
                outputs.extend(stage.advance(wm))
            await self.delivery.rejected(stage.take_rejected())
        if self.observer is not None:
            self.observer.observe(outputs)
        public: list[Awaitable[object]] = []
        internal: list[tuple[str, bytes]] = []
        for message in outputs:
            if isinstance(message, NodeSummary | PodUsage):
                internal.append(("summary" if isinstance(message, NodeSummary) else "usage", encode(message)))
            else:
                public.append(await self.delivery.publish(message))
        part.futures.extend(public)
        if mark.end:  # every public output is out before the cluster can say done
            await asyncio.gather(*part.futures)
            part.futures = []
        futures = part.futures
        for envelope in output_envelopes(partition, mark.seq, internal):
            futures.append(await self.delivery.send(self.cluster_topic, "cluster", envelope))
        stats = {"late_samples_dropped": 0, "sample_gaps": 0}
        for stage in part.stages.values():
            counters = stage.counters
            stats["late_samples_dropped"] += counters["late_samples"]
            stats["sample_gaps"] += counters["gaps"]
        part.stats = stats
        futures.append(await self.delivery.send(self.cluster_topic, "cluster",
                                                node_mark_envelope(partition, mark, stats)))
        metrics.watermark_lag.labels("node").set(max(0.0, time.time() - wm))

    async def _on_its_partition(self, partition: int, key: str, record: ReadRecord) -> bool:
        """Whether a sample read from samples partition ``partition`` belongs there; one that does
        not is dead-lettered (its node's states, and its stage, are on the partition of its key)."""
        home = partition if self.partitioner is None else self.partitioner(key.encode())
        if home == partition:
            return True
        error = (f"sample of node {key!r} on partition {partition} of {record.topic}, but its node's state is on "
                 f"partition {home}: samples must be keyed by their node key ({key!r}) and partitioned by "
                 f"librdkafka's default partitioner (CRC-32 of the key), as gpulens's agent produces them")
        await self.delivery.dead_letter(record.topic, partition, record.offset, record.key, record.raw, error)
        return False

    async def _checkpoint(self, events: EventStream, partition: int, part: NodePartition) -> None:
        """Outputs delivered -> state written -> inputs acknowledged, in this order: a crash at any
        point replays from the previous checkpoint and only repeats outputs (same ids).

        A partition revoked meanwhile writes nothing: its new owner restored the last checkpoint
        and goes on from there; a late write of this worker's state (a zombie) could land after
        the new owner's checkpoints, and the next restore would then take the older state while
        the inputs in between are committed: lost (a chaos run lost a pod's samples that way)."""
        await asyncio.gather(*part.futures)
        part.futures = []
        if self.parts.get(partition) is not part:
            log.info("node partition revoked during its checkpoint; state not written", partition=partition)
            return
        position, sample_position = part.positions(self.topic_name)
        progress: JsonDict = {**part.gate.progress(), "position": position, "sample_position": sample_position}
        self.table[state_key(partition)] = {
            "progress": progress, "stats": part.stats,
            "stages": {node: stage.to_dict() for node, stage in sorted(part.stages.items())}}
        await self.durable.confirm()
        for token in part.unacked:
            await self.delivery.ack(events, token)
        part.unacked = []
        part.checkpointed_at = time.monotonic()
