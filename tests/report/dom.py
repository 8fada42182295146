"""A tiny reader of the report's markup (stdlib parser): sections, charts and their data marks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"meta", "br", "img", "input", "link", "hr", "col", "source", "wbr", "area", "base"}


@dataclass
class Mark:
    tag: str
    series: str
    label: str
    value: float


@dataclass
class Chart:
    name: str
    title: str = ""
    marks: list[Mark] = field(default_factory=list)


@dataclass
class Page:
    title: str = ""
    sections: list[str] = field(default_factory=list)
    charts: dict[str, Chart] = field(default_factory=dict)
    no_data: dict[str, list[str]] = field(default_factory=dict)
    tables: dict[str, list[list[str]]] = field(default_factory=dict)
    """Per section: rows (header row first) of every table in it, in order."""
    kpis: dict[str, str] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)
    text: str = ""

    def series_values(self, chart: str, series: str) -> list[float]:
        """Values of the marks of one series that carry one (a line's path carries none)."""
        return [m.value for m in self.charts[chart].marks if m.series == series and not math.isnan(m.value)]

    def records(self, section: str) -> list[dict[str, str]]:
        """The rows of a section's table(s) as dicts keyed by the header cells."""
        header, *rows = self.tables[section]
        return [dict(zip(header, row, strict=True)) for row in rows if row != header]

    def by_label(self, chart: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in self.charts[chart].marks:
            if not math.isnan(m.value):
                out[m.label] = out.get(m.label, 0.0) + m.value
        return out


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.section = ""
        self.chart: Chart | None = None
        self.capture: str | None = None
        self.buffer: list[str] = []
        self.row: list[str] | None = None
        self.kpi: str | None = None
        self.texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.page.tags.add(tag)
        if tag not in VOID:
            self.stack.append((tag, a))
        if tag == "section":
            self.section = a.get("id", "")
            self.page.sections.append(self.section)
        elif tag == "svg" and "data-chart" in a:
            self.chart = Chart(a["data-chart"], a.get("aria-label", ""))
            self.page.charts[self.chart.name] = self.chart
        elif self.chart is not None and "mark" in a.get("class", "").split():
            self.chart.marks.append(Mark(tag, a.get("data-series", ""), a.get("data-label", ""),
                                         float(a.get("data-value", "nan") or "nan")))
        elif tag == "p" and "no-data" in a.get("class", ""):
            self._start("no-data")
        elif tag == "title" and any(t == "head" for t, _ in self.stack):
            self._start("title")
        elif tag == "table":
            self.page.tables.setdefault(self.section, [])
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self._start("cell")
        elif tag == "div" and "data-kpi" in a:
            self.kpi = a["data-kpi"]
        elif tag == "div" and a.get("class") == "kpi-value" and self.kpi:
            self._start("kpi")

    def _start(self, what: str) -> None:
        self.capture, self.buffer = what, []

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if self.stack:
            self.stack.pop()
        if tag == "svg":
            self.chart = None
        if self.capture == "no-data" and tag == "p":
            self.page.no_data.setdefault(self.section, []).append("".join(self.buffer))
            self.capture = None
        elif self.capture == "title" and tag == "title":
            self.page.title = "".join(self.buffer)
            self.capture = None
        elif self.capture == "cell" and tag in ("td", "th") and self.row is not None:
            self.row.append("".join(self.buffer))
            self.capture = None
        elif self.capture == "kpi" and tag == "div" and self.kpi:
            self.page.kpis[self.kpi] = "".join(self.buffer)
            self.capture, self.kpi = None, None
        elif tag == "tr" and self.row is not None:
            self.page.tables.setdefault(self.section, []).append(self.row)
            self.row = None

    def handle_data(self, data: str) -> None:
        self.texts.append(data)
        if self.capture:
            self.buffer.append(data)


def parse(markup: str) -> Page:
    parser = _Parser()
    parser.feed(markup)
    parser.close()
    parser.page.text = " ".join(parser.texts)
    return parser.page
