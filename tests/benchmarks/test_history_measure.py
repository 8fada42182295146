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
    Rating,
    StoreFigures,
    Subject,
    cookbook,
    expand_macros,
    grafana_step_s,
    measure_store,
    panels,
    rating_of,
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
    lists = {name for name, subject in figures.subjects.items()
             if subject.kind == "section" and subject.rating is not Rating.AGGREGATE}
    assert lists == {f"report section {name}" for name in LISTS} and "report section pods" in lists
    rankings = {name for name, subject in figures.subjects.items() if subject.rating is Rating.PER_POD}
    assert {"gpulens advise --since <range>", "report section top_pods", "panel gpulens-teams: Top idle pods",
            "sql.md #15 Cost per unit of work"} <= rankings
    assert "report section pods" not in rankings and "panel gpulens-teams: Cost per team" not in rankings
    assert figures.pods > 0
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


def cost(result_rows: int, cpu_s: float = 0.01) -> Cost:
    return Cost(queries=1, read_rows=10, read_bytes=100, cpu_s=cpu_s, peak_memory_bytes=1, max_query_s=0.01,
                result_rows=result_rows, wall_s=0.01)


def test_an_undeclared_subject_is_rated_per_row_when_its_answer_grows_with_the_range() -> None:
    query = Subject("sql.md #1", "cookbook", lambda: None, rating=None)
    assert rating_of(query, cost(7), cost(7)) is rating_of(query, cost(0), cost(1)) is Rating.AGGREGATE
    assert rating_of(query, cost(24), cost(720)) is Rating.PER_ROW, "a row per hour over 30 days lists rows"
    section = Subject("report section summary", "section", lambda: None)
    assert rating_of(section, cost(4), cost(400)) is Rating.AGGREGATE, "a declared aggregate stays one"


def test_each_rating_divides_the_cost_by_its_own_measure_of_the_question() -> None:
    def store(days: int, pods: int, costs: dict[str, Cost]) -> StoreFigures:
        subjects = {"ranking": Subject("ranking", "cookbook", lambda: None, Rating.PER_POD),
                    "list": Subject("list", "section", lambda: None, Rating.PER_ROW),
                    "total": Subject("total", "section", lambda: None),
                    "baseline: one raw column, full scan": Subject("baseline: one raw column, full scan", "baseline",
                                                                   lambda: None)}
        return StoreFigures(days, 64, costs | {"baseline: one raw column, full scan": cost(1)}, subjects, {}, pods)

    short = store(1, 100, {"ranking": cost(20, 0.01), "list": cost(100, 0.01), "total": cost(5, 0.01)})
    long = store(30, 3000, {"ranking": cost(20, 0.04), "list": cost(3000, 0.04), "total": cost(5, 0.04)})
    ratios = {r.metric: (r.ratio_to_baseline, r.target) for r in cost_figures(short, long)
              if r.baseline and r.baseline.endswith(", 1 d")}
    assert ratios["ranking"] == (pytest.approx(4 / 30), "<= 2x per pod (1 d)")
    assert ratios["list"] == (pytest.approx(4 / 30), "<= 2x per row (1 d)")
    assert ratios["total"] == (pytest.approx(4.0), "<= 2x (1 d)"), "an aggregate answers for its whole cost"
