"""The rollups (``rollup_hourly``, ``rollup_daily``: materialized views over ``pod_windows``;
``gpu_hourly`` over ``gpu_samples``) give the raw windows' and samples' figures, on a history store
filled by the history benchmark's bulk path (benchmarks/history/fill.py: played days through the
sink's write path, copies ``INSERT ... SELECT``),
and a batch the sink stores again does not make them count twice:

- per team, namespace, project, node and GPU model, per hour and per day: GPU-hours (allocated,
  busy, idle, gap), utilisation hours, energy and cost equal the sums over ``pod_windows FINAL``
  (to float rounding), window counts and peak VRAM exactly;
- per GPU and hour, and per GPU from a start inside an hour (:func:`sinks.rollups.gpu_rows_since`, as
  the advisor reads it): sample counts, seconds (all, unallocated, allocated but idle), memory, first
  and last sample time equal those of ``gpu_samples FINAL``;
- per pod and GPU, per hour and per day (``pod_hourly``, ``pod_daily``), per pod, GPU and hour over
  its active windows (``pod_active_hourly``), per pod and day (``progress_daily``, and
  ``shared_gpu_daily`` over its windows on shared GPUs): every measure equals its aggregate over
  ``pod_windows FINAL`` (or ``workload_progress FINAL``; the stamps the node stage gave the windows
  computed from the stored windows of each start), and so do the pod figures from a start inside an
  hour (:meth:`sinks.rollups.Rollup.rows_since`);
- the report's sections that read the rollups (``team_daily``, ``team_hourly``: fleet summary,
  top teams and projects, idle by team and class, cost by team, utilisation by team per hour and
  per day; ``pod_daily`` and ``progress_daily``: top pods, pods, cost per unit of work) equal the
  same analyses written directly in SQL over ``pod_windows FINAL`` and ``workload_progress FINAL``;
- a played day's window batch written again, as the sink's retry writes it (the same offsets: the
  same deduplication token) and as a worker replay delivers it (the same windows at new offsets),
  changes neither the raw windows nor a rollup figure.
"""

from __future__ import annotations

from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from benchmarks.history.fill import FillOutcome, FillSpec, fill, sink_settings, template_scenario
from common.metrics import MetricsRegistry
from reports.analyses import report_period, run_report
from reports.reader import round_floats, scoped
from reports.timeseries import utilisation_by_team
from schemas.topics import POD_WINDOWS
from simulation.replay import run_in_process
from simulation.store import PREFIX, replay_records
from sinks import rollups
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.ddl import TtlDays
from sinks.rollups import PRICE
from tests.sinks.test_pod_rollups import Figures, assert_figures_equal, raw_figures, rollup_figures

SPEC = FillSpec(gpus=32, days=3, day_s=3600, template_nodes=4, gpus_per_node=4, variants=2)
KEYS = "cluster, namespace, team, project, node, gpu_model"
SUMS = ("allocated_gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "gap_gpu_hours", "util_pct_x_hours", "util_hours",
        "energy_kwh", "cost_usd")
RAW = f"""
SELECT {{period}} AS period, {KEYS},
    sum(allocated_s) / 3600 AS allocated_gpu_hours, sum(busy_s) / 3600 AS busy_gpu_hours,
    sum(idle_s) / 3600 AS idle_gpu_hours, sum(gap_s) / 3600 AS gap_gpu_hours,
    sumIf(coalesce(avg_sm_util_pct, 0) * allocated_s, avg_sm_util_pct IS NOT NULL) / 3600 AS util_pct_x_hours,
    sumIf(allocated_s, avg_sm_util_pct IS NOT NULL) / 3600 AS util_hours,
    sum(coalesce(energy_j, 0)) / 3600000 AS energy_kwh, sum(cost_usd) AS cost_usd,
    max(coalesce(max_mem_used_bytes, 0)) AS peak_mem_bytes, count() AS windows
FROM pod_windows FINAL GROUP BY period, {KEYS}"""
ROLLUP = f"""
SELECT {{period}} AS period, {KEYS}, {', '.join(f'sum({s}) AS {s}' for s in SUMS)},
    max(peak_mem_bytes) AS peak_mem_bytes, sum(windows) AS windows
FROM {{table}} GROUP BY period, {KEYS}"""


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> FillOutcome:
    return fill(SPEC, tmp_path_factory.mktemp("history-rollups"))


