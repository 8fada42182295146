"""Run the node agent once on a real GPU machine, against a real CUDA workload, and check what it saw.

The test suite runs the agent over a fake ``libnvidia-ml.so`` (docs/agent.md); this script is
the check that only a machine with an NVIDIA GPU can make. As root on such a machine, with the
agent's dependencies and (for the workload) PyTorch installed::

    python scripts/gpu_node_check.py --out /tmp/gpu-check [--seconds 60]

What it sets up, so that only the kubelet is a stand-in:

- a pod's cgroup, as the kubelet's systemd driver names it
  (``kubepods.slice/.../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope``), made in
  the machine's own cgroup hierarchy under a parent of its own (removed at the end), and a
  PyTorch workload started inside it: bf16 matrix
  products on GPU 0, reporting its steps and its allocator through ``clients/gpulens_progress.py``
  to the agent's progress socket; halfway it frees half its tensors (allocated drops, reserved
  stays), as a training job does between phases;
- a short-lived CUDA process outside any pod, midway (what NVML says of a process that ends
  between two samples);
- the fake kubelet (:mod:`producers.agent.fake_kubelet`, a real gRPC server) assigning GPU 0 to
  that pod;
- ``python -m producers.agent --stdout`` with the real ``libnvidia-ml.so.1`` and the real
  ``/proc``, sampling every ``--interval`` seconds.

It first measures, in a process of its own, what each NVML call of the agent's adapter costs on
GPU 0 and what loading and initialising the real library adds to a process's memory
(``backend.json``). It writes to ``--out``: ``samples.jsonl`` (the agent's output), ``agent.log``, ``metrics.txt``
(its /metrics at the end), ``nvidia-smi.txt``, ``smi.csv`` (nvidia-smi's own readings beside the
agent's), ``workload.log`` (both CUDA processes) and ``summary.json``, which it also prints: every line decoded by the
topic's schema, GPU 0's readings against nvidia-smi's, the workload's process and its pod as the
agent attributed them, progress and allocator messages, and the agent's peak RSS. Exit 1 when a
check fails; each failure is named in the summary. Stopped (Ctrl-C, SIGTERM), it stops its processes
and removes the cgroups it made.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOAD = """
import os, sys, time
sys.path.insert(0, os.environ["GPULENS_CHECK_CLIENTS"])
import gpulens_progress
seconds = float(sys.argv[1])
try:
    import torch
except ImportError:
    torch = None
print("pid", os.getpid(), "cgroup", open("/proc/self/cgroup").read().strip().replace(chr(10), " | "), flush=True)
if torch is None or not torch.cuda.is_available():
    print("no CUDA: progress only", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        gpulens_progress.report(steps=1, tokens=4096, samples=8)
        time.sleep(0.2)
    gpulens_progress.flush()
    sys.exit(0)
dev = torch.device("cuda:0")
keep = [torch.empty(2**30, dtype=torch.uint8, device=dev) for _ in range(16)]  # 16 GiB held
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
start = time.time()
halved = False
last_alloc = 0.0
steps = 0
while time.time() - start < seconds:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    steps += 1
    gpulens_progress.report(steps=1, tokens=20 * 8192, samples=20)
    if not halved and time.time() - start > seconds / 2:
        del keep[8:]
        halved = True
        print("freed 8 GiB of tensors at", round(time.time() - start, 1), "s", flush=True)
    if time.time() - last_alloc >= 2:
        gpulens_progress.report_torch_allocator()
        last_alloc = time.time()
gpulens_progress.flush()
print("steps", steps, "reserved", torch.cuda.memory_reserved(0), "allocated", torch.cuda.memory_allocated(0),
      flush=True)
"""

SHORT_LIVED = """
import time, torch
x = torch.randn(4096, 4096, device="cuda:0")
end = time.time() + 1.5
while time.time() < end:
    y = x @ x
torch.cuda.synchronize()
print("short-lived process done", flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the workload runs")
    parser.add_argument("--interval", type=float, default=2.0, help="the agent's sample interval")
    parser.add_argument("--metrics-port", type=int, default=9477)
    parser.add_argument("--backend-costs", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _terminated)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.backend_costs:
        (out / "backend.json").write_text(json.dumps(backend_costs(), indent=2))
        return 0
    subprocess.run([sys.executable, __file__, "--out", str(out), "--backend-costs"], check=False, timeout=300)

    gpus = _smi(["--query-gpu=uuid", "--format=csv,noheader"], out).splitlines()
    if not gpus:
        print("nvidia-smi lists no GPU", file=sys.stderr)
        return 2
    (out / "nvidia-smi.txt").write_text(_smi(["-q"], out))
    gpu0, pod_uid = gpus[0].strip(), str(uuid.uuid4())
    with contextlib.ExitStack() as cleanup:
        cgroup = _pod_cgroup(cleanup, pod_uid, secrets.token_hex(32))
        sockets = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="gpulens-check-")))
        agent_rc, rss_mib, agent_memory = _run(args, out, gpu0, cgroup, sockets)
    summary = summarise(out, pod_uid, gpu0, rss_mib, agent_rc, cgroup is not None)
    summary["agent_memory_at_end_mib"] = agent_memory
    with contextlib.suppress(OSError, ValueError):
        summary["backend"] = json.loads((out / "backend.json").read_text())
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 1 if summary["failures"] else 0


