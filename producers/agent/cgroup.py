"""Process -> container -> pod, from ``/proc/<pid>/cgroup``.

NVML reports GPU processes by host PID only. The kubelet puts every container in a cgroup whose
path names the pod UID and the container id, so reading the process's cgroup file answers "which
container, which pod" without asking any API. This needs the host PID namespace (the agent's
``/proc`` must show the GPU processes' PIDs as NVML reports them).

Path shapes handled (one line per hierarchy in cgroup v1, one ``0::`` line in v2):

- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/``
  then ``cri-containerd-<id>.scope`` (containerd), ``crio-<id>.scope`` (CRI-O), ``docker-<id>.scope``
  (Docker / cri-dockerd), ``libpod-<id>.scope`` (Podman);
- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>`` (containerd, Docker) or ``.../crio-<id>``;
- plain Docker outside Kubernetes: ``/docker/<id>`` or ``/system.slice/docker-<id>.scope``;
- a private cgroup namespace shows paths relative to the reader (``/../../kubepods-...``): the
  names are still there, so the same patterns match.

CRI-O's monitor (``crio-conmon-<id>.scope``) is not a container and is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

_HEX_ID = r"[0-9a-f]{64}"
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
"""A pod UID (systemd slices write its dashes as underscores) or a static pod's 32-hex config hash."""

_POD_SYSTEMD = re.compile(rf"kubepods(?:-[a-z]+)?-pod({_UID})\.slice")
_POD_CGROUPFS = re.compile(rf"(?:^|/)pod({_UID})(?:/|$)")
_SCOPE = re.compile(rf"(cri-containerd|crio|docker|libpod)-({_HEX_ID})\.scope")
_CGROUPFS_CONTAINER = re.compile(rf"/pod(?:{_UID})/(crio-)?({_HEX_ID})(?:/|$)")
_PLAIN_DOCKER = re.compile(rf"/docker/({_HEX_ID})(?:/|$)")

_RUNTIME_BY_PREFIX = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "libpod": "podman"}


@dataclass(frozen=True)
class ContainerRef:
    """The container a process runs in; ``container_id`` is the bare 64-hex id (no ``runtime://``)."""

    container_id: str
    pod_uid: str | None
    runtime: str
    """containerd, cri-o, docker, podman, or unknown (cgroupfs paths do not name the runtime)."""


class ProcessResolver(Protocol):
    def resolve(self, pid: int) -> ContainerRef | None:
        """The container of ``pid``; None for a host process or a PID that is gone."""


def _pod_uid(path: str) -> str | None:
    match = _POD_SYSTEMD.search(path) or _POD_CGROUPFS.search(path)
    if not match:
        return None
    return match.group(1).replace("_", "-")


def parse_cgroup_path(path: str) -> ContainerRef | None:
    """The container named by one cgroup path, or None."""
    scope = _SCOPE.search(path)
    if scope:
        return ContainerRef(scope.group(2), _pod_uid(path), _RUNTIME_BY_PREFIX[scope.group(1)])
    bare = _CGROUPFS_CONTAINER.search(path)
    if bare:
        runtime = "cri-o" if bare.group(1) else "unknown"
        return ContainerRef(bare.group(2), _pod_uid(path), runtime)
    docker = _PLAIN_DOCKER.search(path)
    if docker:
        return ContainerRef(docker.group(1), _pod_uid(path), "docker")
    return None


def parse_cgroup_file(text: str) -> ContainerRef | None:
    """The container named by a ``/proc/<pid>/cgroup`` file (v1, v2 or hybrid)."""
    best: ContainerRef | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ref = parse_cgroup_path(parts[2])
        if ref is None:
            continue
        if ref.pod_uid is not None:
            return ref
        best = best or ref
    return best


class ProcFsResolver:
    """Reads ``<proc_root>/<pid>/cgroup`` on every call (cheap, and never stale after PID reuse)."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def resolve(self, pid: int) -> ContainerRef | None:
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            return None
        except OSError:
            return None
        return parse_cgroup_file(text)


class StaticProcessResolver:
    """A fixed PID -> container map (tests, the fleet simulator)."""

    def __init__(self, mapping: dict[int, ContainerRef]) -> None:
        self.mapping = dict(mapping)

    def resolve(self, pid: int) -> ContainerRef | None:
        return self.mapping.get(pid)