def _figures(store: ClickHouseStore, sql: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows = store.query(sql).dicts()
    return {tuple(str(r[k]) for k in ("period", *KEYS.split(", "))): r for r in rows}


def _assert_equal(raw: dict[tuple[Any, ...], dict[str, Any]], rolled: dict[tuple[Any, ...], dict[str, Any]]) -> None:
    assert raw and set(raw) == set(rolled)
    for key, row in raw.items():
        other = rolled[key]
        assert other["windows"] == row["windows"] and other["peak_mem_bytes"] == row["peak_mem_bytes"], key
        for name in SUMS:
            assert other[name] == pytest.approx(row[name], rel=1e-9, abs=1e-9), (key, name)


def _everything(store: ClickHouseStore) -> list[dict[tuple[Any, ...], dict[str, Any]]]:
    return [_figures(store, RAW.format(period="toStartOfHour(window_start)")),
            _figures(store, ROLLUP.format(period="hour", table="rollup_hourly")),
            _figures(store, RAW.format(period="toDate(window_start)")),
            _figures(store, ROLLUP.format(period="day", table="rollup_daily"))]


def test_rollups_equal_the_raw_windows(filled: FillOutcome) -> None:
    with closing(open_store(f"chdb://{filled.path}")) as store:
        raw_hourly, hourly, raw_daily, daily = _everything(store)
        _assert_equal(raw_hourly, hourly)
        _assert_equal(raw_daily, daily)
        copies = {str(r[0]) for r in store.query("SELECT DISTINCT node FROM rollup_hourly").rows}
        assert any("~k1" in node for node in copies), "the fleet copies are rolled up too"


POD_ROLLUPS = (rollups.POD_HOURLY, rollups.POD_DAILY, rollups.PROGRESS_DAILY, rollups.POD_ACTIVE_HOURLY,
               rollups.SHARED_GPU_DAILY)
"""Those with a measure per pod: the active windows' and shared GPUs' rollups read the node stage's
stamps, which their raw figures compute from the stored windows of each start."""


def _pod_figures(store: ClickHouseStore) -> list[tuple[Figures, Figures]]:
    """(raw, rolled) figures of every pod rollup per its keys and period."""
    keys = [("cluster", rollup.period, *rollup.keys) for rollup in POD_ROLLUPS]
    return [(raw_figures(store, rollup, k), rollup_figures(store, rollup, k)) for rollup, k in zip(POD_ROLLUPS, keys,
                                                                                                    strict=True)]


def test_the_pod_rollups_equal_the_raw_windows_and_progress(filled: FillOutcome) -> None:
    with closing(open_store(f"chdb://{filled.path}")) as store:
        for rollup, (raw, rolled) in zip(POD_ROLLUPS, _pod_figures(store), strict=True):
            assert_figures_equal(raw, rolled, rollup.table.name)
        pods = int(store.query("SELECT uniqExact(pod_uid) FROM pod_windows").rows[0][0])
        assert len({key[2] for key in rollup_figures(store, rollups.POD_DAILY, ("cluster", "day", "pod_uid"))}) == pods

        # from a start inside an hour, and on the hour, as the advisor asks
        first, last = (datetime.fromtimestamp(int(ms) / 1000, UTC) for ms in store.query(
            "SELECT toUnixTimestamp64Milli(min(window_start)), toUnixTimestamp64Milli(max(window_start)) "
            "FROM pod_windows").rows[0])
        keys = ("cluster", *rollups.POD_HOURLY.keys)
        on_the_hour = first.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        for start in (first + (last - first) / 3 + timedelta(seconds=1234.5), on_the_hour):
            params = {"start": start.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]}
            raw = raw_figures(store, rollups.POD_HOURLY, keys,
                              "window_start >= toDateTime64({start:String}, 3, 'UTC')", params)
            assert_figures_equal(raw, rollup_figures(store, rollups.POD_HOURLY, keys,
                                                     rollups.POD_HOURLY.rows_since("start"), params), f"since {start}")


