"""Stand-ins for the kubelet's PodResources API.

- :class:`StaticPodResources`: an in-process source with a settable mapping (tests, simulator).
- :class:`FakePodResourcesServer`: a real gRPC server on a unix socket serving ``List``,
  ``GetAllocatableResources`` and ``Get`` from a mapping, so the real client
  (:class:`producers.agent.podresources.KubeletPodResources`) runs end to end without a kubelet.
  Like the NVIDIA device plugin with time-slicing, a device held by several containers is
  handed out as replica ids ``<uuid>::<n>``. ``stop``/``start`` on the same path imitate a
  kubelet restart; ``failing`` makes every call answer that gRPC status. Like a real kubelet it
  also reports NUMA topology and CPU ids (fields the agent's client must skip).

Both serve DRA allocations too: a list of :class:`schemas.messages.DraAllocation` (what the agent
puts on the sample), given at construction (``dra=``) or with ``set_dra``. The server reports them
as the kubelet does, in each container's ``dynamic_resources``, one entry per claim with its
devices (``share_id`` where the allocation has one), beside the device-plugin devices of the same
pod and container.

This module and the tests are the only users of grpcio; the agent's own client speaks the wire
protocol without it (see :mod:`producers.agent.podresources`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from producers.agent import podresources_pb2 as pb
from producers.agent import podresources_pb2_grpc as pb_grpc
from producers.agent.podresources import PodResourcesAnswer, PodResourcesError, unix_target
from schemas.messages import DraAllocation, PodRef


class StaticPodResources:
    """A PodResources source whose answer the caller sets; ``failing`` makes the next calls raise.

    ``set`` gives the device-plugin assignments (device id -> pods), ``set_dra`` the DRA
    allocations; each replaces its own part of the answer only."""

    def __init__(self, mapping: dict[str, list[PodRef]] | None = None,
                 dra: list[DraAllocation] | None = None) -> None:
        self._mapping: dict[str, list[PodRef]] = dict(mapping or {})
        self._dra: list[DraAllocation] = list(dra or [])
        self.failing: str | None = None

    def set(self, mapping: dict[str, list[PodRef]]) -> None:
        self._mapping = {device: list(refs) for device, refs in mapping.items()}

    def set_dra(self, allocations: list[DraAllocation]) -> None:
        self._dra = list(allocations)

    def read(self) -> PodResourcesAnswer:
        if self.failing:
            raise PodResourcesError(self.failing)
        return PodResourcesAnswer({device: list(refs) for device, refs in self._mapping.items()}, list(self._dra))

    def assignments(self) -> dict[str, list[PodRef]]:
        return self.read().assignments

    def dra_allocations(self) -> list[DraAllocation]:
        return self.read().dra_allocations


def default_resource_name(device_id: str) -> str:
    return "nvidia.com/mig-1g.10gb" if device_id.startswith("MIG-") else "nvidia.com/gpu"


_NUMA0 = pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)])


class _Servicer(pb_grpc.PodResourcesListerServicer):
    def __init__(self, server: FakePodResourcesServer) -> None:
        self.server = server

    def _fail_if_asked(self, context: Any) -> None:
        if self.server.failing is not None:
            code, details = self.server.failing
            context.abort(getattr(grpc.StatusCode, code), details)

    def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        self.server.calls["List"] += 1
        self._fail_if_asked(context)
        return pb.ListPodResourcesResponse(pod_resources=self.server.pod_resources())

    def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: Any
    ) -> pb.AllocatableResourcesResponse:
        self.server.calls["GetAllocatableResources"] += 1
        self._fail_if_asked(context)
        by_resource: dict[str, list[str]] = {}
        for device in self.server.allocatable:
            by_resource.setdefault(self.server.resource_of(device), []).append(device)
        return pb.AllocatableResourcesResponse(
            devices=[pb.ContainerDevices(resource_name=name, device_ids=ids, topology=_NUMA0)
                     for name, ids in by_resource.items()],
            cpu_ids=[0, 1, 2, 3],
            memory=[pb.ContainerMemory(memory_type="memory", size=64 * 2**30, topology=_NUMA0)],
        )

    def Get(self, request: pb.GetPodResourcesRequest, context: Any) -> pb.GetPodResourcesResponse:
        self.server.calls["Get"] += 1
        for pod in self.server.pod_resources():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pb.GetPodResourcesResponse(pod_resources=pod)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        raise AssertionError("unreachable")


class FakePodResourcesServer:
    """A PodResources v1 gRPC server on a unix socket (use as a context manager)."""

    def __init__(
        self,
        socket_path: Path,
        mapping: dict[str, list[PodRef]] | None = None,
        allocatable: list[str] | None = None,
        resource_of: Callable[[str], str] = default_resource_name,
        dra: list[DraAllocation] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.resource_of = resource_of
        self._lock = threading.Lock()
        self._mapping: dict[str, list[PodRef]] = dict(mapping or {})
        self._dra: list[DraAllocation] = list(dra or [])
        self.allocatable = list(allocatable if allocatable is not None else self._mapping)
        self.calls = {"List": 0, "GetAllocatableResources": 0, "Get": 0}
        self.failing: tuple[str, str] | None = None
        """(gRPC status name, details) every call answers with, e.g. ``("UNAVAILABLE", "...")``."""
        self._server: grpc.Server | None = None

    def set(self, mapping: dict[str, list[PodRef]]) -> None:
        with self._lock:
            self._mapping = {device: list(refs) for device, refs in mapping.items()}

    def set_dra(self, allocations: list[DraAllocation]) -> None:
        with self._lock:
            self._dra = list(allocations)

    def pod_resources(self) -> list[pb.PodResources]:
        """The mapping and the DRA allocations as the kubelet reports them: per pod, per container,
        per resource name (``devices``) and per claim (``dynamic_resources``)."""
        with self._lock:
            mapping = {device: list(refs) for device, refs in self._mapping.items()}
            dra = list(self._dra)
        # (namespace, pod) -> container -> resource -> device ids
        pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        for device, refs in sorted(mapping.items()):
            for replica, ref in enumerate(refs):
                device_id = f"{device}::{replica}" if len(refs) > 1 else device
                containers = pods.setdefault((ref.namespace, ref.pod), {})
                resources = containers.setdefault(ref.container, {})
                resources.setdefault(self.resource_of(device), []).append(device_id)
        # (namespace, pod) -> container -> (claim namespace, claim name) -> devices
        claims: dict[tuple[str, str], dict[str, dict[tuple[str, str], list[pb.ClaimResource]]]] = {}
        for record in dra:
            pods.setdefault((record.namespace, record.pod), {}).setdefault(record.container, {})
            per_claim = claims.setdefault((record.namespace, record.pod), {}).setdefault(record.container, {})
            per_claim.setdefault((record.claim_namespace, record.claim_name), []).append(pb.ClaimResource(
                cdi_devices=[pb.CDIDevice(name=cdi) for cdi in record.cdi_ids], driver_name=record.driver,
                pool_name=record.pool, device_name=record.device, share_id=record.share_id))
        return [
            pb.PodResources(
                namespace=namespace,
                name=name,
                containers=[
                    pb.ContainerResources(
                        name=container,
                        devices=[
                            pb.ContainerDevices(resource_name=resource, device_ids=ids, topology=_NUMA0)
                            for resource, ids in resources.items()
                        ],
                        cpu_ids=[2, 3],
                        dynamic_resources=[
                            pb.DynamicResource(claim_namespace=claim_ns, claim_name=claim, claim_resources=devices)
                            for (claim_ns, claim), devices in claims.get((namespace, name), {}).get(container, {})
                            .items()
                        ],
                    )
                    for container, resources in containers.items()
                ],
            )
            for (namespace, name), containers in pods.items()
        ]

    def start(self) -> FakePodResourcesServer:
        if self._server is not None:
            return self
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            self.socket_path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="fake-kubelet"))
        pb_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        if server.add_insecure_port(unix_target(self.socket_path)) == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        if self.socket_path.exists():
            self.socket_path.unlink()

    def __enter__(self) -> FakePodResourcesServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
