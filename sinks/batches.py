"""One batch of one partition into ClickHouse, exactly once: the records a batch holds, decoding
and pivoting them into table columns, the facts delivered again at new offsets left out (pod windows
and GPU samples, which feed the rollups' materialized views), the deduplicated inserts, and the dead
letters of what cannot be stored (see :mod:`sinks.sink` for the rules and the consumer loop around it)."""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from common.logs import get_logger
from common.metrics import MetricsRegistry
from schemas.codec import MessageError, decode, decode_canonical_sparse, decode_plain, decode_plain_canonical, encode
from schemas.dead_letters import Headers, dead_letter, dead_letter_headers
from schemas.messages import DEFAULT_CLUSTER, GpuSample, Message
from schemas.outputs import DeadLetterReason
from schemas.topics import K8S_NODES, K8S_PODS, spec_for_name
from sinks import rollups, sample_json
from sinks.clickhouse import StoreRejected
from sinks.cluster import JOURNAL_SYNC
from sinks.ddl import DATETIME_MAX, TtlDays
from sinks.migrations import TTL_TABLES
from sinks.rows import PLAIN_TYPES, Decoded, Plain, Row, TableColumns, Tombstone, rows_for, tables_for

log = get_logger(__name__)


class Refusal(str):
    """Why a record goes to the dead-letter topic: the detail (the string itself) and its code."""

    code: DeadLetterReason

    def __new__(cls, detail: str, code: DeadLetterReason = DeadLetterReason.INVALID) -> Refusal:
        refusal = super().__new__(cls, detail)
        refusal.code = code
        return refusal


def unappliable(what: str, exc: BaseException) -> Refusal:
    """The refusal of a record that made the sink's own code fail (a gpulens fault, not the
    record's): the stream goes on without it."""
    return Refusal(f"{what} failed: {type(exc).__name__}: {exc}", DeadLetterReason.UNAPPLIABLE)


Rejected = list[tuple["ConsumedRecord", Refusal]]
"""Records that go to the dead-letter topic, with why."""


class Store(Protocol):
    """What the sink needs from ClickHouse (``sinks.clickhouse.ClickHouseStore``)."""

    def insert(self, table: str, columns: dict[str, list[Any]], dedup_token: str | None = None,
               repeated_timestamps: bool = False) -> int: ...

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> Any: ...

    def command(self, sql: str) -> None: ...

    def insert_json(self, table: str, lines: bytes, dedup_token: str) -> None: ...


@dataclass(frozen=True)
class ConsumedRecord:
    """One Kafka record, detached from the client library."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


@dataclass(frozen=True, order=True)
class Span:
    """One partition's offset range in a batch."""

    partition: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True)
class Plan:
    """A journalled range of one partition, to be cut again exactly when it is replayed; ``group``
    is the token of the group it was stored in ('' when it was stored alone)."""

    first_offset: int
    last_offset: int
    group: str = ""
    clock: datetime | None = field(default=None, compare=False)
    """The sink's clock the range's time bounds were judged at (its journal row's ``planned_at``)."""


def batch_token(topic: str, spans: Iterable[Span]) -> str:
    """The deduplication token of a block holding these ranges: ``topic:partition:first-last``, for
    a group the ranges in partition order joined by ``+`` (the same whichever member cuts it)."""
    return f"{topic}:" + "+".join(f"{s.partition}:{s.first_offset}-{s.last_offset}" for s in sorted(spans))


def spans_of(token: str) -> tuple[Span, ...]:
    """The ranges of a token made by :func:`batch_token` (topic names hold no ``:``)."""
    _topic, _, ranges = token.partition(":")
    spans = []
    for part in ranges.split("+"):
        partition, _, offsets = part.partition(":")
        first, _, last = offsets.partition("-")
        spans.append(Span(int(partition), int(first), int(last)))
    return tuple(spans)


@dataclass
class Batch:
    """The records of one partition's offset range, stored as one block; a **group** also holds the
    ranges of other partitions of the topic (``joined``), whose records are in ``records`` too, so
    that several partitions' due batches cost one insert (see :mod:`sinks.sink`)."""

    topic: str
    partition: int
    records: list[ConsumedRecord]
    first_offset: int
    last_offset: int
    replayed: bool = False
    joined: tuple[Span, ...] = ()
    clock: datetime | None = None
    """The sink's clock its records' time bounds are judged at: set when it is first prepared and
    journalled with it (``planned_at``), so that a retry and a replay after a crash keep and drop
    the same records, and every table's block under the batch's token holds the same rows."""

    @property
    def spans(self) -> tuple[Span, ...]:
        return (Span(self.partition, self.first_offset, self.last_offset), *self.joined)

    @property
    def committed_spans(self) -> tuple[Span, ...]:
        """The ranges its commit covers: every member of a group it cut, only its own when it
        replays one (each member's owner replays and commits its own)."""
        return self.spans[:1] if self.replayed else self.spans

    @property
    def token(self) -> str:
        return batch_token(self.topic, self.spans)

    def record_token(self, record: ConsumedRecord) -> str:
        """The token of one record's rows when the batch is written record by record."""
        if self.joined:
            return f"{self.token}:{record.partition}:{record.offset}"
        return f"{self.token}:{record.offset}"


