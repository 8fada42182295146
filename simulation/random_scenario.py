"""Seeded random scenarios: valid files of the scenario format and of gpulens's extensions, so that
the pipeline is checked on scenarios nobody wrote, not only on the goldens and the examples.

One seed always gives the same file. A scenario mixes what the format offers: a few nodes (whole
GPUs, time-sliced GPUs with and without per-process figures, MIG devices; some cordoned, some
removed part-way), pods that wait, run, end, get deleted, crash-loop, form gangs, report training
steps, with utilisation and memory in steps, some owned by controllers, using part of their GPUs,
declaring their VRAM or reporting allocator statistics; Kueue workloads (admitted late or never,
deleted); threshold overrides, prices, a non-default cluster, XID faults, lost GPUs, agent gaps,
late samples and poison records. About one scenario in three is also a DRA fleet (docs/dra.md): some
nodes publish their GPUs or MIG devices as ResourceSlices (some with consumable capacity), and some
pods get theirs through ResourceClaims, their own, made from a template, shared by several pods or
holding a share of a GPU's memory; now and then DRA nodes serve ``nvidia.com/gpu`` requests
(``dra_extended_resources``). DRA is drawn from a random stream of its own: the rest of a seed's
file is what the seed's main stream draws, DRA or not. What it is for:

- ``make chaos RANDOM_SCENARIOS=N`` plays N of them (seeded by ``SEED``) through ``replay --kafka
  --workers 3 --chaos``: each report must equal the in-process one byte for byte, as for the goldens;
- the tests replay a rotating few in-process and one a day through Kafka.

``python -m simulation.random_scenario SEED`` prints one as YAML; ``gpulens replay --random SEED``
plays it (with ``--kafka BOOTSTRAP --workers 3 --chaos``, on the user's own broker).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import yaml

MODELS = (("NVIDIA H100 80GB HBM3", 80), ("NVIDIA A100-SXM4-40GB", 40), ("NVIDIA L4", 24))
MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")
"""MIG profiles of an 80 GB GPU (the MIG nodes' model)."""
NAMESPACES = ("research", "serve", "batch")
TEAMS = ("nlp", "vision", "infra")
POISON = (
    ("gpu.samples.v1", "not json at all"),
    ("k8s.pods.v1", '{"uid": "x", "namespace": "a"}'),
    ("k8s.nodes.v1", "[1, 2, 3]"),
    ("k8s.events.v1", '{"uid": "e", "ts": "yesterday"}'),
    ("workload.progress.v1", '{"pod_uid": "p", "namespace": "a", "pod": "b", "ts": "2026-01-05T09:05:00Z", '
                             '"steps_total": -5}'),
)


def _duration(seconds: float) -> str:
    return f"{int(seconds)}s"


def _steps(rng: random.Random, low: float, high: float, run_s: float) -> float | list[list[Any]]:
    """A constant, or a few steps from the moment the pod runs."""
    if rng.random() < 0.5:
        return round(rng.uniform(low, high), 1)
    at = sorted({0, *(rng.randrange(30, max(31, int(run_s))) for _ in range(rng.randint(1, 3)))})
    return [[_duration(t), round(rng.uniform(low, high), 1)] for t in at]


def random_scenario(seed: int) -> dict[str, Any]:
    """The scenario of ``seed`` as a YAML document (a mapping)."""
    rng = random.Random(seed)
    interval = rng.choice((5, 10, 10, 15, 30))
    duration = rng.randrange(8, 31) * 60
    doc: dict[str, Any] = {
        "name": f"random-{seed}",
        "start": f"{rng.choice((2025, 2026, 2027))}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
                 f"T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
        "duration": _duration(duration),
        "sample_interval": _duration(interval),
        "window": rng.choice(("1m", "1m", "2m", "5m")),
    }
    if rng.random() < 0.7:
        doc["thresholds"] = {name: _duration(rng.choice(choices)) for name, choices in (
            ("idle_after", (60, 120, 300)), ("pending_after", (30, 60, 120)),
            ("fragmentation_after", (30, 60)), ("gang_after", (60, 120)), ("idle_node_after", (120, 300, 600)),
            ("vram_pressure_after", (30, 60)), ("crashloop_window", (300, 600)),
        ) if rng.random() < 0.6}
    if rng.random() < 0.3:
        doc["cluster"] = rng.choice(("us-east", "eu-1"))
    doc["prices"] = {model: rng.choice((0.8, 1.5, 2.5, 3.0)) for model, _memory in MODELS if rng.random() < 0.7}
    nodes = doc["nodes"] = [_node(rng, index, duration) for index in range(rng.randint(1, 4))]
    gangs = [f"gang-{g}" for g in range(rng.randint(0, 2))]
    pods = doc["pods"] = [_pod(rng, index, nodes, gangs, duration, interval) for index in range(rng.randint(2, 10))]
    if rng.random() < 0.25:
        doc["workloads"] = _workloads(rng, pods, duration)
    _add_troubles(rng, doc, nodes, duration, interval)
    _add_dra(random.Random(f"dra-{seed}"), doc)
    return doc


def _add_dra(rng: random.Random, doc: dict[str, Any]) -> None:
    """Now and then (its own stream ``rng``) a DRA fleet: some nodes publish their GPUs as
    ResourceSlices, some pods get theirs through claims (docs/scenarios.md, "GPUs through Dynamic
    Resource Allocation"). Only where the format allows it: no DRA node time-slices, a claim pod asks
    no extended resource and its ``gpus`` is the claim's count, a share of memory only on whole GPUs."""
    if rng.random() >= 0.35:
        return
    dra_nodes = _dra_nodes(rng, doc)
    if not dra_nodes:
        return
    if rng.random() < 0.3:
        doc["dra_extended_resources"] = True
    shared_nodes = any(node.get("dra_shared") for node in dra_nodes)
    claims: list[dict[str, Any]] = []
    earlier: dict[tuple[str, str], dict[str, Any]] = {}
    """The last claim or template by (namespace, resource): later pods may name it too (a claim
    several pods then share, a template each of them gets a claim of its own from)."""
    for pod in doc["pods"]:
        if "workload" in pod or rng.random() >= 0.6:
            continue  # a queued workload's pods ask through their pod set's resource
        claim = _pod_claim(rng, pod, earlier, len(claims), shared_nodes)
        if claim is not None:
            claims.append(claim)
    if claims:
        doc["claims"] = claims


def _dra_nodes(rng: random.Random, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Mark some nodes that do not time-slice as DRA nodes (at least one), some of those with
    consumable capacity; the DRA nodes."""
    candidates = [node for node in doc["nodes"] if "time_slicing" not in node]
    if not candidates:
        return []
    dra_nodes = [node for node in candidates if rng.random() < 0.6] or [rng.choice(candidates)]
    for node in dra_nodes:
        node["dra"] = True
        if "mig" not in node and rng.random() < 0.3:
            node["dra_shared"] = True
    return dra_nodes


def _pod_claim(rng: random.Random, pod: dict[str, Any], earlier: dict[tuple[str, str], dict[str, Any]],
               number: int, shared_nodes: bool) -> dict[str, Any] | None:
    """Move ``pod`` onto a claim: an earlier one of its namespace and resource (shared, or a
    template's), or a new one (returned) asking what the pod asked."""
    resource = str(pod.pop("resource", "nvidia.com/gpu"))
    profile = resource.removeprefix("nvidia.com/mig-") if resource != "nvidia.com/gpu" else None
    key = (pod["namespace"], resource)
    again = earlier.get(key)
    if again is not None and rng.random() < 0.4:
        pod |= {"claim": again["name"], "gpus": again["count"]}
        if pod.get("active_gpus", 0) >= again["count"]:
            del pod["active_gpus"]
        return None
    claim: dict[str, Any] = {"name": f"claim-{number}", "namespace": pod["namespace"]}
    if profile is not None:
        claim |= {"device_class": "mig.nvidia.com", "profile": profile}
    claim["count"] = pod["gpus"]
    if rng.random() < 0.5:
        claim["template"] = True
    earlier[key] = claim
    if profile is None and shared_nodes and rng.random() < 0.5:
        claim["memory_gib"] = rng.choice((10, 20, 30, 40))
    pod["claim"] = claim["name"]
    return claim


def _node(rng: random.Random, index: int, duration: int) -> dict[str, Any]:
    model, memory = rng.choice(MODELS)
    node: dict[str, Any] = {"name": f"gpu-{index}", "gpus": rng.choice((1, 2, 4, 8)), "model": model,
                            "memory_gib": memory}
    kind = rng.random()
    if kind < 0.15 and memory == 80:
        node["mig"] = rng.choice(MIG_PROFILES)
    elif kind < 0.35:
        node["time_slicing"] = rng.randint(2, 4)
        node["process_stats"] = rng.random() < 0.7
    if rng.random() < 0.3:
        node["labels"] = {"pool": rng.choice(("train", "serve"))}
    if rng.random() < 0.15:
        node["ready_until"] = _duration(rng.randrange(duration // 3, duration))
    if rng.random() < 0.1:
        node["unschedulable"] = True
    return node


def _pod(rng: random.Random, index: int, nodes: list[dict[str, Any]], gangs: list[str], duration: int,
         interval: int) -> dict[str, Any]:
    namespace = rng.choice(NAMESPACES)
    create = rng.randrange(0, int(duration * 0.6))
    pod: dict[str, Any] = {"name": f"pod-{index}", "namespace": namespace, "create": _duration(create)}
    target = rng.choice(nodes)
    if "mig" in target and rng.random() < 0.7:
        profile = target["mig"]
        pod |= {"resource": f"nvidia.com/mig-{profile}", "gpus": rng.randint(1, 2)}
        memory_max = int(profile.split(".")[1][:-2])  # 2g.20gb: 20 GiB
    else:
        pod["gpus"] = rng.choice((1, 1, 2, 4, 8))
        memory_max = min(memory for _model, memory in MODELS)
    if rng.random() < 0.25:
        pod["node"] = target["name"]
    if rng.random() < 0.6:
        pod["labels"] = {"team": rng.choice(TEAMS), "project": rng.choice(("chat", "search", "eval"))}
    run_s = duration - create
    if rng.random() < 0.4:
        run_s = rng.randrange(2 * interval, max(2 * interval + 1, duration - create))
        pod["run_for"] = _duration(run_s)
        pod["end"] = rng.choice(("Succeeded", "Succeeded", "Failed", "OOMKilled", "Evicted"))
    if rng.random() < 0.2:  # two intervals after its creation at least: a pod created and gone unseen is no test
        pod["delete"] = _duration(rng.randrange(create + 2 * interval, duration + 2 * interval))
    pod["util"] = _steps(rng, 0, 100, run_s)
    pod["memory_gib"] = _steps(rng, 0, memory_max, run_s)
    pod["processes"] = rng.choice((0, 1, 1, 1, 2))
    if gangs and rng.random() < 0.3:
        pod["gang"] = rng.choice(gangs)
    if rng.random() < 0.08:
        pod["crashloop"] = True
    if rng.random() < 0.3:
        pod["steps_per_s"] = round(rng.uniform(0.5, 4.0), 2)
    if rng.random() < 0.15:
        pod["owner"] = f"{rng.choice(('Job', 'PyTorchJob', 'StatefulSet'))}/owner-{rng.randint(0, 2)}"
    if pod["gpus"] > 1 and "resource" not in pod and rng.random() < 0.1:
        pod["active_gpus"] = rng.randint(1, pod["gpus"] - 1)
    if pod["gpus"] == 1 and "resource" not in pod and rng.random() < 0.15:
        pod["vram_request_gib"] = round(rng.uniform(2, 20), 1)
    if rng.random() < 0.1:
        reserved = round(rng.uniform(1, memory_max), 1)
        pod["allocator"] = {"reserved_gib": reserved, "allocated_gib": round(rng.uniform(0, reserved), 1),
                            "retries_per_min": rng.choice((0, 0, 2, 6)), "ooms_per_min": rng.choice((0, 0, 1))}
    return pod


def _add_troubles(rng: random.Random, doc: dict[str, Any], nodes: list[dict[str, Any]], duration: int,
                  interval: int) -> None:
    """Now and then an XID or a lost GPU, an agent gap, a late sample, a poison record."""
    if rng.random() < 0.25:
        node = rng.choice(nodes)
        fault: dict[str, Any] = {"node": node["name"], "gpu": rng.randrange(node["gpus"]),
                                 "at": _duration(rng.randrange(0, duration))}
        fault |= {"xid": rng.choice((13, 31, 48, 79))} if rng.random() < 0.6 else {"lost": True}
        if rng.random() < 0.5:
            fault["until"] = _duration(rng.randrange(duration // 2, duration + 60))
        doc["faults"] = [fault]
    if rng.random() < 0.25:
        start = rng.randrange(0, duration - 60)
        doc["agent_gaps"] = [{"node": rng.choice(nodes)["name"], "from": _duration(start),
                              "to": _duration(start + rng.randrange(interval, 5 * 60))}]
    if rng.random() < 0.25:
        doc["late_samples"] = [{"node": rng.choice(nodes)["name"],
                                "at": _duration(rng.randrange(0, duration, interval)),
                                "by": _duration(rng.choice((5, 20, 45, 120)))}]
    if rng.random() < 0.25:
        topic, value = rng.choice(POISON)
        doc["poison"] = [{"at": _duration(rng.randrange(0, duration)), "topic": topic, "value": value}
                         | ({"key": nodes[0]["name"]} if topic == "gpu.samples.v1" else {})]


def _workloads(rng: random.Random, pods: list[dict[str, Any]], duration: int) -> list[dict[str, Any]]:
    """One or two Kueue workloads; the first's pod set takes one or two of the pods (created once it
    is admitted, never if it is not), the second is demand without pods."""
    workloads: list[dict[str, Any]] = []
    for index in range(rng.randint(1, 2)):
        members = [pod for pod in pods if "workload" not in pod and "node" not in pod][:rng.randint(1, 2)] \
            if index == 0 else []
        namespace = members[0]["namespace"] if members else rng.choice(NAMESPACES)
        gpus = members[0]["gpus"] if members else rng.choice((1, 2, 4))
        queue = rng.choice(("research", "batch"))
        create = rng.randrange(0, duration // 2)
        workload: dict[str, Any] = {
            "name": f"wl-{index}", "namespace": namespace, "queue": queue,
            "pod_sets": [{"name": "workers", "count": max(1, len(members)), "gpus": gpus}],
            "create": _duration(create),
        }
        if rng.random() < 0.7:
            workload["admit"] = _duration(rng.randrange(create, duration))
        if rng.random() < 0.3:
            workload["delete"] = _duration(rng.randrange(create + 60, duration + 60))
        for pod in members:
            pod |= {"namespace": namespace, "gpus": gpus, "workload": workload["name"],
                    "create": _duration(rng.randrange(0, 60))}
            for field in ("resource", "delete", "active_gpus"):
                pod.pop(field, None)
        workloads.append(workload)
    return workloads


def random_scenario_yaml(seed: int) -> str:
    return yaml.safe_dump(random_scenario(seed), sort_keys=False)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m simulation.random_scenario SEED", file=sys.stderr)
        return 2
    sys.stdout.write(random_scenario_yaml(int(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
