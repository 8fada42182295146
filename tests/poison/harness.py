"""The canary fleet the hostile records are mixed into, and the in-process run of a mix.

Canaries are a small scenario's own records (two nodes, a busy trainer, a notebook deleted half-way):
they must all be applied and give the outputs they give alone. Every record fed gets its own offset
(one partition), so a dead letter names exactly one record."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from schemas.outputs import PodLifecycle, PodWindow
from simulation.fleet_state import Tick
from simulation.replay import DEFAULT_LATENESS_S, engine_config
from simulation.scenario import Scenario, load_scenario
from stream_jobs.pipeline import LocalPipeline
from stream_jobs.timeutil import epoch
from tests.poison.generate import ACCEPT_CLUSTERS, APPLIED, TOMBSTONE, Case

CANARY_YAML = """name: poison-canaries
start: "{start}"
duration: 6m
sample_interval: 10s
prices:
  "NVIDIA H100 80GB HBM3": 2.5
nodes:
  - {{name: canary-a, gpus: 2}}
  - {{name: canary-b, gpus: 2}}
pods:
  - {{name: canary-trainer, namespace: canary, gpus: 2, util: 90, memory_gib: 60, labels: {{team: canary}}}}
  - {{name: canary-notebook, namespace: canary, gpus: 1, util: 3, memory_gib: 4, delete: 4m}}
"""


def canary_scenario(start: datetime) -> Scenario:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "canaries.yaml"
        path.write_text(CANARY_YAML.format(start=start.strftime("%Y-%m-%dT%H:%M:%SZ")))
        return load_scenario(path)


@dataclass
class Fed:
    """What a run was fed: a record's source (in process its offset; through Kafka (topic suffix,
partition, offset)) -> the poison case, and the canaries' sources."""

    poison: dict[Any, Case]
    canaries: set[Any]


def canary_outputs(outputs: Iterable[Any], uids: set[str]) -> list[dict[str, Any]]:
    """The outputs that are the canary pods' alone (windows and lifecycle), as JSON data."""
    mine = [m for m in outputs if isinstance(m, PodWindow | PodLifecycle) and m.pod_uid in uids]
    return sorted((m.model_dump(mode="json") for m in mine), key=lambda d: (d.get("window_id", ""), d["pod_uid"]))


def run_in_process(scenario: Scenario, ticks: Sequence[Tick], poison: Sequence[tuple[int, Case]]
                   ) -> tuple[LocalPipeline, Fed]:
    """Feed the canary ticks with ``poison`` (tick index, case) mixed in after each tick's own
    records; advance as the replay does; flush at the end."""
    pipeline = LocalPipeline(replace(engine_config(scenario), accept_clusters=ACCEPT_CLUSTERS))
    by_tick: dict[int, list[Case]] = {}
    for tick_index, case in poison:
        by_tick.setdefault(tick_index, []).append(case)
    fed = Fed({}, set())
    offset = 0
    for index, tick in enumerate(ticks):
        for record in tick.records:
            pipeline.feed(record.topic, record.value, tick.ts, 0, offset, key=record.key)
            fed.canaries.add(offset)
            offset += 1
        for case in by_tick.get(index, []):
            pipeline.feed(case.suffix, case.value, tick.ts, 0, offset, key=case.key)
            fed.poison[offset] = case
            offset += 1
        pipeline.advance(epoch(tick.ts) - DEFAULT_LATENESS_S)
    pipeline.flush(epoch(scenario.start + timedelta(seconds=scenario.end_offset_s)))
    return pipeline, fed


def verdict_errors(letters: Mapping[Any, list[str]], fed: Fed, reader: str = "stream") -> list[str]:
    """Every way the dead letters (source -> reason codes) differ from the labels."""
    errors = []
    for offset in sorted(fed.canaries & set(letters)):
        errors.append(f"{reader}: canary record at offset {offset} was dead-lettered: {letters[offset]}")
    for offset, case in sorted(fed.poison.items()):
        got = sorted(set(letters.get(offset, [])))
        want = [] if case.expected in (APPLIED, TOMBSTONE) else [case.expected]
        if got != want:
            errors.append(f"{reader}: offset {offset}: got {got or APPLIED}, {case.describe()}")
    return errors