SampleSource = tuple[str, str, str]
"""Where a GPU sample comes from: its (cluster, node, agent_boot_id); with its ``seq``, its identity."""


@dataclass(frozen=True, slots=True)
class EngineSample:
    """A GPU sample the engine unpacks: its record, its line for the engine, the rows it makes and
    its identity (to find re-deliveries: :class:`StoredSeqs`). Its other validated fields are not
    kept: in a batch waiting for the store thread they took more memory than the record and the
    line together (about 10 against 8 KiB per sample of 8 GPUs); the source's strings are interned
    (one copy per agent boot)."""

    record: ConsumedRecord
    line: bytes
    gpu_rows: int
    process_rows: int
    source: SampleSource
    seq: int
    ts: datetime


@dataclass
class PreparedBatch:
    """A batch decoded and pivoted into table columns, not yet stored."""

    batch: Batch
    decoded: list[tuple[ConsumedRecord, Decoded]]
    tables: dict[str, TableColumns]
    rejected: Rejected
    """Records that cannot be stored (undecodable, out of the time bounds), with the reason."""
    engine: list[EngineSample] = field(default_factory=list)
    """GPU samples the engine turns into rows (:mod:`sinks.sample_json`); not in ``tables``."""

    def all_decoded(self) -> list[tuple[ConsumedRecord, Decoded]]:
        """Every stored record of the batch, the engine's samples included (read in full), in offset order."""
        return sorted([*self.decoded, *((sample.record, read_in_full(sample.record)) for sample in self.engine)],
                      key=lambda item: item[0].offset)


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
            "sink_dead_letters_total", "Records sent to the dead-letter topic", ("topic", "reason")
        )
        self.dead_letters_suppressed = registry.counter(
            "sink_deadletters_suppressed_total",
            "Records refused beyond the dead-letter rate (deadletter_rate_per_s): counted, not written",
            ("topic", "reason"),
        )
        self.duplicates = registry.counter(
            "sink_duplicates_skipped_total", "Records whose id was already stored", ("table",)
        )
        self.lag = registry.gauge("sink_consumer_lag", "Messages not yet consumed", ("topic", "partition"))
        self.retry_backoff = registry.gauge("sink_retry_backoff_seconds", "Current backoff while ClickHouse fails")


TTL_MARGIN = timedelta(minutes=1)
"""Rows this close to their TTL are dead-lettered too: the engine would drop them within moments."""

DEFAULT_MAX_FUTURE_SKEW_S = 600.0
"""How far ahead of the sink's clock a record's times may be (``SinkSettings.max_future_skew_s``)."""

