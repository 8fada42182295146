"""The Grafana dashboards answer the product's questions, and their SQL runs on the sink's real
ClickHouse schema (migrations applied to an embedded chDB engine) with the right figures.

Every panel's query is executed with the data source plugin's macros expanded as the plugin
expands them, against rows stored as the sink stores them: each pod window once, in batches with
a deduplication token (a batch the sink retries is one the engine drops, in the rollups' views
too), so the rollups the team panels read (``team_hourly``/``team_daily``,
``pod_hourly``/``pod_daily``) hold what the views made of the inserts. A renamed table or column
in the sink breaks this test rather than an operator's dashboard.

The team panels read rollups, so their cost grows with the question, not with the history; over
ranges of whole hours each gives the figures of its twin over the raw windows (``pod_windows
FINAL``, :data:`RAW_TWINS`: the same question as before the rollups), for every selection of the
team and namespace variables, over a range of whole days and hours, one of a day, one inside a
day, and one whose ends are inside hours (the rollup answers for the whole hours holding its ends).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.helpers import GRAFANA_DIR, REPO_ROOT

DASHBOARDS = sorted((GRAFANA_DIR / "dashboards").glob("*.json"))
ROLLUPS = ("team_hourly", "team_daily", "pod_hourly", "pod_daily")

# question -> (words its panel title must contain, table or view its SQL must read)
QUESTIONS = {
    "GPUs by state over time": (("gpus", "state"), "cluster_capacity"),
    "utilisation by team": (("utilisation", "team"), "team_hourly"),
    "idle GPU-hours by team": (("idle", "team"), "team_daily"),
    "idle GPU-hours by GPU class": (("idle", "class"), "team_daily"),
    "pending pods and reasons": (("pending", "reason"), "v_pods"),
    "stranded GPUs over time": (("stranded",), "cluster_capacity"),
    "cost per team": (("cost", "team"), "team_daily"),
    "active alerts": (("active", "alerts"), "v_alerts"),
    "idlest pods": (("top idle pods",), "pod_daily"),
    "VRAM reserved but unused inside pods": (("reserved but unused", "pod"), "pod_hourly"),
    "allocation retries and OOMs": (("retries", "ooms"), "pod_daily"),
    "MIG fragmentation over time": (("mig", "fragmentation"), "cluster_capacity"),
    "shared-GPU VRAM fragmentation over time": (("vram", "fragmentation"), "cluster_capacity"),
}


def _panels() -> list[dict[str, Any]]:
    panels = []
    for path in DASHBOARDS:
        panels.extend(json.loads(path.read_text())["panels"])
    return panels


ALL = "'__all'"  # the variables' allValue, as Grafana substitutes it when "All" is selected


def _step_s(panel: dict[str, Any] | None, grafana_step_s: int) -> int:
    """The step Grafana gives ``$__timeInterval``: its own, but not under the panel's minimum interval."""
    minimum = (panel or {}).get("interval", "")
    return max(grafana_step_s, {"": 0, "1h": 3600}[minimum])


def _expand_macros(sql: str, start: datetime, end: datetime, step_s: int = 60, team: str = ALL,
                   namespace: str = ALL) -> str:
    """The grafana-clickhouse-datasource macros (``$__timeFilter``, ``$__fromTime``, ``$__toTime``:
    whole seconds of the range's milliseconds, as the plugin writes them; ``$__timeInterval`` with
    ``step_s``), for the range
    ``start`` .. ``end``, and the dashboard variables (``${var:singlequote}``) as Grafana
    substitutes the given selection."""
    sql = sql.replace("${team:singlequote}", team).replace("${namespace:singlequote}", namespace)
    sql = sql.replace("${cluster:singlequote}", "'default'")
    lo, hi = int(start.timestamp()), int(end.timestamp())
    sql = re.sub(r"\$__timeFilter\(([^)]+)\)", rf"\1 >= toDateTime({lo}) AND \1 <= toDateTime({hi})", sql)
    sql = sql.replace("$__fromTime", f"toDateTime(intDiv({lo}000,1000))")
    sql = sql.replace("$__toTime", f"toDateTime(intDiv({hi}000,1000))")
    sql = re.sub(r"\$__timeInterval\(([^)]+)\)", rf"toStartOfInterval(toDateTime(\1), INTERVAL {step_s} second)", sql)
    assert "$__" not in sql and "${" not in sql, f"unexpanded macro or variable in {sql}"
    return sql


