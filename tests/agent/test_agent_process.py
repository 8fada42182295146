"""The command the DaemonSet runs (``python -m producers.agent``) on every driver generation.

A real agent process loads the fake ``libnvidia-ml.so.1`` the way it finds the driver's on a node
(``LD_LIBRARY_PATH``), asks a fake kubelet (the real PodResources gRPC API on a unix socket) which
pod holds which device, and reads ``/proc/<pid>/cgroup`` files from a temporary proc root. Each
sample it prints must validate against the committed JSON Schema and name the right pods.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from producers.agent.fake_kubelet import FakePodResourcesServer
from schemas.codec import decode
from schemas.messages import GpuSample, PodRef
from tests.agent.fakenvml import VARIANTS, Gpu, Node, Process, Xid, gpu_uuid, standard_node
from tests.conftest import REPO_ROOT

SCHEMA = json.loads((REPO_ROOT / "schemas" / "json" / "gpu.samples.v1.schema.json").read_text())


def _n(device: str) -> int:
    return int(hashlib.sha256(device.encode()).hexdigest()[:8], 16)


def pod_uid(device: str) -> str:
    """One pod per device (GPU or MIG device): its processes all run in that pod."""
    return f"{_n(device):08x}-0000-4000-8000-{_n(device):012x}"


def container_id(device: str) -> str:
    return f"{_n(device):016x}" * 4


def pod_name(device: str) -> str:
    return f"job-{_n(device):x}"


def write_proc(root: Path, node: Node) -> None:
    """containerd with the systemd cgroup driver (cgroup v2)."""
    for p in node.processes:
        (root / str(p.pid)).mkdir(parents=True)
        slice_uid = pod_uid(p.device).replace("-", "_")
        (root / str(p.pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-pod{slice_uid}.slice/cri-containerd-{container_id(p.device)}.scope\n")


def assignments(node: Node) -> dict[str, list[PodRef]]:
    return {p.device: [PodRef(namespace="ml", pod=pod_name(p.device), container="main")] for p in node.processes}


def agent_samples(node: Node, tmp_path: Path, count: int) -> Iterator[GpuSample]:
    """Run the DaemonSet's command at a 1 s interval and yield its first ``count`` samples."""
    proc_root = tmp_path / "proc"
    write_proc(proc_root, node)
    socket = tmp_path / "kubelet" / "kubelet.sock"
    with FakePodResourcesServer(socket, assignments(node)):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_") and k != "NODE_NAME"}
        env |= node.environment(tmp_path / "node.conf") | {
            "GPULENS_KUBELET_SOCKET": str(socket),
            "GPULENS_PROC_ROOT": str(proc_root),
            "GPULENS_LOG_FORMAT": "text",
            "GPULENS_PROGRESS_SOCKET": "",
            "GPULENS_CLUSTER": "gpu-farm",
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "producers.agent", "--stdout", "--interval", "1", "--node-name", "gpu-node-1"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            for _ in range(count):
                line = process.stdout.readline()
                if not line:
                    process.wait(10)
                    stderr = process.stderr.read() if process.stderr else ""
                    pytest.fail(f"agent exited ({process.returncode}): {stderr}")
                jsonschema.validate(json.loads(line), SCHEMA)
                yield decode(line, GpuSample)
        finally:
            process.terminate()
            process.wait(30)
    assert process.returncode in (0, -15), process.stderr.read() if process.stderr else ""


@pytest.mark.parametrize("name", VARIANTS)
def test_the_daemonset_command_samples_every_driver_generation_with_pods_attributed(
    tmp_path: Path, name: str
) -> None:
    variant = VARIANTS[name]
    node = standard_node(variant)
    samples = list(agent_samples(node, tmp_path, 3))
    assert [s.seq for s in samples] == [0, 1, 2]
    for sample in samples:
        assert sample.node == "gpu-node-1" and sample.driver_version == variant.driver and sample.errors == []
        devices = {g.uuid: g for g in sample.gpus}
        assert set(devices) == {g.uuid for g in node.gpus} | {m.uuid for m in node.migs}
        assert all(g.health == "ok" for g in sample.gpus)
        for expected in node.processes:
            device = devices[expected.device]
            (proc,) = [p for p in device.processes if p.pid == expected.pid]
            assert proc.mem_used_bytes == expected.mem
            assert (proc.pod_uid, proc.container_id) == (pod_uid(expected.device), container_id(expected.device))
            assert (proc.pod_namespace, proc.pod_name, proc.container_name) == ("ml", pod_name(expected.device), "main")
            assert [r.pod for r in device.assigned_to] == [pod_name(expected.device)]


def test_the_daemonset_command_reports_a_gpu_lost_mid_run_with_xid_79(tmp_path: Path) -> None:
    node = Node(VARIANTS["r550"], [Gpu(gpu_uuid(0), lost_after=3), Gpu(gpu_uuid(1), unsupported=("power",))],
                processes=[Process(501, gpu_uuid(0), 2**30), Process(502, gpu_uuid(1), 2**31)],
                xids=[Xid(79, gpu_uuid(0), after=4)])
    samples = list(agent_samples(node, tmp_path, 5))
    health = [[g.health for g in s.gpus] for s in samples]
    assert health[:2] == [["ok", "ok"], ["ok", "ok"]]
    assert all(h == ["lost", "ok"] for h in health[2:]), health
    assert all(s.gpus[0].uuid == gpu_uuid(0) for s in samples)
    xids = [(s.seq, x.xid, x.critical) for s in samples for x in s.gpus[0].xids]
    assert [(x, c) for _, x, c in xids] == [(79, True)]
    assert xids[0][0] >= 2
    for sample in samples:
        gpu1 = sample.gpus[1]
        assert gpu1.power_w is None and gpu1.mem_used_bytes is not None
        assert [p.pod_name for p in gpu1.processes] == [pod_name(gpu_uuid(1))]


PROBE = """
import contextlib, io, json, sys
from producers.agent.main import main
out = io.TextIOWrapper(io.BytesIO())
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
out.flush()
print(json.dumps({"code": code, "sample": out.buffer.getvalue().decode(), "loaded": sorted(sys.modules)}))
"""


def test_the_daemonset_command_asks_the_kubelet_without_grpcio_or_protobuf(tmp_path: Path) -> None:
    # grpcio and protobuf's runtime cost the agent ~13 MiB of its 64 MiB (benchmarks/bench_agent.py):
    # the PodResources call must work, pods attributed, without either being loaded
    node = standard_node(VARIANTS["r550"])
    write_proc(tmp_path / "proc", node)
    socket = tmp_path / "kubelet" / "kubelet.sock"
    with FakePodResourcesServer(socket, assignments(node)) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_") and k != "NODE_NAME"}
        env |= node.environment(tmp_path / "node.conf") | {
            "GPULENS_KUBELET_SOCKET": str(socket), "GPULENS_PROC_ROOT": str(tmp_path / "proc"),
            "GPULENS_CLUSTER": "gpu-farm"}
        result = subprocess.run([sys.executable, "-c", PROBE, "--once", "--stdout", "--node-name", "n1"],
                                cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["code"] == 0 and server.calls["List"] == 1
    sample = decode(probe["sample"].strip(), GpuSample)
    assert sample.cluster == "gpu-farm"
    assert {p.pod_name for g in sample.gpus for p in g.processes} == {pod_name(p.device) for p in node.processes}
    loaded = {m.split(".")[0] for m in probe["loaded"]}
    assert "h2" in loaded
    assert not loaded & {"grpc", "google"}, sorted(loaded & {"grpc", "google"})
