"""In-process replay time at fleet scale, and the stream stages' state and memory for a churning fleet.

Everything a real replay does runs: Kubernetes objects through the watcher's translation, NVML
samples through the agent's sampler over the fake NVML, JSON encode/decode of every record, both
stages, and the report. Figures:

- the one-hour replay of 64 GPUs (8 nodes) and of 1,024 GPUs (128 nodes x 8) at 10 s sampling
  (target for the latter: under 10 s), each against the simulator alone over the same scenario
  (its records made and encoded, nothing decoded or processed: the producer side of the replay,
  measured in the same run), so the pipeline's own share shows;
- the state a stream worker holds for a 1,024-GPU fleet through which 10,000 short pods pass in an
  hour: the serialised checkpoint (``orjson`` of each stage's ``to_dict``, what the faust tables
  store) of the node stages and of the cluster stage at a third, two thirds and the end of the hour
  (flat when the state is bounded by the fleet, not by the pods that ever ran), and the peak RSS of
  a process that runs the simulator and the stages with outputs sent away as a worker does,
  against a process that runs the simulator alone.

The state figures run in child processes (``python -m benchmarks.bench_replay --state ...``) so that
each RSS is one fleet's alone.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness import Context, Result
from simulation.replay import engine_config, feed_tick, run_in_process, worker_gc
from simulation.scenario import Scenario, parse_scenario
from simulation.simulator import FleetSimulator
from stream_jobs.pipeline import LocalPipeline
from stream_jobs.timeutil import epoch

LATENESS_S = 30.0
STATE_NODES, STATE_PODS = 128, 10_000


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


def churn_scenario(nodes: int = STATE_NODES, pods: int = STATE_PODS, duration_s: int = 3600,
                   gpus_per_node: int = 8) -> Scenario:
    """Short one-GPU pods in waves that keep every GPU busy: ``pods`` of them pass through the fleet
    in ``duration_s``, each deleted five minutes after it ends (a Job's ``ttlSecondsAfterFinished``)."""
    gpus = nodes * gpus_per_node
    waves = -(-pods // gpus)
    period = duration_s // waves
    specs: list[dict[str, Any]] = []
    for k in range(pods):
        slot, wave = k % gpus, k // gpus
        create = wave * period + (slot % 20) * 2
        run_for = max(period - 60 - (slot % 7) * 5, 30)
        specs.append({"name": f"job-{k}", "namespace": f"team-{k % 8}", "gpus": 1, "create": f"{create}s",
                      "run_for": f"{run_for}s", "delete": f"{create + run_for + 300}s",
                      "util": [[0, 20 + (k * 37) % 75], [f"{run_for // 2}s", 5 + (k * 13) % 90]],
                      "memory_gib": 4 + k % 40, "labels": {"team": f"team-{k % 8}", "project": f"p{k % 31}"}})
    data = {
        "name": "bench-churn", "start": "2026-01-05T09:00:00Z", "duration": f"{duration_s}s",
        "sample_interval": "10s", "prices": {"NVIDIA H100 80GB HBM3": 2.5},
        "nodes": [{"name": f"gpu-{i:03d}", "gpus": gpus_per_node} for i in range(nodes)],
        "pods": specs,
    }
    return parse_scenario(data)


def simulate_seconds(scenario: Scenario) -> tuple[float, float]:
    """The simulator alone: every tick's records made and encoded, none consumed; (wall, CPU) seconds,
    under the collector thresholds the replay runs under."""
    started, cpu = time.perf_counter(), time.process_time()
    with worker_gc():
        for _tick in FleetSimulator(scenario).run():
            pass
    return time.perf_counter() - started, time.process_time() - cpu


def replay_seconds(scenario: Scenario) -> tuple[float, float, int]:
    """The whole replay, report included: (wall, CPU) seconds and the count of alert transitions."""
    started, cpu = time.perf_counter(), time.process_time()
    result = run_in_process(scenario)
    return time.perf_counter() - started, time.process_time() - cpu, len(result.report["alerts"])


def _replay_figures(label: str, scenario: Scenario, target: str | None) -> list[Result]:
    gc.collect()
    simulated, simulated_cpu = simulate_seconds(scenario)
    gc.collect()
    seconds, cpu, alerts = replay_seconds(scenario)
    samples = len(scenario.nodes) * scenario.ticks
    return [
        Result("replay", f"in-process replay, {label}", seconds, "s", baseline="simulator alone",
               ratio_to_baseline=seconds / simulated, target=target,
               notes=f"{samples} node samples, {alerts} alert transitions; simulator alone {simulated:.2f} s, "
                     f"the pipeline (decode, stages, report) {seconds - simulated:.2f} s"),
        Result("replay", f"in-process replay CPU, {label}", cpu, "s", baseline="simulator alone",
               ratio_to_baseline=cpu / simulated_cpu, target=target,
               notes=f"CPU seconds of the process (a shared machine's wall clock includes others' work); "
                     f"simulator alone {simulated_cpu:.2f} s, the pipeline {cpu - simulated_cpu:.2f} s"),
        Result("replay", f"in-process replay throughput, {label}", samples / cpu, "samples/CPU s",
               notes="one sample = one node with 8 GPUs"),
    ]


# --------------------------------------------------------------------------- state and RSS (child process)


def _rss_kib() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(rest.split()[0])
    return fields


def _checkpoint_bytes(pipeline: LocalPipeline) -> dict[str, int]:
    nodes = [len(orjson.dumps(stage.to_dict())) for stage in pipeline.nodes.values()]
    return {"nodes": sum(nodes), "node_max": max(nodes, default=0),
            "cluster": len(orjson.dumps(pipeline.cluster.to_dict()))}


def measure_state(nodes: int, pods: int, duration_s: int, simulator_only: bool) -> dict[str, Any]:
    """Run the churning fleet as a worker holds it (outputs sent away, not kept) and return its
    checkpoint sizes at a third, two thirds and the end, and this process's RSS."""
    scenario = churn_scenario(nodes, pods, duration_s)
    gc.collect()
    before = _rss_kib()
    simulator = FleetSimulator(scenario)
    pipeline = None if simulator_only else LocalPipeline(engine_config(scenario))
    marks = {scenario.ticks // 3, 2 * scenario.ticks // 3}
    snapshots: list[dict[str, int]] = []
    outputs = 0
    started = time.perf_counter()
    with worker_gc():  # a worker's collector thresholds
        for i, tick in enumerate(simulator.run()):
            if pipeline is None:
                continue
            feed_tick(pipeline, tick)
            pipeline.advance(epoch(tick.ts) - LATENESS_S)
            outputs += len(pipeline.outputs)
            pipeline.outputs.clear()
            if i in marks:
                snapshots.append(_checkpoint_bytes(pipeline))
    if pipeline is not None:
        snapshots.append(_checkpoint_bytes(pipeline))
    seconds = time.perf_counter() - started
    return {"before": before, "after": _rss_kib(), "snapshots": snapshots, "outputs": outputs, "seconds": seconds,
            "pods": len(scenario.pods), "gpus": nodes * 8}


def _child(nodes: int, pods: int, duration_s: int, simulator_only: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.bench_replay", "--state", str(nodes), str(pods), str(duration_s)]
    if simulator_only:
        command.append("--simulator-only")
    done = subprocess.run(command, check=True, capture_output=True, cwd=Path(__file__).resolve().parent.parent)
    result: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    return result


def _state_figures(nodes: int, pods: int, duration_s: int) -> list[Result]:
    alone = _child(nodes, pods, duration_s, simulator_only=True)
    worker = _child(nodes, pods, duration_s, simulator_only=False)
    fleet = f"{worker['gpus']:,} GPUs, {worker['pods']:,} pods in {duration_s // 60} min"
    third, two_thirds, end = (worker["snapshots"] + [worker["snapshots"][-1]] * 3)[:3]
    growth = "; ".join(f"at {at}: nodes {s['nodes'] / 1e6:.2f} MB, cluster {s['cluster'] / 1e6:.2f} MB"
                       for at, s in zip(("1/3", "2/3", "end"), (third, two_thirds, end), strict=True))
    mib = 1024.0
    hwm, hwm_alone = worker["after"]["VmHWM"] / mib, alone["after"]["VmHWM"] / mib
    return [
        Result("replay", f"node stages' checkpoint, {fleet}", end["nodes"] / 1e6, "MB",
               baseline="at 1/3 of the run", ratio_to_baseline=end["nodes"] / max(third["nodes"], 1),
               notes=f"largest node {end['node_max'] / 1e3:.1f} KB; {growth}"),
        Result("replay", f"cluster stage's checkpoint, {fleet}", end["cluster"] / 1e6, "MB",
               baseline="at 1/3 of the run", ratio_to_baseline=end["cluster"] / max(third["cluster"], 1)),
        Result("replay", f"peak RSS, simulator + stages, {fleet}", hwm, "MiB",
               baseline="simulator alone", ratio_to_baseline=hwm / hwm_alone,
               notes=f"simulator alone {hwm_alone:.0f} MiB; after imports and the scenario "
                     f"{worker['before']['VmRSS'] / mib:.0f} MiB; stages' share about {hwm - hwm_alone:.0f} MiB; "
                     f"{worker['outputs']:,} outputs sent away; {worker['seconds']:.1f} s"),
    ]


def run(ctx: Context) -> list[Result]:
    if ctx.quick:
        return [*_replay_figures("10 min x 1,024 GPUs @ 10 s", fleet_scenario(nodes=128, duration="10m"), None),
                *_state_figures(16, 1_000, 600)]
    return [
        *_replay_figures("1 h x 64 GPUs @ 10 s", fleet_scenario(), "< 10 s"),
        *_replay_figures("1 h x 1,024 GPUs @ 10 s", fleet_scenario(nodes=128), "< 10 s"),
        *_state_figures(STATE_NODES, STATE_PODS, 3600),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--state"]:
        n, p, d = (int(a) for a in sys.argv[2:5])
        print(orjson.dumps(measure_state(n, p, d, "--simulator-only" in sys.argv)).decode())
    else:
        s = fleet_scenario(nodes=int(sys.argv[1]) if sys.argv[1:] else 8)
        t = time.perf_counter()
        r = run_in_process(s)
        print(f"{time.perf_counter() - t:.2f}s, {len(r.report['alerts'])} alerts")
