"""A store of N days of an M-GPU fleet, filled in minutes: simulated days played through the real
stages and the sink's write path, then extended in the engine.

Why not the sink alone: it writes 35-90k rows/s, so a month of 1,024 GPUs sampled every 10 s (about
265 M GPU rows) would take hours. The fill plays a few **template days** instead, and the engine
copies them:

1. **Played** (:func:`play_templates`): ``variants`` days of a template fleet (the demo fleet of
   :mod:`simulation.demo_fleet`: five teams, long training jobs that leave GPUs scattered, inference,
   notebooks that go idle holding VRAM, a crash-looping pod, a pending gang, a full-node job waiting
   on fragmentation, a reclaimed spot node; plus a MIG node, a time-sliced node, inference that
   follows the day, and batch jobs that start and end through it), each variant from its own seed,
   dated on consecutive days; every busy pod's utilisation wanders (:func:`_wandering`), so
   the gauges are not constants. Each day runs through :func:`simulation.replay.run_in_process` (the
   stream stages) and :func:`simulation.store.store_in_process` (the sink's :class:`BatchWriter`),
   so its rows are exactly the sink's.
2. **Extended** (:func:`extend`): every table's played rows are copied ``INSERT ... SELECT`` to the
   other ``copies - 1`` fleet copies (nodes, GPUs, pods, windows and alerts renamed with a ``~k<n>``
   suffix, the same per-GPU and per-pod figures) and to the other days (every time shifted by whole
   days from the variant that day plays; pods, windows and alerts renamed ``~d<n>`` as the new pods
   of that day; sequence numbers and Kafka offsets continued). Day ``d`` of copy ``k`` plays
   variant ``(d + k) % variants``, so neighbouring nodes and days differ. The fleet-wide capacity
   windows are one row per window, so the copies' figures are added up
   (:data:`CAPACITY_SUMS`) rather than copied. The rollup tables fill themselves: their
   materialized views run on every insert into ``pod_windows``.

Every table keeps its columns and natural key (tests/benchmarks/test_history_fill.py compares a
small fill with the same fleet through the sink). The store is cached under ``cache_dir`` by its
parameters (:meth:`FillSpec.key`); a fill that did not finish leaves no cache entry. A cached store
of the same parameters under an older schema is copied and brought forward by the store's own
migrations (as an upgrade of the product does: each new rollup is back-filled from the raw rows)
rather than filled again (:func:`upgrade`).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from common.metrics import MetricsRegistry
from common.settings import ClickHouseSettings, SinkSettings
from simulation.demo_fleet import demo_scenario
from simulation.replay import run_in_process
from simulation.scenario import Scenario, parse_scenario, step_value
from simulation.store import PREFIX, replay_records
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.ddl import TtlDays
from sinks.migrations import MIGRATIONS
from sinks.rollups import ROLLUPS
from sinks.service import prepare_store

FILL_VERSION = 4
"""Part of the cache key: a change to what the fill writes makes new stores."""

DAY_S = 86_400

TABLES = ("gpu_samples", "gpu_processes", "gpu_xids", "pod_states", "node_states", "state_tombstones", "k8s_events",
          "workload_progress", "pod_windows", "cluster_capacity", "mig_gpu_windows", "shared_gpu_windows",
          "pod_lifecycle", "alerts")
"""The tables the sink writes from topics (the rollups fill through their views; prices, the batch
journal and the migrations are the store's own)."""

MERGED = (*TABLES, "rollup_hourly", "rollup_daily", *(rollup.table.name for rollup in ROLLUPS))
"""Every table the fill writes, directly or through a view."""

NODE_COLUMNS = frozenset({"node", "gpu_uuid", "mig_parent_uuid", "agent_boot_id", "subject_node", "subject_gpu_uuid"})
"""Columns that name a node or a GPU: renamed per fleet copy only (a node is the same every day;
its sequence numbers go on: day ``d``'s start at ``d`` days of ticks)."""
POD_COLUMNS = frozenset({"pod_uid", "pod", "pod_name", "window_id", "id", "subject_name", "involved_uid",
                         "involved_name", "gang_id", "container_id", "key"})
"""Columns that name a pod, a window, an alert or an event: renamed per copy and per day (each
day's pods are new pods)."""
POD_ARRAYS = frozenset({"pod_uids", "pod_names", "owner_names", "container_ids"})
EXTRA_POD_COLUMNS = {"pod_states": frozenset({"uid", "name"}), "k8s_events": frozenset({"uid"}),
                     "pod_lifecycle": frozenset({"name"})}
"""Per table, the columns that name a pod under a generic name (``uid``, ``name``)."""
EXTRA_NODE_COLUMNS = {"node_states": frozenset({"uid"})}

CAPACITY_SUMS = ("gpus_total", "gpus_allocated", "gpus_busy", "gpus_idle_allocated", "gpus_free", "stranded_gpus",
                 "pending_pods", "pending_gpu_demand", "gpu_s_total", "gpu_s_allocated", "gpu_s_busy",
                 "gpu_s_idle_allocated", "gpu_s_free", "stranded_gpus_max", "mig_gpus", "mig_free_compute_slices",
                 "mig_free_memory_slices", "shared_gpus", "shared_vram_free_bytes", "shared_vram_stranded_bytes",
                 "shared_vram_pending_bytes")
"""Capacity figures of the whole fleet that add up over independent copies (the maximum of a window,
``stranded_gpus_max``, is bounded by the sum of the copies' maxima and taken as it)."""
CAPACITY_MAXES = ("largest_free_block", "shared_vram_largest_free_bytes")
CAPACITY_MAPS = ("mig_free_instances_by_profile", "mig_relayout_capacity_by_profile", "mig_pending_by_profile")
OFFSET_STRIDE = 10**10
"""Kafka offsets of copy ``n`` start ``n`` strides up: distinct, increasing, as a longer topic's."""


@dataclass(frozen=True)
class FillSpec:
    """What to fill: ``gpus`` (at least; whole template copies), ``days`` of history ending today."""

    gpus: int = 1024
    days: int = 30
    sample_interval_s: float = 10.0
    day_s: int = DAY_S
    """A day's length in the played scenarios (tests: a day in miniature)."""
    template_nodes: int = 8
    gpus_per_node: int = 8
    variants: int = 2
    """Distinct played days (seeds); the other days copy them."""
    end: str = ""
    """ISO date the history ends on (exclusive); empty: today (UTC)."""

    @property
    def template_gpus(self) -> int:
        return self.template_nodes * self.gpus_per_node + 2  # + one MIG GPU and one time-sliced GPU

    @property
    def copies(self) -> int:
        return max(1, -(-self.gpus // self.template_gpus))

    @property
    def fleet_gpus(self) -> int:
        return self.copies * self.template_gpus

    @property
    def played_days(self) -> int:
        return min(self.variants, self.days)

    @property
    def start(self) -> datetime:
        end = (datetime.fromisoformat(self.end).replace(tzinfo=UTC) if self.end
               else datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0))
        return end - timedelta(seconds=self.days * self.day_s)

    @property
    def ticks_per_day(self) -> int:
        return int(self.day_s / self.sample_interval_s)

    def key(self) -> str:
        """The cache key: every parameter, the fill's version and the store's schema (its last migration)."""
        return (f"v{FILL_VERSION}-m{MIGRATIONS[-1].version}-g{self.fleet_gpus}-d{self.days}"
                f"-i{self.sample_interval_s:g}-day{self.day_s}-t{self.template_nodes}x{self.gpus_per_node}-var{self.variants}-{self.start.date().isoformat()}")


def template_scenario(spec: FillSpec, variant: int) -> Scenario:
    """The template fleet's day ``variant`` (its own seed), dated ``variant`` days after the start."""
    day_m = spec.day_s / 60
    start = spec.start + timedelta(seconds=variant * spec.day_s)
    doc = demo_scenario(nodes=spec.template_nodes, gpus_per_node=spec.gpus_per_node, duration_m=day_m,
                        seed=7 + variant, start=start.isoformat().replace("+00:00", "Z"))
    # one name for every day: the simulator derives the GPUs' and nodes' ids from it (the same
    # hardware every day); each day's pods are new pods, named for their day
    doc["name"] = "history-template"
    doc["sample_interval"] = f"{spec.sample_interval_s:g}s"
    doc["prices"] = {**doc["prices"], "NVIDIA L4": 0.8}
    doc["nodes"] += [
        {"name": "gpu-mig", "gpus": 1, "mig": "1g.10gb"},
        {"name": "gpu-ts", "gpus": 1, "model": "NVIDIA L4", "memory_gib": 24, "time_slicing": 4},
    ]

    def at(fraction: float) -> str:
        return f"{day_m * fraction:g}m"

    pods: list[dict[str, Any]] = doc["pods"]
    # inference that follows the day: quiet at night, busy in working hours
    pods += [
        {"name": "mig-infer-a", "namespace": "serve", "gpus": 2, "resource": "nvidia.com/mig-1g.10gb",
         "util": [[0, 20], [at(0.35), 75], [at(0.75), 25]], "memory_gib": 8, "labels": {"team": "serve"}},
        {"name": "mig-empty", "namespace": "serve", "gpus": 1, "resource": "nvidia.com/mig-1g.10gb",
         "processes": 0, "labels": {"team": "serve"}},
        {"name": "chat-api", "namespace": "serve", "gpus": 1, "node": "gpu-ts",
         "util": [[0, 10], [at(0.35), 65], [at(0.8), 15]], "memory_gib": 6, "labels": {"team": "serve"}},
        {"name": "batch-eval", "namespace": "serve", "gpus": 1, "node": "gpu-ts", "util": 2, "memory_gib": 4,
         "labels": {"team": "serve"}},
    ]
    # batch jobs that start and end through the day (churn), on the GPUs the training jobs leave
    for j in range(6):
        pods.append({"name": f"batch-{j}", "namespace": "research", "gpus": 1, "create": at(0.1 + 0.13 * j),
                     "run_for": at(0.08), "util": [[0, 85], [at(0.04), 30]], "memory_gib": 20 + 3 * j,
                     "labels": {"team": "research", "project": "batch"}, "end": "Succeeded"})
    if variant:
        for pod in pods:
            pod["name"] = f"{pod['name']}-v{variant}"
            if "gang" in pod:
                pod["gang"] = f"{pod['gang']}-v{variant}"
    return parse_scenario(_wandering(doc, parse_scenario(doc), variant))


WANDER_STEP_S = 300.0
"""How often a busy pod's utilisation moves (the simulator holds a value until the next step)."""


def _wandering(doc: dict[str, Any], parsed: Scenario, variant: int) -> dict[str, Any]:
    """``doc`` with every busy stretch of every pod's utilisation moving: a seeded random walk of up
    to 8 points around the scenario's value, a step every :data:`WANDER_STEP_S`. Idle stretches
    (at most 5 %) stay as they are, so what is idle is the scenario's idle."""
    for pod, spec in zip(doc["pods"], parsed.pods, strict=True):
        rng = random.Random(f"{variant}/{pod['name']}")
        length = spec.run_for if spec.run_for is not None else parsed.duration_s
        points: list[list[Any]] = []
        walk = 0.0
        offset = 0.0
        while offset < length:
            base = step_value(spec.util, offset)
            if base > 5:
                walk = max(-8.0, min(8.0, walk + rng.choice((-2.0, -1.0, 0.0, 1.0, 2.0))))
                value = float(round(max(6.0, min(100.0, base + walk))))
            else:
                value = base
            if not points or points[-1][1] != value:
                points.append([f"{offset:g}s", value])
            next_step = offset + WANDER_STEP_S
            changes = [at for at, _ in spec.util if offset < at < next_step]
            offset = changes[0] if changes else next_step
        pod["util"] = points or [[0, 0]]
    return doc


def sink_settings(spec: FillSpec, path: Path) -> SinkSettings:
    """Settings of the store at ``path`` that keep the whole history (raw samples included), with the
    template fleet's list prices (the sink loads them into ``gpu_prices``, as an installation priced
    for its GPU models has them; without them every money figure of a report is unknown)."""
    keep = TtlDays.keeping(spec.start)
    return SinkSettings(data_dir=path.parent, clickhouse=ClickHouseSettings(url=f"chdb://{path}"),
                        raw_sample_ttl_days=keep.raw + spec.days, state_ttl_days=keep.state + spec.days,
                        rollup_ttl_days=keep.rollup + spec.days, max_future_skew_s=2 * DAY_S,
                        prices_usd_per_gpu_hour=template_scenario(spec, 0).prices)


@dataclass
class FillOutcome:
    spec: FillSpec
    path: Path
    cached: bool
    played_s: float = 0.0
    extended_s: float = 0.0
    merged_s: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)
    upgraded_from: str = ""
    """The cached store of an older schema this one was migrated from ("" when filled here)."""
    migrated_s: float = 0.0
    """Seconds the migrations (and the merge of what they wrote) took on that copy."""

    @property
    def gpu_rows_per_s(self) -> float:
        seconds = self.played_s + self.extended_s + self.merged_s
        return self.rows.get("gpu_samples", 0) / seconds if seconds else 0.0


SINK_BATCH_RECORDS = 10_000
"""Records per batch, the sink's default ``GPULENS_SINK_BATCH_MAX_ROWS``."""


def play_day(writer: BatchWriter, scenario: Scenario, offsets: dict[str, int]) -> dict[str, int]:
    """One scenario through the stages and the sink's write path: the records ``gpulens sink`` would
    read of its replay, in batches of :data:`SINK_BATCH_RECORDS`, at Kafka offsets continuing from
    ``offsets`` (per topic; updated), so the days of one store are one topic's records and their
    deduplication tokens differ."""
    rows: dict[str, int] = {}
    by_topic = replay_records(scenario, run_in_process(scenario))
    for topic in sorted(by_topic):
        base = offsets.get(topic, 0)
        records = [ConsumedRecord(topic, 0, base + i, None if key is None else key.encode(), value)
                   for i, (key, value) in enumerate(by_topic[topic])]
        offsets[topic] = base + len(records)
        for i in range(0, len(records), SINK_BATCH_RECORDS):
            chunk = records[i:i + SINK_BATCH_RECORDS]
            outcome, refused = writer.write(Batch(topic, 0, chunk, chunk[0].offset, chunk[-1].offset))
            if refused:
                raise RuntimeError(f"the sink's write path refused {len(refused)} record(s) of {scenario.name}: "
                                   f"{refused[0][1]}")
            for table, n in outcome.rows_by_table.items():
                rows[table] = rows.get(table, 0) + n
    return rows


def play_templates(spec: FillSpec, path: Path, variants: range | None = None) -> dict[str, int]:
    """Play the template days (``variants``: all) through the stages and the sink's write path into
    the store at ``path``."""
    settings = sink_settings(spec, path)
    store = prepare_store(settings)
    rows: dict[str, int] = {}
    offsets: dict[str, int] = {}
    try:
        writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays.from_settings(settings),
                             max_future_skew_s=settings.max_future_skew_s)
        for variant in variants if variants is not None else range(spec.played_days):
            for table, n in play_day(writer, template_scenario(spec, variant), offsets).items():
                rows[table] = rows.get(table, 0) + n
    finally:
        store.close()
    return rows