def test_dashboards_are_valid_and_unique() -> None:
    assert len(DASHBOARDS) >= 2
    uids = set()
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        assert dashboard["uid"] not in uids
        uids.add(dashboard["uid"])
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        for panel in dashboard["panels"]:
            (target,) = panel["targets"]
            assert target["rawSql"].strip() and target["editorType"] == "sql", f"{path.name}: {panel['title']}"


def _variables(path: Path) -> dict[str, dict[str, Any]]:
    return {var["name"]: var for var in json.loads(path.read_text())["templating"]["list"]}


def test_no_panel_measures_against_the_wall_clock() -> None:
    """A demo's or replay's data is dated in the future or the past: "now" is the data's own end."""
    for panel in _panels():
        assert not re.search(r"\bnow(64)?\(", panel["targets"][0]["rawSql"]), panel["title"]


def test_dashboards_choose_their_datasource_and_filter_by_cluster_team_and_namespace() -> None:
    """No hard-coded data source uid (a user's ClickHouse data source has its own), every read of every
    panel follows the cluster selector, and every panel over per-pod data the team and namespace ones."""
    for path in DASHBOARDS:
        variables = _variables(path)
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "grafana-clickhouse-datasource"
        for name in ("team", "namespace"):
            assert variables[name]["includeAll"] and variables[name]["multi"] and variables[name]["allValue"] == ALL
            assert "${cluster:singlequote}" in variables[name]["query"]
        # one cluster at a time: node names and pod uids repeat across clusters
        assert not variables["cluster"]["includeAll"] and not variables["cluster"]["multi"]
        uids = re.findall(r'"uid": "([^"]*)"', json.dumps(json.loads(path.read_text())["panels"]))
        assert uids and set(uids) == {"${datasource}"}, f"{path.name}: hard-coded data source uid"
        for panel in json.loads(path.read_text())["panels"]:
            sql = panel["targets"][0]["rawSql"]
            reads = re.findall(r"\b(?:FROM|JOIN)\s+([a-z_]+)", sql)
            assert reads and sql.count("cluster = ${cluster:singlequote}") == len(reads), \
                f"{panel['title']}: every table or view it reads must be filtered by the cluster selector"
            if re.search(rf"\b(pod_windows|v_pods|{'|'.join(ROLLUPS)})\b", sql):
                assert "${team:singlequote}" in sql and "${namespace:singlequote}" in sql, panel["title"]
            if "v_alerts" in sql:
                assert "${namespace:singlequote}" in sql, panel["title"]


def test_team_panels_read_rollups_and_show_hours() -> None:
    """The team dashboard reads no raw window (its cost would grow with the history), and a time
    series over an hourly rollup asks Grafana for at least an hour per point and says so."""
    (teams,) = (path for path in DASHBOARDS if path.stem == "gpulens-teams")
    queries = [var["query"] for var in _variables(teams).values() if var["name"] in ("team", "namespace")]
    for panel in json.loads(teams.read_text())["panels"]:
        sql = panel["targets"][0]["rawSql"]
        assert "pod_windows" not in sql and re.search(rf"\b({'|'.join(ROLLUPS)})\b", sql), panel["title"]
        assert "whole hours" in panel["description"], panel["title"]
        if "$__timeInterval(hour)" in sql:
            assert panel["type"] == "timeseries" and panel["interval"] == "1h", panel["title"]
    assert all("pod_windows" not in sql for sql in queries)


def test_every_question_has_a_panel() -> None:
    panels = _panels()
    for question, (words, table) in QUESTIONS.items():
        matching = [
            p for p in panels
            if all(w in p["title"].lower() for w in words) and re.search(rf"\b{table}\b", p["targets"][0]["rawSql"])
        ]
        assert matching, f"no panel answers {question!r} (title with {words}, reading {table})"


