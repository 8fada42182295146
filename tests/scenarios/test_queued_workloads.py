"""Queued Kueue workloads in scenarios: the format's new keys, what the simulator sends, and the
queued demand the pipeline derives (the golden ``queued-workloads`` checks the report; this file
checks the instants around admission and the rule that the same demand is never counted twice)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pytest
import yaml

from schemas.codec import decode
from schemas.messages import PodState, WorkloadState
from schemas.outputs import ClusterCapacity
from schemas.topics import K8S_PODS, K8S_WORKLOADS
from simulation.replay import run_in_process
from simulation.scenario import ScenarioError, load_scenario, parse_scenario
from simulation.simulator import FleetSimulator
from tests.conftest import REPO_ROOT

SCENARIO = REPO_ROOT / "simulation" / "scenarios" / "queued-workloads.yaml"


def _parse(text: str):  # type: ignore[no-untyped-def]
    return parse_scenario(yaml.safe_load(text))


def test_defaults() -> None:
    sc = _parse("duration: 5m\nworkloads: [{name: w}]")
    (w,) = sc.workloads
    assert (w.namespace, w.queue, w.create, w.admit, w.delete, w.gpus) == ("default", "default", 0.0, None, None, 1)
    assert [(s.name, s.count, s.gpus, s.resource) for s in w.pod_sets] == [("main", 1, 1, "nvidia.com/gpu")]


@pytest.mark.parametrize(("text", "message"), [
    ("duration: 5m\nworkloads: [{name: w, colour: red}]", "workloads[0].colour: unknown field"),
    ("duration: 5m\nworkloads: [{queue: q}]", "workloads[0].name: required"),
    ("duration: 5m\nworkloads: [{name: w, create: 5m, admit: 1m}]", "workloads[0].admit: must not be before create"),
    ("duration: 5m\nworkloads: [{name: w}, {name: w}]", "workloads[1].name: duplicate workload default/w"),
    ("duration: 5m\nworkloads: [{name: w, pod_sets: [{count: 0}]}]", "workloads[0].pod_sets[0].count"),
    ("duration: 5m\nworkloads: [{name: w, pod_sets: [{gpus: 1, resource: amd.com/gpu}]}]",
     "workloads[0].pod_sets[0].resource"),
    ("duration: 5m\nworkloads: [{name: w, pod_sets: []}]", "workloads[0].pod_sets: at least one pod set"),
    ("duration: 5m\npods: [{name: p, workload: w}]", "pods[0].workload: no workload default/w in workloads"),
    ("duration: 5m\nworkloads: [{name: w, namespace: a}]\npods: [{name: p, workload: w}]",
     "pods[0].workload: no workload default/w"),
])
def test_invalid_workloads_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        _parse(text)
    assert message in str(err.value)


def test_the_simulator_sends_workload_states_and_creates_pods_at_admission() -> None:
    scenario = load_scenario(SCENARIO)
    workloads: list[tuple[float, str, str, bool]] = []
    created: dict[str, float] = {}
    for tick in FleetSimulator(scenario).run():
        for record in tick.records:
            if record.topic == K8S_WORKLOADS.suffix and record.value is not None:
                w = decode(record.value, WorkloadState)
                workloads.append((tick.offset_s, w.name, w.phase, w.deleted))
            if record.topic == K8S_PODS.suffix and record.value is not None:
                pod = decode(record.value, PodState)
                created.setdefault(pod.name, tick.offset_s)
    assert workloads == [(0.0, "wl-frag", "queued", False), (0.0, "wl-admitted", "queued", False),
                         (180.0, "wl-admitted", "admitted", False), (900.0, "wl-frag", "queued", True)]
    assert created == {"fill-a": 0.0, "fill-b": 0.0, "wl-admitted-0": 180.0, "wl-admitted-1": 180.0}


def _window(outputs: Sequence[object], start: str) -> ClusterCapacity:
    at = datetime.fromisoformat(start)
    return next(m for m in outputs if isinstance(m, ClusterCapacity) and m.window_start == at)


def test_queued_demand_leaves_with_admission_and_is_never_counted_twice() -> None:
    outputs = run_in_process(load_scenario(SCENARIO)).outputs
    before = _window(outputs, "2026-01-05T09:02:00+00:00")
    assert (before.pending_pods, before.queued_workloads, before.queued_gpu_demand, before.pending_gpu_demand) == (
        0, 2, 6, 6)
    # admitted at 3m: its pods run, and its 2 GPUs are neither queued nor pending any more
    after = _window(outputs, "2026-01-05T09:03:00+00:00")
    assert (after.pending_pods, after.queued_workloads, after.queued_gpu_demand, after.pending_gpu_demand) == (
        0, 1, 4, 4)
    assert after.gpus_allocated == 12 and after.stranded_gpus == 4
    gone = _window(outputs, "2026-01-05T09:15:00+00:00")
    assert (gone.queued_workloads, gone.pending_gpu_demand, gone.stranded_gpus) == (0, 0, 0)


POD_GROUP = """
name: pod-group
start: "2026-01-05T09:00:00Z"
duration: 4m
nodes: [{name: gpu-a, gpus: 4}]
pods:
  - {name: hog, gpus: 4, node: gpu-a, util: 90}
  - {name: member-0, gpus: 2, gang: wl, util: 90}
  - {name: member-1, gpus: 2, gang: wl, util: 90}
workloads:
  - {name: wl, labels: {"scheduling.x-k8s.io/pod-group": wl}, pod_sets: [{count: 2, gpus: 2}]}
"""


def test_a_queued_workload_whose_pods_exist_counts_through_its_pods_only() -> None:
    # Kueue's plain-pod groups: the pods exist (gated) while the workload waits; both share the gang
    scenario = parse_scenario(yaml.safe_load(POD_GROUP))
    outputs = run_in_process(scenario).outputs
    window = _window(outputs, "2026-01-05T09:01:00+00:00")
    assert (window.pending_pods, window.queued_workloads, window.pending_gpu_demand) == (2, 0, 4)
