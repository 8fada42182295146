"""The README's run command end to end: ``gpulens demo --duration`` plays a live fleet through the
real broker, the real faust workers and the real sink into the embedded ClickHouse, shows alerts,
exits cleanly leaving no process behind, and ``gpulens report`` (text, JSON and HTML) shows the
fleet's figures afterwards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.processes import pid_alive
from common.settings import KafkaSettings
from reports.html.format import fmt_hours, fmt_usd
from tests.report.dom import Page, parse

pytestmark = pytest.mark.kafka

GPULENS = [sys.executable, "-m", "gpulens"]


def test_demo_runs_a_live_fleet_and_leaves_a_reportable_history(tmp_path: Path, kafka_settings: KafkaSettings) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    port = kafka_settings.bootstrap_servers.rsplit(":", 1)[1]
    env.update({"GPULENS_DATA_DIR": str(tmp_path), "GPULENS_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
                "GPULENS_LOCAL_KAFKA__PORT": port, "GPULENS_LOG_LEVEL": "WARNING", "COLUMNS": "160"})
    demo = subprocess.run([*GPULENS, "demo", "--duration", "45s", "--speed", "20", "--nodes", "8", "--no-view"],
                          capture_output=True, text=True, env=env, timeout=400, check=False)
    output = demo.stdout + demo.stderr
    assert demo.returncode == 0, output[-4000:]
    assert "Traceback" not in output
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]
    assert len(pids) >= 2, output[-2000:]
    assert not [pid for pid in pids if pid_alive(pid)], "the demo left a pipeline process running"

    transitions = int(re.search(r"(\d+) alert transitions", output).group(1))  # type: ignore[union-attr]
    assert transitions >= 5, output[-3000:]
    assert "sink caught up" in output
    fired = re.search(r"alerts fired by type: (.*)", output).group(1)  # type: ignore[union-attr]
    for story in ("idle_gpu", "fragmentation", "pending_gpu", "vram_pressure", "crashloop_gpu", "gang_partial"):
        assert story in fired, f"the demo never fired {story}: {fired}"
    assert "gpulens report" in output and "gpulens sql" in output and "gpulens advise" in output
    # the demo ends with the advisor's headline, read from what the sink stored: never zero on the demo
    # fleet (idle notebooks, a job computing on 1 of its 4 GPUs, a cordoned node nobody uses)
    last = demo.stdout.strip().splitlines()[-1]
    headline = re.fullmatch(r"Reclaimable capacity: ([\d.]+) GPUs \((\d+) %\) reclaimable, \$([\d,]+)/month", last)
    assert headline is not None, demo.stdout[-2000:]
    assert float(headline.group(1)) > 0 and int(headline.group(3).replace(",", "")) > 0, last

    # `gpulens top --once` without the run's prefix says where the data is; with it, shows the fleet
    prefix = re.search(r"gpulens top --topic-prefix (\S+) --once", output).group(1)  # type: ignore[union-attr]
    blind = subprocess.run([*GPULENS, "top", "--once"], capture_output=True, text=True, env=env, timeout=180,
                           check=False)
    assert blind.returncode == 0 and prefix in blind.stderr and "--topic-prefix" in blind.stderr, blind.stderr
    seen = subprocess.run([*GPULENS, "top", "--once", "--topic-prefix", prefix], capture_output=True, text=True,
                          env=env, timeout=180, check=False)
    assert seen.returncode == 0 and seen.stderr == "", seen.stderr[-2000:]
    figures = orjson.loads(seen.stdout)
    # 8 nodes of 8 GPUs, of which the spot node has left by the end
    assert sum(figures["gpus_by_state"].values()) == 7 * 8 and figures["usage_by_team"], figures
    assert "fragmentation" in {alert["type"] for alert in figures["active_alerts"]}, figures

    report = subprocess.run([*GPULENS, "report", "--json"], capture_output=True, text=True, env=env, timeout=180,
                            check=False)
    assert report.returncode == 0, report.stderr[-3000:]
    sections = orjson.loads(report.stdout)
    summary = sections["summary"][0]
    assert summary["gpu_hours_allocated"] > 1.0 and summary["window_cost_usd"] > 0
    assert summary["max_stranded_gpus"] > 0
    assert {"nlp", "vision"} <= {row["team"] for row in sections["top_teams"]}
    # list prices reach the sink too (gpu_prices): list-price cost is never $0 on a priced fleet
    list_cost = sum(row["list_cost_usd"] for row in sections["cost_by_team"])
    window_cost = sum(row["window_cost_usd"] for row in sections["cost_by_team"])
    assert list_cost == pytest.approx(window_cost, rel=0.05), (list_cost, window_cost)
    assert sum(row["idle_list_cost_usd"] for row in sections["cost_by_team"]) > 0
    burned = [row for row in sections["nodes_to_scale_down"] if row["unallocated_gpu_hours"] > 0]
    assert burned and all(row["cost_burned_usd"] > 0 for row in burned), burned

    # every demo pod names its controller, so docs/sql.md's per-job query has owners
    owners = subprocess.run([*GPULENS, "sql", "--format", "json", "SELECT name, owner_kinds FROM pod_states FINAL"],
                            capture_output=True, text=True, env=env, timeout=180, check=False)
    assert owners.returncode == 0, owners.stderr[-3000:]
    rows = orjson.loads(owners.stdout)
    assert rows and all(row["owner_kinds"] for row in rows), [r for r in rows if not r["owner_kinds"]][:5]

    html = tmp_path / "report.html"
    written = subprocess.run([*GPULENS, "report", "--html", str(html)], capture_output=True, text=True, env=env,
                             timeout=180, check=False)
    assert written.returncode == 0, written.stderr[-3000:]
    page = html.read_text()
    assert page.count("<svg") >= 5 and "GPU utilisation by team over time" in page
    _report_views_and_html_agree(sections, parse(page), lambda sql: _sql(sql, env))


def _sql(query: str, env: dict[str, str]) -> list[dict[str, Any]]:
    done = subprocess.run([*GPULENS, "sql", "--format", "json", query], capture_output=True, text=True, env=env,
                          timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows: list[dict[str, Any]] = orjson.loads(done.stdout)
    return rows


def _report_views_and_html_agree(sections: dict[str, Any], page: Page,
                                 sql: Callable[[str], list[dict[str, Any]]]) -> None:
    """Every headline figure is the same in `gpulens report --json`, in the SQL views users are told
    to query (rollup-based) and in the HTML report's tables: per team, per hour, list-price cost too."""
    figures = ("gpu_hours", "idle_gpu_hours", "window_cost_usd", "list_cost_usd", "idle_list_cost_usd")
    report: dict[str, dict[str, float]] = {}
    for row in sections["cost_by_team"]:
        totals = report.setdefault(row["team"], dict.fromkeys(figures, 0.0))
        for figure in figures:
            totals[figure] += row[figure]
    views = {row["team"]: row for row in sql(
        "SELECT team, gpu_hours, idle_gpu_hours, cost_usd AS window_cost_usd, list_cost_usd, "
        "idle_cost_usd AS idle_list_cost_usd FROM v_cost_by_team")}
    assert set(views) == set(report)
    for name, expected in report.items():
        for figure in figures:
            assert views[name][figure] == pytest.approx(expected[figure], rel=1e-6, abs=1e-6), (name, figure)

    html = {(row["team"], row["project"]): row for row in page.records("cost")}
    for row in sections["cost_by_team"]:
        shown = html[(row["team"], row["project"])]
        assert shown["GPU-h"] == fmt_hours(row["gpu_hours"]) and shown["cost"] == fmt_usd(row["window_cost_usd"])
        assert shown["cost at list price"] == fmt_usd(row["list_cost_usd"]), row
    summary = sections["summary"][0]
    assert page.kpis["Cost"] == fmt_usd(summary["window_cost_usd"])

    # per hour and team: the hourly rollup (what v_cost_daily sums) against the windows themselves
    hourly = {(r["hour"], r["team"]): r["gpu_hours"] for r in sql(
        "SELECT hour, team, sum(allocated_gpu_hours) AS gpu_hours FROM rollup_hourly GROUP BY hour, team")}
    direct = {(r["hour"], r["team"]): r["gpu_hours"] for r in sql(
        "SELECT toStartOfHour(window_start) AS hour, team, sum(allocated_s) / 3600 AS gpu_hours "
        "FROM pod_windows FINAL GROUP BY hour, team")}
    assert hourly.keys() == direct.keys() and hourly == pytest.approx(direct, rel=1e-6)
