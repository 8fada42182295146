"""Seeded random scenarios (``simulation.random_scenario``): files nobody wrote, of every feature of
the format, replay in-process with every pod that existed seen; each pod's timeline as the simulator
played it and, on whole GPUs, its cost, idle hours, utilisation and peak memory as the samples the
simulator wrote add up; on whole GPUs the cluster's capacity as the nodes were up and its allocated
GPU-hours as the pods' add up; every alert's transitions in order; the same report every time. A DRA
GPU's samples name their pods in ``dra_allocations``, not in ``assigned_to``: the tally resolves them
through the devices the node published with the node stage's own join (``stream_jobs.dra_join``), so
it knows who holds a DRA GPU while adding up the figures itself.
Fifteen fixed seeds and ten that rotate daily (the seed is in the failure message; ``python -m
simulation.random_scenario SEED`` prints the file). Through Kafka under chaos:
``tests/stream_jobs/test_chaos_workers.py`` and ``make chaos RANDOM_SCENARIOS=N``."""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import pairwise

import orjson
import pytest
import yaml

from gpulens.cli import main as cli
from schemas.codec import MessageError, decode
from schemas.messages import GpuSample, NodeState
from schemas.topics import GPU_SAMPLES, K8S_NODES
from simulation.fleet_state import Tick
from simulation.random_scenario import main, random_scenario, random_scenario_yaml
from simulation.replay import run_in_process
from simulation.scenario import Scenario, parse_scenario
from simulation.simulator import FleetSimulator
from stream_jobs.dra_join import DeviceTable, device_table, join

