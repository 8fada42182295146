"""The watcher's DRA path against a real kube-apiserver 1.37 (``resource.k8s.io/v1`` served by
default), with the token bound to exactly the ClusterRole that deploy/k8s/watcher.yaml ships: the
server validates the DeviceClass, ResourceSlices, ResourceClaim and Pod, the test writes the
claim's allocation through the status subresource as kube-scheduler does, and the published
NodeState / PodState carry what the slices and the claim say. Then with the real kube-scheduler
and kube-controller-manager (``kube_cluster``): the scheduler allocates a claim, serves
``nvidia.com/gpu`` through a DeviceClass's ``extendedResourceName`` (counted once), refuses a
claim no device is left for, with its own FailedScheduling reason, and the controller generates a
pod's claim from a ResourceClaimTemplate."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from producers.watcher.fake_cluster import make_node, make_pod
from producers.watcher.kube import api_client, serves_dra
from producers.watcher.service import WatcherConfig, WatcherMemorySink, WatcherService, kube_sources
from schemas.messages import K8sEvent, NodeState, PodState
from schemas.topics import K8S_EVENTS, K8S_NODES, K8S_PODS
from simulation.kube_local import KubeApiError, LocalKube
from tests.watcher.dra_objects import (
    DRIVER,
    allocate,
    claim,
    device_class,
    gpu_device,
    mig_device,
    resource_slice,
)
from tests.watcher.test_real_apiserver import wait_for, watching

DRA = "/apis/resource.k8s.io/v1"


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture
def namespace(kube: LocalKube, tag: str) -> str:
    name = f"dra-{tag}"
    kube.ensure_namespace(name)
    return name


@pytest.fixture
def running(kube: LocalKube, namespace: str) -> Iterator[tuple[WatcherService, WatcherMemorySink]]:
    with watching(api_client(kubeconfig=kube.kubeconfig()), namespace) as running:
        yield running


def last(sink: WatcherMemorySink, topic: Any, key: str) -> Any:
    records = [r for r in sink.of(topic) if r.key == key]
    return records[-1].message if records else None


def test_dra_gpus_on_the_real_server_are_counted_as_the_device_plugin_would(
        kube: LocalKube, namespace: str, tag: str, running: tuple[WatcherService, WatcherMemorySink]) -> None:
    service, sink = running
    admin = kube.admin()
    watcher = kube.as_watcher()
    assert service.pipeline.dra is not None  # discovered, and the deployed role may list it
    for resource in ("resourceslices", "deviceclasses"):
        assert watcher.get(f"{DRA}/{resource}?limit=1")["kind"].endswith("List")
    with api_client(kubeconfig=kube.kubeconfig()) as api:
        assert serves_dra(api)

    node = f"dra-{tag}"
    kube.create_node(make_node(node, gpus=0))  # no device plugin: only the slices say it has GPUs
    gpu_class = f"gpu-{tag}"
    admin.create(f"{DRA}/deviceclasses", device_class(gpu_class))
    parent = "GPU-11111111-0000-0000-0000-000000000000"
    devices = [gpu_device(0), gpu_device(1), gpu_device(2, uuid=parent),
               *[mig_device(2, "1g.10gb", start, parent_uuid=parent, uuid=f"MIG-{tag}-{start}") for start in range(3)]]
    created_slice = admin.create(f"{DRA}/resourceslices", resource_slice(node, devices, name=f"{node}-gpus"))
    assert created_slice["spec"]["driver"] == DRIVER
    wait_for("the node's DRA capacity", lambda: isinstance(last(sink, K8S_NODES, node), NodeState))
    state = last(sink, K8S_NODES, node)
    assert state.gpu_capacity == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 3}
    assert {d.device for d in state.dra_devices} == {d["name"] for d in devices}
    mig = next(d for d in state.dra_devices if d.mig_profile)
    assert mig.mig_parent_uuid == parent and mig.resource == "nvidia.com/mig-1g.10gb"

    claim_name = "train-gpus"
    admin.create(f"{DRA}/namespaces/{namespace}/resourceclaims", claim(claim_name, namespace, gpu_class, count=2))
    pod = make_pod("train", namespace=namespace, gpus=0)
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim_name}]
    uid = kube.create_pod(pod)["metadata"]["uid"]
    wait_for("the pending pod's demand", lambda: isinstance(last(sink, K8S_PODS, uid), PodState))
    pending = last(sink, K8S_PODS, uid)
    assert pending.phase == "Pending" and pending.node is None and pending.gpu_requests == {"nvidia.com/gpu": 2}

    # what kube-scheduler writes: the allocation and the consumer, through the status subresource
    current = admin.get(f"{DRA}/namespaces/{namespace}/resourceclaims/{claim_name}")
    current["status"] = allocate(claim(claim_name, namespace), node, ["gpu-0", "gpu-1"], [("train", uid)],
                                 pool=node)["status"]
    admin.request("PUT", f"{DRA}/namespaces/{namespace}/resourceclaims/{claim_name}/status", current)
    kube.bind(namespace, "train", node)
    wait_for("the bound pod", lambda: last(sink, K8S_PODS, uid).node == node)
    bound = last(sink, K8S_PODS, uid)
    assert bound.gpu_requests == {"nvidia.com/gpu": 2}

    # the driver republishes its pool without the MIG devices (a new generation): capacity follows
    admin.delete(f"{DRA}/resourceslices/{node}-gpus")
    admin.create(f"{DRA}/resourceslices", resource_slice(node, devices[:3], name=f"{node}-gpus-2", generation=2))
    wait_for("the new capacity",
             lambda: getattr(last(sink, K8S_NODES, node), "gpu_capacity", None) == {"nvidia.com/gpu": 3})

    kube.delete_pod(namespace, "train")
    wait_for("the pod's tombstone", lambda: last(sink, K8S_PODS, uid) is None and len(
        [r for r in sink.of(K8S_PODS) if r.key == uid]) > 1)
    admin.delete(f"{DRA}/resourceslices/{node}-gpus-2")
    wait_for("the node's tombstone", lambda: last(sink, K8S_NODES, node) is None and len(
        [r for r in sink.of(K8S_NODES) if r.key == node]) > 1)
    admin.delete(f"{DRA}/deviceclasses/{gpu_class}")
    kube.delete_node(node)


def test_the_real_scheduler_allocates_claims_and_serves_an_extended_resource_counted_once(
        kube_cluster: LocalKube, tag: str) -> None:
    """kube-scheduler's DynamicResources plugin writes the claims' status, and for a pod asking
    ``nvidia.com/gpu`` on a node without that extended resource it makes the special claim
    (``pod.status.extendedResourceClaimStatus``): the watcher reads both as the scheduler wrote them."""
    kube = kube_cluster
    admin = kube.admin()
    namespace = f"dra-sched-{tag}"
    kube.ensure_namespace(namespace)
    node = f"dra-sched-{tag}"
    kube.create_node(make_node(node, gpus=0), schedulable=True)
    gpu_class = f"gpu-ext-{tag}"
    admin.create(f"{DRA}/deviceclasses", device_class(gpu_class, extended_resource="nvidia.com/gpu"))
    admin.create(f"{DRA}/resourceslices", resource_slice(node, [gpu_device(i) for i in range(3)],
                                                         name=f"{node}-gpus"))
    sink = WatcherMemorySink()
    service = WatcherService(kube_sources(api_client(kubeconfig=kube.kubeconfig()), (namespace,)), sink,
                             WatcherConfig(namespaces=(namespace,), watch_timeout_s=3))
    stop = threading.Event()
    service.start(stop)
    try:
        wait_for("the initial lists", lambda: all(i.synced for i in service.informers))

        def pod(name: str, claim_name: str | None = None, gpus: int = 0) -> str:
            body = make_pod(name, namespace=namespace, gpus=gpus)
            if claim_name:
                body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
                body["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim_name}]
            return str(kube.create_pod(body)["metadata"]["uid"])

        def demand(uid: str) -> Any:
            message = last(sink, K8S_PODS, uid)
            return (message.node, message.gpu_requests) if isinstance(message, PodState) else None

        admin.create(f"{DRA}/namespaces/{namespace}/resourceclaims", claim("two", namespace, gpu_class, count=2))
        two = pod("two", "two")
        wait_for("the scheduler's allocation", lambda: demand(two) == (node, {"nvidia.com/gpu": 2}), timeout_s=90)
        allocated = admin.get(f"{DRA}/namespaces/{namespace}/resourceclaims/two")["status"]
        assert [r["pool"] for r in allocated["allocation"]["devices"]["results"]] == [node, node]
        assert [c["uid"] for c in allocated["reservedFor"]] == [two]

        extended = pod("extended", gpus=1)  # asks nvidia.com/gpu: the DRA driver's class serves it
        wait_for("the extended-resource pod bound", lambda: demand(extended) == (node, {"nvidia.com/gpu": 1}),
                 timeout_s=90)
        status = admin.get(f"/api/v1/namespaces/{namespace}/pods/extended")["status"]
        special = status["extendedResourceClaimStatus"]["resourceClaimName"]
        assert admin.get(f"{DRA}/namespaces/{namespace}/resourceclaims/{special}")["status"]["allocation"]

        admin.create(f"{DRA}/namespaces/{namespace}/resourceclaims", claim("more", namespace, gpu_class, count=1))
        more = pod("more", "more")  # no device left: pending demand, the scheduler's reason on its event
        wait_for("the unallocatable claim's pending demand", lambda: demand(more) == (None, {"nvidia.com/gpu": 1}))
        node_state = last(sink, K8S_NODES, node)
        assert isinstance(node_state, NodeState) and node_state.gpu_capacity == {"nvidia.com/gpu": 3}

        def refusals() -> list[K8sEvent]:
            return [r.message for r in sink.of(K8S_EVENTS) if isinstance(r.message, K8sEvent)
                    and r.message.involved_uid == more and r.message.category == "scheduling_failed"]

        wait_for("the scheduler's FailedScheduling", lambda: bool(refusals()), timeout_s=60)
        assert "cannot allocate all claims" in refusals()[0].message  # the scheduler's own words

        # a claim from a template: kube-controller-manager generates it and names it in the pod's status
        template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "one-gpu"}, "spec": {"spec": claim("x", namespace, gpu_class)["spec"]}}
        admin.create(f"{DRA}/namespaces/{namespace}/resourceclaimtemplates", template)
        body = make_pod("templated", namespace=namespace, gpus=0)
        body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        templated = str(kube.create_pod(body)["metadata"]["uid"])
        wait_for("the generated claim's pending demand", lambda: demand(templated) == (None, {"nvidia.com/gpu": 1}),
                 timeout_s=60)
        generated = admin.get(f"/api/v1/namespaces/{namespace}/pods/templated")["status"]["resourceClaimStatuses"]
        assert generated[0]["name"] == "gpu" and generated[0]["resourceClaimName"].startswith("templated-gpu-")
    finally:
        service.shutdown(stop, timeout_s=10)
        for path in (f"/api/v1/namespaces/{namespace}/pods/two", f"/api/v1/namespaces/{namespace}/pods/extended",
                     f"/api/v1/namespaces/{namespace}/pods/more", f"/api/v1/namespaces/{namespace}/pods/templated",
                     f"{DRA}/resourceslices/{node}-gpus",
                     f"{DRA}/deviceclasses/{gpu_class}", f"/api/v1/nodes/{node}"):
            with contextlib.suppress(KubeApiError):  # already gone
                admin.delete(path, grace_period_s=0 if "/pods/" in path else None)
