"""The ClickHouse sink: every topic into ClickHouse exactly once.

At-least-once transport becomes exactly-once rows through three rules:

1. **Deterministic batches.** Records are buffered per (topic, partition) and cut by size and age.
   Before a batch is inserted its offset range is journalled in ``sink_batches``; after a crash the
   next owner of the partition finds the journalled ranges it has not committed and cuts its first
   batches at exactly those offsets, so a replayed batch is the same block of rows.
2. **Deduplicated inserts.** Each table insert carries ``insert_deduplication_token`` =
   ``topic:partition:first-last``; tables keep a deduplication window, so a block already stored
   (crash after insert, lost acknowledgement, outage retry) is dropped by the engine, and so are
   the rollup views' blocks.
3. **Commit after acknowledgement.** Kafka offsets are committed only after ClickHouse accepted
   every table's block and the dead-letter records are delivered. While ClickHouse is down the
   partitions are paused, the same batch is retried with jittered exponential backoff, and nothing
   is committed; the sink catches up afterwards.

Records a producer sent twice (same deterministic id, different offsets) collapse in the
``ReplacingMergeTree`` tables, whose sorting keys are the facts' natural keys; for ``pod_windows``,
whose inserts feed the rollup views, ids already stored by earlier batches are also filtered out
before the insert, deterministically.

Nothing vanishes silently: rows that cannot be decoded, that the table's TTL would drop on insert,
or that ClickHouse rejects go to the dead-letter topic with the reason and their source position;
they never stop the stream. When ClickHouse rejects one table's block, the tables already written
for the batch are kept as they are and only the remaining tables are written record by record, so
the rejected record is dead-lettered alone (rows of it another table already took are deleted again)
and no row is stored twice.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from common.backoff import Backoff
from common.errors import GpulensError
from common.kafka import BoundedProducer, KafkaException, commit_offsets, consumer_lag, make_consumer
from common.logs import get_logger
from common.metrics import MetricsRegistry
from common.settings import SinkSettings
from schemas.codec import MessageError, decode, decode_plain, encode
from schemas.dead_letters import Headers, dead_letter, dead_letter_headers
from schemas.topics import DEADLETTER, K8S_NODES, K8S_PODS, spec_for_name
from sinks.clickhouse import StoreRejected, StoreUnavailable
from sinks.migrations import TTL_TABLES, TtlDays
from sinks.rows import PLAIN_TYPES, SINK_TOPICS, Decoded, Plain, TableColumns, Tombstone, rows_for, tables_for

log = get_logger(__name__)


class Store(Protocol):
    """What the sink needs from ClickHouse (``sinks.clickhouse.ClickHouseStore``)."""

    def insert(self, table: str, columns: dict[str, list[Any]], dedup_token: str | None = None,
               repeated_timestamps: bool = False) -> int: ...

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> Any: ...

    def command(self, sql: str) -> None: ...


@dataclass(frozen=True)
class ConsumedRecord:
    """One Kafka record, detached from the client library."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


@dataclass
class Batch:
    topic: str
    partition: int
    records: list[ConsumedRecord]
    first_offset: int
    last_offset: int
    replayed: bool = False

    @property
    def token(self) -> str:
        return f"{self.topic}:{self.partition}:{self.first_offset}-{self.last_offset}"


@dataclass
class PartitionBuffer:
    records: list[ConsumedRecord] = field(default_factory=list)
    opened_at: float = 0.0
    plans: list[tuple[int, int]] | None = None
    """Journalled (first, last) ranges still to replay exactly; None until looked up."""


@dataclass
class FlushOutcome:
    rows_by_table: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    skipped_duplicates: int = 0
    first_record_at: float | None = None
    """``time.perf_counter()`` when the first record was buffered (for throughput figures)."""
    last_commit_at: float | None = None


class SinkMetrics:
    def __init__(self, registry: MetricsRegistry) -> None:
        self.rows = registry.counter("sink_rows_written_total", "Rows written per table", ("table",))
        self.batches = registry.counter("sink_batches_total", "Batches committed per topic", ("topic",))
        self.latency = registry.histogram(
            "sink_batch_latency_seconds", "Decode+insert+commit time per batch", ("topic",)
        )
        self.errors = registry.counter("sink_errors_total", "Errors by kind", ("kind",))
        self.dead_letters = registry.counter(
            "sink_dead_letters_total", "Records sent to the dead-letter topic", ("topic",)
        )
        self.duplicates = registry.counter(
            "sink_duplicates_skipped_total", "Records whose id was already stored", ("table",)
        )
        self.lag = registry.gauge("sink_consumer_lag", "Messages not yet consumed", ("topic", "partition"))
        self.retry_backoff = registry.gauge("sink_retry_backoff_seconds", "Current backoff while ClickHouse fails")