def _columns(store: ClickHouseStore, table: str) -> list[tuple[str, str]]:
    return [(str(r[0]), str(r[1])) for r in store.query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {t:String} "
        "ORDER BY position", {"t": table}).rows]


def _suffixed(column: str, suffix: str) -> str:
    return f"if({column} = '', {column}, concat({column}, {suffix}))"


def _expression(table: str, name: str, type_: str, node_sfx: str, pod_sfx: str, shift_s: str, day_shift: str,
                spec: FillSpec) -> str:
    """The ``SELECT`` expression of one column of a copied row."""
    if "DateTime" in type_:
        return f"{name} + toIntervalSecond({shift_s})"
    if type_ == "Date":
        return f"{name} + toIntervalDay({day_shift})"
    if name in NODE_COLUMNS | EXTRA_NODE_COLUMNS.get(table, frozenset()):
        return _suffixed(name, node_sfx)
    if name in POD_COLUMNS | EXTRA_POD_COLUMNS.get(table, frozenset()):
        return _suffixed(name, pod_sfx)
    if name in POD_ARRAYS:
        return f"arrayMap(x -> if(x = '', x, concat(x, {pod_sfx})), {name})"
    if name == "seq":
        return f"seq + toUInt64(day_d) * {spec.ticks_per_day}"
    if name == "kafka_offset":
        return f"kafka_offset + (copy_k * {spec.days} + day_d + 1) * {OFFSET_STRIDE}"
    return name


