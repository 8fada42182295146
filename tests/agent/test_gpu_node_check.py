"""``scripts/gpu_node_check.py``, the real-GPU check, run here over the fake NVML library.

Nothing here has a GPU, so the script's run can't pass: the fake library does not know the
workload's PID. What it must still do is run the agent, decode its output, measure the adapter,
and name exactly what failed; a script that only a GPU machine exercises would otherwise rot
between the rare runs on one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.agent.fakenvml import VARIANTS, build, gpu_uuid, standard_node
from tests.conftest import REPO_ROOT


def test_the_check_runs_the_agent_and_names_what_a_machine_without_a_gpu_fails(tmp_path: Path) -> None:
    variant = VARIANTS["r580"]
    config = standard_node(variant).write(tmp_path / "node.conf")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # only its GPU list matters to the script; the rest is recorded
    smi.write_text(f'#!/bin/sh\ncase "$*" in *uuid*) echo {gpu_uuid(0)};; *) echo "no reading";; esac\n')
    smi.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "LD_LIBRARY_PATH": str(build(variant)), "FAKE_NVML_CONFIG": str(config),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gpu_node_check.py"), "--out", str(out),
                          "--seconds", "3", "--interval", "1", "--metrics-port", "0"],
                         env=env, capture_output=True, text=True, timeout=180)

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
    mounts = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))
    leftovers = [path for mount in mounts for path in mount.glob("gpulens-check-*.slice")]
    assert leftovers == [], "the pod's cgroups are removed after the run"
    if summary["in_pod_cgroup"]:  # root on a cgroup-v2 machine: the workload ran in a pod's cgroup
        assert summary["progress_count"] >= 1
        assert {m["pod_uid"] for m in summary["progress_messages"]} == {summary["progress_messages"][0]["pod_uid"]}
