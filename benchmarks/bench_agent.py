"""Node agent cost at 8 GPUs and 1 Hz, with the fake NVML: CPU time per sample and agent RSS.

Targets (issue 3): <= 0.5 % of one core per GPU, RSS <= 64 MiB (dcgm-exporter is reported at
135-512 MiB).

- In-process: ``NodeSampler.sample`` + encode over the simulated 8-GPU node (fake NVML, the real
  kubelet gRPC client against the fake server on a unix socket, the real /proc cgroup resolver).
  CPU is process time, so it also counts the in-process fake kubelet server: an upper bound.
- Out of process: the agent running its 1 Hz loop and producing to the local broker, as
  ``python -m producers.agent --simulate`` (the lean entry point, what the DaemonSet runs) and as
  ``gpulens agent --simulate`` (the full CLI, which also imports every other part's commands);
  peak RSS (VmHWM) and CPU from /proc over the steady-state part of the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks.harness import Context, Result
from common.kafka import ensure_topics
from producers.agent.cgroup import StaticProcessResolver
from producers.agent.fake_kubelet import StaticPodResources
from producers.agent.sampler import NodeSampler
from producers.agent.simulate import build_simulated_node
from schemas.codec import encode
from schemas.topics import GPU_SAMPLES

BENCH = "agent"
GPUS = 8
CPU_TARGET = "<=0.5% core/GPU"
RSS_TARGET = "<=64 MiB"


def _cpu_per_sample(samples: int, with_kubelet: bool) -> float:
    with build_simulated_node("bench-node") as node:
        node.nvml.init()
        pods = node.pod_resources if with_kubelet else StaticPodResources(node.pod_resources.assignments())
        resolver = node.resolver if with_kubelet else StaticProcessResolver(
            {pid: ref for pid in (41001, 41002, 41003, 41004, 52001, 63001, 64001, 71001, 81001, 82001)
             if (ref := node.resolver.resolve(pid)) is not None})
        sampler = NodeSampler("bench-node", node.nvml, pods, resolver, "bench", 1.0)
        t0 = datetime(2025, 1, 1, tzinfo=UTC)
        for i in range(5):  # warm-up: first calls build caches and connect
            encode(sampler.sample(t0 + timedelta(seconds=i)))
        started = time.process_time()
        for i in range(samples):
            ts = t0 + timedelta(seconds=5 + i)
            node.advance(ts)
            encode(sampler.sample(ts))
        return (time.process_time() - started) / samples


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _run_agent(ctx: Context, command: list[str], seconds: float) -> tuple[float, float]:
    """(peak RSS MiB, CPU % of one core in steady state) of an agent producing at 1 Hz."""
    env = os.environ | {
        "GPULENS_KAFKA__BOOTSTRAP_SERVERS": ctx.kafka.bootstrap_servers,
        "GPULENS_TOPIC_PREFIX": ctx.topic_prefix,
        "GPULENS_LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen([*command, "--simulate", "--interval", "1", "--node-name", "bench-node"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(3.0)  # start-up: imports, first connection
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited early: {proc.stderr.read().decode() if proc.stderr else ''}")
        cpu0, wall0 = _proc_cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        cpu1, wall1 = _proc_cpu_s(proc.pid), time.monotonic()
        rss = _peak_rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    return rss, 100.0 * (cpu1 - cpu0) / (wall1 - wall0)


def run(ctx: Context) -> list[Result]:
    samples = 60 if ctx.quick else 300
    results: list[Result] = []
    per_sample = _cpu_per_sample(samples, with_kubelet=True)
    results.append(Result(BENCH, "cpu per sample (8 GPUs, sample+encode)", per_sample * 1000, "ms",
                          notes=f"{samples} samples; incl. kubelet gRPC call and in-process fake server"))
    results.append(Result(BENCH, "core share per GPU at 1 Hz (in-process)", 100 * per_sample / GPUS, "% core",
                          target=CPU_TARGET))
    bare = _cpu_per_sample(samples, with_kubelet=False)
    results.append(Result(BENCH, "cpu per sample without kubelet call", bare * 1000, "ms",
                          notes="NVML reads, attribution, validation and JSON encode only"))

    ensure_topics(ctx.kafka, [GPU_SAMPLES], ctx.topic_prefix)
    seconds = 5.0 if ctx.quick else 15.0
    lean_rss, lean_cpu = _run_agent(ctx, [sys.executable, "-m", "producers.agent"], seconds)
    results.append(Result(BENCH, "agent RSS, python -m producers.agent", lean_rss, "MiB", target=RSS_TARGET,
                          notes="peak VmHWM, producing to Kafka at 1 Hz, simulated node in-process"))
    results.append(Result(BENCH, "agent core share per GPU at 1 Hz (process)", lean_cpu / GPUS, "% core",
                          target=CPU_TARGET, notes=f"utime+stime over {seconds:.0f}s of steady state"))
    cli_rss, _ = _run_agent(ctx, [str(Path(sys.executable).parent / "gpulens"), "agent"], seconds / 2)
    results.append(Result(BENCH, "agent RSS, gpulens agent (full CLI)", cli_rss, "MiB", target=RSS_TARGET,
                          notes="the CLI imports every part's commands (ClickHouse, Kubernetes clients)"))
    return results