def _copy_sql(store: ClickHouseStore, spec: FillSpec, table: str, variant: int) -> str | None:
    """``INSERT ... SELECT`` of ``table``'s rows of played day ``variant`` to every (copy, day) that
    plays it, except the played one; None when nothing is to be copied."""
    targets = [(k, d) for k in range(spec.copies) for d in range(spec.days)
               if (d + k) % spec.played_days == variant and (k, d) != (0, variant)]
    if not targets:
        return None
    columns = _columns(store, table)
    node_sfx = "if(copy_k = 0, '', concat('~k', toString(copy_k)))"
    pod_sfx = (f"concat(if(copy_k = 0, '', concat('~k', toString(copy_k))), "
               f"if(day_d = {variant}, '', concat('~d', toString(day_d))))")
    day_shift = f"(toInt64(day_d) - {variant})"
    shift_s = f"{day_shift} * {spec.day_s}"
    select = ", ".join(f"{_expression(table, n, t, node_sfx, pod_sfx, shift_s, day_shift, spec)} AS `{n}`"
                       for n, t in columns)
    pairs = ", ".join(f"({k}, {d})" for k, d in targets)
    names = ", ".join(f"`{n}`" for n, _ in columns)
    return (f"INSERT INTO {table} ({names}) SELECT {select} FROM tmpl_{table} "
            f"ARRAY JOIN [{pairs}] AS target WHERE tmpl_variant = {variant} "
            f"SETTINGS insert_deduplicate = 0").replace(
        "copy_k", "target.1").replace("day_d", "target.2")


