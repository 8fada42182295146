"""The agent loop: NVML init backoff and in-process re-init, bounded buffering with the broker
away, self-metrics, and the interval grid."""

from __future__ import annotations

import threading
import time
import urllib.request
from datetime import datetime

import pytest

from common.settings import AgentSettings, KafkaSettings, ProducerSettings, load_settings
from producers.agent.cgroup import StaticProcessResolver
from producers.agent.fake_nvml import FakeGpu, FakeNvml
from producers.agent.nvml_api import NvmlLibraryNotFound
from producers.agent.sampler import NodeSampler
from producers.agent.service import AgentError, AgentKafkaSink, AgentMetrics, AgentService, next_tick
from tests.agent.helpers import gpu_uuid


class ListSink:
    def __init__(self, accept: bool = True) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.accept = accept
        self.closed = False

    def send(self, key: str, payload: bytes) -> bool:
        if self.accept:
            self.sent.append((key, payload))
        return self.accept

    def poll(self) -> None:
        return None

    def queue_depth(self) -> int:
        return 0

    def close(self, timeout_s: float = 10.0) -> int:
        self.closed = True
        return 0


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def metric(metrics: AgentMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.registry.registry.get_sample_value(f"gpulens_{name}", labels or {})
    return 0.0 if value is None else value


def build(nvml: FakeNvml, sink: ListSink | None = None, interval: float = 10.0) -> tuple[AgentService, Clock]:
    metrics = AgentMetrics()
    sampler = NodeSampler("node-a", nvml, None, StaticProcessResolver({}), "boot", interval,
                          on_nvml_error=lambda kind: metrics.nvml_errors.labels(kind).inc())
    clock = Clock()
    return AgentService(sampler, sink or ListSink(), metrics, backoff_max_s=8.0, clock=clock), clock


def test_nvml_init_failures_are_retried_with_backoff_and_reported() -> None:
    nvml = FakeNvml([FakeGpu(gpu_uuid(0), 0)])
    nvml.init_failures = 4
    service, clock = build(nvml)
    attempts_at: list[float] = []
    start = clock.now
    for _ in range(40):  # 20 s of half-second ticks
        calls = nvml.init_calls
        sample = service.step()
        if nvml.init_calls > calls:
            attempts_at.append(clock.now - start)
        if sample is not None:
            break
        clock.now += 0.5
    # 1 s, 2 s, 4 s, 8 s (capped) apart, then the fifth attempt succeeds
    assert attempts_at == [0.0, 1.0, 3.0, 7.0, 15.0]
    assert sample is not None and sample.gpus[0].uuid == gpu_uuid(0)
    assert metric(service.metrics, "agent_nvml_init_failures_total", {"kind": "driver_not_loaded"}) == 4
    assert metric(service.metrics, "agent_nvml_up") == 1


def test_nvml_is_reinitialised_in_process_after_the_driver_goes_away() -> None:
    nvml = FakeNvml([FakeGpu(gpu_uuid(0), 0)])
    sink = ListSink()
    service, clock = build(nvml, sink)
    assert service.step() is not None
    nvml.driver_gone = True
    clock.now += 10
    assert service.step() is None
    assert metric(service.metrics, "agent_nvml_up") == 0
    assert metric(service.metrics, "agent_nvml_errors_total", {"kind": "driver_not_loaded"}) == 1
    assert nvml.shutdown_calls == 1
    clock.now += 10
    again = service.step()  # re-initialised (driver_gone cleared by init) without a restart
    assert again is not None and again.seq == 1 and nvml.init_calls == 2
    assert len(sink.sent) == 2 and all(key == "node-a" for key, _ in sink.sent)


def test_once_without_nvml_library_fails_with_the_reason() -> None:
    class NoLibrary(FakeNvml):
        def init(self) -> None:
            raise NvmlLibraryNotFound("NVML library (libnvidia-ml.so.1) not found")

    service, _ = build(NoLibrary([]))
    with pytest.raises(NvmlLibraryNotFound):
        service.run(threading.Event(), once=True)

    flaky = FakeNvml([FakeGpu(gpu_uuid(0), 0)])
    flaky.init_failures = 1
    service, _ = build(flaky)
    with pytest.raises(AgentError, match="NVML is not available"):
        service.run(threading.Event(), once=True)


def test_a_full_buffer_drops_and_counts_samples() -> None:
    service, clock = build(FakeNvml([FakeGpu(gpu_uuid(0), 0)]), ListSink(accept=False))
    for _ in range(3):
        service.step()
        clock.now += 10
    assert metric(service.metrics, "agent_samples_dropped_total") == 3
    assert metric(service.metrics, "agent_samples_produced_total") == 0


def test_broker_unreachable_buffers_up_to_the_bound_then_drops() -> None:
    settings = load_settings(
        AgentSettings, buffer_max_messages=10, producer=ProducerSettings(delivery_timeout_ms=1000),
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"),  # nothing listens on the discard port
    )
    nvml = FakeNvml([FakeGpu(gpu_uuid(i), i) for i in range(8)])
    metrics = AgentMetrics()
    sink = AgentKafkaSink(settings, metrics)
    sampler = NodeSampler("node-a", nvml, None, StaticProcessResolver({}), "boot", 1.0)
    service = AgentService(sampler, sink, metrics, clock=Clock())
    for _ in range(25):
        service.step()
    assert metric(metrics, "agent_samples_produced_total") == 10
    assert metric(metrics, "agent_samples_dropped_total") == 15
    assert metric(metrics, "agent_queue_depth") == 10
    # the buffered samples time out undelivered and are counted as delivery failures
    assert sink.close(10.0) == 0
    assert metric(metrics, "agent_delivery_failures_total") == 10


def test_metrics_endpoint_serves_the_agent_counters() -> None:
    nvml = FakeNvml([FakeGpu(gpu_uuid(0), 0, failing={"power_w": "unknown"}), FakeGpu(gpu_uuid(1), 1, lost=True)])
    service, _ = build(nvml)
    service.step()
    port = service.metrics.registry.serve(0, addr="127.0.0.1")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "gpulens_agent_samples_produced_total 1.0" in text
    assert 'gpulens_agent_nvml_errors_total{kind="unknown"} 1.0' in text
    assert 'gpulens_agent_nvml_errors_total{kind="gpu_lost"} 1.0' in text
    assert 'gpulens_agent_gpus{health="lost"} 1.0' in text
    assert 'gpulens_agent_gpus{health="degraded"} 1.0' in text
    assert "gpulens_agent_sample_duration_seconds_count 1.0" in text
    assert "gpulens_agent_queue_depth 0.0" in text
    assert "gpulens_agent_delivery_failures_total 0.0" in text


def test_next_tick_is_on_the_interval_grid() -> None:
    assert next_tick(100.0, 10.0) == 110.0
    assert next_tick(104.2, 10.0) == 110.0
    assert next_tick(109.999, 1.0) == 110.0


def test_the_loop_samples_on_the_grid_until_stopped() -> None:
    nvml = FakeNvml([FakeGpu(gpu_uuid(0), 0)])
    sink = ListSink()
    metrics = AgentMetrics()
    seen: list[datetime] = []
    sampler = NodeSampler("node-a", nvml, None, StaticProcessResolver({}), "boot", 1.0)
    service = AgentService(sampler, sink, metrics, before_sample=seen.append)
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,))
    thread.start()
    deadline = time.monotonic() + 10
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and sink.closed and not nvml.initialised
    assert len(seen) >= 3
    # after the first (immediate) sample, samples fall on whole seconds
    assert all(ts.microsecond < 300_000 for ts in seen[1:3]), seen  # generous: a loaded CI machine
    assert (seen[2] - seen[1]).total_seconds() == pytest.approx(1.0, abs=0.3)
