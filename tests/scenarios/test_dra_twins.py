"""A DRA fleet gives the same report as its device-plugin twin, figure by figure.

Each ``simulation/scenarios/dra-<x>.yaml`` twin publishes the fleet of a device-plugin golden through
NVIDIA's DRA driver (ResourceSlices) and asks for every pod's GPUs through ResourceClaims; the
simulator plays it through the watcher's ``DraIndex``, the agent's PodResources ``dynamic_resources``
and the node stage's join. Played under the twin's name (uids, GPU and MIG UUIDs derive from it), the
whole report JSON equals the twin's but for one thing that names the allocation path: the
scheduler's reason for a pending pod (the DynamicResources plugin's ``cannot allocate all claims``
where the device plugin's pod reads ``Insufficient nvidia.com/gpu``). The same holds for extended
resources served by DRA: the device-plugin file's pods unchanged (``nvidia.com/gpu`` in their
containers), its nodes' GPUs published by the DRA driver whose DeviceClass names that resource.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest
import yaml

from schemas.messages import GpuSample
from schemas.topics import GPU_SAMPLES
from simulation.replay import run_in_process
from simulation.scenario import load_scenario, parse_scenario
from simulation.simulator import FleetSimulator
from tests.conftest import REPO_ROOT, SHARED_SCENARIOS

OWN = REPO_ROOT / "simulation" / "scenarios"
TWINS = [
    ("dra-fragmentation", SHARED_SCENARIOS / "fragmentation-basic.yaml"),
    ("dra-idle-node", OWN / "idle-node.yaml"),
    ("dra-mig", OWN / "mig.yaml"),
]
SCHEDULER_REASON = (b"cannot allocate all claims", b"Insufficient nvidia.com/gpu")
"""The one difference allowed: the scheduler's words for a pod that does not fit."""


@pytest.mark.parametrize(("name", "twin"), TWINS, ids=[t[0] for t in TWINS])
def test_dra_twin_reports_equal_the_device_plugin_report(name: str, twin: Path) -> None:
    plugin = load_scenario(twin)
    dra = dataclasses.replace(load_scenario(OWN / f"{name}.yaml"), name=plugin.name)
    assert any(n.dra for n in dra.nodes) and not any(n.dra for n in plugin.nodes)
    expected = orjson.dumps(run_in_process(plugin).report, option=orjson.OPT_INDENT_2).decode()
    got = orjson.dumps(run_in_process(dra).report, option=orjson.OPT_INDENT_2)
    assert got.replace(*SCHEDULER_REASON).decode() == expected


@pytest.mark.parametrize("twin", [SHARED_SCENARIOS / "fragmentation-basic.yaml", OWN / "idle-node.yaml"],
                         ids=lambda p: p.stem)
def test_extended_resources_served_by_dra_report_as_the_device_plugin(twin: Path) -> None:
    plugin = load_scenario(twin)
    data = yaml.safe_load(twin.read_text(encoding="utf-8"))
    data["dra_extended_resources"] = True
    for node in data["nodes"]:
        node["dra"] = True
    dra = parse_scenario(data, default_name=plugin.name)
    expected = orjson.dumps(run_in_process(plugin).report, option=orjson.OPT_INDENT_2).decode()
    simulator = FleetSimulator(dra)
    ticks = list(simulator.run())
    got = orjson.dumps(run_in_process(dra, ticks=ticks).report, option=orjson.OPT_INDENT_2)
    assert got.replace(*SCHEDULER_REASON).decode() == expected
    served = [p for p in simulator.pods if p.scheduled is not None]
    assert served and all(p.claim is not None and p.claim.extended for p in served)
    samples = [GpuSample.model_validate_json(r.value or b"") for tick in ticks for r in tick.records
               if r.topic == GPU_SAMPLES.suffix]
    assert any(s.dra_allocations for s in samples) and not any(g.assigned_to for s in samples for g in s.gpus)


def test_the_dra_twin_takes_the_dra_path() -> None:
    """No device-plugin assignment or GPU allocatable in the DRA twin: the pods' GPUs reach the
    samples only as PodResources ``dynamic_resources``, the nodes' only as ResourceSlices."""
    scenario = load_scenario(OWN / "dra-idle-node.yaml")
    simulator = FleetSimulator(scenario)
    ticks = list(simulator.run())
    assert all(not node.resources.read().assignments for node in simulator.nodes.values())
    samples = [GpuSample.model_validate_json(r.value or b"") for tick in ticks for r in tick.records
               if r.topic == GPU_SAMPLES.suffix]
    last_a = next(s for s in reversed(samples) if s.node == "gpu-a")
    assert {(a.pod, a.device) for a in last_a.dra_allocations} == {("serve", f"gpu-{i}") for i in range(8)}
    assert all(g.assigned_to == [] for g in last_a.gpus)  # the node stage, not the agent, joins them
    assert {n.state.node: n.state.gpu_allocatable for n in simulator.nodes.values()} == {
        "gpu-a": {"nvidia.com/gpu": 8}, "gpu-b": {"nvidia.com/gpu": 8}}
    assert [len(n.state.dra_devices) for n in simulator.nodes.values()] == [8, 8]