def _run(args: argparse.Namespace, out: Path, gpu0: str, cgroup: Path | None,
         sockets: Path) -> tuple[int | None, list[float], dict[str, float]]:
    """The fake kubelet, the agent and the workloads; the agent's exit status, RSS readings and memory at the end."""
    from producers.agent.fake_kubelet import FakePodResourcesServer
    from schemas.messages import PodRef

    kubelet_socket = sockets / "kubelet.sock"
    progress_socket = sockets / "progress.sock"
    assignment = {gpu0: [PodRef(namespace="ml", pod="train-h200", container="trainer")]}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "GPULENS_KUBELET_SOCKET": str(kubelet_socket), "GPULENS_PROGRESS_SOCKET": str(progress_socket),
        "GPULENS_PROGRESS_INTERVAL_S": str(args.interval), "GPULENS_LOG_FORMAT": "json",
        "GPULENS_CHECK_CLIENTS": str(ROOT / "clients"), "GPULENS_CLUSTER": "gpu-check"}
    rss_mib: list[float] = []
    with FakePodResourcesServer(kubelet_socket, assignment), contextlib.ExitStack() as stack:
        agent = _start(stack, [sys.executable, "-m", "producers.agent", "--stdout", "--node-name", "gpu-check",
                               "--interval", str(args.interval), "--metrics-port", str(args.metrics_port)],
                       env, out / "samples.jsonl", out / "agent.log")
        time.sleep(args.interval * 2)  # the agent's first samples show the GPU before the workload
        workload = _start(stack, [sys.executable, "-c", WORKLOAD, str(args.seconds)], env, out / "workload.log",
                          out / "workload.log", cgroup=cgroup)
        began = time.time()
        short_started = False
        with (out / "smi.csv").open("w") as smi:
            while workload.poll() is None:
                now = time.time()
                rss_mib.append(_memory_status(agent.pid).get("VmRSS", 0.0))
                reading = _smi(["--query-gpu=timestamp,utilization.gpu,memory.used,power.draw,temperature.gpu",
                                "--format=csv,noheader", "-i", "0"], out)
                apps = _smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader"], out)
                smi.write(f"{now:.1f},{reading.strip()},{apps.strip().replace(chr(10), ';')}\n")
                if not short_started and now - began > args.seconds / 3:
                    short_started = True
                    _start(stack, [sys.executable, "-c", SHORT_LIVED], env, out / "workload.log", out / "workload.log")
                time.sleep(1.0)
        time.sleep(args.interval * 2)  # samples after the workload ended
        metrics_url = f"http://127.0.0.1:{args.metrics_port}/metrics"
        with contextlib.suppress(OSError), urllib.request.urlopen(metrics_url, timeout=5) as response:
            (out / "metrics.txt").write_bytes(response.read())
        agent_memory = _memory_status(agent.pid)
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    return agent.returncode, rss_mib, agent_memory