def test_a_batch_stored_again_is_not_counted_twice(filled: FillOutcome) -> None:
    scenario = template_scenario(SPEC, 0)
    records = replay_records(scenario, run_in_process(scenario))[POD_WINDOWS.name(PREFIX)]
    settings = sink_settings(SPEC, filled.path)
    with closing(open_store(f"chdb://{filled.path}")) as store:
        before = _everything(store)
        pods_before = _pod_figures(store)
        raw_rows = store.query("SELECT count() FROM pod_windows").rows[0][0]
        writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays.from_settings(settings),
                             max_future_skew_s=settings.max_future_skew_s)
        topic = POD_WINDOWS.name(PREFIX)
        # the played day's first batch as the fill stored it (the sink's retry: the same token), then
        # the same windows at offsets no batch had (a worker's replay: new tokens)
        for first in (0, 10**9):
            batch = [ConsumedRecord(topic, 0, first + i, None if k is None else k.encode(), v)
                     for i, (k, v) in enumerate(records[:2000])]
            writer.write(Batch(topic, 0, batch, batch[0].offset, batch[-1].offset))
        assert store.query("SELECT count() FROM pod_windows").rows[0][0] == raw_rows
        after = _everything(store)
        for old, new in zip(before, after, strict=True):
            _assert_equal(old, new)
        for rollup, (raw, rolled), (_, rolled_after) in zip(POD_ROLLUPS, pods_before, _pod_figures(store),
                                                            strict=True):
            assert_figures_equal(raw, rolled_after, f"{rollup.table.name} after the batch again")
            assert_figures_equal(rolled, rolled_after, f"{rollup.table.name} as before")


GPU_KEYS = ["cluster", *rollups.GPU_HOURLY.keys]
GPU_MEASURES = {name: expression for name, expression in rollups.GPU_HOURLY.measures.items() if name != "interval_s"}
"""``interval_s`` is any of the samples' intervals: one per GPU here, compared as such below."""


GpuFigures = dict[tuple[str, ...], dict[str, Any]]


def _gpu_figures(store: ClickHouseStore, source: str, period: str, where: str = "",
                 params: dict[str, Any] | None = None, merged: bool = False) -> GpuFigures:
    keys = [period, *GPU_KEYS] if period else GPU_KEYS
    measures = (", ".join(f"{rollups.GPU_HOURLY.merged(n)} AS {n}" for n in GPU_MEASURES) if merged
                else ", ".join(f"{e} AS {n}" for n, e in GPU_MEASURES.items()))
    group = ", ".join(keys)
    sql = f"SELECT {group}, {measures} FROM {source} {where} GROUP BY {group}"
    return {tuple(str(r[k]) for k in keys): r for r in store.query(sql, params).dicts()}


def _assert_gpu_equal(raw: GpuFigures, rolled: GpuFigures) -> None:
    assert raw and set(raw) == set(rolled)
    for key, row in raw.items():
        other = rolled[key]
        for name in GPU_MEASURES:
            if name.endswith("_s"):
                assert other[name] == pytest.approx(row[name], rel=1e-9, abs=1e-9), (key, name)
            else:
                assert other[name] == row[name], (key, name)


def test_the_gpu_rollup_equals_the_raw_samples(filled: FillOutcome) -> None:
    with closing(open_store(f"chdb://{filled.path}")) as store:
        by_hour = _gpu_figures(store, "gpu_samples FINAL", "toStartOfHour(ts)")
        _assert_gpu_equal(by_hour, _gpu_figures(store, "gpu_hourly", "hour", merged=True))
        assert len(by_hour) > SPEC.fleet_gpus, "several hours of every GPU"
        intervals = store.query("SELECT uniqExact(sample_interval_s), any(sample_interval_s) FROM gpu_samples").rows
        assert intervals[0][0] == 1
        assert {float(r[0]) for r in store.query("SELECT DISTINCT interval_s FROM gpu_hourly").rows} == {
            float(intervals[0][1])}

        # from a start inside an hour, as the advisor asks (its --since counts back from the latest data)
        first, last = (datetime.fromtimestamp(int(ms) / 1000, UTC) for ms in store.query(
            "SELECT toUnixTimestamp64Milli(min(ts)), toUnixTimestamp64Milli(max(ts)) FROM gpu_samples").rows[0])
        on_the_hour = first.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        for start in (first + (last - first) / 3 + timedelta(seconds=1234.5), on_the_hour):
            params = {"start": start.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]}
            raw = _gpu_figures(store, "gpu_samples FINAL", "",
                               "WHERE ts >= toDateTime64({start:String}, 3, 'UTC')", params)
            _assert_gpu_equal(raw, _gpu_figures(store, rollups.gpu_rows_since("start"), "", params=params,
                                                merged=True))


