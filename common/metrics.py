"""Prometheus self-metrics: each service registers its counters here and serves ``/metrics``.

A service-owned registry (not the global default) keeps tests and the in-process demo, which run
several components in one process, from colliding on metric names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

__all__ = ["Counter", "Gauge", "GaugeFamily", "Histogram", "MetricsRegistry"]


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

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start the ``/metrics`` endpoint on a daemon thread; returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)

    def render(self) -> str:
        return generate_latest(self.registry).decode()
