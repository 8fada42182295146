"""The history benchmark's measurement (benchmarks/history/measure.py) on a small filled store: it
finds every Grafana panel and every cookbook query, expands every macro, and every subject — the
report in its three forms, each of its sections, the advisor, each panel, each cookbook query, the baseline scan — runs
and is costed from the engine's query log, within the product's read limits with a margin of 4x.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from benchmarks.history.fill import FillSpec, fill
from benchmarks.history.main import MEMORY_TARGET, TIME_TARGET_S, cost_figures
from benchmarks.history.measure import (
    Cost,
    StoreFigures,
    Subject,
    cookbook,
    expand_macros,
    grafana_step_s,
    is_aggregate,
    measure_store,
    panels,
)
from reports.analyses import ANALYSES, LISTS
from tests.conftest import REPO_ROOT

SPEC = FillSpec(gpus=16, days=2, day_s=600, template_nodes=4, gpus_per_node=4, variants=1)


def test_every_cookbook_query_and_panel_is_found() -> None:
    blocks = re.findall(r"^```sql$", (REPO_ROOT / "docs" / "sql.md").read_text(), re.MULTILINE)
    assert len(cookbook()) == len(blocks) > 10
    dashboards = {d for d, _, _ in panels()}
    assert dashboards == {"gpulens-fleet", "gpulens-teams"} and len(panels()) >= 12
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for _, title, raw in panels():
        sql = expand_macros(raw, start, start + timedelta(days=30))
        assert "$" not in sql, title
    assert grafana_step_s(86400) == 60 and grafana_step_s(30 * 86400) == 1800


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> StoreFigures:
    cache = tmp_path_factory.mktemp("history-measure")
    outcome = fill(SPEC, cache)
    end = SPEC.start + timedelta(seconds=SPEC.days * SPEC.day_s)
    return measure_store(outcome.path, SPEC.days, SPEC.fleet_gpus, SPEC.start, end, cache / "scratch", runs=1)


def test_every_subject_runs_and_is_costed_within_the_read_limits(figures: StoreFigures) -> None:
    assert len(figures.costs) == 6 + len(ANALYSES) + len(panels()) + len(cookbook())
    for name, cost in figures.costs.items():
        assert cost.queries >= 1, f"{name}: no query in the engine's log"
        assert cost.peak_memory_bytes <= MEMORY_TARGET and cost.max_query_s <= TIME_TARGET_S, name
    report = figures.costs["gpulens report --json"]
    assert report.queries > 10 and report.read_rows > 0 and report.cpu_s > 0
    assert figures.costs["baseline: one raw column, full scan"].read_rows > 0
    assert figures.disk["gpu_samples"] > 0 and figures.disk["rollup_hourly"] > 0 and figures.disk["team_daily"] > 0
    lists = {name for name, subject in figures.subjects.items() if subject.kind == "section" and not subject.aggregate}
    assert lists == {f"report section {name}" for name in LISTS} and "report section pods" in lists
    # the table of figures: every subject against itself (both "ranges" the same store here)
    results = cost_figures(figures, figures)
    assert {r.metric for r in results if r.target == "<= 3x"} >= {"gpulens report --json vs scan"}
    assert all(r.ratio_to_baseline == pytest.approx(1.0) for r in results
               if r.baseline and r.baseline.endswith(", 1 d") and r.value > 0)


def test_the_cache_is_reused(tmp_path: Path) -> None:
    spec = FillSpec(gpus=16, days=1, day_s=300, template_nodes=4, gpus_per_node=4, variants=1)
    first = fill(spec, tmp_path)
    again = fill(spec, tmp_path)
    assert not first.cached and again.cached and again.path == first.path and again.rows == first.rows


def test_an_undeclared_subject_is_rated_per_row_when_its_answer_grows_with_the_range() -> None:
    def cost(result_rows: int) -> Cost:
        return Cost(queries=1, read_rows=10, read_bytes=100, cpu_s=0.01, peak_memory_bytes=1, max_query_s=0.01,
                    result_rows=result_rows, wall_s=0.01)

    query = Subject("sql.md #1", "cookbook", lambda: None, aggregate=None)
    assert is_aggregate(query, cost(7), cost(7)) and is_aggregate(query, cost(0), cost(1))
    assert not is_aggregate(query, cost(24), cost(720)), "a row per hour over 30 days lists rows"
    section = Subject("report section summary", "section", lambda: None)
    assert is_aggregate(section, cost(4), cost(400)), "a declared aggregate stays one"