ROLLED_UP = {table: "rollup" for table in rollups.SOURCES}
"""Tables whose rows also feed tables with another TTL (the rollups count from the rows' time)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _days_before(moment: datetime, days: int) -> datetime:
    """``moment`` less ``days`` days, or the epoch when that is before it (no overflow)."""
    if days >= (moment - _EPOCH).days:
        return _EPOCH
    return moment - timedelta(days=days)


@dataclass(frozen=True)
class TimeBounds:
    """What one batch may hold, at the sink's clock ``now``: per table, the oldest time its TTL
    keeps (``oldest``: a row at or before it is ``too_old``) and the latest time any of its
    columns may hold (``latest``: ``too_far_ahead``), the smaller of the clock plus the allowed
    skew and the last time whose TTL ends before :data:`DATETIME_MAX`. Computed by subtraction from
    fixed ends, so no date arithmetic here overflows or wraps, whatever a record says."""

    now: datetime
    skew_s: float
    oldest: dict[str, datetime]
    """table -> a row whose TTL column is at or before this is past its TTL"""
    latest: dict[str, datetime]
    """table -> no time column may be after this"""
    ahead: datetime
    """the clock plus the skew (tables without a TTL: ``latest`` falls back to it)"""

    def latest_for(self, table: str) -> datetime:
        return self.latest.get(table, self.ahead)

    def too_far_ahead(self, table: str, column: str, value: datetime, ttl_days: int | None) -> Refusal:
        if value > self.ahead:
            return Refusal(f"{table}.{column} = {value.isoformat()} is more than {self.skew_s:g} s ahead of the "
                           f"sink's clock {self.now.isoformat()} (GPULENS_MAX_FUTURE_SKEW_S)",
                           DeadLetterReason.TOO_FAR_AHEAD)
        return Refusal(f"{table}.{column} = {value.isoformat()} is too far ahead for the table's {ttl_days}-day "
                       f"TTL: it would end after {DATETIME_MAX.isoformat()}, the last second ClickHouse's DateTime "
                       "holds, wrap and drop the row", DeadLetterReason.TOO_FAR_AHEAD)


def _latest(column: list[Any]) -> datetime | None:
    """The latest time of a column, None when it holds none (one C-level ``max`` in the usual case)."""
    first = next((v for v in column if v is not None), None)
    if not isinstance(first, datetime):
        return None
    try:
        latest = max(column)
    except TypeError:  # a Nullable column holding NULLs
        latest = max(v for v in column if v is not None)
    return latest if isinstance(latest, datetime) else None


def _oldest(column: list[Any]) -> datetime | None:
    try:
        oldest = min(column)
    except (TypeError, ValueError):  # a Nullable column holding NULLs (or no rows)
        oldest = min((v for v in column if isinstance(v, datetime)), default=None)
    return oldest if isinstance(oldest, datetime) else None


class GcPause:
    """No cyclic garbage collection while a batch is decoded, pivoted and inserted.

    A batch allocates a few objects per value and frees them by reference counting (models, rows
    and columns hold no cycles); without the pause the collector scans every live object, the
    batch's included, dozens of times per batch, which cost about as much as the decoding itself,
    and re-enabling it while a batch's objects are still alive costs a collection over all of them
    (about a second per 2,000 samples). Pauses nest and may overlap across threads (the sink
    prepares one batch while the store thread inserts another, and hands its pause over with the
    batch): the collector is enabled again when the last one ends. Memory stays bounded by the
    batch size.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = False

    def begin(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._depth += 1

    def end(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._was_enabled:
                gc.enable()


GC_PAUSE = GcPause()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """:data:`GC_PAUSE` for the duration of a block."""
    GC_PAUSE.begin()
    try:
        yield
    finally:
        GC_PAUSE.end()


REDELIVERY_LOOKBACK = timedelta(minutes=10)
"""How far before a batch's oldest sample of an unknown source the store is searched for that
source's highest stored ``seq``: a sample stored with a higher ``seq`` was taken later, so this only
covers an agent's clock stepping back."""

MAX_REMEMBERED_SOURCES = 100_000
"""Sample sources (agent boots) :class:`StoredSeqs` keeps per partition before it starts again
(those it forgets are looked up in the store when they next send): a fleet's agents restart, and
every boot is a new source."""


@dataclass
class _PartitionSeqs:
    next_offset: int
    """The offset after the last batch stored: what the remembered seqs cover, all of it before."""
    highest: dict[SampleSource, int]


class StoredSeqs:
    """The highest ``seq`` stored per sample source, per partition of the samples' topic, at the
    offsets before the next one the sink expects there: what tells a GPU sample delivered again at
    a new offset (a producer's resend, a topic replayed into itself) from a new one.

    One agent boot's samples have increasing ``seq`` and, keyed by node, sit in one partition in
    order (the producers are idempotent), so a sample whose ``seq`` is at most one stored at an
    earlier offset of its partition was delivered before. What is remembered holds only while a
    partition's batches are stored in offset order without a gap: a batch that does not start where
    the last one stored ended (the partition assigned again after another sink read it, a journal
    replay after a crash or a rebalance) forgets the partition, whose sources are then looked up in
    the store (:meth:`BatchWriter._drop_redelivered_samples`). So no rebalance hook is needed, and
    a sample is never compared with rows stored at its own or later offsets: a batch stored again
    keeps exactly the samples it kept the first time."""

    def __init__(self, max_sources: int = MAX_REMEMBERED_SOURCES) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], _PartitionSeqs] = {}
        self.max_sources = max_sources

    def known(self, topic: str, partition: int, first_offset: int, sources: Iterable[SampleSource]
              ) -> dict[SampleSource, int]:
        """The highest ``seq`` stored before ``first_offset`` of those ``sources`` it knows (the
        partition is forgotten, and none known, when its last stored batch did not end just before)."""
        with self._lock:
            seqs = self._partitions.get((topic, partition))
            if seqs is None:
                return {}
            if seqs.next_offset != first_offset:
                del self._partitions[(topic, partition)]
                return {}
            return {source: seqs.highest[source] for source in sources if source in seqs.highest}

    def stored(self, topic: str, span: Span, highest: dict[SampleSource, int]) -> None:
        """A batch's range of the partition is stored, with these highest seqs per source (every
        source of the range, each at least what was stored before it)."""
        with self._lock:
            seqs = self._partitions.get((topic, span.partition))
            if seqs is None or seqs.next_offset != span.first_offset:
                seqs = self._partitions[(topic, span.partition)] = _PartitionSeqs(span.first_offset, {})
            if len(seqs.highest) + len(highest) > self.max_sources:
                seqs.highest.clear()
            seqs.highest.update(highest)
            seqs.next_offset = span.last_offset + 1

    def forget(self, partition: tuple[str, int] | None = None) -> None:
        """Forget a (topic, partition), or every one."""
        with self._lock:
            if partition is None:
                self._partitions.clear()
            else:
                self._partitions.pop(partition, None)


def read_in_full(record: ConsumedRecord, message_type: type[Message] = GpuSample) -> Plain:
    """A canonical record's message with every field, defaults included, read again from the record
    (the sink keeps only what the engine path needs; the row path is rare)."""
    if not isinstance(record.value, bytes):
        raise TypeError("only a record's bytes are read again")
    return Plain(message_type, decode_plain_canonical(record.value, message_type)[0], canonical=True)


def completed(record: ConsumedRecord, message: Plain) -> Plain:
    """``message`` with every field, defaults included (a sparse one is read again in full)."""
    return message if message.complete else read_in_full(record, message.type)


def _now() -> datetime:
    return datetime.now(UTC)


def _to_millis(moment: datetime) -> datetime:
    """``moment`` in the journal's precision (``planned_at`` is a ``DateTime64(3)``)."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def _clock(value: Any) -> datetime | None:
    """A journalled ``planned_at`` (an ISO 8601 string from the store, or a datetime) as a clock."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, str) and value:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return None