class SinkStopped(GpulensError):
    """Stop was requested while ClickHouse was failing: leave without committing the batch."""


TTL_MARGIN = timedelta(minutes=1)
NO_ASSIGNMENT_S = 30.0
"""How long ``ClickHouseSink.run(exit_when_idle_s=...)`` waits for a first partition assignment before it
counts the time as idle anyway."""
"""Rows this close to their TTL are dead-lettered too: the engine would drop them within moments."""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a batch is decoded, pivoted and inserted.

    A batch allocates a few objects per value and frees them by reference counting (models, rows
    and columns hold no cycles); without the pause the collector scans every live object, the
    batch's included, dozens of times per batch, which cost about as much as the decoding itself.
    Memory stays bounded by the batch size; the collector runs again once the batch is written.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(record: ConsumedRecord) -> datetime:
    if record.timestamp_ms and record.timestamp_ms > 0:
        return datetime.fromtimestamp(record.timestamp_ms / 1000, UTC)
    return _now()


class BatchWriter:
    """Turns one batch into inserts (the deterministic, Kafka-free half of the sink)."""

    def __init__(self, store: Store, metrics: SinkMetrics, topic_prefix: str, ttl: TtlDays | None = None,
                 now: Callable[[], datetime] | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.prefix = topic_prefix
        self.now = now or _now
        ttl = ttl or TtlDays()
        self.ttl_by_table: dict[str, tuple[str, int]] = {
            table: (expr.removeprefix("toDateTime(").removesuffix(")"), getattr(ttl, kind))
            for table, (expr, kind) in TTL_TABLES.items()
        }
        """table -> (column its TTL counts from, days)"""

    def _any_expired(self, tables: dict[str, TableColumns], now: datetime) -> bool:
        """Whether any row of the batch is old enough for its table's TTL (one ``min`` per column)."""
        for table, columns in tables.items():
            rule = self.ttl_by_table.get(table)
            if rule is None:
                continue
            column, days = rule
            values = columns.column(column)
            try:
                oldest = min(values)
            except (TypeError, ValueError):  # a Nullable column holding NULLs (or no rows)
                oldest = min((v for v in values if isinstance(v, datetime)), default=None)
            if isinstance(oldest, datetime) and oldest + timedelta(days=days) <= now + TTL_MARGIN:
                return True
        return False

    def expired(self, rows: list[tuple[str, dict[str, Any]]], now: datetime) -> str | None:
        """Why the table TTL would drop one of these rows on insert (None when all are kept)."""
        for table, row in rows:
            rule = self.ttl_by_table.get(table)
            if rule is None:
                continue
            column, days = rule
            value = row.get(column)
            if isinstance(value, datetime) and value + timedelta(days=days) <= now + TTL_MARGIN:
                return (f"{table}.{column} = {value.isoformat()} is older than the table's {days}-day TTL: "
                        "ClickHouse would drop it on insert (raise the sink's *_TTL_DAYS to keep such data)")
        return None

    # ---------------------------------------------------------------- decode

    def decode(self, record: ConsumedRecord) -> tuple[Decoded | None, str | None]:
        """The message of one record, or the reason it goes to the dead-letter topic."""
        spec = spec_for_name(record.topic)
        if record.value is None:
            if spec in (K8S_PODS, K8S_NODES):
                key = (record.key or b"").decode(errors="replace")
                return Tombstone.of_record_key(spec.suffix, key, _ts(record)), None
            return None, "empty value (tombstone) on a topic that has no tombstones"
        try:
            if spec.message in PLAIN_TYPES:
                return Plain(spec.message, decode_plain(record.value, spec.message)), None
            return decode(record.value, spec.message), None
        except MessageError as exc:
            return None, f"invalid {spec.suffix} message: {exc}"

    # ---------------------------------------------------------------- write

    def plan(self, batch: Batch) -> None:
        self.store.insert(
            "sink_batches",
            {
                "topic": [batch.topic],
                "partition": [batch.partition],
                "first_offset": [batch.first_offset],
                "last_offset": [batch.last_offset],
                "planned_at": [_now()],
            },
            dedup_token=f"plan:{batch.token}",
        )

    def pending_plans(self, topic: str, partition: int, from_offset: int) -> list[tuple[int, int]]:
        result = self.store.query(
            "SELECT first_offset, last_offset FROM sink_batches "
            "WHERE topic = {topic:String} AND partition = {partition:UInt16} AND last_offset >= {offset:UInt64} "
            "GROUP BY first_offset, last_offset ORDER BY last_offset",
            {"topic": topic, "partition": partition, "offset": from_offset},
        )
        return [(int(r[0]), int(r[1])) for r in result.rows]

    def write(self, batch: Batch) -> tuple[FlushOutcome, list[tuple[ConsumedRecord, str]]]:
        """Insert a batch; returns what was written and the records for the dead-letter topic.

        Raises :class:`StoreUnavailable` when ClickHouse cannot be reached: nothing may be committed.
        """
        with _gc_paused():
            return self._write(batch)

    def _write(self, batch: Batch) -> tuple[FlushOutcome, list[tuple[ConsumedRecord, str]]]:
        outcome = FlushOutcome()
        rejected: list[tuple[ConsumedRecord, str]] = []
        decoded: list[tuple[ConsumedRecord, Decoded]] = []
        for record in batch.records:
            message, reason = self.decode(record)
            if reason is not None:
                rejected.append((record, reason))
            elif message is not None:
                decoded.append((record, message))
        tables = tables_for([(message, record.partition, record.offset) for record, message in decoded])
        now = self.now()
        if self._any_expired(tables, now):
            # rare: find the records concerned and leave them out of this batch's blocks
            fresh: list[tuple[ConsumedRecord, Decoded]] = []
            for record, message in decoded:
                reason = self.expired(rows_for(message, record.partition, record.offset), now)
                if reason is not None:
                    rejected.append((record, reason))
                else:
                    fresh.append((record, message))
            decoded = fresh
            tables = tables_for([(message, record.partition, record.offset) for record, message in decoded])
        outcome.skipped_duplicates = self._drop_stored_windows(batch, tables)
        self.plan(batch)
        written: set[str] = set()
        try:
            for table, columns in tables.items():
                self.store.insert(table, columns.columns, dedup_token=batch.token, repeated_timestamps=True)
                written.add(table)
                outcome.rows_by_table[table] = outcome.rows_by_table.get(table, 0) + columns.n_rows
        except StoreRejected as exc:
            log.warning("batch rejected, writing its remaining tables record by record", batch=batch.token,
                        error=str(exc), tables_written=sorted(written))
            kept = {table: tables[table] for table in tables if table not in written}
            per_record = [(record, rows_for(message, record.partition, record.offset)) for record, message in decoded]
            rejected.extend(self._write_one_by_one(batch, per_record, kept, outcome))
        outcome.dead_letters = len(rejected)
        return outcome, rejected

    def _pivot(self, rows: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, TableColumns]:
        tables: dict[str, TableColumns] = {}
        for table, row in rows:
            columns = tables.get(table)
            if columns is None:
                columns = tables[table] = TableColumns()
            columns.append(row)
        return tables

    def _drop_stored_windows(self, batch: Batch, tables: dict[str, TableColumns]) -> int:
        """Remove windows whose id an earlier batch already stored (the rollups must not see them twice).

        Rows of this very batch's offset range are not "earlier": a retried batch filters to the same
        rows, so its deduplication token still matches.
        """
        windows = tables.get("pod_windows")
        if windows is None or windows.n_rows == 0:
            return 0
        ids = windows.column("window_id")
        starts = windows.column("window_start")
        result = self.store.query(
            "SELECT DISTINCT window_id FROM pod_windows "
            "WHERE window_start >= {lo:DateTime64(3, 'UTC')} AND window_start <= {hi:DateTime64(3, 'UTC')} "
            "AND window_id IN {ids:Array(String)} "
            "AND NOT (kafka_partition = {p:UInt16} AND kafka_offset BETWEEN {first:UInt64} AND {last:UInt64})",
            {
                "lo": min(starts), "hi": max(starts), "ids": sorted(set(ids)),
                "p": batch.partition, "first": batch.first_offset, "last": batch.last_offset,
            },
        )
        seen = {str(r[0]) for r in result.rows}
        keep: list[int] = []
        for i, window_id in enumerate(ids):
            if window_id not in seen:  # the first of an id repeated within the batch stays
                seen.add(window_id)
                keep.append(i)
        dropped = windows.n_rows - len(keep)
        if dropped:
            windows.keep(keep)
            self.metrics.duplicates.labels(table="pod_windows").inc(dropped)
            if windows.n_rows == 0:
                del tables["pod_windows"]
        return dropped

    def _write_one_by_one(
        self,
        batch: Batch,
        per_record: list[tuple[ConsumedRecord, list[tuple[str, dict[str, Any]]]]],
        remaining: dict[str, TableColumns],
        outcome: FlushOutcome,
    ) -> list[tuple[ConsumedRecord, str]]:
        """Write the tables not yet written, one record at a time; return the records ClickHouse refused.

        Only rows the batch still carries (``remaining``: windows filtered as stored are not re-added)
        are written, each block under a token of its own record, so a retry of this batch stores
        nothing twice either.
        """
        rejected: list[tuple[ConsumedRecord, str]] = []
        left = {table: _row_keys(columns) for table, columns in remaining.items()}
        for record, rows in per_record:
            token = f"{batch.token}:{record.offset}"
            mine = [(table, row) for table, row in rows if _row_key(row) in left.get(table, set())]
            stored: list[str] = []
            try:
                for table, columns in self._pivot(mine).items():
                    self.store.insert(table, columns.columns, dedup_token=token)
                    stored.append(table)
                    outcome.rows_by_table[table] = outcome.rows_by_table.get(table, 0) + columns.n_rows
            except StoreRejected as exc:
                # all or nothing per record: rows of it that other tables already took come out again
                for table in sorted({table for table, _ in rows} - {table for table, _ in mine} | set(stored)):
                    self.store.command(f"DELETE FROM {table} WHERE kafka_partition = {int(record.partition)} "
                                       f"AND kafka_offset = {int(record.offset)}")
                rejected.append((record, f"rejected by ClickHouse: {exc}"))
        return rejected


def _row_key(row: dict[str, Any]) -> tuple[int, int]:
    return (int(row["kafka_partition"]), int(row["kafka_offset"]))


def _row_keys(columns: TableColumns) -> set[tuple[int, int]]:
    return set(zip(columns.column("kafka_partition"), columns.column("kafka_offset"), strict=True))


def encoded_dead_letter(record: ConsumedRecord, reason: str) -> tuple[bytes, Headers]:
    """``record``'s dead letter for ``reason``, encoded, with its headers."""
    letter = dead_letter(reason, record.topic, record.value, _now(), record.partition, record.offset)
    return encode(letter), dead_letter_headers(letter)


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
        self.writer = BatchWriter(store, self.metrics, settings.topic_prefix, TtlDays.from_settings(settings))
        self.clock = clock
        self.topics = [spec.name(settings.topic_prefix) for spec in SINK_TOPICS]
        self.dlq_topic = DEADLETTER.name(settings.topic_prefix)
        self.buffers: dict[tuple[str, int], PartitionBuffer] = {}
        self._quiet_since = clock()
        self._assigned = False
        self.backoff = Backoff(base_s=settings.retry_initial_s, cap_s=settings.retry_max_s)
        self.stopping = threading.Event()
        self.totals = FlushOutcome()
        self._consumer: Any = None
        self._producer: BoundedProducer | None = None
        self._last_lag_at = 0.0

    # ---------------------------------------------------------------- lifecycle

    def stop(self) -> None:
        self.stopping.set()

    def _open(self) -> None:
        extra: dict[str, Any] = {
            "session.timeout.ms": self.settings.session_timeout_ms,
            "max.poll.interval.ms": max(300_000, self.settings.session_timeout_ms + 1),
            "partition.assignment.strategy": "cooperative-sticky",
        }
        if self.settings.group_instance_id:
            extra["group.instance.id"] = self.settings.group_instance_id
        self._consumer = make_consumer(self.settings.kafka, self.settings.group_id, extra)
        self._consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_revoke)
        self._producer = BoundedProducer(self.settings.kafka, self.settings.producer)

    def _idle_for(self, idle_s: float, now: float) -> bool:
        """Nothing buffered and quiet for ``idle_s`` since the group assigned partitions (a slow
        first join is not idleness: the data has not been read yet), or for ``NO_ASSIGNMENT_S``
        when no assignment ever came."""
        if any(b.records for b in self.buffers.values()):
            return False
        return now - self._quiet_since >= (idle_s if self._assigned else max(idle_s, NO_ASSIGNMENT_S))

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned = True
        self._quiet_since = self.clock()
        for tp in partitions:
            self.buffers.pop((tp.topic, tp.partition), None)
        log.info("partitions assigned", partitions=[f"{tp.topic}[{tp.partition}]" for tp in partitions])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:
            # uncommitted records are simply re-read by the next owner, which replays the journal
            self.buffers.pop((tp.topic, tp.partition), None)
        log.info("partitions revoked", partitions=[f"{tp.topic}[{tp.partition}]" for tp in partitions])

    def close(self) -> None:
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
                messages = self._consumer.consume(num_messages=1000, timeout=0.2)
                now = self.clock()
                for msg in messages:
                    if msg.error() is not None:
                        self.metrics.errors.labels(kind="kafka").inc()
                        log.warning("consume error", error=str(msg.error()))
                        continue
                    self._buffer(ConsumedRecord(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                                        msg.timestamp()[1]))
                if self._flush_due(now) or messages:
                    # A flush that waited out an outage paused consumption (and librdkafka dropped
                    # what it had prefetched): quiet time counts only from its end.
                    self._quiet_since = self.clock()
                self._report_lag(now)
                if exit_when_idle_s is not None and self._idle_for(exit_when_idle_s, now):
                    break
            self._flush_due(self.clock(), force=True)
        except SinkStopped as exc:
            log.warning("stopped while clickhouse was unavailable; uncommitted records will be re-read",
                        error=str(exc))
        finally:
            self.close()
        log.info("sink stopped", rows=self.totals.rows_by_table, dead_letters=self.totals.dead_letters)
        return self.totals

    # ---------------------------------------------------------------- batching

    def _buffer(self, record: ConsumedRecord) -> None:
        if self.totals.first_record_at is None:
            self.totals.first_record_at = time.perf_counter()
        buffer = self.buffers.setdefault((record.topic, record.partition), PartitionBuffer())
        if not buffer.records:
            buffer.opened_at = self.clock()
        buffer.records.append(record)

    def _due_batches(self, key: tuple[str, int], buffer: PartitionBuffer, now: float, force: bool) -> list[Batch]:
        topic, partition = key
        batches: list[Batch] = []
        if buffer.plans is None and buffer.records:
            buffer.plans = self._retry(lambda: self.writer.pending_plans(topic, partition, buffer.records[0].offset))
            if buffer.plans:
                log.info("replaying journalled batches", topic=topic, partition=partition, ranges=buffer.plans)
        while buffer.plans and buffer.records:
            first, last = buffer.plans[0]
            if buffer.records[-1].offset < last and not force:
                return batches  # wait until the whole journalled range is read again
            take = [r for r in buffer.records if r.offset <= last]
            buffer.records = buffer.records[len(take):]
            buffer.plans.pop(0)
            if take:
                batches.append(Batch(topic, partition, take, first, last, replayed=True))
        if not buffer.records:
            return batches
        size_due = len(buffer.records) >= self.settings.batch_max_rows
        age_due = now - buffer.opened_at >= self.settings.batch_max_age_s
        if size_due or age_due or force:
            while buffer.records:
                take = buffer.records[: self.settings.batch_max_rows]
                buffer.records = buffer.records[len(take):]
                batches.append(Batch(topic, partition, take, take[0].offset, take[-1].offset))
            buffer.opened_at = now
        return batches

    def _flush_due(self, now: float, force: bool = False) -> bool:
        """Write the batches that are due; whether any was written."""
        flushed = False
        for key in list(self.buffers):
            buffer = self.buffers.get(key)
            if buffer is None:
                continue
            for batch in self._due_batches(key, buffer, now, force):
                if self.stopping.is_set() and not force:
                    return flushed
                self._flush(batch)
                flushed = True
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
                                            msg.timestamp()[1]))
            else:
                time.sleep(min(0.2, delay_s))

    def _flush(self, batch: Batch) -> None:
        started = time.perf_counter()
        outcome, rejected = self._retry(lambda: self.writer.write(batch))
        for record, reason in rejected:
            self._send_dead_letter(record, reason)
        if rejected:
            self._retry(self._deliver_dead_letters)
        self._commit(batch)
        for table, n in outcome.rows_by_table.items():
            self.metrics.rows.labels(table=table).inc(n)
            self.totals.rows_by_table[table] = self.totals.rows_by_table.get(table, 0) + n
        self.totals.dead_letters += outcome.dead_letters
        self.totals.skipped_duplicates += outcome.skipped_duplicates
        self.totals.last_commit_at = time.perf_counter()
        self.metrics.batches.labels(topic=batch.topic).inc()
        self.metrics.latency.labels(topic=batch.topic).observe(time.perf_counter() - started)
        log.debug("batch written", batch=batch.token, rows=outcome.rows_by_table, dead_letters=len(rejected))

    def _send_dead_letter(self, record: ConsumedRecord, reason: str) -> None:
        assert self._producer is not None
        value, headers = encoded_dead_letter(record, reason)
        while not self._producer.produce(self.dlq_topic, record.key, value, headers):
            self._producer.poll(0.5)
        self.metrics.dead_letters.labels(topic=record.topic).inc()
        log.warning("record dead-lettered", topic=record.topic, partition=record.partition,
                    offset=record.offset, reason=reason[:300])

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
            commit_offsets(self._consumer, {(batch.topic, batch.partition): batch.last_offset + 1})
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