def _capacity_sql(store: ClickHouseStore, spec: FillSpec) -> str:
    """Every day's fleet capacity windows: the windows of that day's copies added up.

    A played window keeps its id; a window of another day is the id of copy 0's window with
    ``~d<day>``, as a pod window's."""
    columns = [n for n, _ in _columns(store, "cluster_capacity")]
    shift = f"toIntervalSecond((toInt64(target.2) - tmpl_variant) * {spec.day_s})"
    per_row: dict[str, str] = {name: name for name in columns}
    per_row |= {
        "window_start": f"window_start + {shift}", "window_end": f"window_end + {shift}",
        "free_gpus_by_node": ("mapApply((n, c) -> (if(target.1 = 0, n, concat(n, '~k', toString(target.1))), c), "
                              "free_gpus_by_node)"),
        "kafka_offset": f"kafka_offset + (target.2 + 1) * {OFFSET_STRIDE}",
    }
    inner = ", ".join(f"{expr} AS `{name}`" for name, expr in per_row.items() if name != "window_id")
    inner += (", if(target.1 = 0 AND target.2 = tmpl_variant, window_id, '') AS played_id"
              ", if(target.1 = 0, concat(window_id, '~d', toString(target.2)), '') AS copied_id")
    outer = []
    for name in columns:
        if name in ("cluster", "window_start", "window_end"):
            outer.append(f"`{name}`")
        elif name == "window_id":
            outer.append("if(max(played_id) != '', max(played_id), max(copied_id)) AS window_id")
        elif name in CAPACITY_SUMS:
            outer.append(f"sum(`{name}`) AS `{name}`")
        elif name in CAPACITY_MAXES:
            outer.append(f"max(`{name}`) AS `{name}`")
        elif name in CAPACITY_MAPS:
            outer.append(f"sumMap(`{name}`) AS `{name}`")
        elif name == "free_gpus_by_node":
            outer.append("mapFromArrays(groupArrayArray(mapKeys(free_gpus_by_node)), "
                         "groupArrayArray(mapValues(free_gpus_by_node))) AS free_gpus_by_node")
        else:
            outer.append(f"min(`{name}`) AS `{name}`")
    pairs = ", ".join(f"({k}, {d})" for k in range(spec.copies) for d in range(spec.days))
    names = ", ".join(f"`{n}`" for n in columns)
    return (f"INSERT INTO cluster_capacity ({names}) SELECT {', '.join(outer)} FROM ("
            f"SELECT {inner} FROM tmpl_cluster_capacity ARRAY JOIN [{pairs}] AS target "
            f"WHERE (target.2 + target.1) % {spec.played_days} = tmpl_variant) "
            f"GROUP BY cluster, window_start, window_end SETTINGS insert_deduplicate = 0")


