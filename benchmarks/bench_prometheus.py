"""Cost of the stream workers' fleet series on ``/metrics`` for a 512-node, 4,096-GPU fleet.

One pod per GPU (4,096 pod-GPUs in 64 teams), an idle alert open on one GPU in ten, 50 pods pending
past the threshold and a capacity record: about 33,000 series, what all workers of such a fleet
export together (docs/prometheus.md). Measured in this process:

- worker CPU to take one window's records in (``FleetSeries.observe``, per window of the fleet);
- a scrape over HTTP of the same server the worker runs (``MetricsRegistry.serve``): wall time and
  size of the text exposition, and the CPU of rendering it (``render()``, what the worker's
  server thread spends per scrape);
- baseline, measured in the same run: the same series (names, label names and values) as plain
  prometheus_client ``Gauge`` children in a registry of their own, rendered and scraped the same
  way. The ratio says what computing the families at scrape time costs over static gauges.
"""

from __future__ import annotations

import statistics
import time
import urllib.request
from datetime import UTC, datetime, timedelta

from benchmarks.harness import Context, Result
from common.metrics import MetricsRegistry
from schemas.messages import Message
from schemas.outputs import Alert, AlertSubject, ClusterCapacity, PodWindow
from stream_jobs.fleet_metrics import FleetSeries

BENCH = "prometheus"
NODES = 512
GPUS_PER_NODE = 8
TEAMS = 64
PENDING = 50
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
GIB = 2**30


def _windows(start: datetime) -> list[PodWindow]:
    out = []
    for n in range(NODES):
        for g in range(GPUS_PER_NODE):
            i = n * GPUS_PER_NODE + g
            out.append(PodWindow(
                window_id=f"w{i}-{start.timestamp()}", pod_uid=f"uid-{i}", namespace=f"team-{i % TEAMS}",
                pod=f"job-{i // 4}-worker-{i % 4}", node=f"gpu-node-{n:03d}", gpu_uuid=f"GPU-{i:08x}-0000-0000",
                gpu_model="NVIDIA H100 80GB HBM3", window_start=start, window_end=start + timedelta(seconds=60),
                team=f"team-{i % TEAMS}", allocated_s=60.0, busy_s=50.0, idle_s=10.0, samples=6,
                avg_sm_util_pct=float(i % 100), avg_mem_used_bytes=float((i % 80) * GIB), share_fraction=1.0,
                cost_usd=0.05, gpu_index=g, container="main", mem_total_bytes=80 * GIB, avg_power_w=300.0))
    return out


def _alerts() -> list[Message]:
    out: list[Message] = []
    for i in range(0, NODES * GPUS_PER_NODE, 10):
        out.append(Alert(id=f"idle-{i}", type="idle_gpu", severity="warning", state="firing", at=T0,
                         started_at=T0, summary="idle", details={"idle_class": "vram_held"},
                         subject=AlertSubject(kind="pod", namespace=f"team-{i % TEAMS}",
                                              name=f"job-{i // 4}-worker-{i % 4}", gpu_uuid=f"GPU-{i:08x}-0000-0000")))
    for p in range(PENDING):
        out.append(Alert(id=f"pending-{p}", type="pending_gpu", severity="warning", state="firing", at=T0,
                         started_at=T0, summary="pending", details={"pending_s": 600.0, "gpus": 8},
                         subject=AlertSubject(kind="pod", namespace="team-0", name=f"waiting-{p}")))
    out.append(ClusterCapacity(window_id="c", window_start=T0, window_end=T0 + timedelta(seconds=60),
                               gpus_total=4096, gpus_allocated=4000, gpus_busy=3600, gpus_idle_allocated=400,
                               gpus_free=96, largest_free_block=4, stranded_gpus=40, pending_pods=PENDING,
                               pending_gpu_demand=400))
    return out


def _baseline(text: str) -> MetricsRegistry:
    """Static gauges with the very series the fleet export rendered (parsed back from its text)."""
    from prometheus_client.parser import text_string_to_metric_families

    registry = MetricsRegistry(namespace="")
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(("DCGM_", "gpulens_pod", "gpulens_team", "gpulens_cluster")):
            continue
        labels = tuple(family.samples[0].labels) if family.samples else ()
        gauge = registry.gauge(family.name, family.documentation, labels)
        for sample in family.samples:
            (gauge.labels(*sample.labels.values()) if labels else gauge).set(sample.value)
    return registry


def _scrape(port: int, rounds: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as answer:
            size = len(answer.read())
        times.append(time.perf_counter() - started)
    return statistics.median(times), size


def _render_cpu(registry: MetricsRegistry, rounds: int) -> float:
    started = time.process_time()
    for _ in range(rounds):
        registry.render()
    return (time.process_time() - started) / rounds


def run(ctx: Context) -> list[Result]:
    rounds = 3 if ctx.quick else 10
    fleet_registry = MetricsRegistry()
    fleet = FleetSeries(fleet_registry, max_series=1_000_000)
    fleet.observe(_windows(T0))
    fleet.observe(_alerts())
    observe_cpu = []
    for k in range(1, rounds + 1):  # each round: the fleet's next window, node by node as the stages emit
        windows = _windows(T0 + timedelta(seconds=60 * k))
        started = time.process_time()
        for n in range(NODES):
            fleet.observe(windows[n * GPUS_PER_NODE:(n + 1) * GPUS_PER_NODE])
        observe_cpu.append(time.process_time() - started)
    text = fleet_registry.render()
    series = sum(1 for line in text.splitlines()
                 if line.startswith(("DCGM_", "gpulens_pod", "gpulens_team", "gpulens_cluster")))
    baseline = _baseline(text)
    base_text = baseline.render()
    base_series = sum(1 for line in base_text.splitlines() if line and not line.startswith("#"))
    assert base_series == series, (base_series, series)

    fleet_port = fleet_registry.serve(0, addr="127.0.0.1")
    base_port = baseline.serve(0, addr="127.0.0.1")
    _scrape(fleet_port, 1)
    _scrape(base_port, 1)
    fleet_wall, fleet_size = _scrape(fleet_port, rounds)
    base_wall, base_size = _scrape(base_port, rounds)
    fleet_cpu = _render_cpu(fleet_registry, rounds)
    base_cpu = _render_cpu(baseline, rounds)
    per_window = statistics.median(observe_cpu)
    fleet_desc = f"{NODES} nodes, {NODES * GPUS_PER_NODE} GPUs, {series} series"
    base = f"prometheus_client Gauges, same {base_series} series"
    return [
        Result(BENCH, "fleet series exported", series, "series", notes=fleet_desc),
        Result(BENCH, "scrape wall time (HTTP, median)", fleet_wall * 1e3, "ms", base, fleet_wall / base_wall),
        Result(BENCH, "scrape size (text exposition)", fleet_size / 2**20, "MiB", base, fleet_size / base_size),
        Result(BENCH, "worker CPU per scrape (render)", fleet_cpu * 1e3, "ms CPU", base, fleet_cpu / base_cpu),
        Result(BENCH, "worker CPU at a 30 s scrape interval", 100 * fleet_cpu / 30.0, "% core", base,
               fleet_cpu / base_cpu),
        Result(BENCH, "worker CPU to take in a window of the fleet", per_window * 1e3, "ms CPU",
               notes=f"{NODES * GPUS_PER_NODE} windows, observe() per node; per 60 s window: "
                     f"{100 * per_window / 60:.2f} % of a core"),
    ]