# --------------------------------------------------------------------------- the raw twins

_RAW_TEAM = "if(coalesce(team, '') = '', namespace, team)"
_RAW_WHERE = ("cluster = ${cluster:singlequote} AND $__timeFilter(window_start) AND ('__all' IN (${team:singlequote})"
              f" OR {_RAW_TEAM} IN (${{team:singlequote}})) AND ('__all' IN (${{namespace:singlequote}})"
              " OR namespace IN (${namespace:singlequote}))")
RAW_TWINS = {
    "GPU utilisation by team":
        f"SELECT $__timeInterval(window_start) AS time, {_RAW_TEAM} AS team_name, 100 * sum(busy_s) / "
        f"nullIf(sum(allocated_s), 0) AS util_pct FROM pod_windows FINAL WHERE {_RAW_WHERE} GROUP BY time, team_name "
        "ORDER BY time",
    "Idle GPU-hours by team":
        f"SELECT {_RAW_TEAM} AS team_name, sum(idle_s) / 3600 AS idle_gpu_hours, sum(allocated_s) / 3600 AS "
        f"allocated_gpu_hours FROM pod_windows FINAL WHERE {_RAW_WHERE} GROUP BY team_name "
        "ORDER BY idle_gpu_hours DESC LIMIT 20",
    "Idle GPU-hours by GPU class":
        "SELECT gpu_model AS gpu_class, sum(idle_s) / 3600 AS idle_gpu_hours, sum(allocated_s) / 3600 AS "
        f"allocated_gpu_hours FROM pod_windows FINAL WHERE {_RAW_WHERE} GROUP BY gpu_class "
        "ORDER BY idle_gpu_hours DESC LIMIT 20",
    "Cost per team":
        f"SELECT {_RAW_TEAM} AS team_name, sum(cost_usd) AS total_cost_usd, sum(cost_usd * idle_s / "
        f"if(allocated_s > 0, allocated_s, 1)) AS idle_cost_usd FROM pod_windows FINAL WHERE {_RAW_WHERE} "
        "GROUP BY team_name ORDER BY total_cost_usd DESC LIMIT 20",
    "Cost per team over time":
        f"SELECT $__timeInterval(window_start) AS time, {_RAW_TEAM} AS team_name, sum(cost_usd) AS total_cost_usd "
        f"FROM pod_windows FINAL WHERE {_RAW_WHERE} GROUP BY time, team_name ORDER BY time",
    "Top idle pods":
        f"SELECT namespace, pod, {_RAW_TEAM} AS team_name, any(node) AS node, uniqExact(gpu_uuid) AS gpus, "
        "sum(idle_s) / 3600 AS idle_gpu_hours, 100 * sum(busy_s) / nullIf(sum(allocated_s), 0) AS util_pct, "
        f"max(max_mem_used_bytes) AS peak_mem_bytes FROM pod_windows FINAL WHERE {_RAW_WHERE} "
        "GROUP BY namespace, pod, team_name ORDER BY idle_gpu_hours DESC LIMIT 50",
    "VRAM reserved but unused per pod (caching allocator)":
        "SELECT $__timeInterval(window_start) AS time, concat(namespace, '/', pod) AS pod_name, "
        "max(max_reserved_unused_bytes) AS reserved_unused_bytes FROM pod_windows FINAL WHERE "
        f"max_reserved_unused_bytes IS NOT NULL AND {_RAW_WHERE} GROUP BY time, pod_name ORDER BY time, pod_name",
    "Allocation retries and OOMs per pod (caching allocator)":
        "SELECT concat(namespace, '/', pod) AS pod_name, gpu_uuid, max(max_reserved_unused_bytes) AS "
        "most_reserved_unused_bytes, argMax(alloc_reserved_bytes, window_start) AS reserved_bytes, "
        "argMax(alloc_allocated_bytes, window_start) AS allocated_bytes, sum(alloc_retries) AS retries, "
        f"sum(alloc_ooms) AS ooms FROM pod_windows FINAL WHERE max_reserved_unused_bytes IS NOT NULL AND {_RAW_WHERE} "
        "GROUP BY pod_name, gpu_uuid ORDER BY retries + ooms DESC, most_reserved_unused_bytes DESC LIMIT 50",
}
"""Each team panel's question over the raw windows: the figures its rollup query must give."""


