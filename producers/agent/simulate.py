"""A small, realistic simulated GPU node for ``gpulens agent --simulate`` and the benchmark.

Eight H100s on one node:

- GPUs 0-3: one 4-GPU fine-tuning pod (``training/llm-finetune-0``), busy;
- GPU 4: an inference server (``serving/embedder-6d9f7``), moderately busy;
- GPU 5: time-sliced between two notebook pods (``notebooks/alice-nb``, ``notebooks/bob-nb``);
- GPU 6: a pod that holds VRAM and does nothing (``research/idle-jupyter``);
- GPU 7: MIG-partitioned (3g.40gb + 2g.20gb + 2x 1g.10gb), two slices assigned.

The same code paths as on a real node run over it: the fake NVML behind the NVML interface, a
real gRPC PodResources server on a temporary unix socket read by the real kubelet client, and a
temporary ``/proc`` tree of cgroup files read by the real cgroup resolver (containerd and CRI-O
naming, systemd and cgroupfs drivers). :meth:`SimulatedNode.advance` moves utilisation, power
and NVLink counters along a deterministic function of time so a running agent looks alive.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType

from producers.agent.cgroup import ProcFsResolver
from producers.agent.fake_kubelet import FakePodResourcesServer
from producers.agent.fake_nvml import FakeGpu, FakeMigDevice, FakeNvml, FakeProcess
from producers.agent.podresources import KubeletPodResources
from schemas.messages import PodRef

GIB = 2**30


def _stable_uuid(kind: str, node: str, n: int) -> str:
    seed = 2166136261
    for ch in f"{kind}/{node}/{n}":
        seed = ((seed ^ ord(ch)) * 16777619) % (1 << 32)
    body = "".join(f"{(seed * (i + 1) * 2654435761) % (1 << 32):08x}" for i in range(4))
    return f"{kind}-{body[:8]}-{body[8:12]}-{body[12:16]}-{body[16:20]}-{body[20:32]}"


@dataclass(frozen=True)
class HostContainer:
    namespace: str
    name: str
    container: str
    uid: str
    container_id: str
    cgroup: str
    """The process's /proc/<pid>/cgroup content."""


def _pod(namespace: str, name: str, container: str, n: int, style: str) -> HostContainer:
    uid = f"{n:08x}-5a1e-4c0d-9e2f-{n * 7919:012x}"
    cid = f"{n:02x}" * 32
    slice_uid = uid.replace("-", "_")
    if style == "crio-systemd":
        path = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/crio-{cid}.scope"
        text = f"0::{path}\n"
    elif style == "containerd-cgroupfs-v1":
        path = f"/kubepods/besteffort/pod{uid}/{cid}"
        text = f"12:memory:{path}\n11:cpu,cpuacct:{path}\n1:name=systemd:{path}\n0::/\n"
    else:  # containerd, systemd driver, cgroup v2
        path = f"/kubepods.slice/kubepods-pod{slice_uid}.slice/cri-containerd-{cid}.scope"
        text = f"0::{path}\n"
    return HostContainer(namespace, name, container, uid, cid, text)


