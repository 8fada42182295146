"""The replay benchmark's churning fleet and its state measurement, at a size that runs in seconds."""

from __future__ import annotations

from benchmarks.bench_replay import churn_scenario, measure_state


def test_the_churning_fleet_passes_every_pod_through_its_gpus() -> None:
    scenario = churn_scenario(nodes=2, pods=100, duration_s=1200)
    assert len(scenario.pods) == 100
    assert {spec.gpus for spec in scenario.pods} == {1}
    assert all(spec.run_for is not None and spec.delete is not None and spec.create + spec.run_for <= 1200
               for spec in scenario.pods)


def test_the_stages_state_follows_the_fleet_not_the_pods_that_passed() -> None:
    result = measure_state(nodes=2, pods=200, duration_s=1800, simulator_only=False)
    third, two_thirds, end = result["snapshots"]
    assert result["outputs"] > 0 and result["pods"] == 200 and result["gpus"] == 16
    for snapshot in (third, two_thirds, end):
        assert 0 < snapshot["node_max"] <= snapshot["nodes"] and snapshot["cluster"] > 0
    # two thirds of the pods passed between the first snapshot and the last: the state did not grow with them
    assert end["nodes"] < 2 * third["nodes"]
    assert result["after"]["VmHWM"] >= result["before"]["VmRSS"] > 0