# --------------------------------------------------------------------------- the seeded store

_RUNNER = r"""
import json, sys
from datetime import datetime
from sinks.clickhouse import open_store
from sinks.migrations import migrate

job = json.load(sys.stdin)
store = open_store(job["url"])
migrate(store)
for token, windows in job["batches"]:
    columns = {name: [w[name] for w in windows] for name in windows[0]}
    for name in ("window_start", "window_end"):
        columns[name] = [datetime.fromisoformat(v) for v in columns[name]]
    store.insert("pod_windows", columns, dedup_token=token)
for statement in job["seed"]:
    store.command(statement)
results = []
for sql in job["queries"]:
    try:
        results.append({"rows": store.query(sql).dicts()})
    except Exception as exc:  # report every failing query, not just the first
        results.append({"error": f"{type(exc).__name__}: {exc}"})
store.close()
print(json.dumps(results, default=str))
"""

DAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)
"""The seeded history's whole day: it starts the evening before and ends early the day after."""
WINDOW_S = 300
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
USD_PER_GPU_HOUR = {H100: 3.0, A100: 2.0}
GIB = 2**30


def _hours(n: float) -> datetime:
    return DAY + timedelta(hours=n)


@dataclass(frozen=True)
class SeededPod:
    """A pod of the seeded history: one window of :data:`WINDOW_S` per GPU from ``first_h`` to ``last_h``
    (hours after :data:`DAY`, the last one excluded)."""

    namespace: str
    pod: str
    team: str
    project: str
    node: str
    gpus: tuple[str, ...]
    gpu_model: str
    first_h: int
    last_h: int
    busy_s_per_window: int
    avg_sm_util_pct: float
    peak_mem_bytes: int | None


# a training pod, a notebook without a team label (its namespace is its team), an evaluation on two
# GPUs, partly idle, and a notebook that holds VRAM and computes nothing
PODS = {
    "u-train": SeededPod("ml", "train-0", "vision", "detector", "n1", ("GPU-1",), H100, -4, 12, WINDOW_S, 97.0,
                         60 * GIB),
    "u-nb0": SeededPod("nb", "notebook-0", "", "", "n1", ("GPU-2",), H100, -4, 28, 0, 0.0, None),
    "u-eval": SeededPod("research", "eval-0", "nlp", "p1", "n2", ("GPU-3", "GPU-4"), A100, 2, 22, 120, 40.0,
                        20 * GIB),
    "u-nb1": SeededPod("ml", "notebook-1", "vision", "", "n2", ("GPU-5",), A100, 6, 28, 0, 0.0, 8 * GIB),
}
ALLOCATOR_FROM_H, OOM_AT_H = 10, 11.75
"""train-0's caching allocator reports from 10:00 on: 64 GiB reserved, 12 GiB allocated (10 GiB in its
last hour), one retry per window in its last hour and one OOM per window in its last quarter hour."""


