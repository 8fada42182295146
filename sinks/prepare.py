"""Preparing one batch for ClickHouse: each record decoded, the messages pivoted into table columns,
and what cannot be stored (undecodable, past its table's TTL) left out with the reason.

Pure and deterministic (no ClickHouse, no Kafka, the clock passed in): the same records and the same
``now`` always give the same columns, which is what lets a retried batch be the same block. That is
also what lets the sink run it in a process of its own (:mod:`sinks.prepare_pool`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from schemas.codec import MessageError, decode, decode_plain
from schemas.topics import K8S_NODES, K8S_PODS, spec_for_name
from sinks.ddl import TtlDays
from sinks.migrations import TTL_TABLES
from sinks.rows import PLAIN_TYPES, Decoded, Plain, TableColumns, Tombstone, rows_for, tables_for

TTL_MARGIN = timedelta(minutes=1)
"""Rows this close to their TTL are dead-lettered too: the engine would drop them within moments."""


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
class PreparedBatch:
    """A batch decoded and pivoted into table columns, not yet stored."""

    batch: Batch
    kept: list[ConsumedRecord]
    """The records whose rows ``tables`` holds, in batch order."""
    tables: dict[str, TableColumns]
    rejected: list[tuple[ConsumedRecord, str]]
    """Records that cannot be stored (undecodable, past their TTL), with the reason."""


@dataclass
class PreparedParts:
    """What :meth:`BatchPreparer.prepare_parts` computes: the tables, and the rejected records by
    their index in the batch (the compact form a preparing process sends back; see
    :meth:`assemble`)."""

    tables: dict[str, TableColumns]
    rejected: list[tuple[int, str]]

    def assemble(self, batch: Batch) -> PreparedBatch:
        reasons = dict(self.rejected)
        kept = [record for i, record in enumerate(batch.records) if i not in reasons]
        return PreparedBatch(batch, kept, self.tables, [(batch.records[i], reason) for i, reason in self.rejected])


def _now() -> datetime:
    return datetime.now(UTC)


def record_time(record: ConsumedRecord) -> datetime:
    """The record's Kafka timestamp (now when it has none)."""
    if record.timestamp_ms and record.timestamp_ms > 0:
        return datetime.fromtimestamp(record.timestamp_ms / 1000, UTC)
    return _now()


class BatchPreparer:
    """Decodes and pivots batches; holds only the TTLs of the tables."""

    def __init__(self, ttl: TtlDays | None = None, now: Callable[[], datetime] | None = None) -> None:
        self.now = now or _now
        ttl = ttl or TtlDays()
        self.ttl_by_table: dict[str, tuple[str, int]] = {
            table: (expr.removeprefix("toDateTime(").removesuffix(")"), getattr(ttl, kind))
            for table, (expr, kind) in TTL_TABLES.items()
        }
        """table -> (column its TTL counts from, days)"""

    def decode(self, record: ConsumedRecord) -> tuple[Decoded | None, str | None]:
        """The message of one record, or the reason it goes to the dead-letter topic."""
        spec = spec_for_name(record.topic)
        if record.value is None:
            if spec in (K8S_PODS, K8S_NODES):
                key = (record.key or b"").decode(errors="replace")
                return Tombstone.of_record_key(spec.suffix, key, record_time(record)), None
            return None, "empty value (tombstone) on a topic that has no tombstones"
        try:
            if spec.message in PLAIN_TYPES:
                return Plain(spec.message, decode_plain(record.value, spec.message)), None
            return decode(record.value, spec.message), None
        except MessageError as exc:
            return None, f"invalid {spec.suffix} message: {exc}"

    def prepare(self, batch: Batch, now: datetime | None = None) -> PreparedBatch:
        return self.prepare_parts(batch, now).assemble(batch)

    def prepare_parts(self, batch: Batch, now: datetime | None = None) -> PreparedParts:
        """Decode and pivot a batch, leaving out what cannot be stored (``now``: the clock the TTLs
        are checked against, the preparer's own by default)."""
        rejected: list[tuple[int, str]] = []
        decoded: list[tuple[int, Decoded]] = []
        records = batch.records
        for i, record in enumerate(records):
            message, reason = self.decode(record)
            if reason is not None:
                rejected.append((i, reason))
            elif message is not None:
                decoded.append((i, message))
        tables = tables_for([(message, records[i].partition, records[i].offset) for i, message in decoded])
        now = now or self.now()
        if self._any_expired(tables, now):
            # rare: find the records concerned and leave them out of this batch's blocks
            fresh: list[tuple[int, Decoded]] = []
            for i, message in decoded:
                reason = self.expired(rows_for(message, records[i].partition, records[i].offset), now)
                if reason is not None:
                    rejected.append((i, reason))
                else:
                    fresh.append((i, message))
            rejected.sort()
            decoded = fresh
            tables = tables_for([(message, records[i].partition, records[i].offset) for i, message in decoded])
        return PreparedParts(tables, rejected)

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
