"""The demo's fleet: a seeded, realistic mix of GPU workloads written as a scenario.

The result is an ordinary scenario document (``docs/FORMAT.md``), so the demo plays it
through the same simulator as ``gpulens replay``, and a user can dump it (``gpulens demo
--print-scenario``) to replay or edit it. Placement is pinned so the stories gpulens is for happen
on every run, whatever the seed: long training jobs that leave one or two GPUs free per node
(fragmentation), inference services, notebooks that go idle while holding VRAM, a notebook with no
process at all, a crash-looping pod, a job that nearly fills its GPUs' memory, a two-member gang
that only half fits, an 8-GPU job that waits although enough GPUs are free in total, a spot
node that is reclaimed with its pods evicted, a job that holds half a node and computes on one GPU,
and (from 6 nodes) a cordoned node that is never allocated: what ``gpulens advise`` reclaims.
"""

from __future__ import annotations

import random
from typing import Any

TEAMS = (("nlp", "chat"), ("vision", "detect"), ("speech", "asr"), ("recsys", "ranking"), ("research", "agents"))
MODELS = (("NVIDIA H100 80GB HBM3", 2.5), ("NVIDIA A100-SXM4-80GB", 1.6))


def _m(minutes: float) -> str:
    return f"{minutes:g}m"


def demo_scenario(nodes: int = 16, gpus_per_node: int = 8, duration_m: float = 24 * 60, seed: int = 7,
                  start: str = "2026-01-05T09:00:00Z") -> dict[str, Any]:
    """A scenario document for ``nodes`` x ``gpus_per_node`` GPUs over ``duration_m`` minutes."""
    if nodes < 4 or gpus_per_node < 4:
        raise ValueError("the demo fleet needs at least 4 nodes of at least 4 GPUs")
    rng = random.Random(seed)
    names = [f"gpu-{i:02d}" for i in range(nodes)]
    spot, frees_early, half_node = names[-1], names[-2], names[-3]
    reserve = names[-4] if nodes >= 6 else None
    node_docs = []
    for i, name in enumerate(names):
        model = MODELS[0][0] if i < nodes // 2 else MODELS[1][0]
        doc: dict[str, Any] = {"name": name, "gpus": gpus_per_node, "model": model, "memory_gib": 80,
                               "labels": {"pool": "spot" if name == spot else "on-demand"}}
        if name == spot:
            doc["ready_until"] = _m(12)
        if name == reserve:
            doc["unschedulable"] = True  # cordoned and forgotten: paid for, never allocated
        node_docs.append(doc)

    pods: list[dict[str, Any]] = []

    def add(name: str, team_index: int, gpus: int, create_m: float, owner: str, **extra: Any) -> None:
        """``owner`` is the controller's kind: a gang's pods share one owner, a ReplicaSet's name has a hash."""
        team, project = TEAMS[team_index % len(TEAMS)]
        owner_name = extra.get("gang") or (f"{name}-7d4b9c" if owner == "ReplicaSet" else name)
        pods.append({"name": name, "namespace": team, "labels": {"team": team, "project": project},
                     "gpus": gpus, "create": _m(create_m), "owner": f"{owner}/{owner_name}", **extra})

    for i, name in enumerate(n for n in names[:-3] if n != reserve):
        size = gpus_per_node - rng.choice([1, 2, 2, 3])
        add(f"train-{i:02d}", i, size, 0, node=name, owner="PyTorchJob", util=rng.randint(84, 98),
            memory_gib=rng.randint(50, 72), steps_per_s=round(rng.uniform(0.5, 3.0), 2),
            image="nvcr.io/nvidia/pytorch:24.05-py3")
        # one of the leftover GPUs goes to a small pod, the rest stay free but scattered
        kind = i % 4
        if kind == 0:
            add(f"infer-{i:02d}", i + 1, 1, 0, node=name, owner="ReplicaSet", memory_gib=rng.randint(16, 30),
                util=[[_m(0), rng.randint(45, 70)], [_m(30), rng.randint(15, 40)]],
                image="nvcr.io/nvidia/tritonserver:24.05-py3")
        elif kind == 1:
            add(f"notebook-{i:02d}", i + 2, 1, rng.choice([0, 1]), node=name, owner="StatefulSet",
                memory_gib=rng.randint(8, 24),
                util=[[_m(0), rng.randint(40, 70)], [_m(rng.choice([2, 3, 4])), 1]], image="jupyter/pytorch-notebook")
        elif kind == 2 and not any(p["name"] == "etl-embed" for p in pods):
            add("etl-embed", 4, 1, 0, node=name, owner="Job", crashloop=True, util=0, memory_gib=0,
                image="registry.local/etl/embed:1.4")
        elif kind == 2:
            add(f"notebook-empty-{i:02d}", 3, 1, 0, node=name, owner="StatefulSet", util=0, memory_gib=0, processes=0)
        else:
            add(f"finetune-{i:02d}", 0, 1, 0, node=name, owner="Job", util=88,
                memory_gib=[[_m(0), 60], [_m(2), 78.5]], image="nvcr.io/nvidia/nemo:24.05")
    half = gpus_per_node // 2
    # asks for half a node, computes on one GPU: a right-size candidate
    add("train-half", 1, half, 0, node=half_node, owner="PyTorchJob", util=90, memory_gib=60, active_gpus=1)
    add("train-short", 2, gpus_per_node, 0, node=frees_early, owner="Job", util=93, memory_gib=66, run_for=_m(8),
        end="Succeeded")
    add("train-spot", 3, gpus_per_node, 0, node=spot, owner="PyTorchJob", util=95, memory_gib=70, steps_per_s=1.5)
    # A gang whose first member fits on the half-free node and whose second must wait.
    for member in range(2):
        add(f"llm-pretrain-{member}", 0, half, 2, gang="llm-pretrain", owner="JobSet", util=96, memory_gib=74,
            steps_per_s=0.8)
    # A full-node job that waits although enough GPUs are free in total (fragmentation).
    add("train-big-batch", 1, gpus_per_node, 3, owner="Job", util=91, memory_gib=70)
    return {
        "name": f"demo-fleet-{nodes}x{gpus_per_node}",
        "start": start,
        "duration": _m(duration_m),
        "sample_interval": "10s",
        "window": "1m",
        "thresholds": {"idle_after": "5m", "pending_after": "3m", "gang_after": "3m"},
        "prices": dict(MODELS),
        "nodes": node_docs,
        "pods": pods,
    }