DAY = int(time.time() // 86400)
LATENESS_S = 30.0
"""The replay's allowed lateness (docs/FORMAT.md): a sample delivered later is dropped."""
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
    claims = [claim for doc in docs for claim in doc.get("claims", ())]
    assert any(node.get("dra") and "mig" in node for node in nodes)
    assert any(node.get("dra") and "mig" not in node for node in nodes)
    assert any(node.get("dra_shared") for node in nodes) and any("memory_gib" in claim for claim in claims)
    assert any(claim.get("template") for claim in claims) and any("profile" in claim for claim in claims)
    assert any(doc.get("dra_extended_resources") for doc in docs)
    for template in (False, True):  # a claim several pods share; a template several pods' claims come from
        named = [(doc["name"], pod["namespace"], pod["claim"]) for doc in docs for pod in doc["pods"]
                 for claim in doc.get("claims", ()) if (pod["namespace"], pod.get("claim")) ==
                 (claim["namespace"], claim["name"]) and claim.get("template", False) is template]
        assert len(set(named)) < len(named), template
    for field in ("thresholds", "cluster", "faults", "agent_gaps", "late_samples", "poison", "workloads"):
        assert any(field in doc for doc in docs), field


@dataclass
class SampledUsage:
    idle_s: float = 0.0
    util_pct_s: float = 0.0
    util_data_s: float = 0.0
    peak_mem_bytes: int | None = None


def _sampled_usage(ticks: list[Tick], idle_util_pct: float,
                   uid_by_name: dict[tuple[str, str], str]) -> dict[str, SampledUsage]:
    """Per pod uid, the format's figures summed over the GPU samples the simulator wrote that were
    on time (within the default lateness), counting each sample for its interval: an independent
    tally of what the pipeline read, to hold its figures against. A sample's DRA allocations are
    first put on their readings through the devices its node last published (the node stage's join)."""
    usage: dict[str, SampledUsage] = defaultdict(SampledUsage)
    devices: dict[str, DeviceTable] = {}
    for tick in ticks:
        for record in tick.records:
            if record.topic not in (K8S_NODES.suffix, GPU_SAMPLES.suffix) or record.value is None:
                continue
            try:
                if record.topic == K8S_NODES.suffix:
                    state = decode(record.value, NodeState)
                    devices[state.node] = device_table(state.dra_devices)
                    continue
                sample = decode(record.value, GpuSample)
            except MessageError:
                continue  # poison
            if (tick.ts - sample.ts).total_seconds() > LATENESS_S:
                continue
            sample = join(sample, devices.get(sample.node, {}), uid_by_name).sample
            for reading in sample.gpus:
                for ref in reading.assigned_to:
                    pod = usage[str(ref.pod_uid)]
                    if reading.gpu_util_pct is not None:
                        pod.util_pct_s += reading.gpu_util_pct * sample.sample_interval_s
                        pod.util_data_s += sample.sample_interval_s
                        pod.idle_s += sample.sample_interval_s if reading.gpu_util_pct < idle_util_pct else 0.0
                    if reading.mem_used_bytes is not None:
                        pod.peak_mem_bytes = max(pod.peak_mem_bytes or 0, reading.mem_used_bytes)
    return usage


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_scenario_replays(seed: int) -> None:
    text = random_scenario_yaml(seed)
    scenario = parse_scenario(yaml.safe_load(text), source=f"random seed {seed}")
    simulator = FleetSimulator(scenario)
    ticks = list(simulator.run())
    report = run_in_process(scenario, ticks=ticks).report
    sampled = _sampled_usage(ticks, scenario.thresholds.idle_util_pct,
                             {(pod.spec.namespace, pod.spec.name): pod.uid for pod in simulator.pods})
    shared = _shared_claim_pods(scenario)
    most_gpu_hours = 0.0  # every pod's devices counted in its demand all the time it ran
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
        gpus = played.spec.gpus
        most_gpu_hours += gpus * running_s / 3600
        if played.index in shared:  # a shared DRA GPU counts in one pod's demand at a time: the pod's
            gpus = row["gpus"]      # GPU-hours are those of its last request, 0 up to its claim's devices
            assert 0 <= gpus <= played.spec.gpus, f"seed {seed}, {played.spec.name}"
        gpu_hours = gpus * running_s / 3600
        assert row["gpu_hours"] == pytest.approx(gpu_hours, abs=5.1e-5), f"seed {seed}, {played.spec.name}"
        node = nodes.get(str(played.node))
        if node is None or node.mig or node.time_slicing > 1 or not node.process_stats or played.index in shared:
            continue  # the format's figures below are those of whole GPUs a pod holds alone
        price = scenario.prices.get(node.model, 0.0)
        assert row["cost_usd"] == pytest.approx(gpu_hours * price, abs=5.1e-5), f"seed {seed}, {played.spec.name}"
        usage = sampled[played.uid]
        assert (row["idle_gpu_hours"], row["avg_sm_util_pct"], row["peak_mem_bytes"]) == (
            pytest.approx(usage.idle_s / 3600, abs=5.1e-5),
            None if not usage.util_data_s else pytest.approx(usage.util_pct_s / usage.util_data_s, abs=5.1e-5),
            usage.peak_mem_bytes), f"seed {seed}, {played.spec.name}"
    if not any(node.mig or node.time_slicing > 1 for node in scenario.nodes):  # units are whole GPUs
        cluster, step = report["cluster"], scenario.sample_interval_s
        up_s = [scenario.end_offset_s if node.ready_until is None  # a removal takes effect at the next tick
                else min(scenario.end_offset_s, math.ceil(node.ready_until / step) * step) for node in scenario.nodes]
        assert cluster["gpu_hours_capacity"] == pytest.approx(
            sum(node.gpus * s for node, s in zip(scenario.nodes, up_s, strict=True)) / 3600, abs=1e-3), f"seed {seed}"
        # capacity windows (node and cluster stages) and lifecycle records count the same GPU-hours;
        # a DRA GPU several pods share counts once, in the demand of one pod at a time (a pod's own
        # GPU-hours are its last request's): allocated is then at most the pods' devices while they ran
        if shared:
            assert cluster["gpu_hours_allocated"] <= most_gpu_hours + 1e-3, f"seed {seed}"
        else:
            assert cluster["gpu_hours_allocated"] == pytest.approx(
                sum(row["gpu_hours"] or 0.0 for row in report["pods"]), abs=1e-3), f"seed {seed}"
        assert cluster["gpu_hours_unallocated"] == pytest.approx(
            cluster["gpu_hours_capacity"] - cluster["gpu_hours_allocated"], abs=1e-3), f"seed {seed}"
    transitions: dict[str, list[str]] = defaultdict(list)
    for alert in report["alerts"]:
        transitions[alert["id"]].append(alert["state"])
    for alert_id, states in transitions.items():
        assert states[0] == "firing" and all(a != b for a, b in pairwise(states)), \
            f"seed {seed}: alert {alert_id} went {states}"
    assert [alert["at"] for alert in report["alerts"]] == sorted(alert["at"] for alert in report["alerts"])
    assert run_in_process(scenario).report == report, f"seed {seed}: a second replay differs"


def _shared_claim_pods(scenario: Scenario) -> set[int]:
    """Indexes of the pods whose DRA GPUs other pods may hold too: a claim (not a template) several
    pods name, or a claim for a share of each device's memory (consumable capacity)."""
    names = Counter((pod.namespace, pod.claim) for pod in scenario.pods)
    return {index for index, pod in enumerate(scenario.pods)
            if (claim := scenario.claim(pod)) is not None
            and (claim.memory_gib is not None or (not claim.template and names[(pod.namespace, pod.claim)] > 1))}


def test_the_module_prints_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["3"]) == 0
    assert capsys.readouterr().out == random_scenario_yaml(3)
    assert main(["three"]) == 2
    assert "usage" in capsys.readouterr().err


def test_replay_plays_a_random_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    """``gpulens replay --random SEED``: the same report as the file the module prints for SEED."""
    assert cli(["replay", "--random", "3", "--json"]) == 0
    expected = run_in_process(parse_scenario(random_scenario(3))).report
    assert orjson.loads(capsys.readouterr().out) == orjson.loads(orjson.dumps(expected))
    for argv in (["replay"], ["replay", "some.yaml", "--random", "3"]):
        assert cli(argv) == 2
        assert capsys.readouterr().err.strip() == "gpulens: give a SCENARIO file or --random SEED (one of them)"
