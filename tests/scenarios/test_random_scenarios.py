"""Seeded random scenarios (``simulation.random_scenario``): files nobody wrote, of every feature of
the format, replay in-process with every pod that existed seen, each pod's timeline as the simulator played it,
every alert's transitions in order, and the same report every time. Fifteen fixed seeds and ten
that rotate daily (the seed is in the failure message; ``python -m simulation.random_scenario
SEED`` prints the file). Through Kafka under chaos: ``tests/stream_jobs/test_chaos_workers.py``
and ``make chaos RANDOM_SCENARIOS=N``."""

from __future__ import annotations

import time
from collections import defaultdict
from itertools import pairwise

import pytest
import yaml

from simulation.random_scenario import main, random_scenario, random_scenario_yaml
from simulation.replay import run_in_process
from simulation.scenario import parse_scenario
from simulation.simulator import FleetSimulator

DAY = int(time.time() // 86400)
SEEDS = [*range(15), *range(1000 + DAY * 10, 1000 + DAY * 10 + 10)]


def test_one_seed_gives_one_file_and_seeds_differ() -> None:
    assert random_scenario_yaml(7) == random_scenario_yaml(7)
    assert len({random_scenario_yaml(seed) for seed in range(20)}) == 20


def test_the_files_cover_the_format() -> None:
    """Over 200 seeds, every feature the generator offers shows up: a generator that lost one
    would test less without anyone noticing."""
    docs = [random_scenario(seed) for seed in range(200)]
    nodes = [node for doc in docs for node in doc["nodes"]]
    pods = [pod for doc in docs for pod in doc["pods"]]
    assert any("mig" in node for node in nodes) and any("time_slicing" in node for node in nodes)
    assert any(node.get("process_stats") is False for node in nodes)
    assert any("ready_until" in node for node in nodes) and any(node.get("unschedulable") for node in nodes)
    assert any(str(pod.get("resource", "")).startswith("nvidia.com/mig-") for pod in pods)
    for field in ("node", "run_for", "delete", "gang", "crashloop", "steps_per_s", "owner", "active_gpus",
                  "vram_request_gib", "allocator", "workload"):
        assert any(field in pod for pod in pods), field
    assert any(isinstance(pod["util"], list) for pod in pods) and any(pod["processes"] == 0 for pod in pods)
    assert any("admit" not in workload for doc in docs for workload in doc.get("workloads", ()))
    for field in ("thresholds", "cluster", "faults", "agent_gaps", "late_samples", "poison", "workloads"):
        assert any(field in doc for doc in docs), field


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_scenario_replays(seed: int) -> None:
    text = random_scenario_yaml(seed)
    scenario = parse_scenario(yaml.safe_load(text), source=f"random seed {seed}")
    simulator = FleetSimulator(scenario)
    report = run_in_process(scenario, ticks=list(simulator.run())).report
    assert [(row["namespace"], row["name"]) for row in report["pods"]] == \
        [(pod.namespace, pod.name) for pod in scenario.pods], f"seed {seed}"
    nodes = {node.name: node for node in scenario.nodes}
    for row, played in zip(report["pods"], simulator.pods, strict=True):
        # what the simulator did to the pod, against what the pipeline made of the records it wrote
        if played.created is None:  # a pod of a workload never admitted: never created, never seen
            assert row["seen"] is False and row["running_s"] is None, f"seed {seed}, {played.spec.name}"
            continue
        assert row["seen"] is True, f"seed {seed}: the pipeline never saw {played.spec.name}"
        end = played.ended if played.ended is not None else scenario.end_offset_s
        running_s = 0.0 if played.scheduled is None else end - played.scheduled
        expected = {
            "node": played.node,
            "end_reason": played.end_reason or ("Running" if played.scheduled is not None else "Pending"),
            "pending_s": (played.scheduled if played.scheduled is not None else end) - played.created,
            "running_s": running_s,
        }
        assert {key: row[key] for key in expected} == expected, f"seed {seed}, {played.spec.name}"
        gpu_hours = played.spec.gpus * running_s / 3600
        assert row["gpu_hours"] == pytest.approx(gpu_hours, abs=5.1e-5), f"seed {seed}, {played.spec.name}"
        node = nodes.get(str(played.node))
        if node is not None and not node.mig and node.time_slicing == 1:  # whole GPUs: the format's cost
            price = scenario.prices.get(node.model, 0.0)
            assert row["cost_usd"] == pytest.approx(gpu_hours * price, abs=5.1e-5), f"seed {seed}, {played.spec.name}"
    transitions: dict[str, list[str]] = defaultdict(list)
    for alert in report["alerts"]:
        transitions[alert["id"]].append(alert["state"])
    for alert_id, states in transitions.items():
        assert states[0] == "firing" and all(a != b for a, b in pairwise(states)), \
            f"seed {seed}: alert {alert_id} went {states}"
    assert [alert["at"] for alert in report["alerts"]] == sorted(alert["at"] for alert in report["alerts"])
    assert run_in_process(scenario).report == report, f"seed {seed}: a second replay differs"


def test_the_module_prints_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["3"]) == 0
    assert capsys.readouterr().out == random_scenario_yaml(3)
    assert main(["three"]) == 2
    assert "usage" in capsys.readouterr().err
