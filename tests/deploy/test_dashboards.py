"""The Grafana dashboards answer the product's questions, and their SQL runs on the sink's real
ClickHouse schema (migrations applied to an embedded chDB engine) with the right figures.

Every panel's query is executed with the data source plugin's macros expanded as the plugin
expands them, against seeded rows, so a renamed table or column in the sink breaks this test
rather than an operator's dashboard.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.helpers import GRAFANA_DIR, REPO_ROOT

DASHBOARDS = sorted((GRAFANA_DIR / "dashboards").glob("*.json"))

# question -> (words its panel title must contain, table or view its SQL must read)
QUESTIONS = {
    "GPUs by state over time": (("gpus", "state"), "cluster_capacity"),
    "utilisation by team": (("utilisation", "team"), "pod_windows"),
    "idle GPU-hours by team": (("idle", "team"), "pod_windows"),
    "idle GPU-hours by GPU class": (("idle", "class"), "pod_windows"),
    "pending pods and reasons": (("pending", "reason"), "v_pods"),
    "stranded GPUs over time": (("stranded",), "cluster_capacity"),
    "cost per team": (("cost", "team"), "pod_windows"),
    "active alerts": (("active", "alerts"), "v_alerts"),
    "VRAM reserved but unused inside pods": (("reserved but unused", "pod"), "pod_windows"),
    "allocation retries and OOMs": (("retries", "ooms"), "pod_windows"),
    "MIG fragmentation over time": (("mig", "fragmentation"), "cluster_capacity"),
    "shared-GPU VRAM fragmentation over time": (("vram", "fragmentation"), "cluster_capacity"),
}


def _panels() -> list[dict[str, Any]]:
    panels = []
    for path in DASHBOARDS:
        panels.extend(json.loads(path.read_text())["panels"])
    return panels


ALL = "'__all'"  # the variables' allValue, as Grafana substitutes it when "All" is selected


def _expand_macros(sql: str, team: str = ALL, namespace: str = ALL) -> str:
    """The grafana-clickhouse-datasource macros, for a range of the last 30 days and 60 s steps, and
    the dashboard variables (``${var:singlequote}``) as Grafana substitutes the given selection."""
    sql = sql.replace("${team:singlequote}", team).replace("${namespace:singlequote}", namespace)
    sql = sql.replace("${cluster:singlequote}", "'default'")
    sql = re.sub(
        r"\$__timeFilter\(([^)]+)\)",
        r"\1 >= toDateTime64(now() - INTERVAL 30 DAY, 3) AND \1 <= toDateTime64(now() + INTERVAL 1 DAY, 3)",
        sql,
    )
    sql = re.sub(r"\$__timeInterval\(([^)]+)\)", r"toStartOfInterval(toDateTime(\1), INTERVAL 60 second)", sql)
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
            if re.search(r"\b(pod_windows|v_pods)\b", sql):
                assert "${team:singlequote}" in sql and "${namespace:singlequote}" in sql, panel["title"]
            if "v_alerts" in sql:
                assert "${namespace:singlequote}" in sql, panel["title"]


def test_every_question_has_a_panel() -> None:
    panels = _panels()
    for question, (words, table) in QUESTIONS.items():
        matching = [
            p for p in panels
            if all(w in p["title"].lower() for w in words) and re.search(rf"\b{table}\b", p["targets"][0]["rawSql"])
        ]
        assert matching, f"no panel answers {question!r} (title with {words}, reading {table})"


_RUNNER = r"""
import json, sys
from sinks.clickhouse import open_store
from sinks.migrations import migrate

job = json.load(sys.stdin)
store = open_store(job["url"])
migrate(store)
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

