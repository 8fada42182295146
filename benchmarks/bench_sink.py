"""Sink figures: rows/s the sink sustains for GPU samples end to end from Kafka (decode, pivot,
journal, deduplicated insert, commit), next to a plain column-oriented insert of the same rows into
the same engine in the same run (per wall-clock second, the target's measure, and per CPU second of
this process, which other jobs on a shared machine disturb less); and bytes on disk per GPU sample
and per metric column, from ``system.parts_columns`` after the parts are merged (target <= 1.5
bytes per gauge value).

The samples are synthetic but shaped like NVML's: integer utilisation percentages that drift,
power in milliwatts, whole-degree temperatures, memory that steps, clocks that rarely change.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks.harness import Context, Result, stat_cpu_s
from common.kafka import BoundedProducer, ensure_topics
from common.settings import ClickHouseSettings, ProducerSettings, SinkSettings
from schemas import codec
from schemas.messages import GpuProcess, GpuReading, GpuSample, PodRef
from schemas.topics import GPU_SAMPLES
from sinks.clickhouse import ClickHouseStore
from sinks.rows import TableColumns, rows_for
from sinks.service import prepare_store
from sinks.sink import ClickHouseSink

BENCH = "sink"
BASELINE_ROUNDS = 3
SINK_ROUNDS = BASELINE_ROUNDS
GIB = 1024**3
GAUGES = ("gpu_util_pct", "mem_util_pct", "mem_used_bytes", "power_w", "temperature_c", "sm_clock_mhz",
          "mem_clock_mhz", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")


def _samples(nodes: int, per_node: int, start: datetime, seed: int = 7) -> list[GpuSample]:
    rng = random.Random(seed)
    util = {(n, g): rng.randint(0, 100) for n in range(nodes) for g in range(8)}
    mem = {(n, g): rng.randint(0, 80) * GIB for n in range(nodes) for g in range(8)}
    out: list[GpuSample] = []
    for seq in range(per_node):
        for n in range(nodes):
            gpus = []
            for g in range(8):
                key = (n, g)
                util[key] = max(0, min(100, util[key] + rng.choice((-3, -1, 0, 0, 0, 1, 3))))
                if rng.random() < 0.01:
                    mem[key] = rng.randint(0, 80) * GIB
                u = util[key]
                gpus.append(GpuReading(
                    uuid=f"GPU-{n:03d}-{g}", index=g, model="NVIDIA H100 80GB HBM3",
                    gpu_util_pct=float(u), mem_util_pct=float(u // 2), mem_used_bytes=mem[key],
                    mem_total_bytes=80 * GIB, power_w=round(70 + 6.3 * u + rng.gauss(0, 4), 3),
                    temperature_c=float(35 + u // 4), sm_clock_mhz=1980 if u else 345, mem_clock_mhz=2619,
                    pcie_tx_bytes_per_s=float(u * 10_000_000), pcie_rx_bytes_per_s=float(u * 20_000_000),
                    assigned_to=[PodRef(namespace="research", pod=f"job-{n}", container="main", pod_uid=f"uid-{n}")],
                    processes=[GpuProcess(pid=4000 + g, pod_uid=f"uid-{n}", mem_used_bytes=mem[key])],
                ))
            out.append(GpuSample(node=f"node-{n:03d}", ts=start + timedelta(seconds=10 * seq),
                                 agent_boot_id=f"boot-{n}", seq=seq, sample_interval_s=10.0, gpus=gpus))
    return out


THREAD_GROUPS = (("interpreter threads", ("python",)), ("engine insert threads", ("ThreadPool",)),
                 ("engine merges", ("MergeMutate",)), ("Kafka client", ("rdk:",)))
"""Where the sink's CPU goes, by the operating system's name of each thread of this process: the
interpreter's own (decoding, rows, the driver's serialisation), chDB's and librdkafka's."""


def _cpu_by_thread() -> dict[str, tuple[str, float]]:
    """CPU seconds so far of each live thread of this process, with its :data:`THREAD_GROUPS` label
    (empty without /proc)."""
    threads: dict[str, tuple[str, float]] = {}
    tasks = Path("/proc/self/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            name, cpu_s = (task / "comm").read_text().strip(), stat_cpu_s(task / "stat")
        except OSError:  # the thread ended meanwhile
            continue
        group = next((label for label, prefixes in THREAD_GROUPS if name.startswith(prefixes)), "other")
        threads[task.name] = (group, cpu_s)
    return threads


def _cpu_by_group_since(before: dict[str, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per group since ``before``, of the threads alive now (those that ended in between,
    such as the sink's Kafka consumer's, are not counted)."""
    seconds: dict[str, float] = {}
    for tid, (group, cpu_s) in _cpu_by_thread().items():
        seconds[group] = seconds.get(group, 0.0) + cpu_s - before.get(tid, (group, 0.0))[1]
    return seconds