def extend(store: ClickHouseStore, spec: FillSpec, progress: Callable[[str], None] = lambda _: None) -> None:
    """Copy the played days to every fleet copy and day (see the module's docstring)."""
    for table in TABLES:
        store.command(f"DROP TABLE IF EXISTS tmpl_{table}")
        store.command(f"CREATE TABLE tmpl_{table} ENGINE = MergeTree ORDER BY tuple() AS "
                      f"SELECT *, toUInt32(0) AS tmpl_variant FROM {table} WHERE 0")
        time_column = {"node_states": "ts", "state_tombstones": "at", "pod_states": "ts", "alerts": "started_at",
                       "gpu_xids": "ts", "pod_lifecycle": "created_at"}.get(table)
        time_column = time_column or next(n for n, t in _columns(store, table) if "DateTime" in t)
        start = spec.start.strftime("%Y-%m-%d %H:%M:%S")
        store.command(
            f"INSERT INTO tmpl_{table} SELECT *, toUInt32(greatest(0, least({spec.played_days - 1}, "
            f"intDiv(dateDiff('second', toDateTime64('{start}', 3, 'UTC'), {time_column}), {spec.day_s})))) "
            f"FROM {table} FINAL")
    store.command("TRUNCATE TABLE cluster_capacity")
    store.command(_capacity_sql(store, spec), settings={"max_threads": 2})
    for table in TABLES:
        if table == "cluster_capacity":
            continue
        started = time.perf_counter()
        for variant in range(spec.played_days):
            sql = _copy_sql(store, spec, table, variant)
            if sql is not None:
                store.command(sql, settings={"max_threads": 2, "max_insert_threads": 2})
        progress(f"extended {table} in {time.perf_counter() - started:.0f} s")
    for table in TABLES:
        store.command(f"DROP TABLE IF EXISTS tmpl_{table}")