@dataclass
class SimulatedNode:
    node_name: str
    nvml: FakeNvml
    server: FakePodResourcesServer
    pod_resources: KubeletPodResources
    resolver: ProcFsResolver
    workdir: Path
    pods: dict[str, HostContainer] = field(default_factory=dict)
    _last_ts: datetime | None = None
    _owns_workdir: bool = True

    def advance(self, ts: datetime) -> None:
        """Move the node's readings to time ``ts`` (deterministic in ``ts``)."""
        t = ts.timestamp()
        dt = 0.0 if self._last_ts is None else max(0.0, t - self._last_ts.timestamp())
        self._last_ts = ts
        for gpu in self.nvml.gpus:
            phase = gpu.index * 0.7
            if gpu.index <= 3:  # training: high, with a periodic dip (checkpointing)
                util = 93 + 5 * math.sin(t / 17 + phase) - (60 if int(t / 60 + gpu.index) % 10 == 0 else 0)
            elif gpu.index == 4:
                util = 35 + 20 * math.sin(t / 45 + phase)
            elif gpu.index == 5:
                util = 30 + 15 * math.sin(t / 23)
            elif gpu.index == 6:
                util = 0.0
            else:
                util = 0.0  # MIG: not reported
            util = min(100.0, max(0.0, util))
            gpu.gpu_util_pct = round(util, 1)
            gpu.mem_util_pct = round(util * 0.55, 1)
            gpu.power_w = round(72 + 6.2 * util, 1)
            gpu.temperature_c = round(34 + 0.42 * util, 1)
            if gpu.index <= 3:
                rate = 180e9 * util / 100  # bytes/s over NVLink during all-reduce
                gpu.nvlink_tx_bytes_total += int(rate * dt)
                gpu.nvlink_rx_bytes_total += int(rate * dt)
                for proc in gpu.processes:
                    proc.sm_util_pct = round(util * 0.97, 1)
            elif gpu.index == 4:
                for proc in gpu.processes:
                    proc.sm_util_pct = round(util * 0.9, 1)
            elif gpu.index == 5 and len(gpu.processes) == 2:
                gpu.processes[0].sm_util_pct = round(util * 0.8, 1)
                gpu.processes[1].sm_util_pct = round(util * 0.2, 1)

    def close(self) -> None:
        self.pod_resources.close()
        self.server.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SimulatedNode:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def build_simulated_node(node_name: str = "sim-node-0", workdir: Path | None = None) -> SimulatedNode:
    """Build and start the simulated node (close it, or use it as a context manager)."""
    owns = workdir is None
    # unix socket paths are limited to ~107 bytes: keep the directory short
    root = Path(tempfile.mkdtemp(prefix="gpulens-sim-", dir="/tmp")) if workdir is None else workdir
    pods = {
        "train": _pod("training", "llm-finetune-0", "trainer", 1, "containerd-systemd-v2"),
        "embed": _pod("serving", "embedder-6d9f7", "server", 2, "crio-systemd"),
        "alice": _pod("notebooks", "alice-nb", "notebook", 3, "containerd-systemd-v2"),
        "bob": _pod("notebooks", "bob-nb", "notebook", 4, "containerd-systemd-v2"),
        "idle": _pod("research", "idle-jupyter", "jupyter", 5, "containerd-cgroupfs-v1"),
        "asr": _pod("inference", "whisper-0", "asr", 6, "containerd-systemd-v2"),
        "ocr": _pod("inference", "ocr-1", "ocr", 7, "crio-systemd"),
    }
    gpus = [FakeGpu(uuid=_stable_uuid("GPU", node_name, i), index=i) for i in range(8)]
    pid_of: dict[int, HostContainer] = {}

    def run(gpu_or_mig: FakeGpu | FakeMigDevice, pod: HostContainer, pid: int, mem_gib: float) -> None:
        gpu_or_mig.processes.append(FakeProcess(pid=pid, used_gpu_memory_bytes=int(mem_gib * GIB)))
        gpu_or_mig.mem_used_bytes += int(mem_gib * GIB) + 512 * 2**20  # + driver/context overhead
        pid_of[pid] = pod

    for i in range(4):
        run(gpus[i], pods["train"], 41001 + i, 61.5)
    run(gpus[4], pods["embed"], 52001, 21.0)
    run(gpus[5], pods["alice"], 63001, 9.0)
    run(gpus[5], pods["bob"], 64001, 3.5)
    run(gpus[6], pods["idle"], 71001, 30.0)
    gpus[7].mig_devices = [
        FakeMigDevice(_stable_uuid("MIG", node_name, 1), "3g.40gb", 1, 0, 40 * GIB - 512 * 2**20),
        FakeMigDevice(_stable_uuid("MIG", node_name, 2), "2g.20gb", 5, 0, 20 * GIB - 256 * 2**20),
        FakeMigDevice(_stable_uuid("MIG", node_name, 3), "1g.10gb", 13, 0, 10 * GIB - 128 * 2**20),
        FakeMigDevice(_stable_uuid("MIG", node_name, 4), "1g.10gb", 14, 0, 10 * GIB - 128 * 2**20),
    ]
    run(gpus[7].mig_devices[0], pods["asr"], 81001, 17.0)
    run(gpus[7].mig_devices[1], pods["ocr"], 82001, 5.5)
    for mig in gpus[7].mig_devices:
        mig.mem_used_bytes = min(mig.mem_used_bytes, mig.mem_total_bytes)

    def ref(key: str) -> PodRef:
        p = pods[key]
        return PodRef(namespace=p.namespace, pod=p.name, container=p.container)

    mapping = {gpus[i].uuid: [ref("train")] for i in range(4)}
    mapping[gpus[4].uuid] = [ref("embed")]
    mapping[gpus[5].uuid] = [ref("alice"), ref("bob")]
    mapping[gpus[6].uuid] = [ref("idle")]
    mapping[gpus[7].mig_devices[0].uuid] = [ref("asr")]
    mapping[gpus[7].mig_devices[1].uuid] = [ref("ocr")]

    proc_root = root / "proc"
    for pid, pod in pid_of.items():
        (proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc_root / str(pid) / "cgroup").write_text(pod.cgroup)

    allocatable = [g.uuid for g in gpus[:7]] + [m.uuid for m in gpus[7].mig_devices]
    migs = {m.uuid: f"nvidia.com/mig-{m.profile}" for m in gpus[7].mig_devices}
    server = FakePodResourcesServer(
        root / "kubelet.sock", mapping, allocatable, resource_of=lambda d: migs.get(d, "nvidia.com/gpu")
    ).start()
    node = SimulatedNode(
        node_name=node_name,
        nvml=FakeNvml(gpus),
        server=server,
        pod_resources=KubeletPodResources(root / "kubelet.sock"),
        resolver=ProcFsResolver(proc_root),
        workdir=root,
        pods=pods,
        _owns_workdir=owns,
    )
    return node
