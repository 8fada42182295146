"""The ClickHouse sink: every topic into ClickHouse exactly once.

At-least-once transport becomes exactly-once rows through three rules:

1. **Deterministic batches.** Records are buffered per (topic, partition) and cut by size and age
   (a record waits at most the batch age from when it was read). Before a batch is inserted its
   offset range is journalled in ``sink_batches``; after a crash the next owner of the partition
   finds the journalled ranges it has not committed and cuts its first batches at exactly those
   offsets, so a replayed batch is the same block of rows. GPU-sample batches of several
   partitions that are due at once are stored as one block, a **group** (an insert costs the
   engine a fixed time whatever its size); each member's range is journalled with the group, and
   the owner of a member that replays it reads the other members' ranges again from Kafka, so the
   replay is the group's block again, whoever owns the other partitions now.
2. **Deduplicated inserts.** Each table insert carries ``insert_deduplication_token`` =
   ``topic:partition:first-last`` (a group's ranges joined by ``+``); tables keep a deduplication
   window, so a block already stored (crash after insert, lost acknowledgement, outage retry,
   the replay of a group by each of its members' owners) is dropped by the engine, and so are the
   rollup views' blocks.
3. **Commit after acknowledgement.** Kafka offsets are committed only after ClickHouse accepted
   every table's block and the dead-letter records are delivered. While ClickHouse is down the
   partitions are paused, the same batch is retried with jittered exponential backoff, and nothing
   is committed; the sink catches up afterwards. A store thread inserts the batches in the order
   they were cut while the next ones are decoded (at most ``STORE_QUEUE`` handed over at once), and
   they are committed in that order; a batch whose insert failed makes every batch behind it wait
   until it is stored, so no partition's batches are ever stored out of order.

Records a producer sent twice (same deterministic id, different offsets) collapse in the
``ReplacingMergeTree`` tables, whose sorting keys are the facts' natural keys; for ``pod_windows``,
whose inserts feed the rollup views, ids already stored by earlier batches are also filtered out
before the insert, deterministically.

Nothing vanishes silently: records that cannot be decoded (or whose rows the sink fails to build),
rows the table's TTL would drop on insert, rows dated more than ``max_future_skew_s`` ahead of the
sink's clock, and rows ClickHouse rejects go to the dead-letter topic with a reason code, the detail
and their source position; they never stop the stream. When ClickHouse rejects one table's block,
the tables already written for the batch are kept as they are and only the remaining tables are
written record by record, so the rejected record is dead-lettered alone (rows of it another table
already took are deleted again) and no row is stored twice.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from common.backoff import Backoff
from common.errors import GpulensError
from common.kafka import (
    BoundedProducer,
    KafkaException,
    commit_offsets,
    consumer_lag,
    make_consumer,
    read_ranges,
    seek_to,
)
from common.letter_budget import LetterBudget
from common.logs import get_logger
from common.metrics import MetricsRegistry
from common.settings import SinkSettings
from schemas.topics import DEADLETTER, GPU_SAMPLES
from sinks.batches import (
    GC_PAUSE,
    Batch,
    BatchWriter,
    ConsumedRecord,
    FlushOutcome,
    Plan,
    PreparedBatch,
    Refusal,
    Rejected,
    SinkMetrics,
    Store,
    encoded_dead_letter,
    spans_of,
)
from sinks.clickhouse import StoreUnavailable
from sinks.ddl import TtlDays
from sinks.rows import SINK_TOPICS

log = get_logger(__name__)


@dataclass
class PartitionBuffer:
    records: list[ConsumedRecord] = field(default_factory=list)
    arrived_at: list[float] = field(default_factory=list)
    """When each record was read (the sink's clock), for the batch age."""
    plans: list[Plan] | None = None
    """Journalled ranges still to replay exactly; None until looked up."""
    backlog: bool = False
    """What is buffered is the rest of a backlog: a full batch was cut and records were left."""

    def add(self, record: ConsumedRecord, now: float) -> None:
        self.records.append(record)
        self.arrived_at.append(now)

    def take(self, n: int) -> list[ConsumedRecord]:
        """Remove and return the ``n`` oldest records."""
        taken = self.records[:n]
        del self.records[:n]
        del self.arrived_at[:n]
        return taken


@dataclass
class InFlight:
    """A batch handed to the store thread, not yet committed."""

    batch: Batch
    result: Future[tuple[FlushOutcome, Rejected]]
    started: float


class EarlierBatchNotStored(StoreUnavailable):
    """Not inserted because the batch handed over before it was not stored: written again after it."""


class SinkStopped(GpulensError):
    """Stop was requested while ClickHouse was failing: leave without committing the batch."""


POLL_MAX_MESSAGES = 1000
"""The most records one poll returns; a poll that returns fewer waited out its timeout: the
consumer has caught up with the broker."""

STORE_QUEUE = 2
"""Batches handed to the store thread and not yet committed: one being inserted and one waiting
behind it, so that the engine never waits for the decoding of the next batch when one batch took
longer to decode than the one before took to insert (the two take about as long)."""

GROUP_REPLAY_READ_S = 30.0
"""How long the replay of a group waits for the other members' records from Kafka, per attempt."""

GROUP_REPLAY_ATTEMPTS = 3
"""Attempts to read them before the member is replayed alone (see :meth:`ClickHouseSink._replay`)."""

NO_ASSIGNMENT_S = 30.0
"""How long ``ClickHouseSink.run(exit_when_idle_s=...)`` waits for a first partition assignment before it
counts the time as idle anyway."""


class ClickHouseSink:
    """The consumer loop: buffers per partition, writes batches, commits after acknowledgement."""

    def __init__(
        self,
        settings: SinkSettings,
        store: Store,
        registry: MetricsRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.store = store
        self.registry = registry or MetricsRegistry()
        self.metrics = SinkMetrics(self.registry)
        self.writer = BatchWriter(store, self.metrics, settings.topic_prefix, TtlDays.from_settings(settings),
                                  max_future_skew_s=settings.max_future_skew_s,
                                  replicated=bool(settings.clickhouse.cluster))
        self.clock = clock
        self.topics = [spec.name(settings.topic_prefix) for spec in SINK_TOPICS]
        self.grouped_topics = {GPU_SAMPLES.name(settings.topic_prefix)}
        """Topics whose due batches of several partitions are stored as one group: the one whose
        volume makes the engine's fixed cost per insert count (it is unpacked by the engine's views)."""
        self.dlq_topic = DEADLETTER.name(settings.topic_prefix)
        self.letter_budget = LetterBudget(rate=settings.deadletter_rate_per_s, burst=float(settings.deadletter_burst))
        self.buffers: dict[tuple[str, int], PartitionBuffer] = {}
        self._quiet_since = clock()
        self._assigned = False
        self.backoff = Backoff(base_s=settings.retry_initial_s, cap_s=settings.retry_max_s)
        self.stopping = threading.Event()
        self.totals = FlushOutcome()
        self._consumer: Any = None
        self._producer: BoundedProducer | None = None
        self._store_thread: ThreadPoolExecutor | None = None
        self._in_flight: deque[InFlight] = deque()
        self._last_lag_at = 0.0

    # ---------------------------------------------------------------- lifecycle

    def stop(self) -> None:
        self.stopping.set()

    def _open(self) -> None:
        extra: dict[str, Any] = {
            "session.timeout.ms": self.settings.session_timeout_ms,
            "max.poll.interval.ms": max(300_000, self.settings.session_timeout_ms + 1),
            "partition.assignment.strategy": "cooperative-sticky",
            # librdkafka postpones a partition's next fetch by a whole second (its default) once
            # the prefetch queue is full; a sink busy writing a batch drains that queue in bursts,
            # so the default left it idle for a second after every write
            "fetch.queue.backoff.ms": 20,
        }
        if self.settings.group_instance_id:
            extra["group.instance.id"] = self.settings.group_instance_id
        self._consumer = make_consumer(self.settings.kafka, self.settings.group_id, extra)
        self._consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_revoke)
        self._producer = BoundedProducer(self.settings.kafka, self.settings.producer)
        self._store_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sink-store")

    def _idle_for(self, idle_s: float, now: float) -> bool:
        """Nothing buffered and quiet for ``idle_s`` since the group assigned partitions (a slow
        first join is not idleness: the data has not been read yet), or for ``NO_ASSIGNMENT_S``
        when no assignment ever came."""
        if self._in_flight or any(b.records for b in self.buffers.values()):
            return False
        return now - self._quiet_since >= (idle_s if self._assigned else max(idle_s, NO_ASSIGNMENT_S))

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned = True
        self._quiet_since = self.clock()
        for tp in partitions:
            self.buffers.pop((tp.topic, tp.partition), None)
        log.info("partitions assigned", partitions=[f"{tp.topic}[{tp.partition}]" for tp in partitions])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        left = self._settle(in_callback=True)  # their commits still count while the partitions are ours
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        for key in revoked:
            # uncommitted records are simply re-read by the next owner, which replays the journal
            self.buffers.pop(key, None)
        rewind: dict[tuple[str, int], int] = {}
        for batch in left:
            for span in batch.committed_spans:
                if (batch.topic, span.partition) not in revoked:
                    rewind.setdefault((batch.topic, span.partition), span.first_offset)
        for (topic, partition), offset in rewind.items():
            # a partition this sink keeps (an incremental rebalance) reads a batch it could not
            # store again, with everything after it: else later batches would commit past it
            self._read_again(consumer, topic, partition, offset)
        log.info("partitions revoked", partitions=[f"{tp.topic}[{tp.partition}]" for tp in partitions])

    def _read_again(self, consumer: Any, topic: str, partition: int, offset: int) -> None:
        """Drop what is buffered of a partition and read it again from ``offset``."""
        self.buffers.pop((topic, partition), None)
        if consumer is not None:
            seek_to(consumer, topic, partition, offset)
        log.warning("batch not stored before a rebalance; reading its partition again from its first offset",
                    topic=topic, partition=partition, offset=offset)

    def close(self) -> None:
        if self._store_thread is not None:
            self._settle(in_callback=True)
            self._store_thread.shutdown(wait=True)
            self._store_thread = None
        if self._producer is not None:
            self._producer.close(10.0)
        if self._consumer is not None:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.warning("consumer close failed", error=str(exc))
            self._consumer = None

    def run(self, exit_when_idle_s: float | None = None) -> FlushOutcome:
        """Consume until :meth:`stop` (or, with ``exit_when_idle_s``, until caught up and idle)."""
        self._open()
        self._quiet_since = self.clock()
        self._assigned = False
        log.info("sink started", topics=self.topics, group=self.settings.group_id)
        try:
            while not self.stopping.is_set():
                messages = self._consumer.consume(num_messages=POLL_MAX_MESSAGES, timeout=0.2)
                now = self.clock()
                for msg in messages:
                    if msg.error() is not None:
                        self.metrics.errors.labels(kind="kafka").inc()
                        log.warning("consume error", error=str(msg.error()))
                        continue
                    self._buffer(ConsumedRecord(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                                        msg.timestamp()[1]), now)
                # a short poll waited out its timeout: what the broker had is read
                if self._flush_due(now, caught_up=len(messages) < POLL_MAX_MESSAGES) or messages:
                    # A flush that waited out an outage paused consumption (and librdkafka dropped
                    # what it had prefetched): quiet time counts only from its end.
                    self._quiet_since = self.clock()
                self._settle(wait=False)
                self._report_lag(now)
                if exit_when_idle_s is not None and self._idle_for(exit_when_idle_s, now):
                    break
            self._flush_due(self.clock(), force=True)
            self._settle()
        except SinkStopped as exc:
            log.warning("stopped while clickhouse was unavailable; uncommitted records will be re-read",
                        error=str(exc))
        finally:
            self.close()
        self.letter_budget.say(force=True)
        log.info("sink stopped", rows=self.totals.rows_by_table, dead_letters=self.totals.dead_letters)
        return self.totals

    # ---------------------------------------------------------------- batching

    def _buffer(self, record: ConsumedRecord, now: float) -> None:
        if self.totals.first_record_at is None:
            self.totals.first_record_at = time.perf_counter()
        self.buffers.setdefault((record.topic, record.partition), PartitionBuffer()).add(record, now)

    def _due_batches(self, key: tuple[str, int], buffer: PartitionBuffer, now: float, force: bool,
                     caught_up: bool = False) -> list[Batch]:
        batches, waiting = self._replays_due(key, buffer, force)
        if waiting or not buffer.records:
            return batches
        cut, cut_full = self._cut(key, buffer, now, force, caught_up)
        batches += cut
        if batches:
            buffer.backlog = cut_full and bool(buffer.records)
        return batches

    def _replays_due(self, key: tuple[str, int], buffer: PartitionBuffer, force: bool) -> tuple[list[Batch], bool]:
        """The journalled ranges read again, as their batches; True: nothing else is due yet (the
        partition was revoked meanwhile, or a journalled range is not yet read whole)."""
        topic, partition = key
        batches: list[Batch] = []
        if buffer.plans is None and buffer.records:
            self._load_plans()
            if buffer.plans is None:
                return batches, True  # revoked while the lookup waited for ClickHouse: no longer ours
        while buffer.plans and buffer.records:
            plan = buffer.plans[0]
            if buffer.records[-1].offset < plan.last_offset and not force:
                return batches, True  # wait until the whole journalled range is read again
            take = buffer.take(sum(1 for r in buffer.records if r.offset <= plan.last_offset))
            buffer.plans.pop(0)
            if take:
                batches.append(self._replay(topic, partition, take, plan))
        return batches, False

    def _cut(self, key: tuple[str, int], buffer: PartitionBuffer, now: float, force: bool,
             caught_up: bool) -> tuple[list[Batch], bool]:
        """The new batches due, and whether one of them is full.

        A record waits at most the batch age from when it was read; short of that, only full
        batches are cut (a remainder waits for more records rather than becoming a small insert),
        or, once the consumer has caught up, a buffer at least half full or the rest of a backlog
        (waiting would only idle; a backlog's rest is one small insert per backlog, not a trickle).
        """
        topic, partition = key
        max_rows = self.settings.batch_max_rows
        everything = (force or now - buffer.arrived_at[0] >= self.settings.batch_max_age_s
                      or (caught_up and (buffer.backlog or 2 * len(buffer.records) >= max_rows)))
        batches: list[Batch] = []
        cut_full = False
        while len(buffer.records) >= max_rows or (everything and buffer.records):
            take = buffer.take(max_rows)
            cut_full = cut_full or len(take) == max_rows
            batches.append(Batch(topic, partition, take, take[0].offset, take[-1].offset))
        return batches, cut_full

    def _replay(self, topic: str, partition: int, records: list[ConsumedRecord], plan: Plan) -> Batch:
        """The batch that replays a journalled range: the range alone, or, when it was stored in a
        group, the whole group again, the other members' records read from Kafka, so that its token
        and rows are the group's whether or not the group was stored. Only if those records cannot
        be read (gone from the log) is the range replayed alone; if the group had been stored its
        rows are then there twice, one row per fact under ``FINAL`` (counted and logged)."""
        if not plan.group:
            return Batch(topic, partition, records, plan.first_offset, plan.last_offset, replayed=True,
                         clock=plan.clock)
        joined = tuple(span for span in spans_of(plan.group) if span.partition != partition)
        for attempt in range(1, GROUP_REPLAY_ATTEMPTS + 1):
            try:
                others = read_ranges(self.settings.kafka, topic,
                                     [(s.partition, s.first_offset, s.last_offset) for s in joined],
                                     GROUP_REPLAY_READ_S)
                break
            except (TimeoutError, KafkaException) as exc:
                log.warning("the other members of a journalled group could not be read", group=plan.group,
                            attempt=attempt, error=str(exc))
        else:
            self.metrics.errors.labels(kind="group_replayed_alone").inc()
            log.error("replaying a member of a group alone: its rows may be stored twice (one row per fact "
                      "under FINAL)", group=plan.group, partition=partition)
            return Batch(topic, partition, records, plan.first_offset, plan.last_offset, replayed=True,
                         clock=plan.clock)
        read = [ConsumedRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp_ms) for r in others]
        return Batch(topic, partition, records + read, plan.first_offset, plan.last_offset, replayed=True,
                     joined=joined, clock=plan.clock)

    def _grouped(self, due: list[list[Batch]]) -> Iterator[Batch]:
        """The due batches, those of a grouped topic's partitions joined into groups of at most
        ``batch_group_max_rows`` records: each group takes at most the next batch of each
        partition, so a partition's batches are still stored in offset order. Replays go as they
        were journalled."""
        cap = self.settings.batch_group_max_rows
        queues = [deque(batches) for batches in due]
        while queues:
            members: list[Batch] = []
            rows = 0
            for queue in queues:
                batch = queue[0]
                if batch.replayed or batch.topic not in self.grouped_topics:
                    yield queue.popleft()
                elif not members or (batch.topic == members[0].topic and rows + len(batch.records) <= cap):
                    members.append(queue.popleft())
                    rows += len(batch.records)
            queues = [queue for queue in queues if queue]
            if len(members) == 1:
                yield members[0]
            elif members:
                members.sort(key=lambda b: b.partition)
                head = members[0]
                yield Batch(head.topic, head.partition, [r for b in members for r in b.records], head.first_offset,
                            head.last_offset, joined=tuple(span for b in members[1:] for span in b.spans))

    def _load_plans(self) -> None:
        """Look up the journalled ranges of every buffered partition not yet looked up, at once."""
        waiting = {key: buffer for key, buffer in self.buffers.items() if buffer.plans is None and buffer.records}
        starts = {key: buffer.records[0].offset for key, buffer in waiting.items()}
        for (topic, partition), plans in self._retry(lambda: self.writer.pending_plans(starts)).items():
            if self.buffers.get((topic, partition)) is not waiting[(topic, partition)]:
                continue  # revoked while ClickHouse was retried: a new buffer looks up its own
            waiting[(topic, partition)].plans = plans
            if plans:
                log.info("replaying journalled batches", topic=topic, partition=partition, ranges=plans)

    def _flush_due(self, now: float, force: bool = False, caught_up: bool = False) -> bool:
        """Write the batches that are due (``caught_up``: the last poll came back short); whether
        any was written."""
        due: list[list[Batch]] = []
        cut_from: dict[tuple[str, int], PartitionBuffer] = {}
        for key in list(self.buffers):
            buffer = self.buffers.get(key)
            if buffer is None:
                continue  # revoked while an earlier journal lookup waited for ClickHouse
            batches = self._due_batches(key, buffer, now, force, caught_up)
            if batches:
                due.append(batches)
                cut_from[key] = buffer
        flushed = False
        # Every batch cut is written, also when a stop was requested: its records left the buffer,
        # and the stop's final flush must not commit batches cut after it past them. Only a
        # rebalance while an earlier batch waited for ClickHouse drops one: a member's partition
        # is another owner's now, or was sought back to a batch before it. Its members this sink
        # still reads are read again from the batch on.
        for batch in self._grouped(due):
            kept = [span for span in batch.committed_spans
                    if self.buffers.get((batch.topic, span.partition)) is cut_from[(batch.topic, span.partition)]]
            if len(kept) == len(batch.committed_spans):
                self._flush(batch)
                flushed = True
                continue
            for span in kept:
                self._read_again(self._consumer, batch.topic, span.partition, span.first_offset)
        return flushed

    # ---------------------------------------------------------------- one batch

    def _retry(self, action: Callable[[], Any]) -> Any:
        """Run ``action`` until ClickHouse answers, pausing consumption while it is down."""
        paused = False
        try:
            while True:
                try:
                    result = action()
                    self.backoff.reset()
                    self.metrics.retry_backoff.set(0)
                    return result
                except StoreUnavailable as exc:
                    if self.stopping.is_set():
                        raise SinkStopped(str(exc)) from None
                    delay = self.backoff.next_delay_s()
                    self.metrics.errors.labels(kind="clickhouse_unavailable").inc()
                    self.metrics.retry_backoff.set(delay)
                    log.warning("clickhouse unavailable, retrying", error=str(exc), retry_in_s=round(delay, 2))
                    if not paused and self._consumer is not None:
                        self._consumer.pause(self._consumer.assignment())
                        paused = True
                    self._sleep_polling(delay)
        finally:
            if paused and self._consumer is not None:
                self._consumer.resume(self._consumer.assignment())

    def _sleep_polling(self, delay_s: float) -> None:
        deadline = self.clock() + delay_s
        while self.clock() < deadline:
            if self._consumer is not None:
                # partitions are paused: this returns nothing but keeps the group membership alive
                for msg in self._consumer.consume(num_messages=1, timeout=min(0.2, delay_s)):
                    if msg.error() is None:
                        self._buffer(ConsumedRecord(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                                            msg.timestamp()[1]), self.clock())
            else:
                time.sleep(min(0.2, delay_s))

    def _flush(self, batch: Batch) -> None:
        """Prepare ``batch`` here and hand it to the store thread once fewer than ``STORE_QUEUE``
        batches wait there to be committed. The collector stays paused until the store thread has
        freed the prepared rows."""
        started = time.perf_counter()
        GC_PAUSE.begin()
        try:
            handed_over = [self.writer.prepare(batch)]  # no local keeps the rows once the thread took them
            self._settle(keep=STORE_QUEUE - 1)
            assert self._store_thread is not None
            before = self._in_flight[-1].result if self._in_flight else None
            self._in_flight.append(InFlight(batch, self._store_thread.submit(self._store, handed_over, before),
                                            started))
        except BaseException:
            GC_PAUSE.end()
            raise

    def _store(self, handed_over: list[PreparedBatch], before: Future[Any] | None
               ) -> tuple[FlushOutcome, Rejected]:
        """Insert a prepared batch (in the store thread, which runs them in order); ``before`` is
        the batch handed over just before it, done by now: if its insert failed, this one is not
        inserted either, as it would be stored before it (both are written again, in order, when
        they are settled)."""
        prepared = handed_over.pop()
        try:
            if before is not None and before.exception() is not None:
                raise EarlierBatchNotStored(f"the batch before {prepared.batch.token} is not stored yet")
            return self.writer.store_prepared(prepared)
        finally:
            del prepared  # freed by reference counting while the collector is still paused
            GC_PAUSE.end()

    def _settle(self, wait: bool = True, in_callback: bool = False, keep: int = 0) -> list[Batch]:
        """Finish the batches in flight, oldest first: every one whose insert is done, and
        (``wait``) the others until at most ``keep`` are left; the batches left unstored in a
        rebalance callback (see :meth:`_settle_one`)."""
        left: list[Batch] = []
        while self._in_flight:
            if not self._in_flight[0].result.done() and (not wait or len(self._in_flight) <= keep):
                break
            flight = self._in_flight.popleft()
            if not self._settle_one(flight, in_callback):
                left.append(flight.batch)
        return left

    def _settle_one(self, flight: InFlight, in_callback: bool) -> bool:
        """Dead letters, then the commit; whether the batch was committed. While ClickHouse is down
        the whole batch is written again from its records with backoff; not in a rebalance
        callback, where it is left uncommitted (with the batches behind it, which did not store
        before it) to be read again: by the next owner, or by this sink if it keeps the partition."""
        batch = flight.batch
        try:
            outcome, rejected = flight.result.result()
        except StoreUnavailable as exc:
            if not isinstance(exc, EarlierBatchNotStored):  # no attempt was made: not an error of its own
                self.metrics.errors.labels(kind="clickhouse_unavailable").inc()
            if in_callback:
                log.warning("batch not stored before a rebalance; its records will be read again",
                            batch=batch.token, error=str(exc))
                return False
            log.warning("clickhouse unavailable, retrying the batch", batch=batch.token, error=str(exc))
            outcome, rejected = self._retry(lambda: self.writer.write(batch))
        for record, reason in rejected:
            self._send_dead_letter(record, reason)
        if rejected:
            if in_callback:
                try:
                    self._deliver_dead_letters()
                except StoreUnavailable as exc:
                    log.warning("dead letters not delivered before a rebalance; the batch will be read again",
                                batch=batch.token, error=str(exc))
                    return False
            else:
                self._retry(self._deliver_dead_letters)
        self._commit(batch)
        for table, n in outcome.rows_by_table.items():
            self.metrics.rows.labels(table=table).inc(n)
            self.totals.rows_by_table[table] = self.totals.rows_by_table.get(table, 0) + n
        self.totals.dead_letters += outcome.dead_letters
        self.totals.skipped_duplicates += outcome.skipped_duplicates
        self.totals.last_commit_at = time.perf_counter()
        self.metrics.batches.labels(topic=batch.topic).inc()
        self.metrics.latency.labels(topic=batch.topic).observe(time.perf_counter() - flight.started)
        log.debug("batch written", batch=batch.token, rows=outcome.rows_by_table, dead_letters=len(rejected))
        return True

    def _send_dead_letter(self, record: ConsumedRecord, reason: Refusal) -> None:
        """Write ``record``'s dead letter, within :attr:`letter_budget` (beyond it: counted and
        summarised in the log, not written; the record is skipped all the same)."""
        assert self._producer is not None
        if not self.letter_budget.allow(record.topic, reason.code.value):
            self.metrics.dead_letters_suppressed.labels(topic=record.topic, reason=reason.code.value).inc()
            self.letter_budget.say()
            return
        value, headers = encoded_dead_letter(record, reason)
        while not self._producer.produce(self.dlq_topic, record.key, value, headers):
            self._producer.poll(0.5)
        self.metrics.dead_letters.labels(topic=record.topic, reason=reason.code.value).inc()
        log.warning("record dead-lettered", topic=record.topic, partition=record.partition,
                    offset=record.offset, code=reason.code.value, reason=reason[:300])
        self.letter_budget.say()

    def _deliver_dead_letters(self) -> None:
        assert self._producer is not None
        failed_before = self._producer.stats.failed
        if self._producer.flush(30.0) > 0 or self._producer.stats.failed > failed_before:
            self.metrics.errors.labels(kind="deadletter_delivery").inc()
            raise StoreUnavailable(f"dead-letter delivery failed: {self._producer.stats.last_error}")

    def _commit(self, batch: Batch) -> None:
        if self._consumer is None:
            return
        try:
            commit_offsets(self._consumer, {(batch.topic, span.partition): span.last_offset + 1
                                            for span in batch.committed_spans})
        except KafkaException as exc:
            # the rows are stored; a later commit (or the journal replay after a restart) covers it
            self.metrics.errors.labels(kind="commit").inc()
            log.warning("offset commit failed", batch=batch.token, error=str(exc))

    def _report_lag(self, now: float) -> None:
        if now - self._last_lag_at < 5.0 or self._consumer is None:
            return
        self._last_lag_at = now
        try:
            for (topic, partition), lag in consumer_lag(self._consumer).items():
                self.metrics.lag.labels(topic=topic, partition=str(partition)).set(lag)
        except KafkaException as exc:
            log.debug("lag unavailable", error=str(exc))
