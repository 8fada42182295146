"""In-process replay time of a one-hour, 64-GPU scenario at 10 s sampling (target: under 10 s).

Everything a real replay does runs: Kubernetes objects through the watcher's translation, NVML
samples through the agent's sampler over the fake NVML, JSON encode/decode of every record, both
stages, and the report.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.harness import Context, Result
from simulation.replay import run_in_process
from simulation.scenario import Scenario, parse_scenario


def fleet_scenario(nodes: int = 8, gpus_per_node: int = 8, duration: str = "1h") -> Scenario:
    """A busy fleet: mixed job sizes, churn, an idle notebook, a pending job and a gang."""
    pods: list[dict[str, Any]] = []
    for i in range(nodes):
        pods.append({"name": f"train-{i}", "namespace": "research", "gpus": 4, "util": 92, "memory_gib": 60,
                     "labels": {"team": "nlp", "project": "chat"}, "steps_per_s": 3.0})
        pods.append({"name": f"eval-{i}", "namespace": "research", "gpus": 2, "create": f"{i * 3}m",
                     "run_for": "20m", "util": [[0, 70], ["10m", 30]], "memory_gib": 20})
        pods.append({"name": f"nb-{i}", "namespace": "notebooks", "gpus": 1, "util": [[0, 40], ["5m", 1]],
                     "memory_gib": 12, "delete": "50m"})
    pods.append({"name": "big", "namespace": "research", "gpus": 8, "create": "10m", "util": 95})
    for j in range(3):
        pods.append({"name": f"gang-{j}", "namespace": "ml", "gpus": 4, "gang": "llm", "create": "15m", "util": 90})
    data = {
        "name": "bench-fleet", "start": "2026-01-05T09:00:00Z", "duration": duration, "sample_interval": "10s",
        "prices": {"NVIDIA H100 80GB HBM3": 2.5},
        "nodes": [{"name": f"gpu-{i:02d}", "gpus": gpus_per_node} for i in range(nodes)],
        "pods": pods,
    }
    return parse_scenario(data)


def run(ctx: Context) -> list[Result]:
    scenario = fleet_scenario(duration="10m" if ctx.quick else "1h")
    started = time.perf_counter()
    result = run_in_process(scenario)
    seconds = time.perf_counter() - started
    samples = len(scenario.nodes) * scenario.ticks
    return [
        Result("replay", "in-process replay, 1 h x 64 GPUs @ 10 s", seconds, "s", target="< 10 s",
               notes=f"{samples} node samples, {len(result.report['alerts'])} alert transitions"),
        Result("replay", "in-process replay throughput", samples / seconds, "samples/s",
               notes="one sample = one node with 8 GPUs"),
    ]


if __name__ == "__main__":
    s = fleet_scenario()
    t = time.perf_counter()
    r = run_in_process(s)
    print(f"{time.perf_counter() - t:.2f}s, {len(r.report['alerts'])} alerts")
