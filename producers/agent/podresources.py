"""Which pod and container the kubelet assigned each GPU / MIG device to: the PodResources API.

The kubelet serves ``PodResourcesLister`` (gRPC, v1) on a unix socket,
``/var/lib/kubelet/pod-resources/kubelet.sock``. ``List`` returns every pod on the node with the
device ids each container received per extended resource; for the NVIDIA device plugin those are
GPU UUIDs (``GPU-...``), MIG device UUIDs (``MIG-...``), time-slicing replicas (``GPU-...::3``)
or, with ``deviceIDStrategy=index``, GPU indexes. This module returns them unchanged; the sampler
normalises them against what NVML reports.

This is the only module (with the fake server in ``fake_kubelet``) that imports grpc. The channel
is dropped after any failed call and rebuilt on the next, so a kubelet restart (a new socket) is
survived without restarting the agent. If the socket does not exist (PodResources disabled, or not
mounted) the client warns once and returns no assignments: the agent then attributes GPUs through
processes only.

Note: PodResources does not report pod UIDs, so :class:`schemas.messages.PodRef` from here carries
``pod_uid=None``; the sampler links processes (which carry a pod UID from their cgroup) to
assignments by elimination, and the stream jobs join by UID with the watcher's pod state.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import grpc

from common.logs import get_logger
from producers.agent import podresources_pb2 as pb
from producers.agent import podresources_pb2_grpc as pb_grpc
from schemas.messages import PodRef

log = get_logger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


class PodResourcesError(Exception):
    """The kubelet did not answer; the message says why (socket, status code, details)."""


class PodResourcesSource(Protocol):
    def assignments(self) -> dict[str, list[PodRef]]:
        """Device id (GPU UUID, MIG UUID, replica id or index) -> pods/containers holding it.

        Raises :class:`PodResourcesError` when the source exists but does not answer.
        """


def unix_target(socket_path: Path) -> str:
    return f"unix://{socket_path.absolute()}"


class KubeletPodResources:
    """gRPC v1 client of the kubelet PodResources API over its unix socket."""

    def __init__(
        self,
        socket_path: Path = DEFAULT_SOCKET,
        timeout_s: float = 5.0,
        resource_prefixes: Sequence[str] = ("nvidia.com/",),
    ) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.resource_prefixes = tuple(resource_prefixes)
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None
        self._lock = threading.Lock()
        self._warned_missing = False

    @property
    def available(self) -> bool:
        return self.socket_path.exists()

    def _connect(self) -> pb_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                unix_target(self.socket_path),
                options=[("grpc.max_receive_message_length", 16 * 1024 * 1024)],
            )
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def _socket_present(self) -> bool:
        if self.socket_path.exists():
            if self._warned_missing:
                log.info("kubelet pod-resources socket appeared", socket=str(self.socket_path))
                self._warned_missing = False
            return True
        if not self._warned_missing:
            log.warning(
                "kubelet pod-resources socket not found; attributing GPUs through processes only",
                socket=str(self.socket_path),
            )
            self._warned_missing = True
        self._drop()
        return False

    def _wanted(self, resource_name: str) -> bool:
        return resource_name.startswith(self.resource_prefixes)

    def list_pods(self) -> pb.ListPodResourcesResponse:
        """The raw ``List`` answer (raises :class:`PodResourcesError`)."""
        with self._lock:
            stub = self._connect()
            try:
                response: pb.ListPodResourcesResponse = stub.List(
                    pb.ListPodResourcesRequest(), timeout=self.timeout_s, wait_for_ready=False
                )
            except grpc.RpcError as exc:
                self._drop()  # rebuilt on the next call: survives a kubelet restart
                raise PodResourcesError(_describe("List", exc)) from None
            return response

    def assignments(self) -> dict[str, list[PodRef]]:
        if not self._socket_present():
            return {}
        response = self.list_pods()
        mapping: dict[str, list[PodRef]] = {}
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if not self._wanted(devices.resource_name):
                        continue
                    ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
                    for device_id in devices.device_ids:
                        refs = mapping.setdefault(device_id, [])
                        if ref not in refs:
                            refs.append(ref)
        return mapping

    def allocatable(self) -> dict[str, list[str]]:
        """Resource name -> device ids the kubelet can hand out (``GetAllocatableResources``)."""
        if not self._socket_present():
            return {}
        with self._lock:
            stub = self._connect()
            try:
                response = stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=self.timeout_s)
            except grpc.RpcError as exc:
                self._drop()
                raise PodResourcesError(_describe("GetAllocatableResources", exc)) from None
        result: dict[str, list[str]] = {}
        for devices in response.devices:
            if self._wanted(devices.resource_name):
                result.setdefault(devices.resource_name, []).extend(devices.device_ids)
        return result


def _describe(call: str, exc: grpc.RpcError) -> str:
    code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"kubelet PodResources {call} failed: {code}: {details}"