@dataclass
class SinkRound:
    """One run of the sink over the whole topic."""

    rows: int
    rows_per_s: float
    cpu_s: float
    threads: dict[str, float]
    batches: int


def _sink_round(settings: SinkSettings, store: ClickHouseStore, topic: str) -> SinkRound:
    """The sink over ``topic`` from its start, in a group of its own, until caught up and idle."""
    sink = ClickHouseSink(settings, store)
    cpu_started, threads_before = time.process_time(), _cpu_by_thread()
    totals = sink.run(exit_when_idle_s=2.0)
    cpu_s = time.process_time() - cpu_started
    threads = _cpu_by_group_since(threads_before)
    batches = int(sink.registry.registry.get_sample_value("gpulens_sink_batches_total", {"topic": topic}) or 0)
    rows = totals.rows_by_table.get("gpu_samples", 0)
    assert totals.first_record_at is not None and totals.last_commit_at is not None
    return SinkRound(rows, rows / (totals.last_commit_at - totals.first_record_at), cpu_s, threads, batches)


def run(ctx: Context) -> list[Result]:
    nodes, per_node = (40, 60) if ctx.quick else (100, 240)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=10 * per_node)
    samples = _samples(nodes, per_node, start)
    n_samples = len(samples)
    # one topic per round: a round reading the topic of the round before would be an insert of
    # blocks already stored (their deduplication tokens name the topic), which the engine drops
    prefixes = [f"{ctx.topic_prefix}-sink{round_}" for round_ in range(SINK_ROUNDS)]
    producer = BoundedProducer(ctx.kafka, ProducerSettings(linger_ms=20, queue_max_messages=len(samples) + 1000))
    for prefix in prefixes:
        ensure_topics(ctx.kafka, [GPU_SAMPLES], prefix)
        for sample in samples:
            while not producer.produce(GPU_SAMPLES.name(prefix), sample.node, codec.encode(sample)):
                producer.poll(0.05)
        producer.flush(120)
    # the sink runs as in its own process, holding nothing else: the baseline's rows are built
    # again (the same seed and start) once it is done
    del samples

    data_dir = ctx.scratch / f"sink-{int(time.time())}"
    # batches of at most 2,000 samples, the baseline's blocks below, at the sink's default batch
    # age (0.2 s cut the batches of the topic's 12 partitions at 1,000 samples on average, some at 8)
    settings = [SinkSettings(kafka=ctx.kafka, topic_prefix=prefix, data_dir=data_dir, group_id=f"{prefix}-sink",
                             clickhouse=ClickHouseSettings(url=f"chdb://{data_dir / 'clickhouse'}"),
                             batch_max_rows=2000) for prefix in prefixes]
    store = prepare_store(settings[0])
    try:
        # as many rounds as the baseline's, each into empty tables, and the round of the median
        # figure: one round swung between 62,000 and 85,000 rows/s on the 2-core machine
        sink_rounds: list[SinkRound] = []
        for round_settings in settings:
            for table in ("gpu_samples", "gpu_processes"):
                store.command(f"TRUNCATE TABLE {table}")
            sink_rounds.append(_sink_round(round_settings, store, GPU_SAMPLES.name(round_settings.topic_prefix)))
        sink_round = sorted(sink_rounds, key=lambda r: r.rows_per_s)[len(sink_rounds) // 2]
        rows, sink_rps, threads = sink_round.rows, sink_round.rows_per_s, sink_round.threads

        # baseline: the same rows, already decoded and pivoted, inserted column-oriented in batches
        samples = _samples(nodes, per_node, start)
        batches: list[TableColumns] = []
        for i in range(0, len(samples), 2000):
            columns = TableColumns()
            for offset, sample in enumerate(samples[i:i + 2000], start=i):
                for table, row in rows_for(sample, 0, offset):
                    if table == "gpu_samples":
                        columns.append(row)
            batches.append(columns)
        # three rounds, each into a fresh table (a repeated block would be deduplicated), and the
        # median: a single round swung between 70,000 and 120,000 rows/s on the 2-core machine
        rounds: list[tuple[float, float]] = []
        for round_ in range(BASELINE_ROUNDS):
            store.command(f"CREATE TABLE IF NOT EXISTS bench_samples_{round_} AS gpu_samples")
            started, cpu_started = time.perf_counter(), time.process_time()
            for columns in batches:
                store.insert(f"bench_samples_{round_}", columns.columns)
            rounds.append((time.perf_counter() - started, time.process_time() - cpu_started))
        plain_s, plain_cpu_s = statistics.median(s for s, _ in rounds), statistics.median(c for _, c in rounds)
        plain_rows = sum(b.n_rows for b in batches)
        plain_rps = plain_rows / plain_s

        # per-column sizes are only tracked in wide parts: copy into a table that always writes them
        store.command("CREATE TABLE IF NOT EXISTS bench_wide AS gpu_samples")
        store.command("ALTER TABLE bench_wide MODIFY SETTING min_bytes_for_wide_part = 0, min_rows_for_wide_part = 0")
        store.command("INSERT INTO bench_wide SELECT * FROM gpu_samples")
        store.command("OPTIMIZE TABLE bench_wide FINAL")
        per_column = {str(r[0]): float(r[1]) for r in store.query(
            "SELECT column, sum(column_data_compressed_bytes) / sum(rows) FROM system.parts_columns "
            "WHERE active AND table = 'bench_wide' AND database = currentDatabase() GROUP BY column").rows}
        stored_rows = int(store.query("SELECT count() FROM gpu_samples").rows[0][0])
    finally:
        store.close()
    per_sample = sum(per_column.values())
    gauges = {name: per_column[name] for name in GAUGES}
    results = [
        Result(BENCH, "samples end to end (Kafka -> ClickHouse)", sink_rps, "rows/s",
               baseline="plain column insert", ratio_to_baseline=sink_rps / plain_rps,
               notes=f"median of {SINK_ROUNDS} rounds: " + ", ".join(f"{r.rows_per_s:.0f}" for r in sink_rounds)
               + f"; {rows} GPU rows from {n_samples} node samples in {sink_round.batches} batches; "
               f"stored {stored_rows}"),
        Result(BENCH, "plain column-oriented insert", plain_rps, "rows/s",
               notes=f"median of {BASELINE_ROUNDS} rounds: " + ", ".join(f"{plain_rows / s:.0f}" for s, _ in rounds)),
        # CPU seconds of this process (all its threads), less sensitive than wall time to other jobs
        # on a shared machine; the sink's include its whole run (start-up and the idle wait at the
        # end), of the median round
        Result(BENCH, "samples end to end, per CPU second", rows / sink_round.cpu_s, "rows/s",
               baseline="plain column insert, per CPU second",
               ratio_to_baseline=(rows / sink_round.cpu_s) / (plain_rows / plain_cpu_s)),
        *(Result(BENCH, f"sink CPU: {label}", threads[label], "s",
                 notes="the sink's run, by thread name; threads that ended during it not counted")
          for label, _ in (*THREAD_GROUPS, ("other", ())) if label in threads),
        Result(BENCH, "bytes on disk per GPU sample", per_sample, "bytes", notes="all columns, merged parts"),
        Result(BENCH, "bytes per gauge value (mean)", sum(gauges.values()) / len(gauges), "bytes", target="<= 1.5"),
    ]
    results += [Result(BENCH, f"bytes per value: {name}", value, "bytes", target="<= 1.5")
                for name, value in gauges.items()]
    return results
