"""Building blocks of the sink's ClickHouse DDL: TTLs and table settings.

Why a module of its own: the migrations (:mod:`sinks.migrations`), the sink's batch writer and the
replay share them; the column types and codecs are the column spec's (:mod:`sinks.tables`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from common.settings import SinkSettings

DEDUP_WINDOW = 10_000
"""Insert blocks remembered per table for deduplication (a few per partition are ever retried)."""

DATETIME_MAX = datetime(2106, 2, 7, 6, 28, 15, tzinfo=UTC)
"""The last second ClickHouse's ``DateTime`` holds. The tables' TTLs are counted in it
(``toDateTime(ts) + INTERVAL n DAY``, the rollups' ``hour``): a sum past it wraps to the 1970s and
the engine drops the row as expired, so the sink stores no row whose TTL would end after it, and a
TTL that reaches past it from today is refused at start."""


@dataclass(frozen=True)
class TtlDays:
    raw: int = 14
    """gpu_samples, gpu_processes (the big raw series)."""
    state: int = 400
    """pods, nodes, events, progress, windows, capacity, lifecycle, alerts, xids."""
    rollup: int = 730
    """hourly and daily rollups."""

    @classmethod
    def keeping(cls, earliest: datetime, now: datetime | None = None) -> TtlDays:
        """TTLs that keep data dated from ``earliest`` (a past-dated replay) a default period longer."""
        age_days = max(0, ((now or datetime.now(UTC)) - earliest).days + 1)
        default = cls()
        return cls(raw=default.raw + age_days, state=default.state + age_days, rollup=default.rollup + age_days)

    @classmethod
    def from_settings(cls, settings: SinkSettings) -> TtlDays:
        return cls(raw=settings.raw_sample_ttl_days, state=settings.state_ttl_days, rollup=settings.rollup_ttl_days)

    def beyond_datetime(self, now: datetime | None = None) -> str | None:
        """Why these TTLs cannot be kept (None when they can): one that ends after
        :data:`DATETIME_MAX` for a row dated ``now`` would wrap, and every row would be dropped."""
        now = now or datetime.now(UTC)
        room = (DATETIME_MAX - now).days - 1
        for kind, variable in (("raw", "RAW_SAMPLE"), ("state", "STATE"), ("rollup", "ROLLUP")):
            days = getattr(self, kind)
            if days > room:
                return (f"GPULENS_{variable}_TTL_DAYS={days} reaches past {DATETIME_MAX.isoformat()}, the last "
                        f"second of ClickHouse's DateTime in which the tables' TTLs are counted: at most {room} "
                        "days from today")
        return None


def dedup_settings() -> str:
    return f"SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
