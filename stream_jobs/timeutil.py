"""Event time as float epoch seconds inside the stages (cheap to compare, JSON-native state)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

EPS = 1e-6


def epoch(ts: datetime) -> float:
    return ts.timestamp()


def from_epoch(value: float) -> datetime:
    return datetime.fromtimestamp(round(value, 6), UTC)


def iso(value: float) -> str:
    return from_epoch(value).isoformat().replace("+00:00", "Z")


def elapsed(now: float, since: float, duration: float) -> bool:
    """The timing rule: true at the first tick ``now`` with ``now - since >= duration``."""
    return now - since >= duration - EPS


def stable_id(*parts: object) -> str:
    text = "|".join("" if p is None else str(p) for p in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def window_start(ts: float, window_s: float) -> float:
    return (ts // window_s) * window_s


def fmt_duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60}m"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds >= 60:
        return f"{seconds / 60:.1f}m"
    return f"{seconds}s"
