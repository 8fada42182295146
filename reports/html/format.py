"""Formatting for the HTML report: figures with their units (GiB, hours, USD, percent), times,
escaping, and the report's palette and layout constants."""

from __future__ import annotations

import html
import math
from datetime import UTC, datetime
from typing import Any

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#86bcb6")
OTHER_COLOR = "#a0a4a8"
STATE_COLORS = {"busy": "#59a14f", "idle allocated": "#f28e2b", "unallocated": "#c9ced4"}
IDLE_CLASS_COLORS = {"no_process": "#e15759", "vram_held": "#f28e2b", "partly_idle": "#edc948"}
IDLE_CLASS_LABELS = {"no_process": "no process (GPU held, nothing runs)",
                     "vram_held": "VRAM held, no compute", "partly_idle": "partly idle windows"}
PENDING_BUCKETS = ("< 1m", "1-5m", "5-15m", "15-60m", ">= 1h")
MAX_TEAM_SERIES = 8
LONG_TABLE_ROWS = 12

WIDTH = 960
DASH = "\u2013"
"""Shown for a value the data does not have (never a made-up zero)."""
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, 'Liberation Sans', sans-serif"


# --------------------------------------------------------------------------- formatting


def esc(value: object) -> str:
    """Text or attribute value, HTML-escaped (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def as_number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def fmt_number(value: object, digits: int = 2) -> str:
    number = as_number(value)
    if number is None:
        return DASH
    if number == int(number) and abs(number) < 1e15 and digits <= 2:
        return f"{int(number):,}"
    return f"{number:,.{digits}f}"


def fmt_hours(value: object) -> str:
    number = as_number(value)
    return DASH if number is None else f"{number:,.2f}"


def fmt_usd(value: object) -> str:
    number = as_number(value)
    return DASH if number is None else f"${number:,.2f}"


def fmt_pct(value: object) -> str:
    number = as_number(value)
    return DASH if number is None else f"{number:.1f} %"


def fmt_share(value: object) -> str:
    number = as_number(value)
    return DASH if number is None else f"{number * 100:.1f} %"


def fmt_gib(value: object) -> str:
    number = as_number(value)
    return DASH if number is None else f"{number / 2**30:,.1f} GiB"


def fmt_duration(value: object) -> str:
    number = as_number(value)
    if number is None:
        return DASH
    seconds = round(number)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s" if seconds else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def parse_ts(value: object) -> float | None:
    """Epoch seconds of an ISO 8601 UTC timestamp (as the store returns them), or None."""
    if not value or not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def fmt_ts(value: object) -> str:
    epoch = parse_ts(value)
    if epoch is None:
        return DASH
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S").removesuffix(":00")


def svg_number(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text

