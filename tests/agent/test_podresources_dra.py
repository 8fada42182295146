"""DRA allocations through the agent's PodResources client, against two servers: a grpc-go server
built from k8s.io/kubelet's own podresources/v1 package (scripts/podresources-server: the encoding
a real kubelet sends) and the grpcio fake (producers/agent/fake_kubelet.py). Device-plugin and
DRA devices of one container, shared claims, consumable capacity (share_id), non-GPU drivers,
bounds (long names, too many CDI ids, too many devices), a 3,000-pod node; and the server's build
script (scripts/podresources-build.sh): cached, rebuilt when its sources change, a clear failure
without Go."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict

from common.errors import RetriableError
from producers.agent import podresources_pb2 as pb
from producers.agent.cgroup import StaticProcessResolver
from producers.agent.fake_kubelet import FakePodResourcesServer, StaticPodResources
from producers.agent.fake_nvml import FakeGpu, FakeNvml
from producers.agent.podresources import (
    DRA_DECODE_LIMIT,
    SERVICE,
    ClaimDevice,
    DynamicResource,
    KubeletPodResources,
    PodResourcesAnswer,
    decode_list,
    dra_allocations,
    gpu_driver_filter,
    grpc_unary_call,
)
from producers.agent.sampler import NodeSampler
from schemas.messages import MAX_CDI_IDS, MAX_DRA_ALLOCATIONS, DraAllocation, GpuSample, PodRef
from tests.agent.helpers import at, gpu_uuid, ref
from tests.conftest import REPO_ROOT

DRIVER = "gpu.nvidia.com"


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer
    path = Path(tempfile.mkdtemp(prefix="gl-dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def alloc(pod: str, device: str, claim: str, *, container: str = "main", namespace: str = "ml",
          driver: str = DRIVER, pool: str = "node-a", share_id: str | None = None,
          claim_namespace: str | None = None) -> DraAllocation:
    return DraAllocation(driver=driver, pool=pool, device=device, namespace=namespace, pod=pod, container=container,
                         claim_namespace=claim_namespace or namespace, claim_name=claim,
                         cdi_ids=[f"k8s.{driver}/claim={claim}-{device}", f"k8s.{driver}/device={device}"],
                         share_id=share_id)


# a node as a 1.37 kubelet reports it: device-plugin GPUs, DRA GPUs and MIG devices, a claim two pods
# share, one device two claims share through consumable capacity, and a NIC of another DRA driver
MIXED_MAPPING = {gpu_uuid(0): [ref("legacy-0", "trainer", "ml")], gpu_uuid(1): [ref("mixed-0", "main", "ml")]}
MIXED_DRA = [
    alloc("dra-0", "gpu-2", "dra-0-gpu-abcde", container="trainer"),
    alloc("dra-0", "gpu-3", "dra-0-gpu-abcde", container="trainer"),
    alloc("mixed-0", "gpu-4", "mixed-0-gpu-x1y2z"),  # beside its device-plugin GPU, in the same container
    alloc("mig-0", "gpu-5-mig-1g10gb-0", "mig-0-mig-k8s7d", namespace="inference"),
    alloc("shared-a", "gpu-6", "shared-gpu", namespace="research"),  # one claim, two pods
    alloc("shared-b", "gpu-6", "shared-gpu", namespace="research"),
    alloc("share-a", "gpu-7", "share-a-claim", namespace="serve", share_id="4b1c5e1a-0001"),
    alloc("share-b", "gpu-7", "share-b-claim", namespace="serve", share_id="4b1c5e1a-0002"),
    alloc("two-c", "gpu-8", "two-c-claim", container="left"),  # one claim, two containers of a pod
    alloc("two-c", "gpu-8", "two-c-claim", container="right"),
    alloc("dra-0", "nic-0", "dra-0-net", container="trainer", driver="sriov.net.example.com"),
]
EXPECTED_DRA = sorted((a for a in MIXED_DRA if a.driver == DRIVER),
                      key=lambda a: (a.namespace, a.pod, a.container, a.claim_namespace, a.claim_name, a.device))


def kubelet_list(mapping: dict[str, list[PodRef]] | None = None, dra: list[DraAllocation] | None = None,
                 socket_path: Path = Path("/unused")) -> list[pb.PodResources]:
    """The pods the grpcio fake serves for ``mapping`` and ``dra``, with what else a real kubelet
    sends: pod-level exclusive CPUs and memory (Kubernetes 1.37), NUMA topology."""
    fake = FakePodResourcesServer(socket_path, mapping or {}, dra=dra)  # never started: its encoding only
    pods = fake.pod_resources()
    for pod in pods:
        pod.cpu_ids.extend([4, 5])
        pod.memory.add(memory_type="hugepages-2Mi", size=2**31).topology.nodes.add(ID=1)
    return pods


@contextmanager
def grpc_go_kubelet(binary: Path, sockdir: Path, pods: list[pb.PodResources],
                    allocatable: pb.AllocatableResourcesResponse | None = None) -> Iterator[Path]:
    """The grpc-go PodResources server serving ``pods``; yields its socket."""
    write_pods_file(sockdir / "pods.json", pods, allocatable)
    socket_path = sockdir / "kubelet.sock"
    process = subprocess.Popen([str(binary), "--socket", str(socket_path), "--pods", str(sockdir / "pods.json")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening "), f"podresources-server did not start: {line!r} {process.stderr}"
        yield socket_path
    finally:
        process.terminate()
        process.wait(10)


def write_pods_file(path: Path, pods: list[pb.PodResources],
                    allocatable: pb.AllocatableResourcesResponse | None = None) -> None:
    doc = {"list": MessageToDict(pb.ListPodResourcesResponse(pod_resources=pods)),
           "allocatable": MessageToDict(allocatable or pb.AllocatableResourcesResponse())}
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(doc))
    os.replace(staged, path)  # the server reads the file again when it changes


def read_from_fake(sockdir: Path, mapping: dict[str, list[PodRef]], dra: list[DraAllocation]
                   ) -> PodResourcesAnswer:
    with FakePodResourcesServer(sockdir / "fake.sock", mapping, dra=dra):
        return KubeletPodResources(sockdir / "fake.sock").read()


# ------------------------------------------------------------------ decoding through both servers


def test_dra_allocations_decode_alike_through_grpc_go_and_the_grpcio_fake(
        podresources_server_binary: Path, sockdir: Path) -> None:
    with grpc_go_kubelet(podresources_server_binary, sockdir, kubelet_list(MIXED_MAPPING, MIXED_DRA)) as socket_path:
        real = KubeletPodResources(socket_path).read()
    fake = read_from_fake(sockdir, MIXED_MAPPING, MIXED_DRA)
    assert real == fake
    assert real.problems == []
    # the device-plugin GPUs keep their pods; the DRA ones come as (driver, pool, device) + claim
    assert real.assignments == {gpu_uuid(0): [ref("legacy-0", "trainer", "ml")],
                                gpu_uuid(1): [ref("mixed-0", "main", "ml")]}
    assert real.dra_allocations == EXPECTED_DRA
    by_device = {a.device: a for a in real.dra_allocations if a.device != "gpu-6" and a.device != "gpu-7"}
    assert (by_device["gpu-4"].pod, by_device["gpu-4"].container) == ("mixed-0", "main")
    assert by_device["gpu-5-mig-1g10gb-0"].claim_namespace == "inference"
    assert by_device["gpu-2"].cdi_ids == [f"k8s.{DRIVER}/claim=dra-0-gpu-abcde-gpu-2", f"k8s.{DRIVER}/device=gpu-2"]
    # one claim, two pods: both pods hold the same device (the node stage makes it a shared GPU)
    assert {(a.pod, a.device) for a in real.dra_allocations if a.claim_name == "shared-gpu"} == {
        ("shared-a", "gpu-6"), ("shared-b", "gpu-6")}
    # consumable capacity: two claims share gpu-7, each with its own share_id
    assert {(a.pod, a.share_id) for a in real.dra_allocations if a.device == "gpu-7"} == {
        ("share-a", "4b1c5e1a-0001"), ("share-b", "4b1c5e1a-0002")}
    # only GPU drivers (the domain of nvidia.com/): the NIC's driver is left out
    assert all(a.driver == DRIVER for a in real.dra_allocations)


def test_the_grpc_go_server_answers_allocatable_and_a_changed_list(
        podresources_server_binary: Path, sockdir: Path) -> None:
    allocatable = pb.AllocatableResourcesResponse(
        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[gpu_uuid(0), gpu_uuid(1)]),
                 pb.ContainerDevices(resource_name="example.com/fpga", device_ids=["fpga-0"])],
        cpu_ids=[0, 1, 2, 3])
    first = [alloc("dra-0", "gpu-2", "dra-0-gpu")]
    with grpc_go_kubelet(podresources_server_binary, sockdir, kubelet_list({}, first), allocatable) as socket_path:
        client = KubeletPodResources(socket_path)
        assert client.allocatable() == {"nvidia.com/gpu": [gpu_uuid(0), gpu_uuid(1)]}
        assert client.read().dra_allocations == first
        # the pod ends, another gets the device: the kubelet's next answer says so
        second = [alloc("dra-1", "gpu-2", "dra-1-gpu", container="worker")]
        time.sleep(0.01)  # a new modification time even on coarse clocks
        write_pods_file(sockdir / "pods.json", kubelet_list({}, second), allocatable)
        assert client.read().dra_allocations == second
        # Get, by namespace and name, as the kubelet answers it
        request = pb.GetPodResourcesRequest(pod_name="dra-1", pod_namespace="ml").SerializeToString()
        got = pb.GetPodResourcesResponse.FromString(
            grpc_unary_call(socket_path, f"{SERVICE}/Get", request, timeout_s=5.0))
        assert [(c.name, [r.device_name for d in c.dynamic_resources for r in d.claim_resources])
                for c in got.pod_resources.containers] == [("worker", ["gpu-2"])]
        missing = pb.GetPodResourcesRequest(pod_name="gone", pod_namespace="ml").SerializeToString()
        with pytest.raises(RetriableError, match="NOT_FOUND: pod gone in namespace ml not found"):
            grpc_unary_call(socket_path, f"{SERVICE}/Get", missing, timeout_s=5.0)


# ------------------------------------------------------------------ bounds


def absurd_pods() -> list[pb.PodResources]:
    """A kubelet answer no real node gives: names past every bound, too many CDI ids."""
    def claim(name: str, *devices: pb.ClaimResource, namespace: str = "ml") -> pb.DynamicResource:
        return pb.DynamicResource(claim_name=name, claim_namespace=namespace, claim_resources=list(devices))

    def device(name: str, cdi: int = 1, pool: str = "node-a", share_id: str | None = None) -> pb.ClaimResource:
        return pb.ClaimResource(driver_name=DRIVER, pool_name=pool, device_name=name, share_id=share_id,
                                cdi_devices=[pb.CDIDevice(name=f"k8s.{DRIVER}/device={name}-{i}") for i in range(cdi)])

    return [
        pb.PodResources(name="ok-0", namespace="ml", containers=[pb.ContainerResources(name="main", dynamic_resources=[
            claim("ok-claim", device("gpu-0", cdi=MAX_CDI_IDS + 4))])]),
        pb.PodResources(name="p" * 300, namespace="ml", containers=[pb.ContainerResources(
            name="main", dynamic_resources=[claim("c", device("gpu-1"))])]),
        pb.PodResources(name="long-device", namespace="ml", containers=[pb.ContainerResources(
            name="main", dynamic_resources=[claim("c", device("d" * 100)), claim("c" * 400, device("gpu-2"))])]),
        pb.PodResources(name="long-share", namespace="ml", containers=[pb.ContainerResources(
            name="main", dynamic_resources=[claim("c", device("gpu-3", share_id="s" * 200))])]),
    ]


def test_names_past_their_bounds_and_too_many_cdi_ids_are_cut_with_a_reason(
        podresources_server_binary: Path, sockdir: Path) -> None:
    with grpc_go_kubelet(podresources_server_binary, sockdir, absurd_pods()) as socket_path:
        answer = KubeletPodResources(socket_path).read()
    assert [(a.pod, a.device) for a in answer.dra_allocations] == [("ok-0", "gpu-0")]
    assert len(answer.dra_allocations[0].cdi_ids) == MAX_CDI_IDS
    assert len(answer.problems) == 2
    left_out, cdi = answer.problems
    assert left_out == ("pod resources: 4 DRA devices left out, a name beyond its bound (claim_name: 1, device: 1, "
                        f"pod: 1, share_id: 1; the first: ml/{'p' * 40}… claim c device gpu-1)")
    assert cdi == f"pod resources: 4 CDI ids dropped (more than {MAX_CDI_IDS} for one DRA device)"
    # the sample carries the rest and says what was cut
    sample = sample_with(StaticAnswer(answer))
    assert sample.dra_allocations == answer.dra_allocations
    assert sample.errors == answer.problems


def test_a_node_with_more_dra_devices_than_a_sample_holds_keeps_the_first_and_says_how_many_not() -> None:
    devices = [pb.ClaimResource(driver_name=DRIVER, pool_name="node-a", device_name=f"gpu-{i}")
               for i in range(DRA_DECODE_LIMIT + 100)]
    pods = [pb.PodResources(name=f"p-{i // 4:05d}", namespace="ml", containers=[pb.ContainerResources(
        name="main", dynamic_resources=[pb.DynamicResource(claim_name="c", claim_namespace="ml",
                                                           claim_resources=devices[i:i + 4])])])
            for i in range(0, len(devices), 4)]
    raw = pb.ListPodResourcesResponse(pod_resources=pods).SerializeToString()
    decoded = decode_list(raw)
    assert sum(len(d.devices) for p in decoded.pods for c in p.containers for d in c.dynamic_resources) \
        == DRA_DECODE_LIMIT
    assert decoded.dra_devices_skipped == 100
    records, problems = dra_allocations(decoded.pods, gpu_driver_filter(["nvidia.com/"]),
                                        decoded.dra_devices_skipped)
    assert len(records) == MAX_DRA_ALLOCATIONS
    assert problems == [
        f"pod resources: 100 DRA devices not decoded (more than {DRA_DECODE_LIMIT} on the node)",
        f"pod resources: {DRA_DECODE_LIMIT - MAX_DRA_ALLOCATIONS} DRA devices left out "
        f"(more than {MAX_DRA_ALLOCATIONS} on the node)"]
    GpuSample(node="node-a", ts=at(0), agent_boot_id="b", seq=0, sample_interval_s=10.0,
              dra_allocations=records, errors=problems)  # the sample accepts what the agent keeps


def test_absurd_counts_are_counted_not_kept() -> None:
    many_cdi = pb.ClaimResource(driver_name=DRIVER, pool_name="node-a", device_name="gpu-0",
                                cdi_devices=[pb.CDIDevice(name=f"cdi-{i}") for i in range(20_000)])
    empty_claims = [pb.DynamicResource(claim_name=f"empty-{i}", claim_namespace="ml") for i in range(50_000)]
    raw = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(name="p", namespace="ml", containers=[
        pb.ContainerResources(name="main", dynamic_resources=[
            *empty_claims, pb.DynamicResource(claim_name="c", claim_namespace="ml", claim_resources=[many_cdi])])])
    ]).SerializeToString()
    [pod] = decode_list(raw).pods
    [claim] = pod.containers[0].dynamic_resources  # the claims without devices are not kept
    assert (len(claim.devices[0].cdi_ids), claim.devices[0].cdi_ids_dropped) == (MAX_CDI_IDS, 20_000 - MAX_CDI_IDS)
    records, problems = dra_allocations([pod], gpu_driver_filter(["nvidia.com/"]))
    assert [(r.device, len(r.cdi_ids)) for r in records] == [("gpu-0", MAX_CDI_IDS)]
    assert problems == [f"pod resources: {20_000 - MAX_CDI_IDS} CDI ids dropped (more than {MAX_CDI_IDS} for one "
                        "DRA device)"]


def test_the_hand_decoder_reads_dynamic_resources_as_protobuf_encodes_them() -> None:
    claim = pb.DynamicResource(claim_name="c", claim_namespace="ns", claim_resources=[
        pb.ClaimResource(cdi_devices=[pb.CDIDevice(name="a"), pb.CDIDevice(name="b")], driver_name=DRIVER,
                         pool_name="pool", device_name="gpu-0", share_id="s-1"),
        pb.ClaimResource(driver_name=DRIVER, pool_name="pool", device_name="gpu-1", share_id=""),
        pb.ClaimResource(driver_name=DRIVER, pool_name="pool", device_name="gpu-2")])
    raw = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(
        name="p", namespace="ns", cpu_ids=[1, 2**40],
        containers=[pb.ContainerResources(name="main", dynamic_resources=[claim])])]).SerializeToString()
    [pod] = decode_list(raw).pods
    assert pod.containers[0].dynamic_resources == [DynamicResource("c", "ns", [
        ClaimDevice(DRIVER, "pool", "gpu-0", ["a", "b"], "s-1"),
        ClaimDevice(DRIVER, "pool", "gpu-1", [], None),  # an empty share id is none
        ClaimDevice(DRIVER, "pool", "gpu-2", [], None)])]
    for cut in (1, len(raw) // 2, len(raw) - 1):
        with pytest.raises(ValueError):
            decode_list(raw[:cut])


def test_gpu_drivers_are_those_of_the_gpu_resource_domains() -> None:
    wanted = gpu_driver_filter(["nvidia.com/", "amd.com/"])
    assert [d for d in ("gpu.nvidia.com", "nvidia.com", "gpu.amd.com", "sriov.net.example.com", "evilnvidia.com")
            if wanted(d)] == ["gpu.nvidia.com", "nvidia.com", "gpu.amd.com"]
    assert gpu_driver_filter([])("anything.example.com")


# ------------------------------------------------------------------ the sample


class StaticAnswer:
    def __init__(self, answer: PodResourcesAnswer) -> None:
        self.answer = answer

    def read(self) -> PodResourcesAnswer:
        return self.answer


def sample_with(source: StaticAnswer | StaticPodResources, ts: float = 0) -> GpuSample:
    nvml = FakeNvml([FakeGpu(index=0, uuid=gpu_uuid(0))])
    nvml.init()
    sampler = NodeSampler("node-a", nvml, source, StaticProcessResolver({}), boot_id="b", sample_interval_s=10.0)
    return sampler.sample(at(ts))


def test_the_sample_carries_dra_allocations_and_keeps_them_through_a_short_kubelet_restart() -> None:
    pods = StaticPodResources({gpu_uuid(0): [ref("legacy-0")]}, dra=MIXED_DRA[:3])
    nvml = FakeNvml([FakeGpu(index=0, uuid=gpu_uuid(0))])
    nvml.init()
    sampler = NodeSampler("node-a", nvml, pods, StaticProcessResolver({}), boot_id="b", sample_interval_s=10.0)
    first = sampler.sample(at(0))
    assert first.dra_allocations == MIXED_DRA[:3]
    assert first.gpus[0].assigned_to == [ref("legacy-0")]  # DRA leaves the device plugin's part alone
    pods.failing = "kubelet restarting"
    second = sampler.sample(at(10))
    assert second.dra_allocations == MIXED_DRA[:3]  # the recent answer, as for device-plugin assignments
    assert second.errors == ["pod resources: kubelet restarting"]
    for t in (20, 30, 40):
        later = sampler.sample(at(t))
    assert later.dra_allocations == [] and later.gpus[0].assigned_to == []


# ------------------------------------------------------------------ a large node


def many_pods(count: int) -> tuple[dict[str, list[PodRef]], list[DraAllocation]]:
    """``count`` pods: every third holds a device-plugin GPU, the others DRA GPUs or MIG devices."""
    mapping: dict[str, list[PodRef]] = {}
    dra: list[DraAllocation] = []
    for i in range(count):
        name = f"job-{i:05d}"
        if i % 3 == 0:
            mapping[gpu_uuid(i)] = [ref(name, "main", "batch")]
        else:
            dra.append(alloc(name, f"gpu-{i}", f"{name}-gpu", namespace="batch", pool=f"node-a-{i % 7}"))
    return mapping, dra


def test_a_node_with_3000_pods_decodes_alike_through_both_servers(
        podresources_server_binary: Path, sockdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mapping, dra = many_pods(3002)
    with grpc_go_kubelet(podresources_server_binary, sockdir, kubelet_list(mapping, dra)) as socket_path:
        client = KubeletPodResources(socket_path)
        client.read()  # the server's first answer reads its file
        started = time.perf_counter()
        real = client.read()
        real_s = time.perf_counter() - started
    with FakePodResourcesServer(sockdir / "fake.sock", mapping, dra=dra):
        started = time.perf_counter()
        fake = KubeletPodResources(sockdir / "fake.sock").read()
        fake_s = time.perf_counter() - started
    assert real == fake
    assert len(real.assignments) == 1001
    # more DRA devices than a sample holds: the first MAX_DRA_ALLOCATIONS in order, and the reason
    assert len(real.dra_allocations) == MAX_DRA_ALLOCATIONS
    assert real.dra_allocations == sorted(dra, key=lambda a: a.pod)[:MAX_DRA_ALLOCATIONS]
    assert real.problems == [f"pod resources: {len(dra) - MAX_DRA_ALLOCATIONS} DRA devices left out "
                             f"(more than {MAX_DRA_ALLOCATIONS} on the node)"]
    with capsys.disabled():
        print(f"\n3,002 pods ({len(dra)} DRA devices): List + decode {real_s * 1000:.0f} ms from grpc-go, "
              f"{fake_s * 1000:.0f} ms from grpcio")


# ------------------------------------------------------------------ the server's build


BUILD = REPO_ROOT / "scripts" / "podresources-build.sh"


def _build(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**os.environ, **env},
                          timeout=60, check=False)


def test_a_cached_server_is_found_without_go(podresources_server_binary: Path) -> None:
    done = _build(BUILD, {"GO": "/nonexistent/go"})
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == podresources_server_binary


def test_without_go_the_build_fails_naming_the_toolchain_and_leaves_nothing(tmp_path: Path) -> None:
    done = _build(BUILD, {"GO": str(tmp_path / "no-go"), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert done.returncode == 1 and done.stdout == ""
    assert "Go toolchain" in done.stderr and "k8s.io/kubelet" in done.stderr
    assert not (tmp_path / "cache" / "gpulens" / "podresources").exists()


def test_an_edited_server_is_not_taken_from_the_cache(tmp_path: Path, podresources_server_binary: Path) -> None:
    scripts = tmp_path / "scripts"
    shutil.copytree(REPO_ROOT / "scripts" / "podresources-server", scripts / "podresources-server")
    shutil.copy(BUILD, scripts / BUILD.name)
    shutil.copy(BUILD.parent / "go-build-lib.sh", scripts / "go-build-lib.sh")
    main = scripts / "podresources-server" / "main.go"
    main.write_text(main.read_text() + "\n// an edit\n")
    done = _build(scripts / BUILD.name, {"GO": "/nonexistent/go"})  # a cache hit would need no Go
    assert done.returncode == 1 and "Go toolchain" in done.stderr
