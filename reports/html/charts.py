"""Inline SVG charts for the HTML report: scales and ticks, line, stacked column, bar, column and
Gantt charts. Every data mark carries ``class="mark"`` and ``data-*`` attributes and a ``<title>``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from reports.html.format import WIDTH, esc, fmt_duration, fmt_hours, svg_number

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
        y = svg_number(frame.y(tick))
        parts.append(f'<line class="grid" x1="{frame.left}" x2="{svg_number(frame.left + frame.plot_w)}" '
                     f'y1="{y}" y2="{y}"/>')
        parts.append(f'<text class="tick" x="{frame.left - 8}" y="{y}" text-anchor="end" '
                     f'dominant-baseline="middle">{esc(fmt_tick_value(tick))}</text>')
    mid = svg_number(frame.top + frame.plot_h / 2)
    parts.append(f'<text class="axis-label" x="16" y="{mid}" text-anchor="middle" '
                 f'transform="rotate(-90 16 {mid})">{esc(label)}</text>')
    return parts


def _x_time_axis(frame: Frame, label: str) -> list[str]:
    base = svg_number(frame.top + frame.plot_h)
    parts = [f'<line class="axis" x1="{frame.left}" x2="{svg_number(frame.left + frame.plot_w)}" '
             f'y1="{base}" y2="{base}"/>']
    span = frame.x_max - frame.x_min
    for tick in time_ticks(frame.x_min, frame.x_max):
        x = svg_number(frame.x(tick))
        tick_end = svg_number(frame.top + frame.plot_h + 5)
        parts.append(f'<line class="axis" x1="{x}" x2="{x}" y1="{base}" y2="{tick_end}"/>')
        parts.append(f'<text class="tick" x="{x}" y="{svg_number(frame.top + frame.plot_h + 18)}" '
                     f'text-anchor="middle">{esc(fmt_tick_time(tick, span))}</text>')
    parts.append(f'<text class="axis-label" x="{svg_number(frame.left + frame.plot_w / 2)}" '
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
                segments[-1].append(f"{svg_number(frame.x(x))},{svg_number(frame.y(v))}")
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
                             f'cx="{svg_number(frame.x(x))}" cy="{svg_number(frame.y(v))}" r="2.6" fill="{s.color}">'
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
                         f'x="{svg_number(frame.x(start) + 0.5)}" y="{svg_number(y_top)}" width="{svg_number(width)}" '
                         f'height="{svg_number(max(y_bottom - y_top, 0.5))}" fill="{color}">'
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
        x = svg_number(frame.x(tick))
        parts.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{frame.top}" y2="{svg_number(base_y)}"/>')
        parts.append(f'<text class="tick" x="{x}" y="{svg_number(base_y + 18)}" text-anchor="middle">'
                     f'{esc(fmt_tick_value(tick))}</text>')
    parts.append(f'<text class="axis-label" x="{svg_number(frame.left + frame.plot_w / 2)}" y="{height - 8}" '
                 f'text-anchor="middle">{esc(x_label)}</text>')
    for row, category in enumerate(categories):
        y = frame.top + row * row_h + 5
        parts.append(f'<text class="category" x="{label_width - 10}" y="{svg_number(y + (row_h - 10) / 2)}" '
                     f'text-anchor="end" dominant-baseline="middle"><title>{esc(category)}</title>'
                     f'{esc(_truncate(category, label_width // 7))}</text>')
        start = 0.0
        for name, color in segments:
            value = values.get((category, name), 0.0)
            if value <= 0:
                continue
            x0, x1 = frame.x(start), frame.x(start + value)
            parts.append(f'<rect class="mark bar" data-series="{esc(name)}" data-label="{esc(category)}" '
                         f'data-value="{value:g}" x="{svg_number(x0)}" y="{svg_number(y)}" '
                         f'width="{svg_number(max(x1 - x0, 1.0))}" height="{row_h - 10}" fill="{color}">'
                         f'<title>{esc(category)} · {esc(name)}: {esc(value_format(value))}{esc(unit)}</title></rect>')
            start += value
        parts.append(f'<text class="value" x="{svg_number(frame.x(start) + 6)}" y="{svg_number(y + (row_h - 10) / 2)}" '
                     f'dominant-baseline="middle">{esc(value_format(start))}{esc(unit)}</text>')
    parts.append(f'<line class="axis" x1="{frame.left}" x2="{frame.left}" y1="{frame.top}" y2="{svg_number(base_y)}"/>')
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
    parts.append(f'<line class="axis" x1="{frame.left}" x2="{svg_number(frame.left + frame.plot_w)}" '
                 f'y1="{svg_number(base)}" y2="{svg_number(base)}"/>')
    for i, (category, value) in enumerate(zip(categories, values, strict=True)):
        cx = frame.left + slot * (i + 0.5)
        if value > 0:
            top = frame.y(value)
            parts.append(f'<rect class="mark bar" data-series="{esc(series)}" data-label="{esc(category)}" '
                         f'data-value="{value:g}" x="{svg_number(cx - slot * 0.3)}" y="{svg_number(top)}" '
                         f'width="{svg_number(slot * 0.6)}" height="{svg_number(base - top)}" fill="{color}">'
                         f'<title>{esc(category)}: {esc(fmt_tick_value(value))} {esc(series)}</title></rect>')
            parts.append(f'<text class="value" x="{svg_number(cx)}" y="{svg_number(top - 6)}" text-anchor="middle">'
                         f'{esc(fmt_tick_value(value))}</text>')
        parts.append(f'<text class="tick" x="{svg_number(cx)}" y="{svg_number(base + 18)}" text-anchor="middle">'
                     f'{esc(category)}</text>')
    parts.append(f'<text class="axis-label" x="{svg_number(frame.left + frame.plot_w / 2)}" y="{height - 8}" '
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
        x = svg_number(frame.x(tick))
        parts.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{frame.top}" y2="{svg_number(base)}"/>')
        parts.append(f'<text class="tick" x="{x}" y="{svg_number(base + 18)}" text-anchor="middle">'
                     f'{esc(fmt_tick_time(tick, span))}</text>')
    parts.append(f'<text class="axis-label" x="{svg_number(frame.left + frame.plot_w / 2)}" y="{height - 8}" '
                 f'text-anchor="middle">time (UTC)</text>')
    for i, row in enumerate(rows):
        y = frame.top + i * row_h + 5
        mid = svg_number(y + (row_h - 10) / 2)
        parts.append(f'<text class="category" x="{label_width - 10}" y="{mid}" text-anchor="end" '
                     f'dominant-baseline="middle"><title>{esc(row.label)}</title>'
                     f'{esc(_truncate(row.label, 36))}</text>')
        last_x = float(frame.left)
        for start, end, phase in row.spans:
            x0, x1 = frame.x(start), frame.x(max(end, start))
            parts.append(f'<rect class="mark span" data-series="{esc(phase)}" data-label="{esc(row.label)}" '
                         f'data-value="{end - start:g}" x="{svg_number(x0)}" y="{svg_number(y)}" '
                         f'width="{svg_number(max(x1 - x0, 2.0))}" height="{row_h - 10}" rx="3" '
                         f'fill="{GANTT_COLORS[phase]}"><title>{esc(row.label)} · {esc(phase)} '
                         f'{esc(fmt_duration(end - start))}</title></rect>')
            last_x = max(last_x, x1)
        if row.note:
            parts.append(f'<text class="value" x="{svg_number(last_x + 6)}" y="{mid}" dominant-baseline="middle">'
                         f'{esc(row.note)}</text>')
    parts.append("</svg>")
    return "".join(parts)

