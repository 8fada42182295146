"""A scenario played at real speed through a real kube-apiserver (``simulation/kube_replay.py``): the
watcher's records from the server, with the simulator's GPU samples, must give the same report as
the in-process replay of the same scenario (FORMAT.md's tolerances)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.processes import pid_alive
from simulation.kube_local import LocalKube, build_binaries
from simulation.kube_replay import run_through_apiserver, starting_now
from simulation.replay import compare_report, run_in_process
from simulation.scenario import load_scenario

SCENARIO = Path(__file__).parent / "fixtures" / "apiserver-short.yaml"


def test_scenario_through_the_real_control_plane_matches_the_in_process_replay(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # a control plane of its own: no node or pod of another test in the cluster's totals
    with LocalKube(tmp_path_factory.mktemp("kube-scenario"), build_binaries()) as plane:
        scenario = starting_now(load_scenario(SCENARIO), lead_s=3.0)
        real = run_through_apiserver(scenario, plane)
        pids = plane.pids()
    assert len(pids) == 2 and not any(pid_alive(pid) for pid in pids)  # etcd and kube-apiserver stopped
    expected = run_in_process(scenario).report
    assert real.deadletters == []
    assert [(p["name"], p["end_reason"]) for p in real.report["pods"]] == [
        ("train", "Succeeded"), ("oom", "OOMKilled"), ("too-big", "Deleted"), ("late", "Running"),
        ("helper", "Running")]
    problems = compare_report(real.report, expected, scenario.sample_interval_s)
    assert problems == [], "\n".join(problems)
