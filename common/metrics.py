"""Prometheus self-metrics: each service registers its counters here and serves ``/metrics``.

A service-owned registry (not the global default) keeps tests and the in-process demo, which run
several components in one process, from colliding on metric names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.exposition import generate_latest

__all__ = ["Counter", "Gauge", "Histogram", "MetricsRegistry"]


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

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start the ``/metrics`` endpoint on a daemon thread; returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)

    def render(self) -> str:
        return generate_latest(self.registry).decode()
