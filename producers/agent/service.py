"""The agent's run loop: sample on the interval grid, produce, survive NVML and broker failures.

- Samples are taken on the wall-clock grid of ``sample_interval_s`` (10:00:00, 10:00:10, ...), so
  every node's samples line up; a sample that overruns skips the ticks it missed (counted) instead
  of bunching up.
- The GPU source (:class:`producers.agent.source.SampleSource`: NVML by default, or the node's
  dcgm-exporter) is initialised with exponential backoff (1 s doubling to ``backoff_max_s``) and
  reported (log + ``source_up`` gauge + failure counter; for NVML also the ``nvml_*`` ones). When
  it fails as a whole mid-run (driver reload, exporter restart), it is shut down and
  re-initialised in-process. A missing NVML library is fatal (:class:`NvmlLibraryNotFound`): no
  retry inside this container can make it appear.
- Samples go to a :class:`SampleSink`: Kafka through :class:`common.kafka.BoundedProducer`
  (bounded local queue: when the broker is away, the overflow is dropped and counted, memory
  stays bounded) or stdout (one JSON document per line). The same sink carries the
  ``workload.progress.v1`` messages of :mod:`producers.agent.progress` (from its own thread).
- Self-metrics (Prometheus): samples produced / dropped, NVML errors by kind, delivery failures,
  queue depth, sampling duration, missed ticks, GPUs by health.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Protocol

from common.backoff import backoff_delay_s
from common.errors import PermanentError
from common.logs import get_logger
from common.metrics import MetricsRegistry
from common.settings import AgentSettings, ProducerSettings
from producers.agent.nvml_api import NvmlLibraryNotFound
from producers.agent.source import SampleSource, SourceError, SourceUnavailable
from schemas.codec import encode
from schemas.messages import DEFAULT_CLUSTER, GpuSample, scoped_key
from schemas.topics import GPU_SAMPLES, WORKLOAD_PROGRESS

log = get_logger(__name__)


class AgentError(PermanentError):
    """The agent cannot do what was asked (e.g. ``--once`` without a working NVML)."""


class AgentMetrics:
    """The agent's Prometheus self-metrics, on its own registry."""

    def __init__(self, registry: MetricsRegistry | None = None) -> None:
        self.registry = registry or MetricsRegistry()
        r = self.registry
        self.samples_produced = r.counter("agent_samples_produced_total", "Samples handed to the sink")
        self.samples_dropped = r.counter(
            "agent_samples_dropped_total", "Samples dropped because the local buffer was full (broker away)"
        )
        self.nvml_errors = r.counter("agent_nvml_errors_total", "NVML errors by kind", ("kind",))
        self.nvml_init_failures = r.counter(
            "agent_nvml_init_failures_total", "Failed NVML (re-)initialisations by kind", ("kind",)
        )
        self.nvml_up = r.gauge("agent_nvml_up", "1 when NVML is initialised and answering")
        self.delivery_failures = r.counter(
            "agent_delivery_failures_total", "Samples the broker did not acknowledge in time"
        )
        self.queue_depth = r.gauge("agent_queue_depth", "Samples waiting in the local producer queue")
        self.sample_duration = r.histogram("agent_sample_duration_seconds", "Time to take and encode one sample")
        self.missed_ticks = r.counter("agent_missed_ticks_total", "Interval ticks skipped because sampling overran")
        self.pod_resources_errors = r.counter(
            "agent_pod_resources_errors_total", "Failed kubelet PodResources calls"
        )
        self.gpus = r.gauge("agent_gpus", "GPU and MIG devices in the last sample by health", ("health",))
        self.source_up = r.gauge(
            "agent_source_up", "1 when the GPU source (nvml or dcgm-exporter) is initialised and answering",
            ("source",))
        self.source_failures = r.counter(
            "agent_source_failures_total", "Failed (re-)initialisations and whole-source failures by kind",
            ("source", "kind"))


class SampleSink(Protocol):
    def send(self, key: str, payload: bytes) -> bool:
        """Queue one encoded sample; False when it was dropped (buffer full)."""

    def poll(self) -> None: ...

    def queue_depth(self) -> int: ...

    def close(self, timeout_s: float = 10.0) -> int:
        """Flush; returns how many samples are still undelivered."""