# A few windows, one capacity window, one pending pod with its scheduler event, one alert that
# is still firing and one that resolved.
_SEED = [
    """INSERT INTO pod_windows (window_id, pod_uid, namespace, pod, node, gpu_uuid, gpu_model, window_start,
        window_end, team, allocated_s, busy_s, idle_s, samples, cost_usd, share_fraction, avg_sm_util_pct)
     VALUES
     ('w1', 'u1', 'ml', 'train-0', 'n1', 'GPU-1', 'NVIDIA H100 80GB HBM3', {now} - 3600, {now} - 3540,
      'vision', 60, 60, 0, 6, 0.0667, 1, 97),
     ('w2', 'u2', 'nb', 'notebook-0', 'n1', 'GPU-2', 'NVIDIA H100 80GB HBM3', {now} - 3600, {now} - 3540,
      '', 60, 0, 60, 6, 0.0667, 1, 0),
     ('w3', 'u2', 'nb', 'notebook-0', 'n1', 'GPU-2', 'NVIDIA H100 80GB HBM3', {now} - 3540, {now} - 3480,
      '', 60, 0, 60, 6, 0.0667, 1, 0)""",
    # the same window delivered twice must count once (FINAL)
    """INSERT INTO pod_windows (window_id, pod_uid, namespace, pod, node, gpu_uuid, gpu_model, window_start,
        window_end, team, allocated_s, busy_s, idle_s, samples, cost_usd, share_fraction, avg_sm_util_pct)
     VALUES ('w3', 'u2', 'nb', 'notebook-0', 'n1', 'GPU-2', 'NVIDIA H100 80GB HBM3', {now} - 3540,
      {now} - 3480, '', 60, 0, 60, 6, 0.0667, 1, 0)""",
    # a training pod's caching allocator: 48 then 50 GiB reserved but unused, 3 + 4 retries, one OOM
    """INSERT INTO pod_windows (window_id, pod_uid, namespace, pod, node, gpu_uuid, gpu_model, window_start,
        window_end, team, allocated_s, busy_s, idle_s, samples, cost_usd, share_fraction, avg_sm_util_pct,
        alloc_reserved_bytes, alloc_allocated_bytes, max_reserved_unused_bytes, alloc_retries, alloc_ooms)
     VALUES
     ('w4', 'u1', 'ml', 'train-0', 'n1', 'GPU-1', 'NVIDIA H100 80GB HBM3', {now} - 3540, {now} - 3480,
      'vision', 60, 60, 0, 6, 0.0667, 1, 97, 64424509440, 12884901888, 51539607552, 3, 0),
     ('w5', 'u1', 'ml', 'train-0', 'n1', 'GPU-1', 'NVIDIA H100 80GB HBM3', {now} - 3480, {now} - 3420,
      'vision', 60, 60, 0, 6, 0.0667, 1, 97, 64424509440, 10737418240, 53687091200, 4, 1)""",
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


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every panel's query run on the sink schema in a fresh embedded ClickHouse (own process:
    chDB allows one data directory per process)."""
    panels = _panels()
    variable_queries = [(f"{path.stem}:{name}", var["query"]) for path in DASHBOARDS
                        for name, var in _variables(path).items() if var["type"] == "query"]
    selections = {"": (ALL, ALL), "team=vision:": ("'vision'", ALL), "namespace=nb,x:": (ALL, "'nb','x'")}
    titled = [(prefix + p["title"], _expand_macros(p["targets"][0]["rawSql"], *selection))
              for prefix, selection in selections.items() for p in panels]
    titled += [(title, _expand_macros(sql)) for title, sql in variable_queries]
    # one fixed "now" for every seeded row, so a row delivered twice is the same row
    now = f"toDateTime64('{datetime.now(UTC):%Y-%m-%d %H:%M:%S}', 3, 'UTC')"
    job = {
        "url": f"chdb://{tmp_path_factory.mktemp('dashboards') / 'ch'}",
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


def test_every_panel_query_runs_on_the_sink_schema(results: dict[str, dict[str, Any]]) -> None:
    failures = {title: answer["error"] for title, answer in results.items() if "error" in answer}
    assert not failures, "panel queries fail on the sink's schema:\n" + "\n".join(
        f"  {title}: {error[:400]}" for title, error in failures.items()
    )


def test_panels_show_the_right_figures(results: dict[str, dict[str, Any]]) -> None:
    idle = {row["team_name"]: row["idle_gpu_hours"] for row in results["Idle GPU-hours by team"]["rows"]}
    # the notebook's team falls back to its namespace; its duplicate window counts once
    assert idle == pytest.approx({"nb": 2 / 60, "vision": 0.0})

    util = {row["team_name"]: row["util_pct"] for row in results["GPU utilisation by team"]["rows"]}
    assert util == pytest.approx({"vision": 100.0, "nb": 0.0})

    (state,) = results["GPUs by state"]["rows"]
    assert (state["busy"], state["idle_allocated"], state["unallocated"], state["stranded"]) == (6, 4, 3, 3)

    (pending,) = results["Pending pods now, with reasons"]["rows"]
    assert (pending["name"], pending["gpus"]) == ("big-job-0", 4)
    assert "Insufficient nvidia.com/gpu" in pending["reason"]
    # waited from creation to the end of the data (the last capacity window), not to the wall clock
    assert pending["pending_for_s"] == 900 - 540

    (mig,) = results["MIG fragmentation over time"]["rows"]
    assert (mig["free_compute_slices"], mig["free_memory_slices"], mig["empty_instances"],
            mig["pending_mig_devices"]) == (3, 4, 3, 1)
    (vram,) = results["Shared-GPU VRAM fragmentation over time"]["rows"]
    assert (vram["free_vram"], vram["largest_free_on_one_gpu"], vram["stranded_vram"],
            vram["pending_vram_need"]) == (40, 10, 40, 20)

    active = results["Active alerts"]["rows"]
    assert [row["type"] for row in active] == ["idle_gpu"], "a resolved alert is not active"

    cost = {row["team_name"]: row["total_cost_usd"] for row in results["Cost per team"]["rows"]}
    assert cost == pytest.approx({"nb": 2 * 0.0667, "vision": 3 * 0.0667})

    unused = results["VRAM reserved but unused per pod (caching allocator)"]["rows"]
    assert [(row["pod_name"], row["reserved_unused_bytes"]) for row in unused] == [
        ("ml/train-0", 48 * 2**30), ("ml/train-0", 50 * 2**30)]  # pods without allocator statistics: no line
    (retries,) = results["Allocation retries and OOMs per pod (caching allocator)"]["rows"]
    assert (retries["pod_name"], retries["retries"], retries["ooms"], retries["most_reserved_unused_bytes"],
            retries["allocated_bytes"]) == ("ml/train-0", 7, 1, 50 * 2**30, 10 * 2**30)
    assert results["namespace=nb,x:Allocation retries and OOMs per pod (caching allocator)"]["rows"] == []


def test_variables_list_teams_and_namespaces_and_panels_follow_them(results: dict[str, dict[str, Any]]) -> None:
    for dashboard in ("gpulens-fleet", "gpulens-teams"):
        assert sorted(next(iter(r.values())) for r in results[f"{dashboard}:team"]["rows"]) == ["nb", "vision"]
        assert sorted(next(iter(r.values())) for r in results[f"{dashboard}:namespace"]["rows"]) == ["ml", "nb"]

    idle = {row["team_name"] for row in results["team=vision:Idle GPU-hours by team"]["rows"]}
    assert idle == {"vision"}
    pods = {row["pod"] for row in results["namespace=nb,x:Top idle pods"]["rows"]}
    assert pods == {"notebook-0"}
    assert [row["name"] for row in results["team=vision:Pending pods now, with reasons"]["rows"]] == ["big-job-0"]
    assert results["namespace=nb,x:Pending pods now, with reasons"]["rows"] == []
    assert [row["type"] for row in results["namespace=nb,x:Active alerts"]["rows"]] == ["idle_gpu"]
    # fleet-wide capacity does not depend on the selection
    assert results["team=vision:GPUs by state"] == results["GPUs by state"]