def _merge(store: ClickHouseStore) -> None:
    """Merge every table's parts (a month-old store's parts are merged: measure that, not a fresh
    fill's many parts); partitions already merged into one part are left as they are."""
    for table in MERGED:
        store.command(f"OPTIMIZE TABLE {table} FINAL", settings={"optimize_skip_merged_partitions": 1})


def _row_counts(store: ClickHouseStore) -> dict[str, int]:
    return {table: int(store.query(f"SELECT count() FROM {table}").rows[0][0]) for table in MERGED}


def _older_store(spec: FillSpec, cache_dir: Path) -> Path | None:
    """The finished cached store of ``spec`` under the newest older schema (same fill version and
    parameters, a lower last migration), if any."""
    prefix = f"v{FILL_VERSION}-m"
    version, rest = spec.key()[len(prefix):].split("-", 1)
    older = []
    for entry in cache_dir.glob(f"{prefix}*-{rest}"):
        schema = entry.name[len(prefix):].split("-", 1)[0]
        if schema.isdigit() and int(schema) < int(version) and (entry / "fill.json").exists():
            older.append((int(schema), entry))
    return max(older)[1] if older else None


def upgrade(spec: FillSpec, older: Path, target: Path, progress: Callable[[str], None] = lambda _: None) -> FillOutcome:
    """A copy of the cached store ``older`` (``spec`` under an older schema) at ``target`` (a cache
    entry's directory), brought to the current schema by the store's migrations, then merged."""
    shutil.copytree(older, target, symlinks=True, ignore=shutil.ignore_patterns("fill.json"))
    data = json.loads((older / "fill.json").read_text())
    path = target / "clickhouse"
    started = time.perf_counter()
    store = prepare_store(sink_settings(spec, path))
    try:
        progress(f"migrated a copy of {older.name} in {time.perf_counter() - started:.0f} s")
        _merge(store)
        rows = _row_counts(store)
    finally:
        store.close()
    return FillOutcome(spec, path, True, data["played_s"], data["extended_s"], data["merged_s"], rows,
                       upgraded_from=older.name, migrated_s=time.perf_counter() - started)