def _smi(args: list[str], out: Path) -> str:
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        with (out / "smi-errors.txt").open("a") as errors:
            errors.write(f"{args}: {exc}\n")
        return ""


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM (a timeout, a stopped job) unwinds like Ctrl-C: the workload and the agent are stopped and
    the pod's cgroups removed, none left behind in the machine's hierarchy."""
    raise SystemExit(128 + signum)


def _pod_cgroup(stack: contextlib.ExitStack, pod_uid: str, container_id: str) -> Path | None:
    """The container's cgroup directory (None if it can't be made), removed when ``stack`` closes.

    It sits under a parent of this script's own (``gpulens-check-<pid>.slice``), not in the
    kubelet's ``kubepods.slice``: on a node the kubelet cleans up pod cgroups it does not know,
    killing their processes. The agent matches the pod's slice wherever it sits in the path.
    """
    slice_uid = pod_uid.replace("-", "_")
    top = Path(f"gpulens-check-{os.getpid()}.slice")
    relative = (top / "kubepods.slice" / "kubepods-burstable.slice" / f"kubepods-burstable-pod{slice_uid}.slice"
                / f"cri-containerd-{container_id}.scope")
    for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd")):
        if not (mount / "cgroup.procs").exists():
            continue
        try:
            (mount / relative).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"cannot make {mount / relative}: {exc}", file=sys.stderr)
            continue
        stack.callback(_remove_cgroups, mount, relative)
        return mount / relative
    return None


def _remove_cgroups(mount: Path, relative: Path) -> None:
    """Remove the directories made for the pod, deepest first (each is empty once its processes ended)."""
    for depth in range(len(relative.parts), 0, -1):
        with contextlib.suppress(OSError):
            (mount / Path(*relative.parts[:depth])).rmdir()


def _start(stack: contextlib.ExitStack, argv: list[str], env: dict[str, str], stdout: Path, stderr: Path,
           cgroup: Path | None = None) -> subprocess.Popen[bytes]:
    out_file = stack.enter_context(stdout.open("ab"))
    err_file = out_file if stderr == stdout else stack.enter_context(stderr.open("ab"))

    # no preexec_fn: it makes Python fork rather than spawn, and a fork beside the fake kubelet's
    # running gRPC threads can abort the child (gRPC's fork handlers); the workload is moved into
    # its cgroup right after the spawn instead, long before it imports torch and opens the GPU
    process = subprocess.Popen(argv, env=env, stdout=out_file, stderr=err_file, cwd=ROOT)
    stack.callback(_stop, process)
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(process.pid))
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)


def _memory_status(pid: int | str = "self") -> dict[str, float]:
    """VmRSS, VmHWM and the RSS's anonymous / file-backed parts, in MiB."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                fields[name] = round(int(value.split()[0]) / 1024, 1)
    return fields


def backend_costs() -> dict[str, Any]:
    """Milliseconds per call of the adapter on GPU 0 (median of 10) and memory before and after NVML."""
    import producers.agent.main  # noqa: F401  (everything the agent imports, before NVML)
    from producers.agent.nvml import PynvmlBackend

    before = _memory_status()
    backend = PynvmlBackend()
    backend.init()
    after_init = _memory_status()
    handle = backend.device_by_index(0)
    calls = {
        "memory": lambda: backend.memory(handle),
        "utilization": lambda: backend.utilization(handle),
        "power_w": lambda: backend.power_w(handle),
        "temperature_c": lambda: backend.temperature_c(handle),
        "clock_mhz_sm": lambda: backend.clock_mhz(handle, "sm"),
        "pcie_throughput": lambda: backend.pcie_throughput_bytes_per_s(handle),
        "nvlink_bytes_total": lambda: backend.nvlink_bytes_total(handle),
        "compute_processes": lambda: backend.compute_processes(handle),
        "process_utilization": lambda: backend.process_utilization(handle, 0),
        "mig_enabled": lambda: backend.mig_enabled(handle),
    }
    costs: dict[str, Any] = {}
    for name, call in calls.items():
        times = []
        for _ in range(10):
            began = time.perf_counter()
            try:
                call()
            except Exception as exc:  # what the call answers is the finding, not a failure of the script
                costs[name] = f"{type(exc).__name__}: {exc}"
                break
            times.append((time.perf_counter() - began) * 1000)
        else:
            costs[name] = round(statistics.median(times), 3)
    missing = sorted(backend._missing)
    backend.shutdown()
    return {"ms_per_call": costs, "memory_mib_after_imports": before, "memory_mib_after_nvml_init": after_init,
            "calls_this_driver_lacks": missing}