class ProgressSink(Protocol):
    def send_progress(self, key: str, payload: bytes) -> bool:
        """Queue one encoded ``workload.progress.v1`` message (key = pod uid); may run on another thread."""

    def poll(self) -> None: ...


class AgentStdoutSink:
    """One JSON document per line on stdout (``--stdout``)."""

    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self.stream = stream or sys.stdout.buffer
        self._lock = threading.Lock()

    def send(self, key: str, payload: bytes) -> bool:
        with self._lock:
            self.stream.write(payload + b"\n")
            self.stream.flush()
        return True

    def send_progress(self, key: str, payload: bytes) -> bool:
        return self.send(key, payload)

    def poll(self) -> None:
        return None

    def queue_depth(self) -> int:
        return 0

    def close(self, timeout_s: float = 10.0) -> int:
        self.stream.flush()
        return 0


class AgentKafkaSink:
    """Produces to ``<prefix>.gpu.samples.v1`` keyed by node, through the bounded shared producer."""

    def __init__(self, settings: AgentSettings, metrics: AgentMetrics) -> None:
        from common.kafka import BoundedProducer  # the broker client only when producing

        producer_settings = ProducerSettings(
            **(
                settings.producer.model_dump()
                | {
                    "queue_max_kbytes": min(settings.producer.queue_max_kbytes, settings.buffer_max_kbytes),
                    "queue_max_messages": min(settings.producer.queue_max_messages, settings.buffer_max_messages),
                }
            )
        )
        self.topic = GPU_SAMPLES.name(settings.topic_prefix)
        self.progress_topic = WORKLOAD_PROGRESS.name(settings.topic_prefix)
        self._metrics = metrics
        self.producer = BoundedProducer(settings.kafka, producer_settings, on_delivery=self._delivered)

    def _delivered(self, topic: str, ok: bool) -> None:
        if not ok:
            self._metrics.delivery_failures.inc()

    def send(self, key: str, payload: bytes) -> bool:
        return self.producer.produce(self.topic, key, payload)

    def send_progress(self, key: str, payload: bytes) -> bool:
        return self.producer.produce(self.progress_topic, key, payload)

    def poll(self) -> None:
        self.producer.poll(0)

    def queue_depth(self) -> int:
        return self.producer.queue_depth

    def close(self, timeout_s: float = 10.0) -> int:
        return self.producer.close(timeout_s)


def next_tick(now_s: float, interval_s: float) -> float:
    """The next instant on the interval grid strictly after ``now_s``."""
    return (math.floor(now_s / interval_s) + 1) * interval_s