RAW_SECTIONS: dict[str, str] = {
    "summary": """
SELECT count() AS windows, uniqExact(pod_uid) AS pods,
       sum(allocated_s) / 3600 AS gpu_hours_allocated, sum(busy_s) / 3600 AS gpu_hours_busy,
       sum(idle_s) / 3600 AS gpu_hours_idle, sum(gap_s) / 3600 AS gpu_hours_gap,
       sum(cost_usd) AS window_cost_usd,
       sum(w.allocated_s / 3600 * coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
       minOrNull(window_start) AS first_window, maxOrNull(window_end) AS last_window
FROM pod_windows AS w FINAL LEFT JOIN {price} AS p ON p.gpu_model = w.gpu_model""",
    "top_teams": """
SELECT {team} AS team, sum(allocated_s) / 3600 AS gpu_hours, sum(busy_s) / 3600 AS busy_gpu_hours,
       sum(idle_s) / 3600 AS idle_gpu_hours,
       sumIf(avg_sm_util_pct * allocated_s, avg_sm_util_pct IS NOT NULL)
           / nullIf(sumIf(allocated_s, avg_sm_util_pct IS NOT NULL), 0) AS avg_sm_util_pct,
       max(max_mem_used_bytes) AS peak_mem_bytes, sum(coalesce(energy_j, 0)) / 3600000 AS energy_kwh,
       sum(cost_usd) AS cost_usd
FROM pod_windows FINAL GROUP BY team ORDER BY round(gpu_hours, 6) DESC, team LIMIT 20""",
    "top_projects": """
SELECT {team} AS team, {project} AS project, sum(allocated_s) / 3600 AS gpu_hours,
       sum(busy_s) / 3600 AS busy_gpu_hours, sum(idle_s) / 3600 AS idle_gpu_hours,
       sumIf(avg_sm_util_pct * allocated_s, avg_sm_util_pct IS NOT NULL)
           / nullIf(sumIf(allocated_s, avg_sm_util_pct IS NOT NULL), 0) AS avg_sm_util_pct,
       max(max_mem_used_bytes) AS peak_mem_bytes, sum(coalesce(energy_j, 0)) / 3600000 AS energy_kwh,
       sum(cost_usd) AS cost_usd
FROM pod_windows FINAL GROUP BY team, project ORDER BY round(gpu_hours, 6) DESC, team, project LIMIT 20""",
    "top_pods": """
SELECT namespace, pod, {team} AS team, {project} AS project, sum(allocated_s) / 3600 AS gpu_hours,
       sum(busy_s) / 3600 AS busy_gpu_hours, sum(idle_s) / 3600 AS idle_gpu_hours,
       sumIf(avg_sm_util_pct * allocated_s, avg_sm_util_pct IS NOT NULL)
           / nullIf(sumIf(allocated_s, avg_sm_util_pct IS NOT NULL), 0) AS avg_sm_util_pct,
       max(max_mem_used_bytes) AS peak_mem_bytes, sum(coalesce(energy_j, 0)) / 3600000 AS energy_kwh,
       sum(cost_usd) AS cost_usd
FROM pod_windows FINAL GROUP BY namespace, pod, team, project
ORDER BY round(gpu_hours, 6) DESC, namespace, pod, team, project LIMIT 20""",
    "pods": """
WITH w AS (
    SELECT pod_uid, any(namespace) AS namespace, any(pod) AS pod, any(team) AS team, any(project) AS project,
           any(node) AS node, uniqExact(gpu_uuid) AS gpus,
           sum(allocated_s) / 3600 AS gpu_hours, sum(idle_s) / 3600 AS idle_gpu_hours,
           sumIf(avg_sm_util_pct * allocated_s, avg_sm_util_pct IS NOT NULL)
               / nullIf(sumIf(allocated_s, avg_sm_util_pct IS NOT NULL), 0) AS avg_sm_util_pct,
           max(max_mem_used_bytes) AS peak_mem_bytes, sum(cost_usd) AS cost_usd
    FROM pod_windows FINAL GROUP BY pod_uid
),
l AS (SELECT pod_uid, end_reason, pending_s, running_s FROM pod_lifecycle FINAL)
SELECT w.namespace AS namespace, w.pod AS name, if(w.team = '', '(none)', w.team) AS team,
       if(w.project = '', '(none)', w.project) AS project,
       w.node AS node, w.gpus AS gpus, w.gpu_hours AS gpu_hours, w.idle_gpu_hours AS idle_gpu_hours,
       w.avg_sm_util_pct AS avg_sm_util_pct, w.peak_mem_bytes AS peak_mem_bytes, w.cost_usd AS cost_usd,
       l.end_reason AS end_reason, l.pending_s AS pending_s, l.running_s AS running_s
FROM w LEFT JOIN l ON l.pod_uid = w.pod_uid
ORDER BY namespace, name""",
    "cost_per_unit_of_work": """
WITH c AS (
    SELECT pod_uid, any(namespace) AS namespace, any(pod) AS pod, any(team) AS team, any(project) AS project,
           sum(allocated_s) / 3600 AS gpu_hours, sum(cost_usd) AS window_cost_usd,
           sum(allocated_s) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
           sum(steps) AS window_steps, sum(tokens) AS window_tokens
    FROM pod_windows AS w FINAL LEFT JOIN {price} AS p ON p.gpu_model = w.gpu_model
    GROUP BY pod_uid
),
u AS (
    SELECT pod_uid, max(steps_total) - min(steps_total) AS steps, max(tokens_total) - min(tokens_total) AS tokens
    FROM workload_progress FINAL GROUP BY pod_uid
)
SELECT c.namespace AS namespace, c.pod AS pod, {team} AS team, {project} AS project, c.gpu_hours AS gpu_hours,
       greatest(c.window_cost_usd, c.list_cost_usd) AS cost_usd,
       coalesce(nullIf(u.steps, 0), nullIf(c.window_steps, 0)) AS steps,
       coalesce(nullIf(u.tokens, 0), nullIf(c.window_tokens, 0)) AS tokens,
       cost_usd / steps AS cost_per_step_usd, cost_usd / tokens * 1000 AS cost_per_1k_tokens_usd
FROM c LEFT JOIN u ON u.pod_uid = c.pod_uid
WHERE steps > 0 OR tokens > 0
ORDER BY round(cost_usd, 9) DESC, namespace, pod LIMIT 50""",
    "idle_by_team_and_class": """
SELECT {team} AS team, {idle_class} AS idle_class,
       sum(idle_s) / 3600 AS idle_gpu_hours, sum(gap_s) / 3600 AS gap_gpu_hours, uniqExact(pod_uid) AS pods,
       sum(cost_usd * idle_s / nullIf(allocated_s, 0)) AS idle_cost_usd
FROM pod_windows FINAL WHERE idle_s > 0 OR gap_s > 0
GROUP BY team, idle_class ORDER BY idle_gpu_hours DESC, team, idle_class""",
    "cost_by_team": """
SELECT {team} AS team, {project} AS project, sum(allocated_s) / 3600 AS gpu_hours,
       sum(idle_s) / 3600 AS idle_gpu_hours, sum(cost_usd) AS window_cost_usd,
       sum(allocated_s / 3600 * coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
       sum(idle_s / 3600 * coalesce(p.usd_per_gpu_hour, 0)) AS idle_list_cost_usd,
       sum(cost_usd * idle_s / nullIf(allocated_s, 0)) AS idle_window_cost_usd
FROM pod_windows AS w FINAL LEFT JOIN {price} AS p ON p.gpu_model = w.gpu_model
GROUP BY team, project ORDER BY window_cost_usd DESC, list_cost_usd DESC, team, project""",
}
"""Each report section the rollups answer, written directly over the raw windows and progress."""