def _windows() -> list[dict[str, Any]]:
    """Every pod window of the seeded history, once, as the sink writes them."""
    windows = []
    for uid, p in PODS.items():
        for gpu in p.gpus:
            for i in range((p.last_h - p.first_h) * 3600 // WINDOW_S):
                start = _hours(p.first_h) + timedelta(seconds=i * WINDOW_S)
                at = (start - DAY).total_seconds() / 3600
                allocator = p.pod == "train-0" and at >= ALLOCATOR_FROM_H
                allocated = 10 * GIB if at >= 11 else 12 * GIB
                windows.append({
                    "window_id": f"{uid}-{gpu}-{i}", "pod_uid": uid, "namespace": p.namespace, "pod": p.pod,
                    "node": p.node, "gpu_uuid": gpu, "gpu_model": p.gpu_model, "window_start": start.isoformat(),
                    "window_end": (start + timedelta(seconds=WINDOW_S)).isoformat(), "team": p.team,
                    "project": p.project, "allocated_s": WINDOW_S, "busy_s": p.busy_s_per_window,
                    "idle_s": WINDOW_S - p.busy_s_per_window, "samples": WINDOW_S // 10,
                    "cost_usd": WINDOW_S / 3600 * USD_PER_GPU_HOUR[p.gpu_model], "share_fraction": 1.0,
                    "avg_sm_util_pct": p.avg_sm_util_pct, "max_mem_used_bytes": p.peak_mem_bytes,
                    "alloc_reserved_bytes": 64 * GIB if allocator else None,
                    "alloc_allocated_bytes": allocated if allocator else None,
                    "max_reserved_unused_bytes": 64 * GIB - allocated if allocator else None,
                    "alloc_retries": (1 if at >= 11 else 0) if allocator else None,
                    "alloc_ooms": (1 if at >= OOM_AT_H else 0) if allocator else None,
                })
    return windows


def _batches() -> list[tuple[str, list[dict[str, Any]]]]:
    """The windows in the sink's batches (a token per batch), the first one delivered again as the
    sink's retry delivers it: the same token, dropped by the engine."""
    windows = sorted(_windows(), key=lambda w: w["window_start"])
    batches = [(f"pod_windows:0:{i}", windows[i:i + 500]) for i in range(0, len(windows), 500)]
    return [*batches, batches[0]]


NOW = _hours(27)
"""The data's end for the fleet panels: the capacity window, pending pod, event and alerts are dated
before it."""
# one capacity window, one pending pod with its scheduler event, one alert that is still firing and
# one that resolved
_SEED = [
    """INSERT INTO cluster_capacity (window_id, window_start, window_end, gpus_total, gpus_allocated, gpus_busy,
        gpus_idle_allocated, gpus_free, largest_free_block, stranded_gpus, pending_pods, pending_gpu_demand,
        mig_gpus, mig_free_compute_slices, mig_free_memory_slices, mig_free_instances_by_profile,
        mig_pending_by_profile, shared_gpus, shared_vram_free_bytes, shared_vram_largest_free_bytes,
        shared_vram_stranded_bytes, shared_vram_pending_bytes)
     VALUES ('c1', {now} - 600, {now} - 540, 16, 10, 6, 4, 6, 2, 3, 1, 4,
      2, 3, 4, {'1g.10gb': 3}, {'3g.40gb': 1}, 4, 40, 10, 40, 20)""",
    """INSERT INTO pod_states (uid, namespace, name, ts, phase, team, gpus_requested, deleted, created_at)
     VALUES ('p9', 'ml', 'big-job-0', {now} - 300, 'Pending', 'vision', 4, false, {now} - 900)""",
    """INSERT INTO k8s_events (uid, ts, category, reason, message, involved_kind, involved_uid, involved_name)
     VALUES ('e1', {now} - 800, 'scheduling_failed', 'FailedScheduling',
      '0/2 nodes are available: 2 Insufficient nvidia.com/gpu.', 'Pod', 'p9', 'big-job-0')""",
    """INSERT INTO alerts (id, type, severity, state, at, started_at, subject_kind, subject_namespace, subject_name,
        summary)
     VALUES ('a1', 'idle_gpu', 'warning', 'firing', {now} - 500, {now} - 500, 'pod', 'nb', 'notebook-0',
      'notebook-0 idle'),
     ('a2', 'pending_gpu', 'warning', 'firing', {now} - 400, {now} - 400, 'pod', 'ml', 'old-0', 'old pending'),
     ('a2', 'pending_gpu', 'warning', 'resolved', {now} - 100, {now} - 400, 'pod', 'ml', 'old-0', 'scheduled')""",
]

SECOND = timedelta(seconds=1)
# name -> (start, end, the raw twin's range: the whole hours the rollups answer for; ``$__timeFilter``
# includes its end, so a twin ends a second before the hour that an end on the hour leaves out)
RANGES = {
    "all": (_hours(-4), _hours(28), _hours(-4), _hours(28) - SECOND),
    "grafana-rounded": (_hours(-2), _hours(26) - SECOND, _hours(-2), _hours(26) - SECOND),
    "one-day": (_hours(0), _hours(24), _hours(0), _hours(24) - SECOND),
    "inside-a-day": (_hours(9), _hours(13), _hours(9), _hours(13) - SECOND),
    "ends-inside-hours": (_hours(9.4), _hours(11.6), _hours(9), _hours(12) - SECOND),
    "ends-in-a-days-last-hour": (_hours(-3.5), _hours(23.5), _hours(-4), _hours(24) - SECOND),
}
SELECTIONS = {"": (ALL, ALL), "team=vision": ("'vision'", ALL), "namespace=nb,x": (ALL, "'nb','x'")}
TEAM_PANELS = {p["title"]: p for p in _panels() if p["title"] in RAW_TWINS}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every panel's query, every raw twin and every variable query, run on the sink schema in a
    fresh embedded ClickHouse (own process: chDB allows one data directory per process).

    Keys: ``range|selection|title`` (``raw|range|selection|title`` for a raw twin; a sub-hour step:
    ``60s|range|selection|title``), ``dashboard:variable``."""
    titled: list[tuple[str, str]] = []
    for range_name, (start, end, raw_start, raw_end) in RANGES.items():
        for selection, (team, namespace) in SELECTIONS.items():
            for panel in _panels():
                title, sql = panel["title"], panel["targets"][0]["rawSql"]
                titled.append((f"{range_name}|{selection}|{title}",
                               _expand_macros(sql, start, end, _step_s(panel, 60), team, namespace)))
                if title in RAW_TWINS:
                    titled.append((f"raw|{range_name}|{selection}|{title}", _expand_macros(
                        RAW_TWINS[title], raw_start, raw_end, _step_s(panel, 60), team, namespace)))
                if "$__timeInterval" in sql:
                    titled.append((f"60s|{range_name}|{selection}|{title}",
                                   _expand_macros(sql, start, end, 60, team, namespace)))
    start, end, _, _ = RANGES["all"]
    titled += [(f"{path.stem}:{name}", _expand_macros(var["query"], start, end)) for path in DASHBOARDS
               for name, var in _variables(path).items() if var["type"] == "query"]
    now = f"toDateTime64('{NOW:%Y-%m-%d %H:%M:%S}', 3, 'UTC')"
    job = {
        "url": f"chdb://{tmp_path_factory.mktemp('dashboards') / 'ch'}",
        "batches": _batches(),
        "seed": [statement.replace("{now}", now) for statement in _SEED],
        "queries": [sql for _, sql in titled],
    }
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER], input=json.dumps(job), capture_output=True, text=True,
        cwd=Path(REPO_ROOT), timeout=240, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    return {title: answer for (title, _), answer in zip(titled, answers, strict=True)}


def _rows(results: dict[str, dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return list(results[key]["rows"])


def test_every_panel_query_runs_on_the_sink_schema(results: dict[str, dict[str, Any]]) -> None:
    failures = {title: answer["error"] for title, answer in results.items() if "error" in answer}
    assert not failures, "panel queries fail on the sink's schema:\n" + "\n".join(
        f"  {title}: {error[:400]}" for title, error in failures.items()
    )


def _same_rows(rolled: list[dict[str, Any]], raw: list[dict[str, Any]], where: str) -> None:
    """The same rows with the same columns, floats to their rounding (the rollups add the same
    seconds and dollars in another order). Rows are compared by their other columns: a panel's
    ORDER BY leaves ties (teams at the same time, pods as idle as each other) in any order, and
    every answer here is shorter than its LIMIT."""
    assert [list(r) for r in rolled] == [list(r) for r in raw], where

    def by_keys(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(rows, key=lambda r: [str(v) for v in r.values() if not isinstance(v, float)])

    for got, want in zip(by_keys(rolled), by_keys(raw), strict=True):
        for column, value in want.items():
            if isinstance(value, float):
                assert got[column] == pytest.approx(value, rel=1e-9, abs=1e-9), (where, column, got, want)
            else:
                assert got[column] == value, (where, column, got, want)


def test_team_panels_give_the_raw_windows_figures(results: dict[str, dict[str, Any]]) -> None:
    """Every team panel, for every range and selection, equals its raw twin over the range's whole
    hours; the seeded history has rows in every one of them (the check compares something)."""
    for range_name in RANGES:
        for selection in SELECTIONS:
            for title in TEAM_PANELS:
                key = f"{range_name}|{selection}|{title}"
                _same_rows(_rows(results, key), _rows(results, f"raw|{key}"), key)
        for title in TEAM_PANELS:
            if "caching allocator" not in title:
                assert _rows(results, f"{range_name}||{title}"), f"{range_name}: {title} is empty"
    assert _rows(results, "ends-inside-hours||Allocation retries and OOMs per pod (caching allocator)")


def test_time_series_show_a_point_per_hour_at_the_least(results: dict[str, dict[str, Any]]) -> None:
    """Asked for points closer than an hour (a panel's minimum interval removed), an hourly rollup
    answers with its hours, the same points as at a step of an hour."""
    for range_name in RANGES:
        for title, panel in TEAM_PANELS.items():
            if "$__timeInterval" not in panel["targets"][0]["rawSql"]:
                continue
            key = f"{range_name}||{title}"
            fine = _rows(results, f"60s|{key}")
            assert fine and all(datetime.fromisoformat(str(row["time"])).minute == 0 for row in fine), key
            _same_rows(fine, _rows(results, key), key)


def test_panels_show_the_right_figures(results: dict[str, dict[str, Any]]) -> None:
    def rows(title: str, range_name: str = "all") -> list[dict[str, Any]]:
        return _rows(results, f"{range_name}||{title}")

    idle = {row["team_name"]: (row["idle_gpu_hours"], row["allocated_gpu_hours"])
            for row in rows("Idle GPU-hours by team")}
    # notebook-0 has no team label: its namespace is its team; 32 hours idle on one GPU
    assert idle == {"nb": pytest.approx((32.0, 32.0)), "nlp": pytest.approx((24.0, 40.0)),
                    "vision": pytest.approx((22.0, 38.0))}
    assert [row["team_name"] for row in rows("Idle GPU-hours by team")] == ["nb", "nlp", "vision"]
    by_class = {row["gpu_class"]: row["idle_gpu_hours"] for row in rows("Idle GPU-hours by GPU class")}
    assert by_class == pytest.approx({A100: 46.0, H100: 32.0})

    util = {(row["time"], row["team_name"]): row["util_pct"] for row in rows("GPU utilisation by team", "one-day")}
    assert len(util) == 24 + 24 + 20  # vision and nb every hour of the day, nlp from 02:00 to 22:00
    assert sorted({round(pct, 9) for pct in util.values()}) == [0.0, 40.0, 50.0, 100.0]  # vision: 2 pods, 1 busy

    cost = {row["team_name"]: (row["total_cost_usd"], row["idle_cost_usd"]) for row in rows("Cost per team")}
    assert cost == {"nb": pytest.approx((96.0, 96.0)), "vision": pytest.approx((92.0, 44.0)),
                    "nlp": pytest.approx((80.0, 48.0))}
    over_time = rows("Cost per team over time", "inside-a-day")
    # 09:00 to 13:00: notebook-0, eval-0 (2 GPUs), notebook-1 every hour, train-0 until 12:00
    assert len(over_time) == 4 * 3 and sum(row["total_cost_usd"] for row in over_time) == pytest.approx(
        4 * (3.0 + 2 * 2.0 + 2.0) + 3 * 3.0)

    top = [(row["pod"], row["team_name"], row["node"], row["gpus"], row["idle_gpu_hours"])
           for row in rows("Top idle pods")]
    assert top == [("notebook-0", "nb", "n1", 1, pytest.approx(32.0)), ("eval-0", "nlp", "n2", 2, pytest.approx(24.0)),
                   ("notebook-1", "vision", "n2", 1, pytest.approx(22.0)), ("train-0", "vision", "n1", 1, 0.0)]

    # train-0's allocator, 10:00 to 12:00: 52 GiB reserved but unused in its first hour, 54 in its last
    unused = rows("VRAM reserved but unused per pod (caching allocator)")
    assert [(row["pod_name"], row["reserved_unused_bytes"]) for row in unused] == [
        ("ml/train-0", 52 * GIB), ("ml/train-0", 54 * GIB)]  # pods without allocator statistics: no line
    (retries,) = rows("Allocation retries and OOMs per pod (caching allocator)")
    assert (retries["pod_name"], retries["retries"], retries["ooms"], retries["most_reserved_unused_bytes"],
            retries["reserved_bytes"], retries["allocated_bytes"]) == ("ml/train-0", 12, 3, 54 * GIB, 64 * GIB,
                                                                        10 * GIB)
    assert _rows(results, "all|namespace=nb,x|Allocation retries and OOMs per pod (caching allocator)") == []

    (state,) = rows("GPUs by state")
    assert (state["busy"], state["idle_allocated"], state["unallocated"], state["stranded"]) == (6, 4, 3, 3)

    (pending,) = rows("Pending pods now, with reasons")
    assert (pending["name"], pending["gpus"]) == ("big-job-0", 4)
    assert "Insufficient nvidia.com/gpu" in pending["reason"]
    # waited from creation to the end of the data (the last capacity window), not to the wall clock
    assert pending["pending_for_s"] == 900 - 540

    (mig,) = rows("MIG fragmentation over time")
    assert (mig["free_compute_slices"], mig["free_memory_slices"], mig["empty_instances"],
            mig["pending_mig_devices"]) == (3, 4, 3, 1)
    (vram,) = rows("Shared-GPU VRAM fragmentation over time")
    assert (vram["free_vram"], vram["largest_free_on_one_gpu"], vram["stranded_vram"],
            vram["pending_vram_need"]) == (40, 10, 40, 20)

    active = rows("Active alerts")
    assert [row["type"] for row in active] == ["idle_gpu"], "a resolved alert is not active"


def test_a_range_inside_hours_shows_the_hours_holding_its_ends(results: dict[str, dict[str, Any]]) -> None:
    """09:24 to 11:36: the figures of 09:00 to 12:00 (its twin's range), not of the 2.2 hours."""
    idle = {row["team_name"]: row["allocated_gpu_hours"]
            for row in _rows(results, "ends-inside-hours||Idle GPU-hours by team")}
    assert idle == pytest.approx({"nb": 3.0, "nlp": 6.0, "vision": 6.0})


def test_variables_list_teams_and_namespaces_and_panels_follow_them(results: dict[str, dict[str, Any]]) -> None:
    for dashboard in ("gpulens-fleet", "gpulens-teams"):
        assert sorted(next(iter(r.values())) for r in results[f"{dashboard}:team"]["rows"]) == ["nb", "nlp", "vision"]
        assert sorted(next(iter(r.values())) for r in results[f"{dashboard}:namespace"]["rows"]) == [
            "ml", "nb", "research"]

    idle = {row["team_name"] for row in _rows(results, "all|team=vision|Idle GPU-hours by team")}
    assert idle == {"vision"}
    pods = {row["pod"] for row in _rows(results, "all|namespace=nb,x|Top idle pods")}
    assert pods == {"notebook-0"}
    assert [row["name"] for row in _rows(results, "all|team=vision|Pending pods now, with reasons")] == ["big-job-0"]
    assert _rows(results, "all|namespace=nb,x|Pending pods now, with reasons") == []
    assert [row["type"] for row in _rows(results, "all|namespace=nb,x|Active alerts")] == ["idle_gpu"]
    # fleet-wide capacity does not depend on the selection
    assert results["all|team=vision|GPUs by state"] == results["all||GPUs by state"]
