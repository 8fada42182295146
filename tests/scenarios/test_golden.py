"""Golden tests: every scenario with an expected-results file replays to a matching report.

The shared examples (copied into ``tests/data/scenarios``) and the product's own scenarios
(``simulation/scenarios``) are compared with FORMAT.md's tolerances by ``compare_report``: alert
times within two sample intervals, numbers to four decimals, only the fields the expected file
names — and the expected alert list is complete, so an extra alert fails the test.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from schemas.outputs import PodLifecycle
from simulation.replay import POD_FIGURES, build_report, compare_report, run_in_process
from simulation.scenario import load_scenario
from simulation.simulator import FleetSimulator
from tests.conftest import REPO_ROOT, SHARED_SCENARIOS

OWN_SCENARIOS = REPO_ROOT / "simulation" / "scenarios"


def _cases() -> list[Path]:
    files = sorted(SHARED_SCENARIOS.glob("*.yaml")) + sorted(OWN_SCENARIOS.glob("*.yaml"))
    return [f for f in files if f.with_suffix("").with_suffix(".expected.json").exists()
            or f.parent.joinpath(f.stem + ".expected.json").exists()]


def test_shared_examples_are_present() -> None:
    names = {f.stem for f in SHARED_SCENARIOS.glob("*.yaml")}
    assert {"idle-notebook", "fragmentation-basic"} <= names


@pytest.mark.parametrize("path", _cases(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_scenario_matches_expected(path: Path) -> None:
    scenario = load_scenario(path)
    expected = orjson.loads(path.parent.joinpath(path.stem + ".expected.json").read_bytes())
    result = run_in_process(scenario)
    problems = compare_report(result.report, expected, scenario.sample_interval_s)
    assert problems == [], "\n".join(problems)
    # the report shows only what the pipeline emitted: without its lifecycle records no pod row
    # is filled from elsewhere, and every pod the file expects is a difference
    blind = build_report(scenario, [m for m in result.outputs if not isinstance(m, PodLifecycle)],
                         FleetSimulator(scenario).pod_uids(), {})
    assert all(row["seen"] is False and all(row[f] is None for f in POD_FIGURES) for row in blind["pods"])
    unseen = [p for p in compare_report(blind, expected, scenario.sample_interval_s) if "not seen" in p]
    assert len(unseen) == sum(1 for want in expected.get("pods", []) if want.get("seen", True))


@pytest.mark.parametrize("path", sorted(SHARED_SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_report_is_byte_identical_across_runs(path: Path) -> None:
    scenario = load_scenario(path)
    first = orjson.dumps(run_in_process(scenario).report)
    second = orjson.dumps(run_in_process(load_scenario(path)).report)
    assert first == second


def test_idle_notebook_details_and_quiet_neighbours() -> None:
    report = run_in_process(load_scenario(SHARED_SCENARIOS / "idle-notebook.yaml")).report
    firing = [a for a in report["alerts"] if a["state"] == "firing"]
    assert [(a["type"], a["subject"]["name"]) for a in firing] == [("idle_gpu", "notebook-alice")]
    assert firing[0]["details"]["idle_class"] == "vram_held"
    resolved = [a for a in report["alerts"] if a["state"] == "resolved"]
    assert resolved[0]["id"] == firing[0]["id"]
    assert not any(a["type"] == "idle_node" for a in report["alerts"])


def test_fragmentation_details() -> None:
    report = run_in_process(load_scenario(SHARED_SCENARIOS / "fragmentation-basic.yaml")).report
    frag = next(a for a in report["alerts"] if a["type"] == "fragmentation" and a["state"] == "firing")
    assert frag["summary"] == "train-4 needs 4 GPUs; 8 are free but at most 3 on one node"
    pending = next(a for a in report["alerts"] if a["type"] == "pending_gpu" and a["state"] == "firing")
    assert pending["details"]["would_fit_unfragmented"] is True
    assert pending["details"]["last_scheduler_reason"] == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert pending["details"]["request"] == {"nvidia.com/gpu": 4}
