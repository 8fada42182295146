"""``gpulens report --html`` on replayed scenarios shows the figures ``gpulens replay`` reports.

Each scenario is replayed in-process, all its topics are written into a private embedded
ClickHouse through the sink's own write path, and the report is produced by the CLI
(``GPULENS_CLICKHOUSE__URL=chdb://...``). The charts' data marks and the header must then agree
with the replay's per-pod and cluster figures: cost per team, idle GPU-hours per team, stranded
GPUs, waiting times.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from gpulens.cli import main
from reports.html.format import fmt_gib, fmt_hours, fmt_usd
from simulation.scenario import load_scenario
from sinks.clickhouse import open_store
from sinks.migrations import migrate
from tests.conftest import SHARED_SCENARIOS
from tests.report.conftest import StoredReport
from tests.report.dom import Page, parse

HERE = Path(__file__).parent
SCENARIOS = [SHARED_SCENARIOS / "idle-notebook.yaml", SHARED_SCENARIOS / "fragmentation-basic.yaml",
             HERE / "scenarios" / "report-fleet.yaml"]


def _team(pod: dict[str, object]) -> str:
    return str(pod["team"] or "(none)")


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_html_report_agrees_with_the_replay_report(path: Path,
                                                   stored_report: Callable[[Path], StoredReport]) -> None:
    stored = stored_report(path)
    assert stored.stdout.strip() == f"HTML report written to {stored.html_path}"
    page = parse(stored.html_path.read_text(encoding="utf-8"))
    replay, cluster, pods = stored.replay, stored.replay["cluster"], stored.replay["pods"]

    cost = Counter[str]()
    idle = Counter[str]()
    for pod in pods:
        cost[_team(pod)] += pod["cost_usd"]
        idle[_team(pod)] += pod["idle_gpu_hours"]

    # header
    assert page.kpis["GPU capacity"] == f"{fmt_hours(cluster['gpu_hours_capacity'])} GPU-h"
    assert page.kpis["Idle while allocated"] == f"{fmt_hours(sum(idle.values()))} GPU-h"
    # a fleet without list prices: its money is unknown (a dash), not $0 (reports.notes)
    priced = bool(load_scenario(path).prices)
    assert page.kpis["Cost"] == fmt_usd(sum(cost.values()) if priced else None)
    assert page.kpis["Peak stranded GPUs"] == str(cluster["max_stranded_gpus"])
    fired = sum(1 for a in replay["alerts"] if a["state"] == "firing")
    assert page.kpis["Alerts fired"] == str(fired)

    # cost per team: the bars (busy + idle part) add up to the replay's per-pod cost
    if sum(cost.values()) > 0:
        shown = page.by_label("cost")
        assert shown == pytest.approx({t: c for t, c in cost.items() if c > 0}, abs=1e-3)
    else:
        assert "cost" not in page.charts and "no price is configured" in page.no_data["cost"][0]

    # idle GPU-hours by team (stacked idle classes)
    if sum(idle.values()) > 0:
        assert page.by_label("idle") == pytest.approx({t: h for t, h in idle.items() if h > 0}, abs=1e-3)
    else:
        assert "idle" not in page.charts and page.no_data["idle"]

    # every team that held GPUs has a utilisation line
    lines = {m.series for m in page.charts["utilisation"].marks if m.tag == "path"}
    assert lines == {_team(p) for p in pods if p["gpu_hours"] > 0}

    # stranded GPUs over time peak at the replay's maximum
    assert max(page.series_values("stranded", "stranded GPUs (peak)")) == cluster["max_stranded_gpus"]

    # the timeline shows every pod, longest wait first, each wait as long as the replay says
    spans = page.charts["lifecycle"].marks
    waits = {m.label.split(" (")[0]: m.value for m in spans if m.series == "pending"}
    expected = {f"{p['namespace']}/{p['name']}": p["pending_s"] for p in pods if p["pending_s"] > 0}
    assert waits == pytest.approx(expected)
    assert len({m.label for m in spans}) == len(pods)
    if expected:
        assert spans[0].label.startswith(max(expected, key=lambda k: expected[k]))
    # pending-time histogram: one lifecycle record per pod
    assert sum(page.by_label("pending").values()) == len(pods)

    # peak VRAM per pod: what the replay measured, in GiB
    vram = {row["pod"]: row["peak VRAM"] for row in page.records("vram")} if "vram" in page.charts else {}
    measured = {f"{p['namespace']}/{p['name']}": fmt_gib(p["peak_mem_bytes"]) for p in pods
                if p.get("peak_mem_bytes") is not None and p["gpu_hours"] > 0}
    assert vram == measured

    # alerts still firing at the end: those the replay never resolved
    resolved = {a["id"] for a in replay["alerts"] if a["state"] == "resolved"}
    open_types = Counter(a["type"] for a in replay["alerts"] if a["state"] == "firing" and a["id"] not in resolved)
    assert page.by_label("firing") == {t: float(n) for t, n in open_types.items()} if open_types else \
        "firing" not in page.charts

    if path.stem == "idle-notebook":
        assert vram, "the notebook and its neighbours report VRAM"
        # the notebook held VRAM without compute: 20 idle minutes, $2.50/GPU-h
        assert page.by_label("idle") == {"vision": pytest.approx(1 / 3, abs=1e-3)}
        assert page.series_values("cost", "idle") == [pytest.approx(2.5 / 3, abs=1e-3)]
    if path.stem == "fragmentation-basic":
        assert waits == {"research/train-4": 900.0}
        assert "Insufficient nvidia.com/gpu" in page.charts["pending-reasons"].marks[0].label


def _html_report_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *statements: str) -> Page:
    """The HTML report (through the CLI) of a fresh store holding what ``statements`` insert."""
    url = f"chdb://{tmp_path / 'clickhouse'}"
    store = open_store(url)
    try:
        migrate(store)
        for statement in statements:
            store.command(statement)
    finally:
        store.close()
    monkeypatch.setenv("GPULENS_CLICKHOUSE__URL", url)
    out = tmp_path / "report.html"
    assert main(["report", "--html", str(out), "--data-dir", str(tmp_path)]) == 0
    return parse(out.read_text(encoding="utf-8"))


def test_an_empty_store_gives_a_report_that_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = _html_report_of(tmp_path, monkeypatch)
    assert page.charts == {}
    assert all(page.no_data.get(s) for s in page.sections), page.no_data
    assert "gpulens sink" in page.no_data["summary"][0]


_OFFSET = "(number * 60 + if(number >= 60, 70 * 3600, 0))"  # 60 windows, then 10 windows 70 hours later
_STEADY_FLEET = [statement.replace("_OFFSET", _OFFSET) for statement in (
    """INSERT INTO cluster_capacity (window_id, window_start, window_end, gpus_total, gpus_allocated, gpus_busy,
        gpus_idle_allocated, gpus_free, largest_free_block, stranded_gpus, pending_pods, pending_gpu_demand)
      SELECT toString(number), toDateTime64('2026-01-05 09:00:00', 3, 'UTC') + _OFFSET,
             toDateTime64('2026-01-05 09:01:00', 3, 'UTC') + _OFFSET, 120, 100, 94, 6, 20, 1, 20, 2, 8
      FROM numbers(70)""",
    """INSERT INTO pod_windows (window_id, pod_uid, namespace, pod, node, gpu_uuid, gpu_model, window_start,
        window_end, team, allocated_s, busy_s, idle_s, samples, cost_usd, share_fraction, avg_sm_util_pct,
        max_mem_used_bytes)
      SELECT toString(number), 'u', 'ml', 'train', 'n', 'GPU-1', 'H100',
             toDateTime64('2026-01-05 09:00:00', 3, 'UTC') + _OFFSET,
             toDateTime64('2026-01-05 09:01:00', 3, 'UTC') + _OFFSET, 'vision', 60, 60, 0, 6, 0.1, 1, 90,
             42949672960
      FROM numbers(70)""")]


def test_a_partly_covered_bucket_shows_the_fleet_as_it_was_not_diluted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A steady fleet (94 busy, 6 idle, 20 free, all 20 stranded) seen for an hour and, 70 hours later,
    for 10 minutes: the span makes the buckets hourly, so the last bucket holds 10 minutes of windows,
    and must still show 94 / 6 / 20 (not 15.7 / 1 / 3.3)."""
    page = _html_report_of(tmp_path, monkeypatch, *_STEADY_FLEET)
    for series, gpus in (("busy", 94.0), ("idle allocated", 6.0), ("unallocated", 20.0)):
        assert page.series_values("fleet-states", series) == pytest.approx([gpus] * len(
            page.series_values("fleet-states", series))), series
    assert len(page.series_values("fleet-states", "busy")) == 2, "hourly buckets: one full, one of 10 minutes"
    util = [m for m in page.charts["utilisation"].marks if m.tag != "path" and not math.isnan(m.value)]
    assert [m.value for m in util] == pytest.approx([90.0, 90.0])
    free = page.series_values("stranded", "free GPUs (avg)")
    assert free and free[-1] == pytest.approx(20.0)
    assert page.series_values("stranded", "stranded GPUs (peak)")[-1] == 20

    # the text report speaks in units, not raw bytes and seconds
    capsys.readouterr()
    assert main(["report", "--section", "pods", "--data-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "40.0 GiB" in text and "$7.00" in text and "42949672960" not in text


def test_html_cannot_be_combined_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--html", str(tmp_path / "r.html"), "--json", "--data-dir", str(tmp_path)]) == 2
    assert "--html writes the whole report" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_since_reports_the_last_part_of_the_history_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The steady fleet: an hour of windows, then 10 minutes 70 hours later. ``--since`` counts back
    from the latest window: the last hour or two days hold the 10 late minutes only, three days all."""
    _html_report_of(tmp_path, monkeypatch, *_STEADY_FLEET)

    def report(*args: str) -> dict[str, list[dict[str, object]]]:
        capsys.readouterr()
        assert main(["report", "--json", *args, "--data-dir", str(tmp_path)]) == 0
        return json.loads(capsys.readouterr().out)

    whole = report()
    for since, windows in (("1h", 10), ("2d", 10), ("3d", 70), ("10m", 10), ("5m", 5)):
        got = report("--since", since)
        summary, (pod,) = got["summary"][0], got["pods"]
        assert summary["windows"] == windows, since
        assert summary["gpu_hours_allocated"] == pytest.approx(windows / 60, abs=1e-6), since
        assert summary["gpu_hours_capacity"] == pytest.approx(windows * 120 / 60, abs=1e-6), since
        assert pod["cost_usd"] == pytest.approx(windows * 0.1, abs=1e-6), since
        assert [r["hour"] for r in got["fragmentation_over_time"]] == [
            r["hour"] for r in whole["fragmentation_over_time"]][-1 if windows < 60 else 0:], since
    assert report("--since", "3d") == whole
    assert report("--since", "99999999999d") == whole, "longer than any date: the whole history"

    # the HTML report's charts: the 10 late minutes, in minutes (the whole history: the 70 hours, hourly)
    out = tmp_path / "since.html"
    assert main(["report", "--html", str(out), "--since", "1h", "--data-dir", str(tmp_path)]) == 0
    page = parse(out.read_text(encoding="utf-8"))
    assert page.series_values("fleet-states", "busy") == pytest.approx([94.0] * 10)
    util = [m.value for m in page.charts["utilisation"].marks if m.tag != "path" and not math.isnan(m.value)]
    assert util == pytest.approx([90.0] * 10)

    capsys.readouterr()
    assert main(["report", "--section", "summary", "--since", "1h", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(
        "period: 2026-01-08T07:10:00.000Z .. 2026-01-08T08:10:00.000Z (--since counts back from the latest data)")


@pytest.mark.parametrize("args, message", [
    (["--since", "yesterday"], "--since"),
    (["--since", "0h"], "--since"),
])
def test_a_bad_since_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                            message: str) -> None:
    assert main(["report", *args, "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
