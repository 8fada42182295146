"""The kubelet PodResources client against a real gRPC server on a unix socket: device -> pod
mapping, allocatable devices, a kubelet restart, and a missing socket."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.agent.cgroup import StaticProcessResolver
from producers.agent.fake_kubelet import FakePodResourcesServer
from producers.agent.fake_nvml import FakeGpu, FakeMigDevice, FakeNvml, FakeProcess
from producers.agent.podresources import KubeletPodResources, PodResourcesError
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
