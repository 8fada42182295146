"""The demo's fleet: a seeded, realistic mix of GPU workloads written as a scenario.

The result is an ordinary scenario document (``shared/scenarios/FORMAT.md``), so the demo plays it
through the same simulator as ``gpulens replay`` and a user can dump it (``gpulens demo
--print-scenario``) and replay or edit it. The mix covers what gpulens is for: long training jobs,
inference services with daily swings, notebooks that go idle while holding VRAM, a gang that only
partly fits, a crash-looping pod, a job left pending by fragmentation, a spot node that is
reclaimed (its pods evicted) and a node left empty (a scale-to-zero candidate).
"""

from __future__ import annotations

import random
from typing import Any

TEAMS = (("nlp", "chat"), ("vision", "detect"), ("speech", "asr"), ("recsys", "ranking"), ("research", "agents"))
MODELS = (("NVIDIA H100 80GB HBM3", 80, 2.5), ("NVIDIA A100-SXM4-80GB", 80, 1.6), ("NVIDIA L40S", 48, 1.0))


def _minutes(value: float) -> str:
    return f"{value:g}m"


def demo_scenario(nodes: int = 16, gpus_per_node: int = 8, duration_m: int = 60, seed: int = 7) -> dict[str, Any]:
    """A scenario document for ``nodes`` x ``gpus_per_node`` GPUs over ``duration_m`` minutes."""
    if nodes < 4:
        raise ValueError("the demo fleet needs at least 4 nodes")
    rng = random.Random(seed)
    node_docs = []
    for i in range(nodes):
        model, memory_gib, _price = MODELS[0] if i < nodes // 2 else MODELS[1 + (i % 2)]
        doc: dict[str, Any] = {"name": f"gpu-{i:02d}", "gpus": gpus_per_node, "model": model, "memory_gib": memory_gib,
                               "labels": {"pool": "spot" if i == nodes - 1 else "on-demand"}}
        if i == nodes - 1:
            doc["ready_until"] = _minutes(max(6, duration_m // 3))  # spot reclaim
        node_docs.append(doc)

    pods: list[dict[str, Any]] = []

    def add(name: str, team_index: int, gpus: int, create_m: float, **extra: Any) -> None:
        team, project = TEAMS[team_index % len(TEAMS)]
        pods.append({"name": name, "namespace": team, "labels": {"team": team, "project": project},
                     "gpus": gpus, "create": _minutes(create_m), **extra})

    # Long training jobs fill most of the fleet (8-GPU and 4-GPU shapes).
    capacity = (nodes - 2) * gpus_per_node  # leave room for the stories below
    used = 0
    job = 0
    while used + gpus_per_node <= capacity * 0.55:
        gpus = gpus_per_node if rng.random() < 0.6 else gpus_per_node // 2
        add(f"train-{job:02d}", job, gpus, rng.choice([0, 0, 0, 2, 5]),
            util=rng.randint(82, 98), memory_gib=rng.randint(50, 76), steps_per_s=round(rng.uniform(0.5, 3.0), 2),
            image="nvcr.io/nvidia/pytorch:24.05-py3",
            run_for=_minutes(rng.choice([duration_m * 2, duration_m // 2 + 10, duration_m])))
        used += gpus
        job += 1
    # Inference services: steady, moderate utilisation, one GPU each.
    for i in range(max(4, nodes // 2)):
        add(f"infer-{i:02d}", i + 1, 1, 0, util=[[_minutes(0), rng.randint(35, 70)],
                                                  [_minutes(duration_m // 2), rng.randint(10, 40)]],
            memory_gib=rng.randint(20, 40), image="nvcr.io/nvidia/tritonserver:24.05-py3")
    # Notebooks that work for a while and then sit on their GPU holding VRAM.
    for i in range(max(3, nodes // 4)):
        add(f"notebook-{i:02d}", i + 2, 1, rng.choice([0, 1, 3]),
            util=[[_minutes(0), rng.randint(40, 70)], [_minutes(rng.choice([2, 4, 6])), 1]],
            memory_gib=rng.randint(8, 24), image="jupyter/pytorch-notebook:latest")
    # A notebook that holds a GPU with no process at all.
    add("notebook-empty", 3, 1, 1, util=0, memory_gib=0, processes=0)
    # A gang of four 8-GPU workers that arrives late and only partly fits.
    for member in range(4):
        add(f"llm-pretrain-{member}", 0, gpus_per_node, max(4, duration_m // 6), gang="llm-pretrain",
            util=95, memory_gib=78, steps_per_s=0.8)
    # A crash-looping pod.
    add("etl-embed", 4, 1, 2, crashloop=True, util=0, memory_gib=0, image="registry.local/etl/embed:1.4")
    # A job that waits on fragmentation: needs a full node while free GPUs are scattered.
    add("train-big-batch", 1, gpus_per_node, max(3, duration_m // 8), util=91, memory_gib=70)
    # A job that uses nearly all VRAM (vram_pressure).
    add("finetune-70b", 0, 2, 1, util=88, memory_gib=[[_minutes(0), 60], [_minutes(3), 79]])
    return {
        "name": f"demo-fleet-{nodes}x{gpus_per_node}",
        "start": "2026-01-05T09:00:00Z",
        "duration": _minutes(duration_m),
        "sample_interval": "10s",
        "window": "1m",
        "thresholds": {"idle_after": "5m", "pending_after": "3m", "idle_node_after": "10m"},
        "prices": {model: price for model, _memory, price in MODELS},
        "nodes": node_docs,
        "pods": pods,
    }