RAW_UTILISATION = """
WITH w AS (SELECT toStartOfInterval(window_start, toIntervalSecond({bucket_s})) AS bucket, * FROM pod_windows FINAL),
covered AS (SELECT bucket, greatest(dateDiff('millisecond', min(window_start), max(window_end)), 1) / 1000 AS covered_s
            FROM w GROUP BY bucket)
SELECT w.bucket AS bucket, {team} AS team_label, any(c.covered_s) AS covered_s,
       sum(allocated_s) / any(c.covered_s) AS gpus_allocated, sum(busy_s) / any(c.covered_s) AS gpus_busy,
       sum(idle_s) / any(c.covered_s) AS gpus_idle,
       sumIf(avg_sm_util_pct * allocated_s, avg_sm_util_pct IS NOT NULL)
           / nullIf(sumIf(allocated_s, avg_sm_util_pct IS NOT NULL), 0) AS avg_sm_util_pct,
       sum(cost_usd) AS cost_usd
FROM w INNER JOIN covered AS c ON c.bucket = w.bucket GROUP BY bucket, team_label ORDER BY bucket, team_label"""


def _assert_rows_equal(raw: list[dict[str, Any]], rolled: list[dict[str, Any]], what: str) -> None:
    assert raw, f"{what}: the filled store answers"
    assert len(rolled) == len(raw), what
    for expected, got in zip(raw, rolled, strict=True):
        assert list(got) == list(expected), what
        for name, value in expected.items():
            if isinstance(value, float):
                assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-6), (what, name, expected)
            else:
                assert got[name] == value, (what, name, expected)


