"""The wire check's fast search for numbers JSON readers may read differently finds exactly what its
declared pattern finds: on records as the agents write them, on hand-picked edge cases and on random
bytes over the characters the pattern tells apart."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stream_jobs.pipeline import _SUSPECT, _suspect

CASES = [
    b"", b"{}", b'{"a":1}', b'{"a": 1e5}', b'{"a":1E5}', b'{"a":1.5e-3}', b'{"a":1.e3}', b'{"a":-2e9}',
    b'{"a":NaN}', b'[Infinity]', b'{"a":-Infinity}', b'{"a" :\t\n NaN}', b'{"a":1234567890123456789}',
    b'{"a":-1234567890123456789}', b'{"a":123456789012345678}', b'{"a":"1e5"}', b'{"a":"x:1e5"}',
    b'{"uuid":"GPU-6a79700a-8cbd-56a3-3e40-fdb7baa5a4e0"}', b'{"id":"2b252d3ecb67ab5872a1ad011d8d4f0b"}',
    b'{"a":[1,2,3e1]}', b'{"a":[ 1 , 2 ,\x0b3e1]}', b'{"a":[{"b":1}],"c":true,"d":null}', b'{"a":0.5,"b":N}',
    b":,[", b",-", b", -I", b"[--1e1]", b":\x0c1.e", b"x1e5", b",1.2.3e",
]


@pytest.mark.parametrize("value", CASES)
def test_the_fast_search_agrees_with_the_pattern_on_edge_cases(value: bytes) -> None:
    assert _suspect(value) is (_SUSPECT.search(value) is not None)


def test_the_fast_search_agrees_with_the_pattern_on_random_bytes() -> None:
    rnd = random.Random(53)
    alphabet = b'0123456789:[,{}" \t\n\r\x0b\x0c\x1c-.eEINaxf+'
    for _ in range(40_000):
        value = bytes(rnd.choice(alphabet) for _ in range(rnd.randint(0, 24)))
        assert _suspect(value) is (_SUSPECT.search(value) is not None), value
    for _ in range(4_000):
        value = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 40)))
        assert _suspect(value) is (_SUSPECT.search(value) is not None), value


def test_the_fast_search_agrees_with_the_pattern_on_simulated_samples() -> None:
    from simulation.scenario import load_scenario
    from simulation.simulator import FleetSimulator

    scenario = load_scenario(Path(__file__).resolve().parents[2] / "simulation" / "scenarios" / "gpu-health.yaml")
    values = [record.value for tick in FleetSimulator(scenario).run() for record in tick.records
              if record.value is not None]
    assert values
    for value in values:
        assert _suspect(value) is (_SUSPECT.search(value) is not None)
