"""``scripts/gpu_node_check.py``, the real-GPU check, run here over the fake NVML library.

Nothing here has a GPU, so the script's run can't pass: the fake library does not know the
workload's PID. What it must still do is run the agent, decode its output, measure the adapter,
and name exactly what failed; a script that only a GPU machine exercises would otherwise rot
between the rare runs on one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.agent.fakenvml import VARIANTS, build, gpu_uuid, standard_node
from tests.conftest import REPO_ROOT

VARIANT = VARIANTS["r580"]
CGROUP_MOUNTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))


def _environment(tmp_path: Path) -> dict[str, str]:
    """The fake NVML library of a standard node and an ``nvidia-smi`` that lists its first GPU."""
    config = standard_node(VARIANT).write(tmp_path / "node.conf")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # only its GPU list matters to the script; the rest is recorded
    smi.write_text(f'#!/bin/sh\ncase "$*" in *uuid*) echo {gpu_uuid(0)};; *) echo "no reading";; esac\n')
    smi.chmod(0o755)
    return {**os.environ, "LD_LIBRARY_PATH": str(build(VARIANT)), "FAKE_NVML_CONFIG": str(config),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _check(out: Path, seconds: float) -> list[str]:
    return [sys.executable, str(REPO_ROOT / "scripts" / "gpu_node_check.py"), "--out", str(out),
            "--seconds", str(seconds), "--interval", "1", "--metrics-port", "0"]


def _check_cgroups() -> set[Path]:
    """The pod cgroups' parents the check makes (``gpulens-check-<pid>.slice``), wherever they are."""
    return {path for mount in CGROUP_MOUNTS for path in mount.glob("gpulens-check-*.slice")}


def test_the_check_runs_the_agent_and_names_what_a_machine_without_a_gpu_fails(tmp_path: Path) -> None:
    variant = VARIANT
    out = tmp_path / "out"
    before = _check_cgroups()
    run = subprocess.run(_check(out, 3), env=_environment(tmp_path), capture_output=True, text=True, timeout=180)

    summary = json.loads((out / "summary.json").read_text())
    assert run.returncode == 1, run.stderr[-2000:]
    pid = summary["workload_pid"]
    expected = [f"the workload's pid {pid} in no sample of GPU 0"]
    if summary["in_pod_cgroup"]:
        expected.append("no process of GPU 0 attributed to the workload's pod uid")
    assert pid and summary["failures"] == expected
    assert summary["samples"] >= 3 and summary["driver_version"] == variant.driver
    assert summary["pids_seen_on_gpu0"] == [1101, 1102]
    assert all(g["assigned_to"] == ["ml/train-h200/trainer"] for g in summary["gpu0"])
    assert summary["gpu0"][0]["mem_used_gib"] == 10.0  # _v2: without the 616 MiB the driver keeps
    backend = summary["backend"]
    assert backend["calls_this_driver_lacks"] == [] and set(backend["ms_per_call"]) >= {"memory", "pcie_throughput"}
    assert _check_cgroups() - before == set(), "the pod's cgroups are removed after the run"
    if summary["in_pod_cgroup"]:  # root on a cgroup-v2 machine: the workload ran in a pod's cgroup
        assert summary["progress_count"] >= 1
        assert {m["pod_uid"] for m in summary["progress_messages"]} == {summary["progress_messages"][0]["pod_uid"]}


def test_a_check_stopped_midway_stops_its_processes_and_removes_its_cgroups(tmp_path: Path) -> None:
    """SIGTERM (a timeout, a stopped job) while the workload runs: the script ends at once, and neither
    its workload nor its pod's cgroups outlive it."""
    out = tmp_path / "out"
    before = _check_cgroups()
    check = subprocess.Popen(_check(out, 120), env=_environment(tmp_path), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "workload.log").exists() and time.monotonic() < deadline and check.poll() is None:
            time.sleep(0.2)
        assert (out / "workload.log").exists(), "the workload started"
        workloads = _workload_pids(check.pid)
        check.send_signal(signal.SIGTERM)
        assert check.wait(30) == 128 + signal.SIGTERM
    finally:
        if check.poll() is None:
            check.kill()
    assert _check_cgroups() - before == set(), "no cgroup of the stopped check is left"
    assert not any(Path(f"/proc/{pid}").exists() for pid in workloads), "its processes are stopped"


def _workload_pids(parent: int) -> list[int]:
    """The check's child processes (the agent, the workload), by their parent pid."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            if f"\nPPid:\t{parent}\n" in status.read_text():
                pids.append(int(status.parent.name))
    return pids
