"""Process -> container -> pod from /proc/<pid>/cgroup, for the runtimes, cgroup versions and
drivers found on Kubernetes GPU nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.agent.cgroup import ContainerRef, ProcFsResolver, parse_cgroup_file

CID = "3f6e1c2a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
UID = "8a7b6c5d-1234-4e5f-9a8b-0c1d2e3f4a5b"
SUID = UID.replace("-", "_")

CASES = {
    "containerd / systemd / cgroup v2": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/cri-containerd-{CID}.scope\n",
        ContainerRef(CID, UID, "containerd"),
    ),
    "containerd / systemd / guaranteed QoS": (
        f"0::/kubepods.slice/kubepods-pod{SUID}.slice/cri-containerd-{CID}.scope\n",
        ContainerRef(CID, UID, "containerd"),
    ),
    "cri-o / systemd / cgroup v2": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/crio-{CID}.scope\n",
        ContainerRef(CID, UID, "cri-o"),
    ),
    "docker (cri-dockerd) / systemd / cgroup v1": (
        "12:memory:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{SUID}.slice/docker-{CID}.scope\n"
        "1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{SUID}.slice/docker-{CID}.scope\n",
        ContainerRef(CID, UID, "docker"),
    ),
    "containerd / cgroupfs / cgroup v1": (
        f"11:cpuset:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"10:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        "0::/\n",
        ContainerRef(CID, UID, "unknown"),
    ),
    "containerd / cgroupfs / cgroup v2 / guaranteed": (
        f"0::/kubepods/pod{UID}/{CID}\n",
        ContainerRef(CID, UID, "unknown"),
    ),
    "cri-o / cgroupfs / cgroup v1": (
        f"4:devices:/kubepods/burstable/pod{UID}/crio-{CID}\n",
        ContainerRef(CID, UID, "cri-o"),
    ),
    "private cgroup namespace (relative path)": (
        f"0::/../../kubepods-besteffort-pod{SUID}.slice/cri-containerd-{CID}.scope\n",
        ContainerRef(CID, UID, "containerd"),
    ),
    "nested cgroup inside the container": (
        f"0::/kubepods.slice/kubepods-pod{SUID}.slice/cri-containerd-{CID}.scope/init.scope\n",
        ContainerRef(CID, UID, "containerd"),
    ),
    "plain docker outside kubernetes": (
        f"0::/system.slice/docker-{CID}.scope\n",
        ContainerRef(CID, None, "docker"),
    ),
    "plain docker / cgroupfs v1": (
        f"9:memory:/docker/{CID}\n",
        ContainerRef(CID, None, "docker"),
    ),
    "static pod (config hash as uid)": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0123456789abcdef0123456789abcdef.slice/"
        f"cri-containerd-{CID}.scope\n",
        ContainerRef(CID, "0123456789abcdef0123456789abcdef", "containerd"),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_cgroup_paths_name_the_container_and_pod(name: str) -> None:
    text, expected = CASES[name]
    assert parse_cgroup_file(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",  # a host process
        "0::/system.slice/nvidia-persistenced.service\n",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/crio-conmon-{CID}.scope\n",
        "0::/\n",
        "",
    ],
)
def test_host_processes_and_runtime_monitors_are_not_containers(text: str) -> None:
    assert parse_cgroup_file(text) is None


def test_procfs_resolver_reads_the_pid_cgroup_file(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(CASES["containerd / systemd / cgroup v2"][0])
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text("0::/init.scope\n")
    resolver = ProcFsResolver(tmp_path)
    assert resolver.resolve(4242) == ContainerRef(CID, UID, "containerd")
    assert resolver.resolve(7) is None
    assert resolver.resolve(99999) is None  # the process exited between NVML and /proc