class AgentService:
    """Owns the source's lifecycle and the sampling loop around it."""

    def __init__(
        self,
        sampler: SampleSource,
        sink: SampleSink,
        metrics: AgentMetrics,
        *,
        backoff_max_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        before_sample: Callable[[datetime], None] | None = None,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        self.sampler = sampler
        self.cluster = cluster
        self.is_nvml = sampler.name == "nvml"
        self.sink = sink
        self.metrics = metrics
        self.backoff_max_s = backoff_max_s
        self.clock = clock
        self.before_sample = before_sample
        self.nvml_ready = False
        self._init_failures = 0
        self._next_init_at = 0.0
        self.last_sample: GpuSample | None = None
        self._set_up(0)

    @property
    def _display_name(self) -> str:
        return "NVML" if self.is_nvml else self.sampler.name

    def _set_up(self, value: int) -> None:
        self.metrics.source_up.labels(self.sampler.name).set(value)
        if self.is_nvml:
            self.metrics.nvml_up.set(value)

    @property
    def interval_s(self) -> float:
        return self.sampler.sample_interval_s

    # ------------------------------------------------------------------ NVML lifecycle

    def ensure_nvml(self, now_s: float) -> bool:
        """Initialise the source if needed and due; False while it is down (retried with backoff)."""
        if self.nvml_ready:
            return True
        if now_s < self._next_init_at:
            return False
        source = self.sampler.name
        try:
            self.sampler.init()
        except NvmlLibraryNotFound:
            self.metrics.nvml_init_failures.labels("library_not_found").inc()
            raise
        except SourceError as exc:
            self._init_failures += 1
            delay = backoff_delay_s(self._init_failures, base_s=1.0, cap_s=self.backoff_max_s, jitter=0.0)
            self._next_init_at = now_s + delay
            self.metrics.source_failures.labels(source, exc.kind).inc()
            if self.is_nvml:
                self.metrics.nvml_init_failures.labels(exc.kind).inc()
            log.warning(f"{source} init failed", source=source, kind=exc.kind, error=str(exc),
                        attempt=self._init_failures, retry_in_s=delay)
            return False
        if self._init_failures:
            log.info(f"{source} initialised", source=source, after_attempts=self._init_failures + 1)
        self._init_failures = 0
        self.nvml_ready = True
        self.sampler.reset()
        self._set_up(1)
        return True

    def _nvml_lost(self, exc: SourceError, now_s: float) -> None:
        source = self.sampler.name
        log.error(f"{source} unavailable; re-initialising", source=source, kind=exc.kind, error=str(exc))
        self.metrics.source_failures.labels(source, exc.kind).inc()
        if self.is_nvml:
            self.metrics.nvml_errors.labels(exc.kind).inc()
        self._set_up(0)
        try:
            self.sampler.shutdown()
        except Exception as shutdown_exc:  # the library is already broken: report, carry on
            log.warning(f"{source} shutdown failed", error=str(shutdown_exc))
        self.nvml_ready = False
        self._next_init_at = now_s  # first retry right away, then backoff

    # ------------------------------------------------------------------ one step

    def step(self) -> GpuSample | None:
        """Take, encode and hand one sample to the sink; None when NVML is not available."""
        now_s = self.clock()
        if not self.ensure_nvml(now_s):
            return None
        ts = datetime.fromtimestamp(now_s, UTC)
        started = time.perf_counter()
        if self.before_sample is not None:
            self.before_sample(ts)
        try:
            sample = self.sampler.sample(ts)
        except SourceUnavailable as exc:
            self._nvml_lost(exc, now_s)
            return None
        if self.cluster != DEFAULT_CLUSTER:
            sample = sample.model_copy(update={"cluster": self.cluster})
        payload = encode(sample)
        self.metrics.sample_duration.observe(time.perf_counter() - started)
        if self.sink.send(scoped_key(self.cluster, sample.node), payload):
            self.metrics.samples_produced.inc()
        else:
            self.metrics.samples_dropped.inc()
            log.warning("sample dropped: local buffer full (broker unreachable?)", seq=sample.seq)
        self.sink.poll()
        self.metrics.queue_depth.set(self.sink.queue_depth())
        health: dict[str, int] = {"ok": 0, "degraded": 0, "lost": 0, "error": 0}
        for gpu in sample.gpus:
            health[gpu.health] += 1
        for state, count in health.items():
            self.metrics.gpus.labels(state).set(count)
        self.last_sample = sample
        return sample

    # ------------------------------------------------------------------ the loop

    def run(self, stop: threading.Event, once: bool = False) -> int:
        """Sample until ``stop`` is set (or once); returns how many samples were produced."""
        produced = 0
        try:
            if once:
                if not self.ensure_nvml(self.clock()):
                    raise AgentError(f"{self._display_name} is not available (see the log above); no sample taken")
                sample = self.step()
                if sample is None:
                    raise AgentError(f"{self._display_name} failed while sampling (see the log above); no sample taken")
                return 1
            log.info("agent started", node=self.sampler.node_name, interval_s=self.interval_s,
                     boot_id=self.sampler.boot_id)
            due: float | None = None
            while not stop.is_set():
                if self.step() is not None:
                    produced += 1
                now = self.clock()
                upcoming = next_tick(now, self.interval_s)
                if due is not None:
                    missed = round((upcoming - due) / self.interval_s) - 1
                    if missed > 0:
                        self.metrics.missed_ticks.inc(missed)
                        log.warning("sampling overran the interval", missed_ticks=missed)
                due = upcoming
                stop.wait(max(0.0, upcoming - now))
            return produced
        finally:
            remaining = self.sink.close(10.0)
            if remaining:
                log.warning("samples not delivered at shutdown", count=remaining)
            self.sampler.shutdown()
