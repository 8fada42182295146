"""The scenario format as users write it: defaults, durations, steps, thresholds, and errors that
name the field (``gpulens replay`` exits 2 with one line, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from schemas.codec import decode
from schemas.messages import PodState, WorkloadProgress
from schemas.topics import K8S_PODS, WORKLOAD_PROGRESS
from simulation.replay import run_in_process
from simulation.scenario import ScenarioError, parse_duration, parse_scenario, step_value
from simulation.simulator import FleetSimulator
from tests.conftest import REPO_ROOT, SHARED_SCENARIOS


def _parse(text: str):  # type: ignore[no-untyped-def]
    return parse_scenario(yaml.safe_load(text))


def test_defaults_follow_format_md() -> None:
    sc = _parse("duration: 5m\nnodes: [{name: a}]\npods: [{name: p, gpus: 2}]")
    node, pod = sc.nodes[0], sc.pods[0]
    assert (node.gpus, node.model, node.memory_gib, node.driver, node.cuda) == (
        8, "NVIDIA H100 80GB HBM3", 80.0, "550.54.15", "12.4")
    assert sc.sample_interval_s == 10 and sc.window_s == 60 and sc.prices == {}
    assert (pod.processes, pod.create, pod.end, pod.namespace) == (1, 0.0, "Succeeded", "default")


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("1.5h", 5400), (45, 45), (2.5, 2.5),
                                                ("500ms", 0.5), ("1d", 86400)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text, "x") == seconds


def test_util_steps_hold_from_their_offset() -> None:
    sc = _parse("duration: 5m\npods: [{name: p, util: [[10m, 2], [0m, 90]]}]")
    steps = sc.pods[0].util
    assert [step_value(steps, t) for t in (0, 599, 600, 3600)] == [90, 90, 2, 2]


def test_threshold_overrides_accept_durations_and_seconds() -> None:
    sc = _parse("duration: 5m\nthresholds: {idle_after: 2m, pending_after: 90, idle_util_pct: 10}")
    assert (sc.thresholds.idle_after, sc.thresholds.pending_after, sc.thresholds.idle_util_pct) == (120, 90, 10)


@pytest.mark.parametrize(("text", "message"), [
    ("duration: 5m\npods: [{name: a}, {name: b}, {name: c, util: high}]", "pods[2].util: expected a number"),
    ("duration: 5m\npods: [{name: a, util: 120}]", "pods[0].util: must be <= 100"),
    ("duration: 5m\npods: [{name: a, util: [[0m, 5], [bad, 3]]}]", "pods[0].util[1][0]: expected a duration"),
    ("duration: 5m\npods: [{name: a, gpus: -1}]", "pods[0].gpus: must be >= 0"),
    ("duration: 5m\npods: [{name: a, end: Exploded}]", "pods[0].end: expected one of"),
    ("duration: 5m\npods: [{name: a, gpu: 1}]", "pods[0].gpu: unknown field"),
    ("duration: 5m\nnodes: [{name: a}, {name: a}]", "nodes[1].name: duplicate"),
    ("duration: soon", "duration: expected a duration"),
    ("nodes: []", "duration: required"),
    ("duration: 5m\nthresholds: {idle_afterr: 5m}", "thresholds.idle_afterr: unknown threshold"),
    ("duration: 5m\nsample_interval: 0s", "sample_interval: must be greater than zero"),
    ("duration: 5m\nstart: yesterday", "start: expected an ISO 8601"),
    ("- just\n- a list", "must be a YAML mapping"),
    ("duration: 5m\npods: [{name: a, owner: Widget/w}]", "pods[0].owner: expected Kind/name with Kind one of"),
    ("duration: 5m\npods: [{name: a, owner: Job/Bad_Name}]", "pods[0].owner: 'Bad_Name' is not a valid"),
    ("duration: 5m\npods: [{name: a, gpus: 2, active_gpus: 3}]", "pods[0].active_gpus: must be <= gpus (2), got 3"),
    ("duration: 5m\npods: [{name: a, active_gpus: -1}]", "pods[0].active_gpus: must be >= 0"),
    ("duration: 5m\npods: [{name: a}, {name: b}, {name: c}, {name: d, gpus: 1.5}]",
     "pods[3].gpus: expected a whole number, got 1.5"),
    ("duration: 5m\npods: [{name: a, labels: {team: [ml]}}]", "pods[0].labels.team: expected a string value"),
    ("duration: 5m\nworkloads: [{name: w, pod_sets: [{count: 0}]}]", "workloads[0].pod_sets[0].count: must be >= 1"),
    ("duration: 5m\nworkloads: [{name: w, pod_sets: [{size: 2}]}]",
     "workloads[0].pod_sets[0].size: unknown field; known fields: count, gpus, name, resource"),
    ("duration: 5m\nnodes: [{name: a}]\nagent_gaps: [{node: a, from: 5m, until: 9m}]",
     "agent_gaps[0].until: unknown field; known fields: from, node, to"),
    ("duration: 5m\nnodes: [{name: a}]\nagent_gaps: [{node: a, from: 5m}]",
     "agent_gaps[0].to: expected a duration like 90s, 10m or 1.5h, got None"),
    ("duration: 5m\nnodes: [7]", "nodes[0]: expected a mapping, got int"),
    ("duration: 5m\nprices: {H100: -2}", "prices.H100: must be >= 0"),
])
def test_invalid_files_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        _parse(text)
    assert message in str(info.value)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpulens.cli", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=False)


def test_cli_reports_a_bad_file_in_one_line_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("duration: 5m\nnodes: [{name: a}]\npods: [{name: p, memory_gib: lots}]\n")
    result = _cli("replay", str(bad), "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pods[0].memory_gib: expected a number" in lines[0]
    assert "Traceback" not in result.stderr


def test_cli_json_is_the_report_and_byte_identical(tmp_path: Path) -> None:
    path = REPO_ROOT / "simulation" / "scenarios" / "gang-partial.yaml"
    first = _cli("replay", str(path), "--json")
    second = _cli("replay", str(path), "--json")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    import orjson

    report = orjson.loads(first.stdout)
    assert set(report) >= {"scenario", "alerts", "pods", "cluster"}
    assert report["alerts"][0]["subject"] == {"kind": "gang", "namespace": "ml", "name": "llm-7", "node": None,
                                              "gpu_uuid": None}


def test_cli_summary_is_readable() -> None:
    result = _cli("replay", str(REPO_ROOT / "simulation" / "scenarios" / "idle-node.yaml"))
    assert result.returncode == 0, result.stderr
    assert "idle_node" in result.stdout and "late-job" in result.stdout


def test_threshold_override_moves_the_alert() -> None:
    text = (SHARED_SCENARIOS / "idle-notebook.yaml").read_text()
    data = yaml.safe_load(text)
    data["thresholds"] = {"idle_after": "2m"}
    report = run_in_process(parse_scenario(data)).report
    firing = [a for a in report["alerts"] if a["type"] == "idle_gpu" and a["state"] == "firing"]
    assert [a["at"] for a in firing] == ["2026-01-05T09:07:00Z"]


def test_duration_not_on_the_tick_grid_rounds_up_to_whole_intervals() -> None:
    sc = _parse("duration: 95s\nnodes: [{name: a, gpus: 1}]\npods: [{name: p, util: 50}]")
    report = run_in_process(sc).report
    assert report["pods"][0]["running_s"] == 100


def test_owners_reach_the_pod_state_and_training_steps_are_whole() -> None:
    """Pods name their controller (the per-job SQL of docs/sql.md needs it); a gang shares one owner;
    a training job reports whole steps, as a real training loop counts them."""
    sc = _parse("""
duration: 2m
nodes: [{name: n, gpus: 4}]
pods:
  - {name: w-0, gpus: 1, owner: JobSet/llm, steps_per_s: 0.73}
  - {name: w-1, gpus: 1, owner: JobSet/llm}
  - {name: nb, gpus: 1, owner: StatefulSet/nb}
  - {name: bare, gpus: 1}
""")
    states: dict[str, PodState] = {}
    steps: list[float] = []
    for tick in FleetSimulator(sc).run():
        for record in tick.records:
            if record.topic == K8S_PODS.suffix and record.value is not None:
                state = decode(record.value, PodState)
                states[state.name] = state
            elif record.topic == WORKLOAD_PROGRESS.suffix and record.value is not None:
                steps.append(decode(record.value, WorkloadProgress).steps_total or 0.0)
    owners = {name: [(o.kind, o.name) for o in state.owners] for name, state in states.items()}
    assert owners == {"w-0": [("JobSet", "llm")], "w-1": [("JobSet", "llm")], "nb": [("StatefulSet", "nb")],
                      "bare": []}
    assert states["w-0"].owners[0].uid == states["w-1"].owners[0].uid != states["nb"].owners[0].uid
    assert steps and steps[-1] > 0 and all(value == int(value) for value in steps)