def fill(spec: FillSpec, cache_dir: Path, merge: bool = True,
         progress: Callable[[str], None] = lambda _: None) -> FillOutcome:
    """The store of ``spec`` under ``cache_dir`` (the cached one, one of an older schema migrated, or
    filled now); ``progress`` is told of each step of a fill (the full size takes about half an hour)."""
    path = cache_dir / spec.key() / "clickhouse"
    done = path.parent / "fill.json"
    if done.exists():
        data = json.loads(done.read_text())
        return FillOutcome(spec, path, True, data["played_s"], data["extended_s"], data["merged_s"], data["rows"],
                           data.get("upgraded_from", ""), data.get("migrated_s", 0.0))
    if path.parent.exists():
        shutil.rmtree(path.parent)  # a fill or an upgrade that did not finish
    older = _older_store(spec, cache_dir) if merge else None
    if older is not None:
        outcome = upgrade(spec, older, path.parent, progress)
    else:
        outcome = _fill_new(spec, path, merge, progress)
    done.write_text(json.dumps({"spec": asdict(spec), "played_s": outcome.played_s, "extended_s": outcome.extended_s,
                                "merged_s": outcome.merged_s, "rows": outcome.rows,
                                "upgraded_from": outcome.upgraded_from, "migrated_s": outcome.migrated_s}, indent=2))
    return outcome


def _fill_new(spec: FillSpec, path: Path, merge: bool, progress: Callable[[str], None]) -> FillOutcome:
    path.parent.mkdir(parents=True)
    started = time.perf_counter()
    play_templates(spec, path)
    outcome = FillOutcome(spec, path, False, played_s=time.perf_counter() - started)
    progress(f"played {spec.played_days} template days in {outcome.played_s:.0f} s")
    store = open_store(f"chdb://{path}")
    try:
        started = time.perf_counter()
        extend(store, spec, progress)
        outcome.extended_s = time.perf_counter() - started
        started = time.perf_counter()
        if merge:
            _merge(store)
            progress(f"merged in {time.perf_counter() - started:.0f} s")
        outcome.merged_s = time.perf_counter() - started
        outcome.rows = _row_counts(store)
    finally:
        store.close()
    return outcome
