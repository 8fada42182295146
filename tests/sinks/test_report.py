"""``gpulens report`` on replayed scenarios agrees with ``gpulens replay``'s own report.

The replay runs in-process (simulator + stream stages); its inputs (samples, pods, nodes, events,
progress) and its outputs (windows, capacity, lifecycle, alerts) travel through the real broker to
the sink, into the real engine; the report is then read back through the CLI.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
import pytest

from common.settings import KafkaSettings
from gpulens.cli import main
from reports.analyses import ANALYSES
from simulation.scenario import load_scenario
from sinks.service import run_sink
from tests.conftest import REPO_ROOT, SHARED_SCENARIOS
from tests.sinks.conftest import Item, make_sink_settings, replayed_items

pytestmark = pytest.mark.kafka

HERE = Path(__file__).parent
SCENARIOS = [SHARED_SCENARIOS / "idle-notebook.yaml", SHARED_SCENARIOS / "fragmentation-basic.yaml",
             HERE / "scenarios" / "sink-costs.yaml"]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_report_agrees_with_the_replay_report(
    path: Path, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path,
    producer: Callable[[Iterable[Item]], int], capsys: pytest.CaptureFixture[str],
) -> None:
    replay, items = replayed_items(path)
    producer(items)
    scenario = load_scenario(path)
    settings = make_sink_settings(kafka_settings, topic_prefix, tmp_path, batch_max_rows=2000,
                                  batch_max_age_s=0.3, raw_sample_ttl_days=3650,
                                  prices_usd_per_gpu_hour=dict(scenario.prices))
    run_sink(settings, exit_when_idle_s=1.0)

    capsys.readouterr()
    assert main(["report", "--json", "--data-dir", str(tmp_path)]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert list(report) == list(ANALYSES)

    # per pod: GPU-hours, idle GPU-hours and cost from the stored windows
    ours = {(p["namespace"], p["name"]): p for p in report["pods"]}
    for pod in replay["pods"]:
        if pod["gpu_hours"] == 0:
            assert (pod["namespace"], pod["name"]) not in ours
            continue
        row = ours[(pod["namespace"], pod["name"])]
        for figure in ("gpu_hours", "idle_gpu_hours"):
            assert row[figure] == pytest.approx(pod[figure], abs=1e-3), (pod["name"], figure)
        # without list prices the money is unknown (reports.notes), not the replay's $0
        assert row["cost_usd"] == (pytest.approx(pod["cost_usd"], abs=1e-3) if scenario.prices else None), pod["name"]
        assert row["end_reason"] == pod["end_reason"]

    # fleet totals
    summary = report["summary"][0]
    cluster = replay["cluster"]
    assert summary["gpu_hours_capacity"] == pytest.approx(cluster["gpu_hours_capacity"], abs=1e-3)
    assert summary["gpu_hours_allocated"] == pytest.approx(cluster["gpu_hours_allocated"], abs=1e-3)
    assert summary["gpu_hours_idle_allocated"] == pytest.approx(cluster["gpu_hours_idle_allocated"], abs=1e-3)
    assert summary["gpu_hours_unallocated"] == pytest.approx(cluster["gpu_hours_unallocated"], abs=1e-3)
    assert summary["max_stranded_gpus"] == cluster["max_stranded_gpus"]
    assert summary["gpu_hours_idle"] == pytest.approx(sum(p["idle_gpu_hours"] for p in replay["pods"]), abs=1e-3)
    by_team = Counter[str]()
    for pod in replay["pods"]:
        by_team[pod["team"]] += pod["gpu_hours"]
    for row in report["top_teams"]:
        assert row["gpu_hours"] == pytest.approx(by_team[row["team"]], abs=1e-3)
    if scenario.prices:
        assert summary["window_cost_usd"] == pytest.approx(sum(p["cost_usd"] for p in replay["pods"]), abs=1e-3)
        assert sum(r["window_cost_usd"] for r in report["cost_by_team"]) == pytest.approx(summary["window_cost_usd"])
    else:
        assert summary["window_cost_usd"] is None and all(r["window_cost_usd"] is None for r in report["cost_by_team"])

    # the canned questions are answered from the same data
    assert {r["name"]: r["end_reason"] for r in report["lifecycle_timeline"]} == {
        p["name"]: p["end_reason"] for p in replay["pods"]}
    assert sum(r["pods"] for r in report["pending_distribution"]) == len(replay["pods"])
    assert max(r["max_stranded_gpus"] for r in report["fragmentation_over_time"]) == cluster["max_stranded_gpus"]
    fired = Counter(a["type"] for a in replay["alerts"] if a["state"] == "firing")
    assert {r["type"]: r["alerts"] for r in report["alerts_by_type"]} == dict(fired)
    unallocated = sum(r["unallocated_gpu_hours"] for r in report["nodes_to_scale_down"])
    assert unallocated == pytest.approx(cluster["gpu_hours_unallocated"], abs=1e-3)
    if any(p["pending_s"] > 0 for p in replay["pods"]):
        assert report["pending_reasons"] and "Insufficient nvidia.com/gpu" in report["pending_reasons"][0]["reason"]

    if path.stem == "sink-costs":
        # every query of the SQL cookbook runs on this data through the same CLI
        cookbook = (REPO_ROOT / "docs" / "sql.md").read_text()
        queries = [block.split("```", 1)[0] for block in cookbook.split("```sql\n")[1:]]
        assert len(queries) >= 15
        for query in queries:
            assert main(["sql", query, "--format", "json", "--data-dir", str(tmp_path)]) == 0, (
                query, capsys.readouterr().err)
            assert isinstance(orjson.loads(capsys.readouterr().out), list)
        idle = {(r["team"], r["idle_class"]): r["idle_gpu_hours"] for r in report["idle_by_team_and_class"]}
        assert idle == {("analytics", "no_process"): pytest.approx(1 / 3, abs=1e-3),
                        ("analytics", "vram_held"): pytest.approx(0.25, abs=1e-3)}
        gpu_b = next(r for r in report["nodes_to_scale_down"] if r["node"] == "gpu-b")
        assert gpu_b["unallocated_share"] == 1.0
        assert gpu_b["cost_burned_usd"] == pytest.approx(2 * 20 / 60 * 3.0, abs=1e-3)
        (unit,) = report["cost_per_unit_of_work"]
        train = next(p for p in replay["pods"] if p["name"] == "train-1")
        assert unit["pod"] == "train-1" and unit["cost_usd"] == pytest.approx(train["cost_usd"], abs=1e-3)
        assert unit["cost_per_step_usd"] == pytest.approx(train["cost_per_step_usd"], rel=0.02)
