"""The simulator dresses a device-plugin node only when what its dressing depends on changed:
the records are those of a simulator that dresses every node at every tick."""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from collections.abc import Callable
from functools import partial

import pytest

import simulation.simulator as simulator_module
from benchmarks.bench_replay import churn_scenario, fleet_scenario
from simulation.fleet_state import SimNode
from simulation.random_scenario import random_scenario
from simulation.scenario import Scenario, load_scenario, parse_scenario
from simulation.simulator import FleetSimulator
from tests.conftest import REPO_ROOT

FIXED_START = uuidlib.UUID(int=53)


def _records(scenario: Scenario, monkeypatch: pytest.MonkeyPatch, memo: bool) -> tuple[int, str]:
    """(dressings done, a digest of every record in order), the run starting with a fixed boot id."""
    monkeypatch.setattr(simulator_module.uuidlib, "uuid4", lambda: FIXED_START)
    simulator = FleetSimulator(scenario)
    if not memo:
        def no_key(node: object, t: float) -> None:
            return None

        monkeypatch.setattr(simulator, "_dress_key", no_key)
    dressings = 0
    dress_all = simulator._dress_all

    def counted(node: SimNode, t: float) -> None:
        nonlocal dressings
        dressings += 1
        dress_all(node, t)

    monkeypatch.setattr(simulator, "_dress_all", counted)
    digest = hashlib.sha256()
    for tick in simulator.run():
        for record in tick.records:
            digest.update(repr((tick.offset_s, record.topic, record.key, record.value)).encode())
    return dressings, digest.hexdigest()


def _own(name: str) -> Callable[[], Scenario]:
    return partial(load_scenario, REPO_ROOT / "simulation" / "scenarios" / f"{name}.yaml")


def _random(seed: int) -> Scenario:
    return parse_scenario(random_scenario(seed))


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "fleet": partial(fleet_scenario, nodes=4, duration="30m"),
    "churn": partial(churn_scenario, nodes=4, pods=200, duration_s=1200),
    "time-slicing": _own("noisy-neighbour"),
    "gpu-health": _own("gpu-health"),
    "dra-shared-claim": _own("dra-shared-claim"),
    "mig-relayout": _own("mig-fragmentation"),
    # the random generator's seeds with DRA claims, MIG, node removal, agent gaps, faults, late samples
    **{f"random-{seed}": partial(_random, seed) for seed in (1, 6, 11, 15, 29)},
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_records_are_those_of_a_dressing_at_every_tick(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = SCENARIOS[name]()
    memo_dressings, memo_digest = _records(scenario, monkeypatch, memo=True)
    monkeypatch.undo()
    full_dressings, full_digest = _records(scenario, monkeypatch, memo=False)
    assert memo_digest == full_digest
    assert memo_dressings <= full_dressings


def test_a_steady_fleet_is_dressed_when_its_pods_change_only() -> None:
    scenario = fleet_scenario(nodes=4, duration="1h")
    simulator = FleetSimulator(scenario)
    dressed: list[float] = []
    dress_all = simulator._dress_all

    def noted(node: SimNode, t: float) -> None:
        dressed.append(t)
        dress_all(node, t)

    simulator._dress_all = noted  # type: ignore[method-assign]
    for _tick in simulator.run():
        pass
    assert len(dressed) < len(scenario.nodes) * scenario.ticks / 4  # far fewer than every node at every tick
    assert {0.0, 600.0} <= set(dressed)  # the start, and the ten-minute step of the eval pods' load
