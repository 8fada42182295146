"""``gpulens report --html FILE``: one self-contained HTML page with the fleet's figures as charts.

Team leads and finance open the report in a browser, mail it, or archive it; it must therefore
need nothing else — no JavaScript, no CDN, no web fonts. The charts are inline SVG generated here
from the same plain rows as ``gpulens report`` (``sinks.analyses``) plus the time series of
``sinks.timeseries``, every chart has axis labels with units, a legend and the table of its
figures underneath, and an empty section says so instead of drawing an empty frame.

:func:`render_html` is pure (data in, HTML out) and deterministic — the same rows give the same
bytes, so reports can be diffed and tested. Every string that comes from the cluster (pod, team,
namespace names, scheduler messages) is escaped. :func:`collect_report_data` runs the queries;
:func:`write_html_report` does both and writes the file.

Data marks in the SVG carry ``class="mark"`` and ``data-series``/``data-label``/``data-value``
attributes and a ``<title>`` tooltip, so a browser test (and a curious reader) can find them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.settings import AdviseThresholds
from gpulens.html_fragmentation import fragmentation_section
from schemas.messages import DEFAULT_CLUSTER
from sinks import timeseries
from sinks.advise import advice_rows, advise, pack_text
from sinks.analyses import ANALYSES, Reader, run_report, scoped
from sinks.fragmentation_series import fragmentation_over_time

Rows = list[dict[str, Any]]

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


def esc(value: Any) -> str:
    """Text or attribute value, HTML-escaped (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def fmt_number(value: Any, digits: int = 2) -> str:
    number = _num(value)
    if number is None:
        return DASH
    if number == int(number) and abs(number) < 1e15 and digits <= 2:
        return f"{int(number):,}"
    return f"{number:,.{digits}f}"


def fmt_hours(value: Any) -> str:
    number = _num(value)
    return DASH if number is None else f"{number:,.2f}"


def fmt_usd(value: Any) -> str:
    number = _num(value)
    return DASH if number is None else f"${number:,.2f}"


def fmt_pct(value: Any) -> str:
    number = _num(value)
    return DASH if number is None else f"{number:.1f} %"


def fmt_share(value: Any) -> str:
    number = _num(value)
    return DASH if number is None else f"{number * 100:.1f} %"


def fmt_gib(value: Any) -> str:
    number = _num(value)
    return DASH if number is None else f"{number / 2**30:,.1f} GiB"


def fmt_duration(value: Any) -> str:
    number = _num(value)
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


def parse_ts(value: Any) -> float | None:
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


def fmt_ts(value: Any) -> str:
    epoch = parse_ts(value)
    if epoch is None:
        return DASH
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S").removesuffix(":00")


def _svg_num(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


# --------------------------------------------------------------------------- scales and ticks


def nice_ticks(high: float, count: int = 5, integer: bool = False) -> list[float]:
    """0 .. a round number >= ``high`` in ``count``-ish round steps (whole steps for counts of things)."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = next(m * magnitude for m in steps if m * magnitude >= raw)
    if integer:
        step = max(step, 1.0)
    top = math.ceil(high / step - 1e-9) * step
    return [round(i * step, 10) for i in range(round(top / step) + 1)]


TIME_STEPS_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 2 * 86400, 7 * 86400)


def time_ticks(start: float, end: float, max_ticks: int = 8) -> list[float]:
    span = max(end - start, 1.0)
    step = next((s for s in TIME_STEPS_S if span / s <= max_ticks), TIME_STEPS_S[-1])
    first = math.ceil(start / step) * step
    return [float(t) for t in range(int(first), int(end) + 1, step)]


def fmt_tick_time(epoch: float, span_s: float) -> str:
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%H:%M") if span_s <= 86400 else moment.strftime("%m-%d %H:%M")


def fmt_tick_value(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


@dataclass
class Frame:
    """Plot area inside the SVG and the axes' scales."""

    height: int
    left: int = 64
    right: int = 24
    top: int = 16
    bottom: int = 52
    x_min: float = 0.0
    x_max: float = 1.0
    y_min: float = 0.0
    y_max: float = 1.0

    @property
    def plot_w(self) -> float:
        return WIDTH - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom

    def x(self, value: float) -> float:
        span = (self.x_max - self.x_min) or 1.0
        return self.left + (value - self.x_min) / span * self.plot_w

    def y(self, value: float) -> float:
        span = (self.y_max - self.y_min) or 1.0
        return self.top + self.plot_h - (value - self.y_min) / span * self.plot_h


def _svg_open(chart: str, frame: Frame, title: str) -> str:
    return (f'<svg class="chart" data-chart="{esc(chart)}" role="img" aria-label="{esc(title)}" '
            f'viewBox="0 0 {WIDTH} {frame.height}" width="{WIDTH}" height="{frame.height}" '
            f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>')


def _y_axis(frame: Frame, ticks: Sequence[float], label: str) -> list[str]:
    parts = []
    for tick in ticks:
        y = _svg_num(frame.y(tick))
        parts.append(f'<line class="grid" x1="{frame.left}" x2="{_svg_num(frame.left + frame.plot_w)}" '
                     f'y1="{y}" y2="{y}"/>')
        parts.append(f'<text class="tick" x="{frame.left - 8}" y="{y}" text-anchor="end" '
                     f'dominant-baseline="middle">{esc(fmt_tick_value(tick))}</text>')
    mid = _svg_num(frame.top + frame.plot_h / 2)
    parts.append(f'<text class="axis-label" x="16" y="{mid}" text-anchor="middle" '
                 f'transform="rotate(-90 16 {mid})">{esc(label)}</text>')
    return parts


def _x_time_axis(frame: Frame, label: str) -> list[str]:
    base = _svg_num(frame.top + frame.plot_h)
    parts = [f'<line class="axis" x1="{frame.left}" x2="{_svg_num(frame.left + frame.plot_w)}" '
             f'y1="{base}" y2="{base}"/>']
    span = frame.x_max - frame.x_min
    for tick in time_ticks(frame.x_min, frame.x_max):
        x = _svg_num(frame.x(tick))
        tick_end = _svg_num(frame.top + frame.plot_h + 5)
        parts.append(f'<line class="axis" x1="{x}" x2="{x}" y1="{base}" y2="{tick_end}"/>')
        parts.append(f'<text class="tick" x="{x}" y="{_svg_num(frame.top + frame.plot_h + 18)}" '
                     f'text-anchor="middle">{esc(fmt_tick_time(tick, span))}</text>')
    parts.append(f'<text class="axis-label" x="{_svg_num(frame.left + frame.plot_w / 2)}" '
                 f'y="{frame.height - 8}" text-anchor="middle">{esc(label)}</text>')
    return parts


# --------------------------------------------------------------------------- charts


@dataclass
class Series:
    name: str
    color: str
    points: list[tuple[float, float | None]] = field(default_factory=list)
    dashed: bool = False
    unit: str = ""


def line_chart(chart: str, title: str, series: Sequence[Series], y_label: str, x_range: tuple[float, float],
               y_max: float | None = None, height: int = 320, integer: bool = False) -> str:
    """Lines over time; a ``None`` value breaks the line (missing data is not zero)."""
    values = [v for s in series for _, v in s.points if v is not None]
    ticks = nice_ticks(y_max if y_max is not None else max(values, default=0.0), integer=integer)
    frame = Frame(height, x_min=x_range[0], x_max=x_range[1], y_max=ticks[-1])
    parts = [_svg_open(chart, frame, title), *_y_axis(frame, ticks, y_label), *_x_time_axis(frame, "time (UTC)")]
    for s in series:
        segments: list[list[str]] = [[]]
        for x, v in s.points:
            if v is None:
                segments.append([])
            else:
                segments[-1].append(f"{_svg_num(frame.x(x))},{_svg_num(frame.y(v))}")
        d = " ".join("M" + " L".join(seg) for seg in segments if seg)
        if d:
            dash = ' stroke-dasharray="6 4"' if s.dashed else ""
            parts.append(f'<path class="mark line" data-series="{esc(s.name)}" d="{d}" fill="none" '
                         f'stroke="{s.color}" stroke-width="2.25" stroke-linejoin="round"{dash}>'
                         f'<title>{esc(s.name)}</title></path>')
        if len(s.points) <= 90:
            for x, v in s.points:
                if v is None:
                    continue
                when = datetime.fromtimestamp(x, UTC).strftime("%Y-%m-%d %H:%M")
                parts.append(f'<circle class="mark point" data-series="{esc(s.name)}" data-value="{v:g}" '
                             f'cx="{_svg_num(frame.x(x))}" cy="{_svg_num(frame.y(v))}" r="2.6" fill="{s.color}">'
                             f'<title>{esc(s.name)} at {esc(when)} UTC: {esc(fmt_tick_value(round(v, 2)))}'
                             f'{esc(s.unit)}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def stacked_time_columns(chart: str, title: str, buckets: Sequence[float], bucket_s: float,
                         layers: Sequence[tuple[str, str, Sequence[float]]], y_label: str, unit: str,
                         height: int = 320) -> str:
    """One stacked column per time bucket; ``layers`` are (name, colour, value per bucket), bottom first."""
    totals = [sum(layer[2][i] for layer in layers) for i in range(len(buckets))]
    ticks = nice_ticks(max(totals, default=0.0), integer=True)
    frame = Frame(height, x_min=buckets[0], x_max=buckets[-1] + bucket_s, y_max=ticks[-1])
    parts = [_svg_open(chart, frame, title), *_y_axis(frame, ticks, y_label), *_x_time_axis(frame, "time (UTC)")]
    width = max(frame.plot_w / len(buckets) - 1.0, 1.0)
    for i, start in enumerate(buckets):
        base = 0.0
        when = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M")
        for name, color, values in layers:
            value = values[i]
            if value <= 0:
                continue
            y_top, y_bottom = frame.y(base + value), frame.y(base)
            parts.append(f'<rect class="mark bar" data-series="{esc(name)}" data-value="{value:g}" '
                         f'x="{_svg_num(frame.x(start) + 0.5)}" y="{_svg_num(y_top)}" width="{_svg_num(width)}" '
                         f'height="{_svg_num(max(y_bottom - y_top, 0.5))}" fill="{color}">'
                         f'<title>{esc(when)} UTC · {esc(name)}: {esc(fmt_tick_value(round(value, 2)))}{esc(unit)}'
                         f'</title></rect>')
            base += value
    parts.append("</svg>")
    return "".join(parts)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def hbar_chart(chart: str, title: str, categories: Sequence[str],
               segments: Sequence[tuple[str, str]], values: dict[tuple[str, str], float],
               x_label: str, unit: str, value_format: Callable[[Any], str] = fmt_hours,
               label_width: int = 220) -> str:
    """Horizontal (stacked) bars: one bar per category, one segment per (name, colour)."""
    row_h = 30
    totals = [sum(values.get((c, s), 0.0) for s, _ in segments) for c in categories]
    ticks = nice_ticks(max(totals, default=0.0))
    height = 16 + row_h * len(categories) + 52
    frame = Frame(height, left=label_width, right=96, x_max=ticks[-1])
    parts = [_svg_open(chart, frame, title)]
    base_y = frame.top + frame.plot_h
    for tick in ticks:
        x = _svg_num(frame.x(tick))
        parts.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{frame.top}" y2="{_svg_num(base_y)}"/>')
        parts.append(f'<text class="tick" x="{x}" y="{_svg_num(base_y + 18)}" text-anchor="middle">'
                     f'{esc(fmt_tick_value(tick))}</text>')
    parts.append(f'<text class="axis-label" x="{_svg_num(frame.left + frame.plot_w / 2)}" y="{height - 8}" '
                 f'text-anchor="middle">{esc(x_label)}</text>')
    for row, category in enumerate(categories):
        y = frame.top + row * row_h + 5
        parts.append(f'<text class="category" x="{label_width - 10}" y="{_svg_num(y + (row_h - 10) / 2)}" '
                     f'text-anchor="end" dominant-baseline="middle"><title>{esc(category)}</title>'
                     f'{esc(_truncate(category, label_width // 7))}</text>')
        start = 0.0
        for name, color in segments:
            value = values.get((category, name), 0.0)
            if value <= 0:
                continue
            x0, x1 = frame.x(start), frame.x(start + value)
            parts.append(f'<rect class="mark bar" data-series="{esc(name)}" data-label="{esc(category)}" '
                         f'data-value="{value:g}" x="{_svg_num(x0)}" y="{_svg_num(y)}" '
                         f'width="{_svg_num(max(x1 - x0, 1.0))}" height="{row_h - 10}" fill="{color}">'
                         f'<title>{esc(category)} · {esc(name)}: {esc(value_format(value))}{esc(unit)}</title></rect>')
            start += value
        parts.append(f'<text class="value" x="{_svg_num(frame.x(start) + 6)}" y="{_svg_num(y + (row_h - 10) / 2)}" '
                     f'dominant-baseline="middle">{esc(value_format(start))}{esc(unit)}</text>')
    parts.append(f'<line class="axis" x1="{frame.left}" x2="{frame.left}" y1="{frame.top}" y2="{_svg_num(base_y)}"/>')
    parts.append("</svg>")
    return "".join(parts)


def column_chart(chart: str, title: str, categories: Sequence[str], values: Sequence[float], color: str,
                 x_label: str, y_label: str, series: str, height: int = 300) -> str:
    """Vertical bars, one per category (e.g. a histogram's buckets of counts)."""
    ticks = nice_ticks(max(values, default=0.0), integer=True)
    frame = Frame(height, y_max=ticks[-1])
    parts = [_svg_open(chart, frame, title), *_y_axis(frame, ticks, y_label)]
    slot = frame.plot_w / max(len(categories), 1)
    base = frame.top + frame.plot_h
    parts.append(f'<line class="axis" x1="{frame.left}" x2="{_svg_num(frame.left + frame.plot_w)}" '
                 f'y1="{_svg_num(base)}" y2="{_svg_num(base)}"/>')
    for i, (category, value) in enumerate(zip(categories, values, strict=True)):
        cx = frame.left + slot * (i + 0.5)
        if value > 0:
            top = frame.y(value)
            parts.append(f'<rect class="mark bar" data-series="{esc(series)}" data-label="{esc(category)}" '
                         f'data-value="{value:g}" x="{_svg_num(cx - slot * 0.3)}" y="{_svg_num(top)}" '
                         f'width="{_svg_num(slot * 0.6)}" height="{_svg_num(base - top)}" fill="{color}">'
                         f'<title>{esc(category)}: {esc(fmt_tick_value(value))} {esc(series)}</title></rect>')
            parts.append(f'<text class="value" x="{_svg_num(cx)}" y="{_svg_num(top - 6)}" text-anchor="middle">'
                         f'{esc(fmt_tick_value(value))}</text>')
        parts.append(f'<text class="tick" x="{_svg_num(cx)}" y="{_svg_num(base + 18)}" text-anchor="middle">'
                     f'{esc(category)}</text>')
    parts.append(f'<text class="axis-label" x="{_svg_num(frame.left + frame.plot_w / 2)}" y="{height - 8}" '
                 f'text-anchor="middle">{esc(x_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


@dataclass
class GanttRow:
    label: str
    spans: list[tuple[float, float, str]]
    """(start, end, phase) with phase in GANTT_COLORS."""
    note: str = ""
    open_ended: bool = False


GANTT_COLORS = {"pending": "#e15759", "running": "#4e79a7"}


def gantt_chart(chart: str, title: str, rows: Sequence[GanttRow], x_range: tuple[float, float],
                label_width: int = 240) -> str:
    """One row per pod: when it waited (pending) and when it held GPUs (running)."""
    row_h = 28
    height = 16 + row_h * len(rows) + 52
    frame = Frame(height, left=label_width, right=110, x_min=x_range[0], x_max=x_range[1])
    parts = [_svg_open(chart, frame, title)]
    base = frame.top + frame.plot_h
    span = frame.x_max - frame.x_min
    for tick in time_ticks(frame.x_min, frame.x_max):
        x = _svg_num(frame.x(tick))
        parts.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{frame.top}" y2="{_svg_num(base)}"/>')
        parts.append(f'<text class="tick" x="{x}" y="{_svg_num(base + 18)}" text-anchor="middle">'
                     f'{esc(fmt_tick_time(tick, span))}</text>')
    parts.append(f'<text class="axis-label" x="{_svg_num(frame.left + frame.plot_w / 2)}" y="{height - 8}" '
                 f'text-anchor="middle">time (UTC)</text>')
    for i, row in enumerate(rows):
        y = frame.top + i * row_h + 5
        mid = _svg_num(y + (row_h - 10) / 2)
        parts.append(f'<text class="category" x="{label_width - 10}" y="{mid}" text-anchor="end" '
                     f'dominant-baseline="middle"><title>{esc(row.label)}</title>'
                     f'{esc(_truncate(row.label, 36))}</text>')
        last_x = float(frame.left)
        for start, end, phase in row.spans:
            x0, x1 = frame.x(start), frame.x(max(end, start))
            parts.append(f'<rect class="mark span" data-series="{esc(phase)}" data-label="{esc(row.label)}" '
                         f'data-value="{end - start:g}" x="{_svg_num(x0)}" y="{_svg_num(y)}" '
                         f'width="{_svg_num(max(x1 - x0, 2.0))}" height="{row_h - 10}" rx="3" '
                         f'fill="{GANTT_COLORS[phase]}"><title>{esc(row.label)} · {esc(phase)} '
                         f'{esc(fmt_duration(end - start))}</title></rect>')
            last_x = max(last_x, x1)
        if row.note:
            parts.append(f'<text class="value" x="{_svg_num(last_x + 6)}" y="{mid}" dominant-baseline="middle">'
                         f'{esc(row.note)}</text>')
    parts.append("</svg>")
    return "".join(parts)


# --------------------------------------------------------------------------- page pieces


def legend(items: Iterable[tuple[str, str]], dashed: Iterable[str] = ()) -> str:
    dashed_names = set(dashed)
    entries = []
    for name, color in items:
        kind = " dashed" if name in dashed_names else ""
        entries.append(f'<li><span class="swatch{kind}" style="background:{color}"></span>{esc(name)}</li>')
    return f'<ul class="legend">{"".join(entries)}</ul>'


Column = tuple[str, str, Callable[[Any], str]]
"""(row key, header, cell formatter)."""


def _text(value: Any) -> str:
    if value is None or value == "":
        return DASH
    if isinstance(value, list):
        return "; ".join(str(v) for v in value) or DASH
    return str(value)


def _wrap(value: Any) -> str:
    """Like :func:`_text`, for long free text that may wrap in a table cell."""
    return _text(value)


def table(columns: Sequence[Column], rows: Rows, caption: str) -> str:
    classes = {key: "num" if fmt not in (_text, _wrap) else "wrap" if fmt is _wrap else "" for key, _, fmt in columns}

    def attr(key: str) -> str:
        return f' class="{classes[key]}"' if classes[key] else ""

    head = "".join(f'<th scope="col"{attr(key)}>{esc(header)}</th>' for key, header, _ in columns)
    body = []
    for row in rows:
        cells = "".join(f'<td{attr(key)}>{esc(fmt(row.get(key)))}</td>' for key, _, fmt in columns)
        team = row.get("team", row.get("team_label"))
        body.append(f'<tr data-team="{esc(team)}">{cells}</tr>' if team is not None else f"<tr>{cells}</tr>")
    markup = (f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
    if len(rows) > LONG_TABLE_ROWS:
        return (f'<details class="table"><summary>{esc(caption or "Table")} ({len(rows)} rows)</summary>'
                f'<div class="scroll">{markup}</div></details>')
    heading = f'<div class="caption">{esc(caption)}</div>' if caption else ""
    return f'<div class="table">{heading}<div class="scroll">{markup}</div></div>'


def no_data(message: str) -> str:
    return f'<p class="no-data" role="note">No data: {esc(message)}</p>'


def section(anchor: str, title: str, lede: str, body: str) -> str:
    return (f'<section class="card" id="{esc(anchor)}"><h2>{esc(title)}</h2>'
            f'<p class="lede">{esc(lede)}</p>{body}</section>')


def team_colors(data: dict[str, Any]) -> dict[str, str]:
    """A stable colour per team: biggest GPU consumer first, then by name; the same in every chart."""
    hours: dict[str, float] = {}
    for key in ("top_teams", "cost_by_team", "idle_by_team_and_class"):
        for row in data.get(key) or []:
            team = str(row.get("team"))
            hours[team] = hours.get(team, 0.0) + (_num(row.get("gpu_hours")) or 0.0)
    for row in data.get("utilisation_by_team") or []:
        hours.setdefault(str(row.get("team_label")), 0.0)
    ordered = sorted(hours, key=lambda t: (-hours[t], t))
    return {team: PALETTE[i % len(PALETTE)] for i, team in enumerate(ordered)}


def css_string(value: str) -> str:
    """``value`` as a quoted CSS string: anything but letters, digits, '-' and '_' hex-escaped, so a
    team name can neither end the string nor the <style> element."""
    return '"' + "".join(c if (c.isalnum() and c.isascii()) or c in "-_" else f"\\{ord(c):x} " for c in value) + '"'


TEAM_CHARTS = (("utilisation", "data-series"), ("idle", "data-label"), ("cost", "data-label"))
"""Charts whose marks each belong to one team, and the attribute that names it."""


def team_filter(teams: Sequence[str]) -> tuple[str, str]:
    """A team filter without scripts: ``report.html#team-N`` (a link per team in the header) hides
    every table row, and the marks of the per-team charts, of the other teams. Returns the anchors
    (to place before ``main``) and the CSS rules."""
    anchors = "".join(f'<span class="team-anchor" id="team-{i}"></span>' for i in range(len(teams)))
    rules = []
    for i, team in enumerate(teams):
        name = css_string(team)
        hide = [f"#team-{i}:target ~ main tr[data-team]:not([data-team={name}])"]
        hide += [f"#team-{i}:target ~ main #{chart} .mark:not([{attribute}={name}])"
                 for chart, attribute in TEAM_CHARTS]
        rules.append(",".join(hide) + "{display:none}")
        rules.append(f"#team-{i}:target ~ header a[href=\"#team-{i}\"]{{background:#fff;color:#1f2d3d}}")
    return anchors, "\n".join(rules)


def _team_links(teams: Sequence[str]) -> str:
    if not teams:
        return ""
    links = "".join(f'<a href="#team-{i}">{esc(team)}</a>' for i, team in enumerate(teams))
    return f'<div class="teams">Team: <a href="#">all</a>{links}</div>'


# --------------------------------------------------------------------------- sections


def _summary_section(data: dict[str, Any]) -> str:
    rows = data.get("summary") or []
    s = rows[0] if rows else {}
    if not s or not (_num(s.get("windows")) or _num(s.get("gpu_hours_capacity"))):
        return section("summary", "Fleet summary", "Totals over the whole period in the store.",
                       no_data("the store has no pod windows or capacity windows yet — run the sink "
                               "(`gpulens sink`) or `gpulens demo` first."))
    capacity = _num(s.get("gpu_hours_capacity")) or 0.0
    allocated = _num(s.get("gpu_hours_allocated")) or 0.0
    idle = _num(s.get("gpu_hours_idle")) or 0.0
    idle_cost = sum(_num(r.get("idle_window_cost_usd")) or 0.0 for r in data.get("cost_by_team") or [])
    alerts = data.get("alerts_by_type") or []

    def share(part: float, whole: float) -> str:
        return f"{part / whole * 100:.1f} % of {'capacity' if whole == capacity else 'allocated'}" if whole else ""

    cards = [
        ("GPU capacity", f"{fmt_hours(capacity)} GPU-h", "GPU-hours the fleet offered"),
        ("Allocated", f"{fmt_hours(allocated)} GPU-h", share(allocated, capacity)),
        ("Busy", f"{fmt_hours(s.get('gpu_hours_busy'))} GPU-h",
         share(_num(s.get("gpu_hours_busy")) or 0.0, allocated)),
        ("Idle while allocated", f"{fmt_hours(idle)} GPU-h", share(idle, allocated)),
        ("Unallocated", f"{fmt_hours(s.get('gpu_hours_unallocated'))} GPU-h",
         share(_num(s.get("gpu_hours_unallocated")) or 0.0, capacity)),
        ("Cost", fmt_usd(s.get("window_cost_usd")), f"of which idle {fmt_usd(idle_cost)}"),
        ("Peak stranded GPUs", fmt_number(s.get("max_stranded_gpus")), "free but unusable (fragmented)"),
        ("Peak pending demand", f"{fmt_number(s.get('max_pending_gpu_demand'))} GPUs", "requested by waiting pods"),
        ("GPU pods", fmt_number(max(_num(s.get("pods_ended")) or 0, _num(s.get("pods")) or 0)),
         f"{fmt_number(s.get('pods'))} held GPUs in this period"),
        ("Alerts fired", fmt_number(sum(_num(r.get("alerts")) or 0 for r in alerts)),
         f"{fmt_number(sum(_num(r.get('still_firing')) or 0 for r in alerts))} still firing"),
    ]
    markup = "".join(f'<div class="kpi" data-kpi="{esc(label)}"><div class="kpi-label">{esc(label)}</div>'
                     f'<div class="kpi-value">{esc(value)}</div><div class="kpi-note">{esc(note)}</div></div>'
                     for label, value, note in cards)
    lede = (f"Data from {fmt_ts(s.get('first_window'))} to {fmt_ts(s.get('last_window'))} UTC. GPU-hours come "
            f"from the per-pod windows; capacity, unallocated and stranded GPUs from the cluster capacity windows. "
            f"Money is USD as priced by the stream jobs.")
    return section("summary", "Fleet summary", lede, f'<div class="kpis">{markup}</div>')


def _bucket_label(bucket_s: int) -> str:
    return fmt_duration(bucket_s).replace("m", " min").replace("h 00 min", " h") if bucket_s < 86400 else \
        fmt_duration(bucket_s)


def _utilisation_section(data: dict[str, Any], colors: dict[str, str], bucket_s: int) -> str:
    rows = data.get("utilisation_by_team") or []
    title = "GPU utilisation by team over time"
    lede = (f"Average SM utilisation of the GPUs each team held, weighted by allocated time, per "
            f"{_bucket_label(bucket_s)} bucket. A gap in the line is missing data, not idle time.")
    if not rows:
        return section("utilisation", title, lede, no_data("no pod windows in the store."))
    totals: dict[str, float] = {}
    for row in rows:
        team = str(row["team_label"])
        totals[team] = totals.get(team, 0.0) + (_num(row.get("gpus_allocated")) or 0.0)
    ranked = sorted(totals, key=lambda t: (-totals[t], t))
    shown = ranked if len(ranked) <= MAX_TEAM_SERIES + 1 else ranked[:MAX_TEAM_SERIES]
    other = "other teams"
    buckets = sorted({parse_ts(r["bucket"]) or 0.0 for r in rows})
    acc: dict[tuple[str, float], list[float]] = {}
    for row in rows:
        team = str(row["team_label"])
        name = team if team in shown else other
        at = parse_ts(row["bucket"]) or 0.0
        weight = _num(row.get("gpus_allocated")) or 0.0
        util = _num(row.get("avg_sm_util_pct"))
        slot = acc.setdefault((name, at), [0.0, 0.0, 0.0])
        slot[2] += weight
        if util is not None:
            slot[0] += util * weight
            slot[1] += weight
    names = shown + ([other] if any(t not in shown for t in ranked) else [])
    half = bucket_s / 2
    series = []
    for name in names:
        points: list[tuple[float, float | None]] = []
        for at in buckets:
            found = acc.get((name, at))
            points.append((at + half, found[0] / found[1] if found and found[1] > 0 else None))
        series.append(Series(name, colors.get(name, OTHER_COLOR), points, unit=" %"))
    chart = line_chart("utilisation", title, series, "SM utilisation (%)",
                       (buckets[0], buckets[-1] + bucket_s), y_max=100.0)
    columns: list[Column] = [("bucket", "bucket start (UTC)", fmt_ts), ("team_label", "team", _text),
                             ("covered_s", "covers", fmt_duration),
                             ("gpus_allocated", "GPUs allocated (avg)", fmt_hours),
                             ("gpus_busy", "GPUs busy (avg)", fmt_hours), ("gpus_idle", "GPUs idle (avg)", fmt_hours),
                             ("avg_sm_util_pct", "SM utilisation", fmt_pct), ("cost_usd", "cost", fmt_usd)]
    body = (legend((s.name, s.color) for s in series) + chart
            + table(columns, rows, "Utilisation per team and bucket"))
    return section("utilisation", title, lede, body)


def _fleet_states_section(data: dict[str, Any], bucket_s: int) -> str:
    rows = data.get("capacity_over_time") or []
    title = "Fleet GPUs by state over time"
    lede = (f"Time-averaged GPUs per {_bucket_label(bucket_s)} bucket: busy, allocated but idle "
            f"(below the idle threshold), and not allocated to any pod. A bucket the data covers only in part "
            f"(see 'covers') is averaged over that part.")
    if not rows:
        return section("fleet-states", title, lede, no_data("no cluster capacity windows in the store."))
    buckets = [parse_ts(r["bucket"]) or 0.0 for r in rows]
    busy = [_num(r.get("gpus_busy")) or 0.0 for r in rows]
    idle = [_num(r.get("gpus_idle_allocated")) or 0.0 for r in rows]
    free = [_num(r.get("gpus_free")) or 0.0 for r in rows]
    layers = [("busy", STATE_COLORS["busy"], busy), ("idle allocated", STATE_COLORS["idle allocated"], idle),
              ("unallocated", STATE_COLORS["unallocated"], free)]
    chart = stacked_time_columns("fleet-states", title, buckets, bucket_s, layers, "GPUs", " GPUs")
    columns: list[Column] = [("bucket", "bucket start (UTC)", fmt_ts), ("covered_s", "covers", fmt_duration),
                             ("gpus_total", "GPUs total", fmt_hours),
                             ("gpus_allocated", "allocated", fmt_hours), ("gpus_busy", "busy", fmt_hours),
                             ("gpus_idle_allocated", "idle allocated", fmt_hours),
                             ("gpus_free", "unallocated", fmt_hours)]
    body = legend((n, c) for n, c, _ in layers) + chart + table(columns, rows, "GPUs by state per bucket")
    return section("fleet-states", title, lede, body)


def _idle_section(data: dict[str, Any]) -> str:
    rows = data.get("idle_by_team_and_class") or []
    title = "Idle GPU-hours by team and idle class"
    lede = ("GPU-hours allocated to pods while their GPUs sat below the idle threshold, split by why: no process "
            "on the GPU, memory held without compute, or windows that were only partly idle. Gaps in the data "
            "are counted separately and never as idle.")
    idle_rows = [r for r in rows if (_num(r.get("idle_gpu_hours")) or 0.0) > 0]
    if not idle_rows:
        body = no_data("no allocated GPU sat idle in this period.")
        if rows:
            body += table(_idle_columns(), rows, "Idle and gap GPU-hours per team and class")
        return section("idle", title, lede, body)
    totals: dict[str, float] = {}
    values: dict[tuple[str, str], float] = {}
    for row in idle_rows:
        team, cls = str(row["team"]), str(row["idle_class"])
        hours = _num(row.get("idle_gpu_hours")) or 0.0
        totals[team] = totals.get(team, 0.0) + hours
        key = (team, IDLE_CLASS_LABELS.get(cls, cls))
        values[key] = values.get(key, 0.0) + hours
    teams = sorted(totals, key=lambda t: (-totals[t], t))
    classes = sorted({str(r["idle_class"]) for r in idle_rows},
                     key=lambda c: (list(IDLE_CLASS_COLORS).index(c) if c in IDLE_CLASS_COLORS else 99, c))
    segments = [(IDLE_CLASS_LABELS.get(c, c), IDLE_CLASS_COLORS.get(c, OTHER_COLOR)) for c in classes]
    chart = hbar_chart("idle", title, teams, segments, values, "idle GPU-hours", " GPU-h")
    return section("idle", title, lede,
                   legend(segments) + chart + table(_idle_columns(), rows, "Idle and gap GPU-hours per team and class"))


def _idle_columns() -> list[Column]:
    return [("team", "team", _text), ("idle_class", "idle class", _text),
            ("idle_gpu_hours", "idle GPU-h", fmt_hours), ("gap_gpu_hours", "gap GPU-h (no data)", fmt_hours),
            ("pods", "pods", fmt_number), ("idle_cost_usd", "idle cost", fmt_usd)]


def _pending_section(data: dict[str, Any]) -> str:
    rows = data.get("pending_distribution") or []
    title = "Pending time distribution"
    lede = ("How long GPU pods waited between creation and being scheduled, from their lifecycle records "
            "(one per pod).")
    if not rows:
        return section("pending", title, lede, no_data("no pod lifecycle records in the store."))
    by_bucket = {str(r["bucket"]): r for r in rows}
    names = list(PENDING_BUCKETS) + sorted(b for b in by_bucket if b not in PENDING_BUCKETS)
    counts = [_num(by_bucket.get(b, {}).get("pods")) or 0.0 for b in names]
    chart = column_chart("pending", title, names, counts, "#b07aa1", "time pending before scheduling",
                         "pods", "pods")
    columns: list[Column] = [("bucket", "waited", _text), ("pods", "pods", fmt_number), ("gpus", "GPUs", fmt_number),
                             ("pending_hours", "pending hours", fmt_hours),
                             ("max_pending_s", "longest wait", fmt_duration)]
    ordered = [by_bucket[b] for b in names if b in by_bucket]
    return section("pending", title, lede, chart + table(columns, ordered, "Pods per pending-time bucket"))


def _pending_reasons_section(data: dict[str, Any]) -> str:
    rows = data.get("pending_reasons") or []
    title = "Why pods waited"
    lede = ("Pending hours by the scheduler's reason recorded on each pod's lifecycle, with the number of "
            "scheduling-failure events seen for the same message.")
    columns: list[Column] = [("reason", "reason", _text), ("pods", "pods", fmt_number),
                             ("pending_hours", "pending hours", fmt_hours),
                             ("scheduler_events", "scheduler events", fmt_number)]
    with_hours = [r for r in rows if (_num(r.get("pending_hours")) or 0.0) > 0]
    if not with_hours:
        body = no_data("no pod waited for a recorded reason.")
        if rows:
            body += table(columns, rows, "Pending reasons")
        return section("pending-reasons", title, lede, body)
    reasons = [str(r["reason"]) for r in with_hours]
    values = {(str(r["reason"]), "pending hours"): _num(r.get("pending_hours")) or 0.0 for r in with_hours}
    chart = hbar_chart("pending-reasons", title, reasons, [("pending hours", "#b07aa1")], values,
                       "pending hours (pod-hours)", " h", label_width=390)
    return section("pending-reasons", title, lede, chart + table(columns, rows, "Pending reasons"))


def _stranded_section(data: dict[str, Any], bucket_s: int) -> str:
    rows = data.get("capacity_over_time") or []
    title = "Stranded GPUs over time"
    lede = (f"Per {_bucket_label(bucket_s)} bucket: GPUs that were free but could not serve any pending pod "
            f"because they were spread over nodes (peak in the bucket), beside all free GPUs and the GPUs "
            f"pending pods asked for.")
    if not rows:
        return section("stranded", title, lede, no_data("no cluster capacity windows in the store."))
    buckets = [parse_ts(r["bucket"]) or 0.0 for r in rows]
    half = bucket_s / 2

    def points(key: str) -> list[tuple[float, float | None]]:
        return [(at + half, _num(r.get(key))) for at, r in zip(buckets, rows, strict=True)]

    series = [Series("stranded GPUs (peak)", "#e15759", points("max_stranded_gpus"), unit=" GPUs"),
              Series("free GPUs (avg)", "#8c959f", points("gpus_free"), unit=" GPUs"),
              Series("pending GPU demand (peak)", "#b07aa1", points("max_pending_gpu_demand"), dashed=True,
                     unit=" GPUs"),
              Series("largest free block (min)", "#76b7b2", points("min_largest_free_block"), dashed=True,
                     unit=" GPUs")]
    chart = line_chart("stranded", title, series, "GPUs", (buckets[0], buckets[-1] + bucket_s), integer=True)
    columns: list[Column] = [("bucket", "bucket start (UTC)", fmt_ts), ("covered_s", "covers", fmt_duration),
                             ("max_stranded_gpus", "stranded GPUs (peak)", fmt_number),
                             ("avg_stranded_gpus", "stranded GPUs (avg)", fmt_hours),
                             ("gpus_free", "free GPUs (avg)", fmt_hours),
                             ("min_largest_free_block", "largest free block", fmt_number),
                             ("max_pending_gpu_demand", "pending GPU demand", fmt_number),
                             ("max_pending_pods", "pending pods", fmt_number)]
    hourly: list[Column] = [("hour", "hour (UTC)", fmt_ts), ("avg_gpus_free", "free GPUs (avg)", fmt_hours),
                            ("max_stranded_gpus", "stranded GPUs (peak)", fmt_number),
                            ("stranded_gpu_hours", "stranded GPU-h", fmt_hours),
                            ("max_pending_gpu_demand", "pending GPU demand", fmt_number)]
    body = (legend(((s.name, s.color) for s in series), dashed=[s.name for s in series if s.dashed]) + chart
            + table(columns, rows, "Stranded and free GPUs per bucket")
            + table(hourly, data.get("fragmentation_over_time") or [], "Fragmentation per hour"))
    return section("stranded", title, lede, body)


def _cost_section(data: dict[str, Any]) -> str:
    rows = data.get("cost_by_team") or []
    title = "Cost per team"
    lede = ("What each team's GPU windows cost (USD, priced by the stream jobs), split into the part spent "
            "while the GPUs were busy and the part spent while they sat idle. The table adds projects and "
            "a re-pricing at the sink's current list prices.")
    columns: list[Column] = [("team", "team", _text), ("project", "project", _text),
                             ("gpu_hours", "GPU-h", fmt_hours), ("idle_gpu_hours", "idle GPU-h", fmt_hours),
                             ("window_cost_usd", "cost", fmt_usd), ("idle_window_cost_usd", "idle cost", fmt_usd),
                             ("list_cost_usd", "cost at list price", fmt_usd)]
    if not rows:
        return section("cost", title, lede, no_data("no pod windows in the store."))
    busy: dict[str, float] = {}
    idle: dict[str, float] = {}
    for row in rows:
        team = str(row["team"])
        cost = _num(row.get("window_cost_usd")) or 0.0
        idle_cost = _num(row.get("idle_window_cost_usd")) or 0.0
        busy[team] = busy.get(team, 0.0) + max(cost - idle_cost, 0.0)
        idle[team] = idle.get(team, 0.0) + idle_cost
    teams = sorted(busy, key=lambda t: (-(busy[t] + idle[t]), t))
    if sum(busy.values()) + sum(idle.values()) <= 0:
        body = no_data("the windows carry no cost (no price is configured for these GPU models).")
        return section("cost", title, lede, body + table(columns, rows, "Cost per team and project"))
    values = {(t, "busy"): busy[t] for t in teams} | {(t, "idle"): idle[t] for t in teams}
    segments = [("busy", "#4e79a7"), ("idle", "#f28e2b")]
    chart = hbar_chart("cost", title, teams, segments, values, "cost (USD)", "", value_format=fmt_usd)
    swatches = legend([("cost while busy", "#4e79a7"), ("cost while idle", "#f28e2b")])
    return section("cost", title, lede, swatches + chart
                   + table(columns, rows, "Cost per team and project"))


def _lifecycle_section(data: dict[str, Any]) -> str:
    rows = data.get("longest_waiting_pods") or []
    title = "Lifecycle of the longest-waiting pods"
    lede = ("Each row is one GPU pod, longest wait first: red while it waited to be scheduled, blue while it "
            "held its GPUs (to its end, or to the end of the data if it still runs).")
    if not rows:
        return section("lifecycle", title, lede, no_data("no pod lifecycle records in the store."))
    summary = (data.get("summary") or [{}])[0]
    instants = [parse_ts(r.get(k)) for r in rows for k in ("created_at", "scheduled_at", "started_at", "finished_at")]
    data_end = parse_ts(summary.get("last_window")) or max((t for t in instants if t is not None), default=0.0)
    gantt_rows = []
    for row in rows:
        created = parse_ts(row.get("created_at"))
        scheduled = parse_ts(row.get("scheduled_at"))
        started = parse_ts(row.get("started_at")) or scheduled
        finished = parse_ts(row.get("finished_at"))
        if created is None:
            continue
        end = finished if finished is not None else max(data_end, created)
        spans: list[tuple[float, float, str]] = []
        pending_end = scheduled if scheduled is not None else (started if started is not None else end)
        if pending_end > created:
            spans.append((created, pending_end, "pending"))
        if started is not None and end > started:
            spans.append((started, end, "running"))
        gpus = _num(row.get("gpus"))
        label = f"{row.get('namespace')}/{row.get('name')} ({fmt_number(gpus)} GPU{'s' if gpus != 1 else ''})"
        note = f"waited {fmt_duration(row.get('pending_s'))}" if (_num(row.get("pending_s")) or 0) > 0 else \
            str(row.get("end_reason") or "")
        gantt_rows.append(GanttRow(label, spans, note, finished is None))
    starts = [s for r in gantt_rows for s, _, _ in r.spans] + [data_end]
    ends = [e for r in gantt_rows for _, e, _ in r.spans] + [data_end]
    chart = gantt_chart("lifecycle", title, gantt_rows, (min(starts), max(ends)))
    columns: list[Column] = [("pod_label", "pod", _text), ("team", "team", _text),
                             ("gpus", "GPUs", fmt_number), ("node", "node", _text),
                             ("created_at", "created (UTC)", fmt_ts), ("scheduled_at", "scheduled (UTC)", fmt_ts),
                             ("finished_at", "finished (UTC)", fmt_ts), ("pending_s", "waited", fmt_duration),
                             ("running_s", "ran", fmt_duration), ("end_reason", "end", _text),
                             ("pending_reasons", "pending reasons", _wrap), ("gpu_hours", "GPU-h", fmt_hours),
                             ("cost_usd", "cost", fmt_usd)]
    rows = [r | {"pod_label": f"{r.get('namespace')}/{r.get('name')}"} for r in rows]
    swatches = legend([("pending (waiting to be scheduled)", GANTT_COLORS["pending"]),
                       ("running (holding GPUs)", GANTT_COLORS["running"])])
    return section("lifecycle", title, lede, swatches + chart + table(columns, rows, "Longest-waiting pods"))


MIG_CAPABLE = ("A100", "H100", "H200", "H20", "B200", "GB200", "A30")
"""GPU models whose memory can be split into MIG slices (a name containing one of these)."""
SLICES = ((1 / 8, "1g"), (1 / 4, "2g"), (1 / 2, "3g"))
HEADROOM = 1.2


def fits_in(peak_bytes: float | None, gpu_bytes: float | None, model: str) -> str:
    """The smallest slice of the GPU that holds the pod's peak VRAM with 20 % headroom: a MIG profile
    (named like NVIDIA's, 1g = an eighth of the memory) on MIG-capable models, a share otherwise."""
    if peak_bytes is None or not gpu_bytes:
        return DASH
    mig = any(name in model for name in MIG_CAPABLE)
    for fraction, compute in SLICES:
        if peak_bytes * HEADROOM <= gpu_bytes * fraction:
            size_gb = round(gpu_bytes * fraction / 2**30)
            return f"MIG {compute}.{size_gb}gb" if mig else f"1/{round(1 / fraction)} of a shared GPU"
    return "whole GPU"


def _vram_section(data: dict[str, Any]) -> str:
    rows = data.get("pod_vram_peaks") or []
    title = "Peak VRAM per pod against GPU memory"
    lede = ("The most VRAM each pod used in any window (and in its 95th-percentile window) against the memory "
            "of the GPUs it held, biggest GPU-hours first: pods far below their GPU's memory could move to a "
            f"smaller MIG slice or share a GPU. 'fits in' keeps {round((HEADROOM - 1) * 100)} % headroom over "
            "the peak.")
    if not rows:
        return section("vram", title, lede, no_data("no pod windows with a VRAM reading in the store."))
    rows = [r | {"pod_label": f"{r.get('namespace')}/{r.get('pod')}",
                 "fits_in": fits_in(_num(r.get("peak_mem_bytes")), _num(r.get("gpu_mem_bytes")),
                                    str(r.get("gpu_model") or ""))} for r in rows]
    labels = [str(r["pod_label"]) for r in rows]
    values: dict[tuple[str, str], float] = {}
    for row in rows:
        peak = (_num(row.get("peak_mem_bytes")) or 0.0) / 2**30
        total = (_num(row.get("gpu_mem_bytes")) or 0.0) / 2**30
        values[(str(row["pod_label"]), "peak VRAM")] = peak
        values[(str(row["pod_label"]), "never used")] = max(total - peak, 0.0)
    segments = [("peak VRAM", "#4e79a7"), ("never used", "#d0d7de")]
    chart = hbar_chart("vram", title, labels, segments, values, "GiB per GPU", " GiB", value_format=fmt_number)
    columns: list[Column] = [("pod_label", "pod", _text), ("team", "team", _text), ("gpu_model", "GPU", _text),
                             ("gpus", "GPUs", fmt_number), ("gpu_hours", "GPU-h", fmt_hours),
                             ("peak_mem_bytes", "peak VRAM", fmt_gib), ("p95_mem_bytes", "p95 window VRAM", fmt_gib),
                             ("gpu_mem_bytes", "GPU memory", fmt_gib), ("peak_share", "peak share", fmt_share),
                             ("fits_in", "fits in", _text)]
    swatches = legend([("peak VRAM", "#4e79a7"), ("GPU memory never used", "#d0d7de")])
    return section("vram", title, lede, swatches + chart + table(columns, rows, "Peak VRAM per pod"))


def _advice_section(data: dict[str, Any]) -> str:
    advice = data.get("advice") or {}
    title = "Reclaimable capacity"
    headline = advice.get("headline")
    if not headline:
        return section("reclaimable", title, "What `gpulens advise` finds reclaimable.",
                       no_data("the store has no pod windows or capacity windows yet."))
    totals = advice.get("totals") or {}
    cards = [("Reclaimable", f"{headline['gpus']:.1f} GPUs", f"{headline['percent']:.0f} % of the fleet"),
             ("Per month", fmt_usd(headline["usd_per_month"]), f"{fmt_usd(totals.get('reclaimable_cost_usd'))} "
              f"in this period")]
    cards += [(label, f"{fmt_hours(totals.get(f'{key}_gpu_hours'))} GPU-h", fmt_usd(totals.get(f"{key}_cost_usd")))
              for key, label in (("reclaim", "Reclaim idle pods"), ("right_size", "Right-size"), ("pack", "Pack"),
                                 ("scale_to_zero", "Scale to zero"))]
    cards.append(("Lost to fragmentation", f"{fmt_hours(totals.get('queue_delayed_gpu_hours'))} GPU-h",
                  "pending demand delayed (not in the total)"))
    kpis = "".join(f'<div class="kpi" data-kpi="{esc(label)}"><div class="kpi-label">{esc(label)}</div>'
                   f'<div class="kpi-value">{esc(value)}</div><div class="kpi-note">{esc(note)}</div></div>'
                   for label, value, note in cards)
    lede = (f"{advice.get('headline_text')}; {pack_text(headline)}. Over {advice['period']['start']} to "
            f"{advice['period']['end']} (counted back from the latest data). No GPU-hour is in two categories; "
            "the method and its limits are in docs/advise.md.")
    columns: list[Column] = [("category", "category", _text), ("subject", "pod / node / pool", _text),
                             ("team", "team", _text), ("detail", "why", _wrap), ("gpu_hours", "GPU-h", fmt_hours),
                             ("cost_usd", "money", fmt_usd)]
    rows = [r | {"team": r.get("team") or "-"} for r in data.get("reclaimable_capacity") or []]
    return section("reclaimable", title, lede, f'<div class="kpis">{kpis}</div>'
                   + table(columns, rows, "Recommendations with the figures behind them"))


def _firing_section(data: dict[str, Any]) -> str:
    rows = data.get("firing_alerts") or []
    title = "Alerts still firing"
    lede = ("Alerts whose last transition is 'firing', most severe and oldest first; the age is measured to the "
            "end of the data, not to the wall clock.")
    if not rows:
        return section("firing", title, lede, no_data("no alert is firing at the end of the data."))
    counts: dict[str, float] = {}
    for row in rows:
        counts[str(row["alert_type"])] = counts.get(str(row["alert_type"]), 0.0) + 1.0
    types = sorted(counts, key=lambda t: (-counts[t], t))
    chart = column_chart("firing", title, types, [counts[t] for t in types], "#e15759", "alert type", "alerts",
                         "firing")
    rows = [r | {"subject": f"{r.get('kind')} " + "/".join(str(p) for p in (r.get("namespace"), r.get("name")) if p)
                 if r.get("name") else f"{r.get('kind')} {r.get('node') or ''}".strip()} for r in rows]
    columns: list[Column] = [("severity", "severity", _text), ("alert_type", "type", _text),
                             ("subject", "subject", _text), ("first_at", "since (UTC)", fmt_ts),
                             ("age_s", "age", fmt_duration), ("summary", "summary", _wrap)]
    return section("firing", title, lede, chart + table(columns, rows, "Alerts firing at the end of the data"))


def _more_section(data: dict[str, Any]) -> str:
    parts = []
    tables: list[tuple[str, str, list[Column]]] = [
        ("top_pods", "Top GPU consumers by pod", [
            ("namespace", "namespace", _text), ("pod", "pod", _text), ("team", "team", _text),
            ("project", "project", _text), ("gpu_hours", "GPU-h", fmt_hours),
            ("idle_gpu_hours", "idle GPU-h", fmt_hours), ("avg_sm_util_pct", "SM utilisation", fmt_pct),
            ("peak_mem_bytes", "peak VRAM", fmt_gib), ("energy_kwh", "energy (kWh)", fmt_hours),
            ("cost_usd", "cost", fmt_usd)]),
        ("nodes_to_scale_down", "Nodes to scale down", [
            ("node", "node", _text), ("gpu_model", "GPU model", _text), ("gpus", "GPUs", fmt_number),
            ("unallocated_gpu_hours", "unallocated GPU-h", fmt_hours),
            ("unallocated_share", "unallocated share", fmt_share),
            ("cost_burned_usd", "cost burned", fmt_usd), ("idle_node_alerts", "idle-node alerts", fmt_number)]),
        ("alerts_by_type", "Alerts by type", [
            ("type", "type", _text), ("alerts", "alerts", fmt_number), ("still_firing", "still firing", fmt_number),
            ("avg_duration_s", "mean duration", fmt_duration)]),
        ("cost_per_unit_of_work", "Cost per unit of work", [
            ("namespace", "namespace", _text), ("pod", "pod", _text), ("team", "team", _text),
            ("cost_usd", "cost", fmt_usd), ("steps", "steps", fmt_number),
            ("cost_per_step_usd", "USD per step", lambda v: fmt_number(v, 6)),
            ("cost_per_1k_tokens_usd", "USD per 1k tokens", lambda v: fmt_number(v, 6))]),
    ]
    for key, caption, columns in tables:
        rows = data.get(key) or []
        parts.append(f'<h3>{esc(caption)}</h3>')
        parts.append(table(columns, rows, "") if rows else no_data(f"nothing to show for {caption.lower()}."))
    return section("more", "More analyses", "The other canned analyses of `gpulens report`, as tables.",
                   "".join(parts))


CSS = """
:root{--ink:#1f2328;--muted:#57606a;--line:#d8dee4;--bg:#f6f8fa;--card:#fff;--accent:#4e79a7}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 FONT}
header.top{background:#1f2d3d;color:#fff;padding:28px 40px 24px}
header.top h1{margin:0 0 4px;font-size:26px;font-weight:650;letter-spacing:.2px}
header.top p{margin:0;color:#c9d1d9}
nav{display:flex;flex-wrap:wrap;gap:6px 16px;margin-top:14px}
nav a{color:#9ecbff;text-decoration:none;font-size:13px}
.teams{margin-top:10px;font-size:12.5px;color:#c9d1d9;display:flex;flex-wrap:wrap;gap:6px;align-items:center}
.teams a{color:#9ecbff;text-decoration:none;border:1px solid #3d5166;border-radius:10px;padding:1px 9px}
.team-anchor{position:fixed;top:0}
main{max-width:1040px;margin:0 auto;padding:24px 20px 48px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:20px 24px;margin:0 0 20px;
box-shadow:0 1px 2px rgba(31,35,40,.04)}
h2{margin:0 0 4px;font-size:18px;font-weight:650}
h3{margin:18px 0 6px;font-size:15px}
.lede{margin:0 0 12px;color:var(--muted);max-width:880px}
.kpis{display:grid;grid-template-columns:repeat(5,1fr);gap:12px}
.kpi{border:1px solid var(--line);border-radius:8px;padding:10px 12px;background:#fbfcfd}
.kpi-label{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.4px}
.kpi-value{font-size:20px;font-weight:650;margin:2px 0;font-variant-numeric:tabular-nums}
.kpi-note{font-size:12px;color:var(--muted)}
svg.chart{display:block;width:100%;height:auto;max-width:WIDTHpx;font-family:FONT}
svg .grid{stroke:#eaeef2;stroke-width:1}
svg .axis{stroke:#8c959f;stroke-width:1}
svg .tick{fill:#57606a;font-size:11px}
svg .axis-label{fill:#1f2328;font-size:12px;font-weight:600}
svg .category{fill:#1f2328;font-size:12px}
svg .value{fill:#57606a;font-size:11px}
svg .mark:hover{opacity:.75}
.legend{list-style:none;display:flex;flex-wrap:wrap;gap:4px 18px;margin:0 0 6px;padding:0;font-size:13px}
.legend li{display:flex;align-items:center;gap:6px}
.swatch{display:inline-block;width:14px;height:10px;border-radius:2px}
.swatch.dashed{height:3px;width:18px}
.no-data{margin:8px 0;padding:14px 16px;border:1px dashed #afb8c1;border-radius:8px;background:#f6f8fa;
color:var(--muted);font-style:italic}
.table{margin-top:12px}
.caption,details.table summary{font-size:12px;color:var(--muted);font-weight:600;margin-bottom:4px;cursor:default}
details.table summary{cursor:pointer}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:12.5px;font-variant-numeric:tabular-nums}
th,td{padding:5px 8px;border-bottom:1px solid #eaeef2;text-align:left;white-space:nowrap}
th{background:#f6f8fa;font-weight:600;color:#424a53}
td.num,th.num{text-align:right}
td.wrap{white-space:normal;min-width:180px}
tbody tr:nth-child(even){background:#fbfcfd}
footer{color:var(--muted);font-size:12px;text-align:center;padding:8px 0 24px}
""".replace("FONT", FONT).replace("WIDTH", str(WIDTH))

SECTION_LINKS = (("summary", "Summary"), ("utilisation", "Utilisation"), ("fleet-states", "GPU states"),
                 ("idle", "Idle GPU-hours"), ("pending", "Pending time"), ("pending-reasons", "Pending reasons"),
                 ("stranded", "Stranded GPUs"), ("cost", "Cost"), ("vram", "VRAM"), ("reclaimable", "Reclaimable"),
                 ("firing", "Firing alerts"),
                 ("lifecycle", "Lifecycle"), ("more", "More"))


def render_html(data: dict[str, Any], title: str = "gpulens fleet report") -> str:
    """The whole report page for ``data`` (as :func:`collect_report_data` returns it); pure and deterministic."""
    bucket_s = int(_num(data.get("bucket_s")) or 60)
    colors = team_colors(data)
    summary = (data.get("summary") or [{}])[0]
    period = (f"{fmt_ts(summary.get('first_window'))} to {fmt_ts(summary.get('last_window'))} UTC"
              if summary.get("first_window") else "no data yet")
    nav = "".join(f'<a href="#{anchor}">{esc(label)}</a>' for anchor, label in SECTION_LINKS)
    teams = sorted(colors)
    anchors, filter_css = team_filter(teams)
    sections = [
        _summary_section(data),
        _utilisation_section(data, colors, bucket_s),
        _fleet_states_section(data, bucket_s),
        _idle_section(data),
        _pending_section(data),
        _pending_reasons_section(data),
        _stranded_section(data, bucket_s),
        fragmentation_section(data, bucket_s),
        _cost_section(data),
        _vram_section(data),
        _advice_section(data),
        _firing_section(data),
        _lifecycle_section(data),
        _more_section(data),
    ]
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}{filter_css}</style></head><body>{anchors}"
        f'<header class="top"><h1>{esc(title)}</h1><p>{esc(period)} · GPU-hours, idle time, waiting, '
        f"fragmentation and cost of the GPU fleet</p><nav>{nav}</nav>{_team_links(teams)}</header>"
        f'<main>{"".join(sections)}</main>'
        f"<footer>Generated by gpulens from ClickHouse (pod windows, cluster capacity, pod lifecycle, alerts). "
        f"Self-contained: no scripts, no external resources.</footer>"
        "</body></html>\n"
    )


# --------------------------------------------------------------------------- data and file


def collect_report_data(reader: Reader, advise_thresholds: AdviseThresholds | None = None,
                        cluster: str | None = None) -> dict[str, Any]:
    """Every canned analysis plus the time series the charts need, as plain rows, of one cluster
    (``sinks.analyses.scoped``: the named one, else the store's only one); ``advice`` is the
    reclaimable-capacity advisor's whole answer (``sinks.advise``), run once for its section."""
    reader = scoped(reader, cluster)
    data: dict[str, Any] = dict(run_report(reader, [n for n in ANALYSES if n != "reclaimable_capacity"]))
    data["cluster"] = reader.cluster
    data["advice"] = advise(reader, advise_thresholds or AdviseThresholds())
    data["reclaimable_capacity"] = advice_rows(data["advice"])
    bucket_s = timeseries.choose_bucket_s(reader)
    data["bucket_s"] = bucket_s
    data["utilisation_by_team"] = timeseries.utilisation_by_team(reader, bucket_s)
    data["capacity_over_time"] = timeseries.capacity_over_time(reader, bucket_s)
    data["fragmentation_series"] = fragmentation_over_time(reader, bucket_s)
    data["longest_waiting_pods"] = timeseries.longest_waiting_pods(reader)
    data["pod_vram_peaks"] = timeseries.pod_vram_peaks(reader)
    data["firing_alerts"] = timeseries.firing_alerts(reader)
    return data


def write_html_report(reader: Reader, path: Path | str, advise_thresholds: AdviseThresholds | None = None,
                      cluster: str | None = None) -> Path:
    """Query, render and write the report of one cluster (see :func:`collect_report_data`); returns the
    file's path."""
    target = Path(path)
    data = collect_report_data(reader, advise_thresholds, cluster)
    page = render_html(data) if data["cluster"] == DEFAULT_CLUSTER else render_html(
        data, f"gpulens fleet report: cluster {data['cluster']}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return target
