"""Prometheus self-metrics: each service registers its counters here and serves ``/metrics``.

A service-owned registry (not the global default) keeps tests and the in-process demo, which run
several components in one process, from colliding on metric names. :func:`parse_exposition` reads
another exporter's text (the agent's dcgm-exporter source).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from common.errors import PermanentError

__all__ = [
    "Counter",
    "ExpositionError",
    "Gauge",
    "GaugeFamily",
    "Histogram",
    "MetricsRegistry",
    "Sample",
    "parse_exposition",
]


class ExpositionError(PermanentError, ValueError):
    """The text is not in the Prometheus exposition format."""


@dataclass(frozen=True)
class Sample:
    """One series of an exposition: its name, labels and value."""

    name: str
    labels: dict[str, str]
    value: float


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\}\s*)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_exposition(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (version 0.0.4), names as written (the client
    library's own parser renames counters to ``*_total``); raises :class:`ExpositionError` naming
    the line."""
    samples: list[Sample] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME.match(line)
        if match is None:
            raise ExpositionError(f"line {number}: no metric name: {line[:120]!r}")
        name, rest = match.group(), line[match.end():]
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            rest = rest[1:].lstrip()
            while not rest.startswith("}"):
                label = _LABEL.match(rest)
                if label is None:
                    raise ExpositionError(f"line {number}: malformed labels: {line[:120]!r}")
                labels[label.group(1)] = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group()], label.group(2))
                rest = rest[label.end():]
                if label.group(3).startswith("}"):
                    rest = "}" + rest
                    break
            rest = rest[1:]
        parts = rest.split()
        if not 1 <= len(parts) <= 2:
            raise ExpositionError(f"line {number}: expected a value (and a timestamp): {line[:120]!r}")
        try:
            value = float(parts[0])
        except ValueError:
            raise ExpositionError(f"line {number}: value {parts[0]!r} is not a number") from None
        samples.append(Sample(name, labels, value))
    return samples


class GaugeFamily:
    """A gauge family computed at scrape time (its full name, no namespace added): what a
    ``MetricsRegistry.add_collector`` function yields, so callers need no prometheus_client."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...]) -> None:
        self.family = GaugeMetricFamily(name, doc, labels=list(labels))

    def add(self, label_values: tuple[str, ...], value: float) -> None:
        self.family.add_metric(label_values, value)


class _FunctionCollector(Collector):
    def __init__(self, collect: Callable[[], Iterable[GaugeFamily]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        for family in self._collect():
            yield family.family


class MetricsRegistry:
    """A named registry; ``serve(port)`` exposes it over HTTP, ``render()`` returns the text."""

    def __init__(self, namespace: str = "gpulens") -> None:
        self.registry = CollectorRegistry()
        self.namespace = namespace

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, labels, namespace=self.namespace, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labels, namespace=self.namespace, registry=self.registry)

    def histogram(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Histogram:
        return Histogram(name, doc, labels, namespace=self.namespace, registry=self.registry)

    def add_collector(self, collect: Callable[[], Iterable[GaugeFamily]]) -> None:
        """Serve the families ``collect()`` yields at each scrape (series that come and go)."""
        self.registry.register(_FunctionCollector(collect))

    def serve(self, port: int, addr: str | IPv4Address | IPv6Address = "127.0.0.1") -> int:
        """Start the ``/metrics`` endpoint on a daemon thread; returns the bound port. ``addr``:
        the service's ``metrics_addr`` setting (``GPULENS_METRICS_ADDR``), loopback unless chosen."""
        server, _thread = start_http_server(port, addr=str(addr), registry=self.registry)
        return int(server.server_port)

    def render(self) -> str:
        return generate_latest(self.registry).decode()