def _since(sql: str, start: datetime | None) -> str:
    """``sql`` over the raw windows and progress at or after ``start`` (None: all of them)."""
    if start is None:
        return sql
    at = f"toDateTime64('{start:%Y-%m-%d %H:%M:%S.%f}', 6, 'UTC')"
    windows = f"(SELECT * FROM pod_windows FINAL WHERE window_start >= {at})"
    return (sql.replace("pod_windows AS w FINAL", f"{windows} AS w").replace("pod_windows FINAL", windows)
            .replace("workload_progress FINAL", f"(SELECT * FROM workload_progress FINAL WHERE ts >= {at})"))


@pytest.mark.parametrize("since_h", [None, 2.5, 1.0, 1 / 60],
                         ids=lambda h: "whole history" if h is None else f"{h:g} h")
def test_the_report_sections_from_the_rollups_equal_the_same_sql_over_the_raw_windows(
        filled: FillOutcome, since_h: float | None) -> None:
    """Over the whole history and over the last ``since_h`` hours of data (``gpulens report --since``):
    a start inside an hour, on the hour, in the last hour."""
    names = {"team": "if(team = '', '(none)', team)", "project": "if(project = '', '(none)', project)",
             "idle_class": rollups.IDLE_CLASS, "price": PRICE}
    with closing(open_store(f"chdb://{filled.path}")) as store:
        reader = scoped(store)
        period = report_period(reader, None if since_h is None else since_h * 3600)
        assert (period.start is None) == (since_h is None)
        report = run_report(reader, list(RAW_SECTIONS), period=period)
        for name, sql in RAW_SECTIONS.items():
            raw = round_floats(store.query(_since(sql, period.start).format(**names)).dicts(),
                               9 if name == "cost_per_unit_of_work" else 6)
            if name == "summary":  # its capacity and lifecycle figures come from their own tables
                report[name] = [{key: report[name][0][key] for key in raw[0]}]
            _assert_rows_equal(raw, report[name], name)
        assert len({r["idle_class"] for r in report["idle_by_team_and_class"]}) >= 2, "several idle classes"
        if since_h is not None:
            return
        for bucket_s in (3600, 7200, 86400):
            raw = round_floats(store.query(RAW_UTILISATION.format(bucket_s=bucket_s, **names)).dicts())
            _assert_rows_equal(raw, utilisation_by_team(reader, bucket_s), f"utilisation per {bucket_s} s")