def summarise(out: Path, pod_uid: str, gpu0: str, rss_mib: list[float], agent_rc: int | None,
              in_pod_cgroup: bool) -> dict[str, Any]:
    """Every output line decoded by its topic's schema, and what it says of GPU 0 and the workload."""
    from schemas.codec import MessageError, decode
    from schemas.messages import GpuSample, WorkloadAllocator, WorkloadProgress

    failures: list[str] = []
    samples: list[GpuSample] = []
    progress: list[WorkloadProgress] = []
    allocator: list[WorkloadAllocator] = []
    for number, line in enumerate((out / "samples.jsonl").read_bytes().splitlines(), 1):
        kind: type[Any] = (WorkloadAllocator if b'"devices"' in line else WorkloadProgress if b'"steps_total"' in line
                           else GpuSample)
        try:
            message = decode(line, kind)
        except MessageError as exc:
            failures.append(f"line {number} is not a valid {kind.__name__}: {exc}")
            continue
        if isinstance(message, GpuSample):
            samples.append(message)
        elif isinstance(message, WorkloadProgress):
            progress.append(message)
        else:
            allocator.append(message)
    readings = [(s, g) for s in samples for g in s.gpus if g.uuid == gpu0]
    pids = {p.pid for _, g in readings for p in g.processes}
    ours = [(s, p) for s, g in readings for p in g.processes if p.pod_uid == pod_uid]
    workload_pid = _workload_pid(out)
    if not samples:
        failures.append("no sample")
    if not readings:
        failures.append(f"GPU 0 ({gpu0}) in no sample")
    if workload_pid is not None and workload_pid not in pids:
        failures.append(f"the workload's pid {workload_pid} in no sample of GPU 0")
    if in_pod_cgroup and not ours:
        failures.append("no process of GPU 0 attributed to the workload's pod uid")
    if in_pod_cgroup and not progress:
        failures.append("no progress message")
    used_vs_smi = _used_vs_smi(out, [(s.ts.timestamp(), g.mem_used_bytes) for s, g in readings])
    if used_vs_smi and statistics.median(abs(d) for d in used_vs_smi) > 64:
        failures.append(f"GPU 0's used memory is a median {statistics.median(used_vs_smi)} MiB off nvidia-smi's")
    if agent_rc not in (0, None):
        failures.append(f"the agent exited {agent_rc}")
    log_levels: dict[str, int] = {}
    for log_line in _lines(out / "agent.log"):
        with contextlib.suppress(ValueError):
            level = str(json.loads(log_line).get("level", "?"))
            log_levels[level] = log_levels.get(level, 0) + 1
    return {
        "failures": failures,
        "driver_version": samples[0].driver_version if samples else None,
        "cuda_driver_version": samples[0].cuda_driver_version if samples else None,
        "samples": len(samples),
        "gpus_per_sample": sorted({len(s.gpus) for s in samples}),
        "sample_errors": sorted({e for s in samples for e in s.errors}),
        "gpu0": [
            {"ts": s.ts.isoformat(), "util_pct": g.gpu_util_pct, "mem_util_pct": g.mem_util_pct,
             "mem_used_gib": None if g.mem_used_bytes is None else round(g.mem_used_bytes / 2**30, 2),
             "power_w": g.power_w, "temp_c": g.temperature_c, "sm_mhz": g.sm_clock_mhz,
             "pcie_rx_mb_s": None if g.pcie_rx_bytes_per_s is None else round(g.pcie_rx_bytes_per_s / 1e6, 1),
             "nvlink_tx_mb_s": None if g.nvlink_tx_bytes_per_s is None else round(g.nvlink_tx_bytes_per_s / 1e6, 1),
             "health": g.health, "assigned_to": [f"{r.namespace}/{r.pod}/{r.container}" for r in g.assigned_to],
             "processes": [p.model_dump(exclude_none=True) for p in g.processes]}
            for s, g in readings],
        "model": readings[0][1].model if readings else None,
        "mem_used_minus_smi_mib": used_vs_smi,
        "workload_pid": workload_pid,
        "pids_seen_on_gpu0": sorted(pids),
        "workload_samples_attributed": len(ours),
        "progress_messages": [m.model_dump(mode="json", exclude_none=True) for m in progress[-3:]],
        "progress_count": len(progress),
        "allocator_messages": [m.model_dump(mode="json", exclude_none=True) for m in allocator[-2:]],
        "allocator_count": len(allocator),
        "agent_peak_rss_mib": max(rss_mib, default=0.0),
        "agent_log_levels": log_levels,
        "agent_exit": agent_rc,
        "in_pod_cgroup": in_pod_cgroup,
    }


def _used_vs_smi(out: Path, used: list[tuple[float, int | None]]) -> list[float]:
    """Agent minus nvidia-smi used memory (MiB) for each nvidia-smi reading within 0.5 s of a sample."""
    differences = []
    for line in _lines(out / "smi.csv"):
        parts = line.split(",")
        with contextlib.suppress(ValueError, IndexError):
            at, smi_mib = float(parts[0]), float(parts[3].split()[0])
            near = [b for ts, b in used if b is not None and abs(ts - at) <= 0.5]
            if near:
                differences.append(round(near[0] / 2**20 - smi_mib, 1))
    return differences


def _workload_pid(out: Path) -> int | None:
    for line in _lines(out / "workload.log"):
        if line.startswith("pid "):
            return int(line.split()[1])
    return None


def _lines(path: Path) -> Iterator[str]:
    with contextlib.suppress(OSError):
        yield from path.read_text().splitlines()


if __name__ == "__main__":
    sys.exit(main())
