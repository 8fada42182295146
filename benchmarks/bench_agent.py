"""Node agent cost at 8 GPUs and 1 Hz: CPU time per sample, agent RSS and CPU, and CLI start time.

Targets (issues 3 and 12): <= 0.5 % of one core per GPU, RSS <= 64 MiB (dcgm-exporter is reported
at 135-512 MiB), ``gpulens --help`` and ``gpulens <command> --help`` <= 0.3 s.

- In-process: ``NodeSampler.sample`` + encode over the simulated 8-GPU node (fake NVML, the real
  kubelet gRPC client against the fake server on a unix socket, the real /proc cgroup resolver).
  CPU is process time, so it also counts the in-process fake kubelet server: an upper bound.
- Out of process, the DaemonSet's own command: ``python -m producers.agent`` (no --simulate)
  running its 1 Hz loop and producing to the local broker, with the real pynvml loading the fake
  ``libnvidia-ml.so.1`` of tests/agent/fakenvml (8 GPUs, an R550 driver) through
  ``LD_LIBRARY_PATH``, a fake kubelet (gRPC on a unix socket, served by this process) and a
  temporary /proc tree; peak RSS (VmHWM) and CPU from /proc over the steady-state part of the run.
  For comparison the same with ``--simulate`` (which also runs the fake kubelet server and the
  simulated node inside the agent) and as ``gpulens agent --simulate`` (the CLI entry point).
- CLI start: wall time of ``gpulens --help`` and ``gpulens agent --help`` (median of several
  runs), against ``python -c pass`` measured in the same run.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks.harness import Context, Result, process_cpu_s
from common.kafka import ensure_topics
from producers.agent.cgroup import StaticProcessResolver
from producers.agent.fake_kubelet import FakePodResourcesServer, StaticPodResources
from producers.agent.sampler import NodeSampler
from producers.agent.simulate import build_simulated_node
from schemas.codec import encode
from schemas.messages import PodRef
from schemas.topics import GPU_SAMPLES
from tests.agent.fakenvml import VARIANTS, Gpu, Node, Process, gpu_uuid

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


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _run_agent(
    ctx: Context, command: list[str], seconds: float, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """(peak RSS MiB, CPU % of one core in steady state) of an agent producing at 1 Hz, its progress
    socket listening (in a temporary directory, not the node's /var/run)."""
    sockets = tempfile.mkdtemp(prefix="gpl-bench-")
    env = os.environ | {
        "GPULENS_KAFKA__BOOTSTRAP_SERVERS": ctx.kafka.bootstrap_servers,
        "GPULENS_TOPIC_PREFIX": ctx.topic_prefix,
        "GPULENS_LOG_LEVEL": "WARNING",
        "GPULENS_PROGRESS_SOCKET": f"{sockets}/progress.sock",
    } | (env or {})
    proc = subprocess.Popen([*command, "--interval", "1", "--node-name", "bench-node"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(3.0)  # start-up: imports, first connection
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited early: {proc.stderr.read().decode() if proc.stderr else ''}")
        cpu0, wall0 = process_cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        cpu1, wall1 = process_cpu_s(proc.pid), time.monotonic()
        rss = _peak_rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(sockets, ignore_errors=True)
    return rss, 100.0 * (cpu1 - cpu0) / (wall1 - wall0)


def _fake_node() -> Node:
    """8 GPUs of an R550 driver, ten GPU processes (one pod each), as the simulated node has."""
    gpus = [Gpu(gpu_uuid(i), name="NVIDIA H100 80GB HBM3") for i in range(8)]
    processes = [Process(40001 + i, gpu_uuid(i % 8), (i + 1) * 2**30, sm_pct=10 * (i % 8)) for i in range(10)]
    return Node(VARIANTS["r550"], gpus, processes=processes)


def _run_daemonset_command(ctx: Context, seconds: float) -> tuple[float, float]:
    """``python -m producers.agent`` on the fake NVML library, a fake kubelet and a /proc tree."""
    node = _fake_node()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for p in node.processes:
            (root / "proc" / str(p.pid)).mkdir(parents=True)
            uid = f"{p.pid:08x}_0000_4000_8000_{p.pid:012x}"
            (root / "proc" / str(p.pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{p.pid:064x}.scope\n")
        mapping = {p.device: [PodRef(namespace="bench", pod=f"pod-{p.pid}", container="main")]
                   for p in node.processes}
        with FakePodResourcesServer(root / "kubelet.sock", mapping):
            env = node.environment(root / "node.conf") | {
                "GPULENS_KUBELET_SOCKET": str(root / "kubelet.sock"),
                "GPULENS_PROC_ROOT": str(root / "proc"),
                "GPULENS_CLUSTER": "bench",  # required against a real cluster, as on a DaemonSet
            }
            return _run_agent(ctx, [sys.executable, "-m", "producers.agent"], seconds, env)


def _start_s(command: list[str], runs: int) -> float:
    """Median wall time of ``command`` (stdout discarded)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


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
    ds_rss, ds_cpu = _run_daemonset_command(ctx, seconds)
    results.append(Result(BENCH, "agent RSS, DaemonSet command", ds_rss, "MiB",
                          target=RSS_TARGET, notes="python -m producers.agent; peak VmHWM, 8 GPUs via pynvml + fake "
                          "libnvidia-ml, fake kubelet, producing to Kafka at 1 Hz"))
    results.append(Result(BENCH, "agent core/GPU at 1 Hz, DaemonSet command", ds_cpu / GPUS, "% core",
                          target=CPU_TARGET, notes=f"utime+stime over {seconds:.0f}s of steady state"))
    lean_rss, lean_cpu = _run_agent(ctx, [sys.executable, "-m", "producers.agent", "--simulate"], seconds)
    results.append(Result(BENCH, "agent RSS, producers.agent --simulate", lean_rss, "MiB",
                          notes="also runs the fake kubelet gRPC server and the simulated node in-process"))
    results.append(Result(BENCH, "agent core/GPU at 1 Hz, --simulate", lean_cpu / GPUS, "% core",
                          notes=f"utime+stime over {seconds:.0f}s of steady state"))
    gpulens = str(Path(sys.executable).parent / "gpulens")
    cli_rss, _ = _run_agent(ctx, [gpulens, "agent", "--simulate"], seconds / 2)
    results.append(Result(BENCH, "agent RSS, gpulens agent --simulate", cli_rss, "MiB",
                          notes="the CLI entry point: click and the agent command only (commands load lazily)"))

    runs = 5 if ctx.quick else 15
    python_s = _start_s([sys.executable, "-c", "pass"], runs)
    for command in (["--help"], ["agent", "--help"]):
        took = _start_s([gpulens, *command], runs)
        results.append(Result(BENCH, f"start time, gpulens {' '.join(command)}", took, "s",
                              baseline="python -c pass", ratio_to_baseline=took / python_s, target="<=0.3 s",
                              notes=f"median of {runs}; python -c pass {python_s:.3f}s in the same run"))
    return results
