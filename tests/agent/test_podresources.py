"""The kubelet PodResources client against a real gRPC server on a unix socket: device -> pod
mapping, allocatable devices, a kubelet restart, a missing socket; and, as the client speaks gRPC
over HTTP/2 itself, large answers, error statuses, a socket that is not a kubelet, the decoder."""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.agent import podresources_pb2 as pb
from producers.agent.cgroup import StaticProcessResolver
from producers.agent.fake_kubelet import FakePodResourcesServer
from producers.agent.fake_nvml import FakeGpu, FakeMigDevice, FakeNvml, FakeProcess
from producers.agent.podresources import (
    ContainerDevices,
    ContainerResources,
    KubeletPodResources,
    PodResources,
    PodResourcesError,
    decode_list_response,
)
from producers.agent.sampler import NodeSampler
from tests.agent.helpers import GIB, at, container, gpu_uuid, ref


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer
    path = Path(tempfile.mkdtemp(prefix="gl-kubelet-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


MAPPING = {
    gpu_uuid(0): [ref("train-0", "trainer", "ml")],
    gpu_uuid(1): [ref("train-0", "trainer", "ml")],
    gpu_uuid(2): [ref("alice-nb", "nb", "notebooks"), ref("bob-nb", "nb", "notebooks")],
    "MIG-1111": [ref("whisper-0", "asr", "inference")],
}


def test_list_maps_every_gpu_and_mig_device_to_its_pods_over_grpc(sockdir: Path) -> None:
    resources = {"MIG-1111": "nvidia.com/mig-3g.40gb"}
    with FakePodResourcesServer(sockdir / "kubelet.sock", MAPPING,
                                resource_of=lambda d: resources.get(d, "nvidia.com/gpu")) as server:
        client = KubeletPodResources(sockdir / "kubelet.sock")
        got = client.assignments()
        client.close()
    assert server.calls["List"] == 1
    assert got[gpu_uuid(0)] == [ref("train-0", "trainer", "ml")]
    assert got["MIG-1111"] == [ref("whisper-0", "asr", "inference")]
    # the shared GPU comes back as time-slicing replicas, one per container
    assert got[f"{gpu_uuid(2)}::0"] == [ref("alice-nb", "nb", "notebooks")]
    assert got[f"{gpu_uuid(2)}::1"] == [ref("bob-nb", "nb", "notebooks")]
    assert all(r.pod_uid is None for refs in got.values() for r in refs)  # the API has no pod UIDs


def test_non_gpu_resources_are_ignored_and_allocatable_lists_gpu_devices(sockdir: Path) -> None:
    mapping = {gpu_uuid(0): [ref("a")], "sriov-vf-3": [ref("b")]}
    with FakePodResourcesServer(sockdir / "k.sock", mapping, allocatable=[gpu_uuid(0), gpu_uuid(1), "sriov-vf-3"],
                                resource_of=lambda d: "intel.com/sriov" if d.startswith("sriov") else "nvidia.com/gpu"):
        client = KubeletPodResources(sockdir / "k.sock")
        assert set(client.assignments()) == {gpu_uuid(0)}
        assert client.allocatable() == {"nvidia.com/gpu": [gpu_uuid(0), gpu_uuid(1)]}
        client.close()


def test_the_client_survives_a_kubelet_restart(sockdir: Path) -> None:
    socket = sockdir / "kubelet.sock"
    server = FakePodResourcesServer(socket, {gpu_uuid(0): [ref("a")]}).start()
    client = KubeletPodResources(socket, timeout_s=2.0)
    try:
        assert client.assignments() == {gpu_uuid(0): [ref("a")]}
        server.stop()
        # the kubelet is restarting: the socket file exists again but nobody listens yet
        socket.touch()
        with pytest.raises(PodResourcesError, match="List failed"):
            client.assignments()
        socket.unlink()
        server = FakePodResourcesServer(socket, {gpu_uuid(0): [ref("b")]}).start()
        assert client.assignments() == {gpu_uuid(0): [ref("b")]}
    finally:
        client.close()
        server.stop()


def test_a_missing_socket_warns_once_and_attributes_nothing(sockdir: Path, caplog: pytest.LogCaptureFixture) -> None:
    client = KubeletPodResources(sockdir / "absent.sock")
    with caplog.at_level(logging.WARNING):
        assert client.assignments() == {}
        assert client.assignments() == {}
    warnings = [r for r in caplog.records if "pod-resources socket not found" in r.getMessage()]
    assert len(warnings) == 1


def test_sampler_over_the_real_client_attributes_gpus_and_processes(sockdir: Path) -> None:
    gpus = [
        FakeGpu(gpu_uuid(0), 0, processes=[FakeProcess(10, 20 * GIB, 90.0)]),
        FakeGpu(gpu_uuid(1), 1, processes=[FakeProcess(11, 20 * GIB, 85.0)]),
        FakeGpu(gpu_uuid(2), 2, processes=[FakeProcess(12, 2 * GIB, 30.0), FakeProcess(13, GIB, 1.0)]),
        FakeGpu(gpu_uuid(3), 3, mig_devices=[FakeMigDevice("MIG-1111", "3g.40gb", 1, 0, 40 * GIB, 5 * GIB,
                                                            [FakeProcess(14, 4 * GIB)])]),
    ]
    nvml = FakeNvml(gpus)
    nvml.init()
    pids = {10: container(1, 1), 11: container(1, 1), 12: container(2, 2), 13: container(3, 3),
            14: container(4, 4)}
    with FakePodResourcesServer(sockdir / "kubelet.sock", MAPPING):
        client = KubeletPodResources(sockdir / "kubelet.sock")
        sampler = NodeSampler("node-a", nvml, client, StaticProcessResolver(pids), "boot", 10.0)
        sample = sampler.sample(at(0))
        client.close()
    by = {g.uuid: g for g in sample.gpus}
    assert [r.pod for r in by[gpu_uuid(0)].assigned_to] == ["train-0"]
    assert by[gpu_uuid(0)].processes[0].pod_name == "train-0"
    assert by[gpu_uuid(2)].shared and sorted(r.pod for r in by[gpu_uuid(2)].assigned_to) == ["alice-nb", "bob-nb"]
    assert by["MIG-1111"].processes[0].pod_name == "whisper-0"
    assert by["MIG-1111"].processes[0].container_name == "asr"


# The client speaks gRPC over HTTP/2 itself (no grpcio in the agent): these pin the protocol edges.


def test_an_answer_larger_than_the_http2_windows_arrives_whole(sockdir: Path) -> None:
    # ~300 KiB: several DATA frames and WINDOW_UPDATEs beyond the 64 KiB initial windows
    mapping = {f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}": [ref(f"pod-{i}", "main", f"team-{i % 7}")]
               for i in range(3000)}
    with FakePodResourcesServer(sockdir / "kubelet.sock", mapping):
        client = KubeletPodResources(sockdir / "kubelet.sock")
        got = client.assignments()
    assert got == mapping


def test_a_grpc_error_status_reaches_the_caller_with_its_code_and_details(sockdir: Path) -> None:
    with FakePodResourcesServer(sockdir / "kubelet.sock", MAPPING) as server:
        server.failing = ("PERMISSION_DENIED", "pod-resources: accès refusé 100%")
        client = KubeletPodResources(sockdir / "kubelet.sock")
        with pytest.raises(PodResourcesError) as raised:
            client.assignments()
        assert str(raised.value) == (
            "kubelet PodResources List failed: PERMISSION_DENIED: pod-resources: accès refusé 100%")
        with pytest.raises(PodResourcesError, match="GetAllocatableResources failed: PERMISSION_DENIED"):
            client.allocatable()
        server.failing = None
        assert client.assignments()[gpu_uuid(0)] == [ref("train-0", "trainer", "ml")]


def _serve_raw(path: Path, answer: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A unix socket server that reads the request, then sends ``answer`` and closes (None: stays mute)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                if answer is None:
                    conn.recv(65536)  # until the client gives up and closes
                else:
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


@pytest.mark.parametrize(("answer", "expected"), [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
     "List failed: UNAVAILABLE: the kubelet closed the connection before answering"),
    (b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + bytes(8),  # an HTTP/2 GOAWAY, NO_ERROR
     "List failed: UNAVAILABLE: the kubelet closed the connection \\(HTTP/2 NO_ERROR\\)"),
    (b"", "List failed: UNAVAILABLE: the kubelet closed the connection before answering"),
    (None, "List failed: DEADLINE_EXCEEDED: no answer within 0.5s"),
])
def test_something_that_is_not_a_kubelet_on_the_socket_is_an_error_not_a_hang(
        sockdir: Path, answer: bytes | None, expected: str) -> None:
    listener, thread = _serve_raw(sockdir / "kubelet.sock", answer)
    try:
        with pytest.raises(PodResourcesError, match=expected):
            KubeletPodResources(sockdir / "kubelet.sock", timeout_s=0.5).assignments()
    finally:
        listener.close()
        thread.join(5)


def test_the_hand_decoder_reads_what_protobuf_encodes_and_skips_every_other_field() -> None:
    pods = [pb.PodResources(name="träin-0", namespace="ml", containers=[
        pb.ContainerResources(
            name="trainer",
            devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-a", "GPU-b::3"],
                                         topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=1)])),
                     pb.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb", device_ids=["MIG-c"])],
            cpu_ids=[0, 2**40], memory=[pb.ContainerMemory(memory_type="hugepages-1Gi", size=2**33)],
            dynamic_resources=[pb.DynamicResource(claim_name="c", claim_resources=[
                pb.ClaimResource(cdi_devices=[pb.CDIDevice(name="nvidia.com/gpu=0")], driver_name="gpu")])]),
        pb.ContainerResources(name="sidecar")])]
    raw = pb.ListPodResourcesResponse(pod_resources=pods).SerializeToString()
    assert decode_list_response(raw) == [PodResources("träin-0", "ml", [
        ContainerResources("trainer", [ContainerDevices("nvidia.com/gpu", ["GPU-a", "GPU-b::3"]),
                                       ContainerDevices("nvidia.com/mig-1g.10gb", ["MIG-c"])]),
        ContainerResources("sidecar")])]
    assert decode_list_response(b"") == []
    for cut in (1, 7, len(raw) // 2, len(raw) - 1):
        with pytest.raises(ValueError):
            decode_list_response(raw[:cut])
