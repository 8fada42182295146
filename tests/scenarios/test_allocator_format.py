"""The scenario format's ``pods[].allocator`` (docs/scenarios.md): what it accepts, what it refuses
(naming the field), and what the simulator sends for it through the agent's ingestion."""

from __future__ import annotations

import pytest
import yaml

from schemas.codec import decode
from schemas.messages import WorkloadAllocator
from schemas.topics import WORKLOAD_ALLOCATOR
from simulation.allocator_play import allocator_line
from simulation.scenario import AllocatorSpec, ScenarioError, parse_scenario
from simulation.simulator import FleetSimulator

GIB = 2**30


def _parse(allocator: str, extra: str = "") -> AllocatorSpec | None:
    text = f"duration: 5m\nnodes: [{{name: n, gpus: 2}}]\n{extra}pods: [{{name: a, gpus: 2, allocator: {allocator}}}]"
    return parse_scenario(yaml.safe_load(text)).pods[0].allocator


def test_fields_and_defaults() -> None:
    assert _parse("{reserved_gib: 60, allocated_gib: 12}") == AllocatorSpec(reserved_gib=60, allocated_gib=12)
    assert _parse("{reserved_gib: 60, allocated_gib: 12, retries_per_min: 2, ooms_per_min: 0.5, from: 5m, "
                  "until: 10m}") == AllocatorSpec(60, 12, 2, 0.5, 300.0, 600.0)


@pytest.mark.parametrize(("allocator", "message"), [
    ("{allocated_gib: 12}", "pods[0].allocator.reserved_gib: required"),
    ("{reserved_gib: 10, allocated_gib: 12}", "pods[0].allocator.allocated_gib: must be <= 10"),
    ("{reserved_gib: 10, allocated_gib: 1, retries_per_min: -1}", "pods[0].allocator.retries_per_min: must be >= 0"),
    ("{reserved_gib: 10, allocated_gib: 1, from: 5m, until: 5m}", "pods[0].allocator.until: must be after from"),
    ("{reserved_gib: 10, allocated_gib: 1, fragmented: yes}", "pods[0].allocator.fragmented: unknown field"),
    ("{reserved_gib: 2000000, allocated_gib: 1}", "pods[0].allocator.reserved_gib: must be <= 1.04858e+06"),
    ("12GiB", "pods[0].allocator: expected a mapping"),
])
def test_invalid_allocator_names_the_field(allocator: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        _parse(allocator)
    assert message in str(info.value)


def test_the_line_is_what_the_client_sends() -> None:
    spec = AllocatorSpec(60, 12, 2, 0.5, 300)  # reserved, allocated GiB; retries, OOMs per min; from
    assert allocator_line(spec, 1, 300 + 150) == (
        f"allocator device=1 reserved={60 * GIB} allocated={12 * GIB} max_reserved={60 * GIB} retries=5 ooms=1")


def test_each_gpu_reports_every_interval_while_running_outside_agent_gaps() -> None:
    text = ("name: s\nduration: 3m\nnodes: [{name: n, gpus: 2}]\nagent_gaps: [{node: n, from: 60s, to: 90s}]\n"
            "pods: [{name: a, gpus: 2, allocator: {reserved_gib: 8, allocated_gib: 2, from: 30s, until: 150s}}]")
    scenario = parse_scenario(yaml.safe_load(text))
    reports: dict[float, WorkloadAllocator] = {}
    for tick in FleetSimulator(scenario).run():
        for record in tick.records:
            if record.topic == WORKLOAD_ALLOCATOR.suffix:
                assert record.value is not None
                reports[tick.offset_s] = decode(record.value, WorkloadAllocator)
    assert sorted(reports) == [30.0, 40.0, 50.0, 90.0, 100.0, 110.0, 120.0, 130.0, 140.0]
    message = reports[30.0]
    assert (message.node, message.namespace, message.pod) == ("n", "default", "a")
    assert [(d.device, d.reserved_bytes, d.allocated_bytes) for d in message.devices] == [
        (0, 8 * GIB, 2 * GIB), (1, 8 * GIB, 2 * GIB)]