def _ts(record: ConsumedRecord) -> datetime:
    if record.timestamp_ms and record.timestamp_ms > 0:
        try:
            return datetime.fromtimestamp(record.timestamp_ms / 1000, UTC)
        except (OverflowError, ValueError, OSError):  # a producer's timestamp past year 9999: too far ahead
            return datetime.max.replace(tzinfo=UTC)
    return _now()


class BatchWriter:
    """Turns one batch into inserts (the deterministic, Kafka-free half of the sink)."""

    def __init__(self, store: Store, metrics: SinkMetrics, topic_prefix: str, ttl: TtlDays | None = None,
                 now: Callable[[], datetime] | None = None,
                 max_future_skew_s: float = DEFAULT_MAX_FUTURE_SKEW_S, replicated: bool = False) -> None:
        self.store = store
        self.replicated = replicated
        """Cluster mode: the journal is a Replicated table, synced before it is read (:data:`JOURNAL_SYNC`)."""
        self.metrics = metrics
        self.prefix = topic_prefix
        self.now = now or _now
        self.max_future_skew_s = max_future_skew_s
        ttl = ttl or TtlDays()
        self.ttl_by_table: dict[str, tuple[str, int]] = {
            table: (expr.removeprefix("toDateTime(").removesuffix(")"), getattr(ttl, kind))
            for table, (expr, kind) in TTL_TABLES.items()
        }
        """table -> (column its TTL counts from, days)"""
        self.latest_by_table: dict[str, tuple[datetime, int]] = {}
        """table -> (the last time whose TTL ends before DATETIME_MAX, the days counted: the
        longest TTL the table's rows are kept under, the rollups' too for ``pod_windows``)"""
        for table, (_column, days) in self.ttl_by_table.items():
            if table in ROLLED_UP:
                days = max(days, getattr(ttl, ROLLED_UP[table]))
            self.latest_by_table[table] = (_days_before(DATETIME_MAX - TTL_MARGIN, days), days)
        self.stored_seqs = StoredSeqs()
        """The highest seq stored per GPU sample source (:meth:`_drop_redelivered_samples`)."""

    def bounds(self, now: datetime) -> TimeBounds:
        """The time bounds of a batch prepared at ``now`` (see :class:`TimeBounds`)."""
        room_s = (DATETIME_MAX - now).total_seconds()
        ahead = now + timedelta(seconds=self.max_future_skew_s) if self.max_future_skew_s < room_s else DATETIME_MAX
        return TimeBounds(
            now, self.max_future_skew_s,
            oldest={table: _days_before(now + TTL_MARGIN, days) for table, (_, days) in self.ttl_by_table.items()},
            latest={table: min(ahead, latest) for table, (latest, _) in self.latest_by_table.items()},
            ahead=ahead,
        )

    def _any_out_of_bounds(self, tables: dict[str, TableColumns], bounds: TimeBounds) -> bool:
        """Whether any row of the batch is out of its table's time bounds (one ``min`` or ``max``
        per time column)."""
        for table, columns in tables.items():
            rule = self.ttl_by_table.get(table)
            if rule is not None and columns.n_rows:
                oldest = _oldest(columns.column(rule[0]))
                if oldest is not None and oldest <= bounds.oldest[table]:
                    return True
            latest_allowed = bounds.latest_for(table)
            for values in columns.data:
                latest = _latest(values)
                if latest is not None and latest > latest_allowed:
                    return True
        return False

    def _any_expired(self, tables: dict[str, TableColumns], now: datetime) -> bool:
        """:meth:`_any_out_of_bounds` at the clock ``now``."""
        return self._any_out_of_bounds(tables, self.bounds(now))

    def out_of_bounds(self, rows: list[tuple[str, Row]], bounds: TimeBounds) -> Refusal | None:
        """Why one record's rows cannot be stored for their times (None when they can): a time
        too far ahead of the sink's clock (or too late for its table's TTL to be counted), or a
        row the table's TTL would drop on insert."""
        for table, row in rows:
            latest_allowed = bounds.latest_for(table)
            for column, value in row.items():
                if isinstance(value, datetime) and value > latest_allowed:
                    days = self.latest_by_table.get(table, (None, None))[1]
                    return bounds.too_far_ahead(table, column, value, days)
            rule = self.ttl_by_table.get(table)
            if rule is None:
                continue
            column, days = rule
            value = row.get(column)
            if isinstance(value, datetime) and value <= bounds.oldest[table]:
                return Refusal(f"{table}.{column} = {value.isoformat()} is older than the table's {days}-day TTL: "
                               "ClickHouse would drop it on insert (raise the sink's *_TTL_DAYS to keep such data)",
                               DeadLetterReason.TOO_OLD)
        return None

    # ---------------------------------------------------------------- decode

    def decode(self, record: ConsumedRecord) -> tuple[Decoded | None, Refusal | None]:
        """The message of one record, or the reason it goes to the dead-letter topic (never raises)."""
        try:
            return self._decode(record)
        except Exception as exc:
            return None, unappliable(f"decoding a {record.topic} record", exc)

    def _decode(self, record: ConsumedRecord) -> tuple[Decoded | None, Refusal | None]:
        spec = spec_for_name(record.topic)
        if record.value is None:
            if spec in (K8S_PODS, K8S_NODES):
                key = (record.key or b"").decode(errors="replace")
                return Tombstone.of_record_key(spec.suffix, key, _ts(record)), None
            return None, Refusal("empty value (tombstone) on a topic that has no tombstones")
        try:
            if spec.message is GpuSample:
                # most samples go to the engine, which needs only a few of their fields from here
                sparse = decode_canonical_sparse(record.value, spec.message)
                if sparse is not None:
                    return Plain(spec.message, sparse, canonical=True, complete=False), None
                return Plain(spec.message, decode_plain(record.value, spec.message)), None
            if spec.message in PLAIN_TYPES:
                return Plain(spec.message, decode_plain(record.value, spec.message)), None
            return decode(record.value, spec.message), None
        except MessageError as exc:
            return None, Refusal(f"invalid {spec.suffix} message: {exc}", exc.code)

    # ---------------------------------------------------------------- write

    def plan(self, batch: Batch) -> None:
        """Journal the batch's ranges (one row per partition; a group's rows name the group)."""
        spans = sorted(batch.spans)
        group = batch.token if len(spans) > 1 else ""
        self.store.insert(
            "sink_batches",
            {
                "topic": [batch.topic] * len(spans),
                "partition": [span.partition for span in spans],
                "first_offset": [span.first_offset for span in spans],
                "last_offset": [span.last_offset for span in spans],
                "planned_at": [batch.clock or _now()] * len(spans),
                "batch_group": [group] * len(spans),
            },
            dedup_token=f"plan:{batch.token}",
        )

    def pending_plans(self, starts: dict[tuple[str, int], int]) -> dict[tuple[str, int], list[Plan]]:
        """The journalled ranges of each (topic, partition) that end at or after its start offset,
        in offset order: one query for every partition that needs them (after an assignment, each
        would otherwise wait for its own query behind the insert in flight)."""
        if not starts:
            return {}
        if self.replicated:
            self.store.command(JOURNAL_SYNC)
        result = self.store.query(
            "SELECT topic, partition, first_offset, last_offset, batch_group, min(planned_at) FROM sink_batches "
            "WHERE has({keys:Array(Tuple(String, UInt16))}, (topic, partition)) AND last_offset >= {offset:UInt64} "
            "GROUP BY topic, partition, first_offset, last_offset, batch_group ORDER BY last_offset, batch_group",
            {"keys": sorted(starts), "offset": min(starts.values())},
        )
        plans: dict[tuple[str, int], list[Plan]] = {key: [] for key in starts}
        for topic, partition, first, last, group, *planned in result.rows:
            key = (str(topic), int(partition))
            if key in plans and int(last) >= starts[key]:
                plans[key].append(Plan(int(first), int(last), str(group), _clock(planned[0] if planned else None)))
        return plans

    def write(self, batch: Batch) -> tuple[FlushOutcome, Rejected]:
        """Insert a batch; returns what was written and the records for the dead-letter topic.

        Raises :class:`StoreUnavailable` when ClickHouse cannot be reached: nothing may be committed.
        """
        with gc_paused():
            return self.store_prepared(self.prepare(batch))

    def prepare(self, batch: Batch) -> PreparedBatch:
        """Decode and pivot a batch, leaving out what cannot be stored (no ClickHouse call: the sink
        prepares the next batch while the previous one is being inserted)."""
        rejected: Rejected = []
        decoded: list[tuple[ConsumedRecord, Decoded]] = []
        for record in batch.records:
            message, reason = self.decode(record)
            if reason is not None:
                rejected.append((record, reason))
            elif message is not None:
                decoded.append((record, message))
        if batch.clock is None:
            batch.clock = _to_millis(self.now())
        bounds = self.bounds(batch.clock)
        engine, decoded = self._engine_lines(decoded, bounds, rejected)
        tables, decoded = self._tables(decoded, rejected)
        if self._any_out_of_bounds(tables, bounds):
            # rare: find the records concerned and leave them out of this batch's blocks
            kept: list[tuple[ConsumedRecord, Decoded]] = []
            for record, message in decoded:
                try:
                    reason = self.out_of_bounds(rows_for(message, record.partition, record.offset), bounds)
                except Exception as exc:
                    reason = unappliable("building its rows", exc)
                if reason is not None:
                    rejected.append((record, reason))
                else:
                    kept.append((record, message))
            tables, decoded = self._tables(kept, rejected)
        return PreparedBatch(batch, decoded, tables, rejected, engine)

    def _tables(self, decoded: list[tuple[ConsumedRecord, Decoded]], rejected: Rejected
                ) -> tuple[dict[str, TableColumns], list[tuple[ConsumedRecord, Decoded]]]:
        """The batch's rows as table columns, and the records they come from: a record whose rows
        cannot be built (a gpulens fault) is dead-lettered alone and the others are kept."""
        try:
            return tables_for([(message, record.partition, record.offset) for record, message in decoded]), decoded
        except Exception as exc:
            log.error("the rows of a batch could not be built; building them record by record", error=repr(exc))
        kept: list[tuple[ConsumedRecord, Decoded]] = []
        for record, message in decoded:
            try:
                tables_for([(message, record.partition, record.offset)])
            except Exception as exc:
                rejected.append((record, unappliable("building its rows", exc)))
            else:
                kept.append((record, message))
        return tables_for([(message, record.partition, record.offset) for record, message in kept]), kept

    def _engine_lines(self, decoded: list[tuple[ConsumedRecord, Decoded]], bounds: TimeBounds, rejected: Rejected
                      ) -> tuple[list[EngineSample], list[tuple[ConsumedRecord, Decoded]]]:
        """The canonical GPU samples the engine can unpack (with their lines), and the other records.

        All samples take the row path when one of them is out of the samples' time bounds (rare:
        that path finds and dead-letters it)."""
        engine: list[EngineSample] = []
        rest: list[tuple[ConsumedRecord, Decoded]] = []
        times: list[datetime] = []
        for record, message in decoded:
            try:
                taken = _engine_sample_or_message(record, message)
            except Exception as exc:
                rejected.append((record, unappliable("preparing a sample", exc)))
                continue
            if isinstance(taken, tuple):
                engine.append(taken[0])
                times.append(taken[1])
            else:
                rest.append((record, taken))
        if times and (min(times) <= bounds.oldest["gpu_samples"]
                      or max(times) > min(bounds.latest_for("gpu_samples"), bounds.latest_for("gpu_processes"))):
            return [], _all_as_rows(decoded, engine, rest, rejected)
        return engine, rest

    def store_prepared(self, prepared: PreparedBatch) -> tuple[FlushOutcome, Rejected]:
        """Journal and insert a prepared batch (see :meth:`write`); call it once per preparation, as
        it filters the batch's windows in place."""
        batch, decoded, tables = prepared.batch, prepared.decoded, prepared.tables
        outcome = FlushOutcome()
        rejected = list(prepared.rejected)
        outcome.skipped_duplicates = self._drop_stored_windows(batch, tables)
        highest: dict[int, dict[SampleSource, int]] | None = None
        if spec_for_name(batch.topic).message is GpuSample:
            dropped, highest = self._drop_redelivered_samples(prepared)
            outcome.skipped_duplicates += dropped
            decoded = prepared.decoded
        self.plan(batch)
        if prepared.engine:
            tables, decoded = self._store_engine_lines(prepared, outcome)
        written: set[str] = set()
        try:
            for table, columns in _rollup_sources_last(tables):
                self.store.insert(table, columns.columns, dedup_token=batch.token, repeated_timestamps=True)
                written.add(table)
                outcome.rows_by_table[table] = outcome.rows_by_table.get(table, 0) + columns.n_rows
        except StoreRejected as exc:
            log.warning("batch rejected, writing its remaining tables record by record", batch=batch.token,
                        error=str(exc), tables_written=sorted(written))
            kept = {table: tables[table] for table in tables if table not in written}
            per_record: list[tuple[ConsumedRecord, list[tuple[str, Row]]]] = []
            for record, message in decoded:
                try:
                    per_record.append((record, rows_for(message, record.partition, record.offset)))
                except Exception as exc:  # its rows were built for the batch: not stored, so none to delete
                    rejected.append((record, unappliable("building its rows", exc)))
            rejected.extend(self._write_one_by_one(batch, per_record, kept, outcome))
        if highest is not None:
            for span in batch.spans:
                if len(rejected) > len(prepared.rejected):  # rows of a refused record were deleted again
                    self.stored_seqs.forget((batch.topic, span.partition))
                else:
                    self.stored_seqs.stored(batch.topic, span, highest.get(span.partition, {}))
        outcome.dead_letters = len(rejected)
        return outcome, rejected

    def _store_engine_lines(self, prepared: PreparedBatch, outcome: FlushOutcome
                            ) -> tuple[dict[str, TableColumns], list[tuple[ConsumedRecord, Decoded]]]:
        """Insert the batch's engine lines; the tables and records the row path still has to write:
        those of the prepared batch, or, when the engine refused the lines (a line it cannot read
        fails the insert before any row is written: :mod:`sinks.sample_json`), every record of it,
        the samples included."""
        batch = prepared.batch
        try:
            self.store.insert_json(sample_json.TABLE, b"\n".join(sample.line for sample in prepared.engine),
                                   dedup_token=f"{batch.token}:json")
        except StoreRejected as exc:
            log.warning("the engine refused the batch's samples, writing them as rows", batch=batch.token,
                        error=str(exc))
            everything = prepared.all_decoded()
            self.metrics.errors.labels(kind="engine_refused_samples").inc()
            tables = tables_for([(message, record.partition, record.offset) for record, message in everything])
            return tables, everything
        gpu_rows = sum(sample.gpu_rows for sample in prepared.engine)
        process_rows = sum(sample.process_rows for sample in prepared.engine)
        outcome.rows_by_table["gpu_samples"] = outcome.rows_by_table.get("gpu_samples", 0) + gpu_rows
        if process_rows:
            outcome.rows_by_table["gpu_processes"] = outcome.rows_by_table.get("gpu_processes", 0) + process_rows
        return prepared.tables, prepared.decoded

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
        ranges: dict[str, Any] = {}
        mine: list[str] = []
        for i, span in enumerate(batch.spans):
            mine.append(f"(kafka_partition = {{p{i}:UInt16}} "
                        f"AND kafka_offset BETWEEN {{f{i}:UInt64}} AND {{l{i}:UInt64}})")
            ranges |= {f"p{i}": span.partition, f"f{i}": span.first_offset, f"l{i}": span.last_offset}
        result = self.store.query(
            "SELECT DISTINCT window_id FROM pod_windows "
            "WHERE window_start >= {lo:DateTime64(3, 'UTC')} AND window_start <= {hi:DateTime64(3, 'UTC')} "
            f"AND window_id IN {{ids:Array(String)}} AND NOT ({' OR '.join(mine)})",
            {"lo": min(starts), "hi": max(starts), "ids": sorted(set(ids)), **ranges},
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

    def _drop_redelivered_samples(self, prepared: PreparedBatch) -> tuple[int, dict[int, dict[SampleSource, int]]]:
        """Remove GPU samples delivered before at an earlier offset of their partition (the
        rollups fed by ``gpu_samples`` must not count them twice), as wholes: their rows of every
        table, engine lines and records. Returns how many were removed and, per partition, the
        highest ``seq`` per source once the batch is stored (for :attr:`stored_seqs`).

        A sample is delivered again when its ``seq`` is at most the highest of its source (cluster,
        node, agent boot) stored at an earlier offset of its partition: before the batch (from
        :attr:`stored_seqs`, or, for a source it does not know, from one query for all of them,
        bounded by the sort key's ``cluster`` and ``node`` and by time), or earlier in the batch.
        Nothing at the batch's own offsets or after counts, so a retried or replayed batch keeps the
        same samples and its deduplication tokens still match.
        """
        batch = prepared.batch
        samples = self._sample_identities(prepared)
        if not samples:
            return 0, {}
        first = {span.partition: span.first_offset for span in batch.spans}
        sources: dict[int, set[SampleSource]] = {}
        for partition, _offset, source, _seq, _ts in samples:
            sources.setdefault(partition, set()).add(source)
        highest: dict[int, dict[SampleSource, int]] = {
            partition: self.stored_seqs.known(batch.topic, partition, first[partition], of)
            for partition, of in sources.items()}
        unknown = {(partition, source) for partition, of in sources.items() for source in of
                   if source not in highest[partition]}
        if unknown:
            oldest = min(ts for partition, _offset, source, _seq, ts in samples if (partition, source) in unknown)
            for (partition, source), seq in self._stored_seqs_of(batch, unknown, oldest).items():
                highest[partition][source] = seq
        dropped: set[tuple[int, int]] = set()
        for partition, offset, source, seq, _ts in sorted(samples, key=lambda s: (s[0], s[1])):
            of = highest[partition]
            if seq <= of.get(source, -1):
                dropped.add((partition, offset))
            else:
                of[source] = seq
        if dropped:
            self._drop_records(prepared, dropped)
            self.metrics.duplicates.labels(table="gpu_samples").inc(len(dropped))
        return len(dropped), highest

    @staticmethod
    def _sample_identities(prepared: PreparedBatch) -> list[tuple[int, int, SampleSource, int, datetime]]:
        """(partition, offset, source, seq, ts) of every sample of the batch that stores rows."""
        samples = [(s.record.partition, s.record.offset, s.source, s.seq, s.ts)
                   for s in prepared.engine if s.gpu_rows]
        rows = prepared.tables.get("gpu_samples")
        if rows is not None and rows.n_rows:
            seen: set[tuple[int, int]] = set()
            for partition, offset, cluster, node, boot, seq, ts in zip(
                    *(rows.column(name) for name in ("kafka_partition", "kafka_offset", "cluster", "node",
                                                     "agent_boot_id", "seq", "ts")), strict=True):
                if (partition, offset) not in seen:
                    seen.add((partition, offset))
                    samples.append((partition, offset, (cluster, node, boot), seq, ts))
        return samples

    def _stored_seqs_of(self, batch: Batch, sources: set[tuple[int, SampleSource]], oldest: datetime
                        ) -> dict[tuple[int, SampleSource], int]:
        """The highest ``seq`` of each (partition, source) stored before the batch's offsets of the
        partition, among samples taken since ``oldest`` (less :data:`REDELIVERY_LOOKBACK`)."""
        earlier: list[str] = []
        ranges: dict[str, Any] = {}
        for i, span in enumerate(sorted({span.partition: span for span in batch.spans}.values())):
            if any(partition == span.partition for partition, _ in sources):
                earlier.append(f"(kafka_partition = {{p{i}:UInt16}} AND kafka_offset < {{f{i}:UInt64}})")
                ranges |= {f"p{i}": span.partition, f"f{i}": span.first_offset}
        result = self.store.query(
            "SELECT kafka_partition, cluster, node, agent_boot_id, max(seq) FROM gpu_samples "
            "WHERE cluster IN {clusters:Array(String)} AND node IN {nodes:Array(String)} "
            "AND ts >= {lo:DateTime64(3, 'UTC')} "
            "AND (kafka_partition, cluster, node, agent_boot_id) "
            "IN {keys:Array(Tuple(UInt16, String, String, String))} "
            f"AND ({' OR '.join(earlier)}) GROUP BY kafka_partition, cluster, node, agent_boot_id",
            {"clusters": sorted({source[0] for _, source in sources}),
             "nodes": sorted({source[1] for _, source in sources}),
             "lo": oldest - REDELIVERY_LOOKBACK,
             "keys": sorted((partition, *source) for partition, source in sources), **ranges},
        )
        return {(int(partition), (str(cluster), str(node), str(boot))): int(seq)
                for partition, cluster, node, boot, seq in result.rows}

    @staticmethod
    def _drop_records(prepared: PreparedBatch, dropped: set[tuple[int, int]]) -> None:
        """Leave the records at these (partition, offset) out of the batch: engine lines, records and rows."""
        prepared.engine = [s for s in prepared.engine if (s.record.partition, s.record.offset) not in dropped]
        prepared.decoded = [(record, message) for record, message in prepared.decoded
                            if (record.partition, record.offset) not in dropped]
        for table, columns in list(prepared.tables.items()):
            if not columns.n_rows or "kafka_offset" not in columns.names:
                continue
            keep = [i for i, key in enumerate(zip(columns.column("kafka_partition"), columns.column("kafka_offset"),
                                                  strict=True)) if key not in dropped]
            if len(keep) < columns.n_rows:
                columns.keep(keep)
                if not keep:
                    del prepared.tables[table]

    def _write_one_by_one(
        self,
        batch: Batch,
        per_record: list[tuple[ConsumedRecord, list[tuple[str, dict[str, Any]]]]],
        remaining: dict[str, TableColumns],
        outcome: FlushOutcome,
    ) -> Rejected:
        """Write the tables not yet written, one record at a time; return the records ClickHouse refused.

        Only rows the batch still carries (``remaining``: windows filtered as stored are not re-added)
        are written, each block under a token of its own record, so a retry of this batch stores
        nothing twice either.
        """
        rejected: Rejected = []
        left = {table: _row_keys(columns) for table, columns in remaining.items()}
        for record, rows in per_record:
            token = batch.record_token(record)
            mine = [(table, row) for table, row in rows if _row_key(row) in left.get(table, set())]
            stored: list[str] = []
            try:
                for table, columns in _rollup_sources_last(self._pivot(mine)):
                    self.store.insert(table, columns.columns, dedup_token=token)
                    stored.append(table)
                    outcome.rows_by_table[table] = outcome.rows_by_table.get(table, 0) + columns.n_rows
            except StoreRejected as exc:
                # all or nothing per record: rows of it that other tables already took come out again
                for table in sorted({table for table, _ in rows} - {table for table, _ in mine} | set(stored)):
                    self.store.command(f"DELETE FROM {table} WHERE kafka_partition = {int(record.partition)} "
                                       f"AND kafka_offset = {int(record.offset)}")
                rejected.append((record, Refusal(f"rejected by ClickHouse: {exc}", DeadLetterReason.REJECTED_BY_STORE)))
        return rejected


def _rollup_sources_last(tables: dict[str, TableColumns]) -> list[tuple[str, TableColumns]]:
    """The tables in the order to insert them: those that feed rollups last, so that a record whose
    rows another table refuses is deleted again (:meth:`BatchWriter._write_one_by_one`) before a
    rollup counted it (a rollup's view keeps what it counted)."""
    return sorted(tables.items(), key=lambda item: item[0] in rollups.SOURCES)


def _row_key(row: dict[str, Any]) -> tuple[int, int]:
    return (int(row["kafka_partition"]), int(row["kafka_offset"]))


def _row_keys(columns: TableColumns) -> set[tuple[int, int]]:
    return set(zip(columns.column("kafka_partition"), columns.column("kafka_offset"), strict=True))


def encoded_dead_letter(record: ConsumedRecord, reason: str) -> tuple[bytes, Headers]:
    """``record``'s dead letter for ``reason`` (its code when it is a :class:`Refusal`), encoded,
    with its headers."""
    code = reason.code if isinstance(reason, Refusal) else DeadLetterReason.INVALID
    letter = dead_letter(str(reason), record.topic, record.value, _now(), record.partition, record.offset,
                         reason=code)
    return encode(letter), dead_letter_headers(letter)


def _engine_sample_or_message(record: ConsumedRecord, message: Decoded) -> tuple[EngineSample, datetime] | Decoded:
    """A canonical GPU sample's line for the engine, with the sample's time; otherwise the message
    for the row path (a sample the engine does not unpack read in full)."""
    if not (isinstance(message, Plain) and message.canonical and isinstance(record.value, bytes)):
        return message
    data = message.data
    line = sample_json.engine_line(record.value, data, record.partition, record.offset)
    if line is None:
        return completed(record, message)
    source = (sys.intern(data.get("cluster") or DEFAULT_CLUSTER), sys.intern(data["node"]),
              sys.intern(data["agent_boot_id"]))
    return EngineSample(record, line, *sample_json.row_counts(data), source, data["seq"], data["ts"]), data["ts"]


def _all_as_rows(decoded: list[tuple[ConsumedRecord, Decoded]], engine: list[EngineSample],
                 rest: list[tuple[ConsumedRecord, Decoded]], rejected: Rejected
                 ) -> list[tuple[ConsumedRecord, Decoded]]:
    """Every record for the row path, in the batch's order: the samples read in full."""
    kept = {id(record): (record, message) for record, message in rest}
    unpacked = {id(sample.record) for sample in engine}
    everything: list[tuple[ConsumedRecord, Decoded]] = []
    for record, message in decoded:
        if id(record) in kept:
            everything.append(kept[id(record)])
        elif id(record) in unpacked:
            try:
                everything.append((record, completed(record, message) if isinstance(message, Plain) else message))
            except Exception as exc:
                rejected.append((record, unappliable("reading a sample in full", exc)))
    return everything
