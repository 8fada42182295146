"""The watcher following DRA through the real ``kubernetes`` client and the simulated API server
(``FakeApiServer(dra=True)`` serves ``resource.k8s.io/v1`` like a 1.34+ server): listed before
nodes and pods, watched, and every change republishes the nodes and pods it concerns; a server
without the group, or a role that may not list it, is watched as before."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from common.backoff import Backoff
from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.fake_cluster import (
    make_event,
    make_node,
    make_pod,
    set_finished,
    set_running,
    set_unschedulable,
)
from producers.watcher.informer import Informer
from producers.watcher.kube import api_client, serves_dra
from producers.watcher.service import WatcherConfig, WatcherMemorySink, WatcherService, kube_sources
from schemas.messages import NodeState, PodState
from schemas.topics import K8S_EVENTS, K8S_NODES, K8S_PODS
from tests.watcher.conftest import FakeClock, populate
from tests.watcher.dra_objects import allocate, claim, claim_pod, device_class, gpu_device, resource_slice


@pytest.fixture
def dra_server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval_s=0.2, dra=True) as srv:
        yield srv


def build(server: FakeApiServer, namespaces: tuple[str, ...] = ()) -> tuple[WatcherService, WatcherMemorySink]:
    sink = WatcherMemorySink()
    service = WatcherService(kube_sources(api_client(host=server.url), namespaces), sink,
                             WatcherConfig(namespaces=namespaces, watch_timeout_s=1), clock=FakeClock(),
                             backoff_factory=lambda: Backoff(base_s=0.5, cap_s=30.0))
    return service, sink


def informer(service: WatcherService, resource: str) -> Informer:
    return next(i for i in service.informers if i.resource.split(":")[0] == resource)


def last_node(sink: WatcherMemorySink, name: str) -> NodeState | None:
    records = [r for r in sink.of(K8S_NODES) if r.key == name]
    message = records[-1].message if records else None
    assert message is None or isinstance(message, NodeState)
    return message


def last_pod(sink: WatcherMemorySink, uid: str) -> PodState | None:
    records = [r for r in sink.of(K8S_PODS) if r.key == uid]
    message = records[-1].message if records else None
    assert message is None or isinstance(message, PodState)
    return message


def test_dra_is_listed_first_and_every_change_republishes_what_it_concerns(dra_server: FakeApiServer) -> None:
    server = dra_server
    server.put("deviceclasses", device_class())
    server.put("nodes", make_node("dra-0", gpus=0))
    server.put("resourceslices", resource_slice("dra-0", [gpu_device(i) for i in range(4)]))
    server.put("resourceclaims", claim("train-gpus", count=4))
    pod = claim_pod("train", "uid-train", ["train-gpus"])
    server.put("pods", pod)
    server.put("pods", claim_pod("waits", "uid-waits", ["not-made-yet"]))
    with api_client(host=server.url) as api:
        assert serves_dra(api)
    service, sink = build(server)
    assert [i.resource for i in service.informers][:4] == ["deviceclasses", "resourceslices", "resourceclaims",
                                                           "nodes"]
    assert service.sync(threading.Event())
    node = last_node(sink, "dra-0")
    assert node is not None and node.gpu_capacity == {"nvidia.com/gpu": 4} and len(node.dra_devices) == 4
    pending = last_pod(sink, "uid-train")
    assert pending is not None and pending.phase == "Pending" and pending.gpu_requests == {"nvidia.com/gpu": 4}
    assert [r.key for r in sink.records].count("dra-0") == 1  # listed after DRA: published once, complete
    assert last_pod(sink, "uid-waits") is None  # its claim is not there: no demand known yet

    # the scheduler allocates and binds; the kubelet starts it
    server.put("resourceclaims", allocate(claim("train-gpus", count=4), "dra-0",
                                          [f"gpu-{i}" for i in range(4)], [("train", "uid-train")]))
    informer(service, "resourceclaims").watch_once()
    set_running(pod, "dra-0", datetime(2024, 5, 6, 8, tzinfo=UTC))
    server.put("pods", pod)
    informer(service, "pods").watch_once()
    running = last_pod(sink, "uid-train")
    assert running is not None and running.phase == "Running" and running.gpu_requests == {"nvidia.com/gpu": 4}

    # the late claim appears: the pod that waited for it is published with its demand
    server.put("resourceclaims", claim("not-made-yet", count=2))
    informer(service, "resourceclaims").watch_once()
    waits = last_pod(sink, "uid-waits")
    assert waits is not None and waits.gpu_requests == {"nvidia.com/gpu": 2}

    # the driver withdraws two GPUs: the node is republished with its new capacity
    server.put("resourceslices", resource_slice("dra-0", [gpu_device(0), gpu_device(1)], generation=2))
    informer(service, "resourceslices").watch_once()
    node = last_node(sink, "dra-0")
    assert node is not None and node.gpu_capacity == {"nvidia.com/gpu": 2}
    server.delete("resourceslices", "dra-0-gpu.nvidia.com-slice")
    informer(service, "resourceslices").watch_once()
    assert last_node(sink, "dra-0") is None  # no GPU left: dropped downstream (tombstone)


def test_pods_sharing_a_claim_are_republished_when_its_first_consumer_changes(dra_server: FakeApiServer) -> None:
    server = dra_server
    server.put("nodes", make_node("dra-0", gpus=0))
    server.put("resourceslices", resource_slice("dra-0", [gpu_device(0)]))
    server.put("resourceclaims", allocate(claim("shared"), "dra-0", ["gpu-0"],
                                          [("a", "uid-a"), ("b", "uid-b")]))
    for name in ("a", "b"):
        server.put("pods", claim_pod(name, f"uid-{name}", ["shared"], node="dra-0"))
    service, sink = build(server)
    assert service.sync(threading.Event())
    a, b = last_pod(sink, "uid-a"), last_pod(sink, "uid-b")
    assert a is not None and b is not None
    assert (a.gpu_requests, b.gpu_requests) == ({"nvidia.com/gpu": 1}, {})  # b shares it like a time-sliced GPU
    server.delete("pods", "ml/a")
    server.put("resourceclaims", allocate(claim("shared"), "dra-0", ["gpu-0"], [("b", "uid-b")]))
    informer(service, "pods").watch_once()
    informer(service, "resourceclaims").watch_once()
    b = last_pod(sink, "uid-b")
    assert b is not None and b.gpu_requests == {"nvidia.com/gpu": 1}


def test_a_finished_pod_keeps_its_gpus_when_the_controller_deletes_its_claim(dra_server: FakeApiServer) -> None:
    """As on a real server: the pod ends, the resourceclaim controller releases and deletes the claim
    it generated from a template, the pod is deleted. Every later message still says 2 GPUs."""
    server = dra_server
    server.put("nodes", make_node("dra-0", gpus=0))
    server.put("resourceslices", resource_slice("dra-0", [gpu_device(0), gpu_device(1)]))
    generated = claim("train-gpu-x7k2p", count=2)
    server.put("resourceclaims", allocate(copy.deepcopy(generated), "dra-0", ["gpu-0", "gpu-1"],
                                          [("train", "uid-train")]))
    pod = claim_pod("train", "uid-train", [], templates={"gpu": "train-gpu-x7k2p"}, node="dra-0")
    server.put("pods", pod)
    service, sink = build(server)
    assert service.sync(threading.Event())
    running = last_pod(sink, "uid-train")
    assert running is not None and running.gpu_requests == {"nvidia.com/gpu": 2}
    set_finished(pod, datetime(2024, 5, 6, 9, tzinfo=UTC))
    server.put("pods", pod)
    informer(service, "pods").watch_once()
    server.put("resourceclaims", allocate(copy.deepcopy(generated), "dra-0", ["gpu-0", "gpu-1"], []))
    server.delete("resourceclaims", "ml/train-gpu-x7k2p")
    informer(service, "resourceclaims").watch_once()
    server.delete("pods", "ml/train")
    informer(service, "pods").watch_once()
    states = [r.message for r in sink.of(K8S_PODS) if r.key == "uid-train"]
    assert states[-1] is None  # the tombstone, after the final state
    finals = [m for m in states if isinstance(m, PodState)]
    assert [m.phase for m in finals][:2] == ["Running", "Succeeded"] and finals[-1].deleted
    assert all(m.gpu_requests == {"nvidia.com/gpu": 2} for m in finals)


def test_a_pod_waiting_on_a_shared_claim_is_reported_with_its_scheduling_failure(dra_server: FakeApiServer) -> None:
    """The claim's first consumer counts its GPU; the second cannot be placed ("cannot allocate all
    claims", no nvidia.com/ in the text): it is still a GPU pod, published, and its event kept."""
    server = dra_server
    server.put("deviceclasses", device_class())
    server.put("nodes", make_node("dra-0", gpus=0))
    server.put("resourceslices", resource_slice("dra-0", [gpu_device(0)]))
    server.put("resourceclaims", allocate(claim("shared"), "dra-0", ["gpu-0"], [("a", "uid-a")]))
    server.put("pods", claim_pod("a", "uid-a", ["shared"], node="dra-0"))
    waiter = claim_pod("b", "uid-b", ["shared"], created="2024-05-06T07:05:00Z")
    message = "0/1 nodes are available: 1 cannot allocate all claims."
    set_unschedulable(waiter, message, datetime(2024, 5, 6, 7, 5, tzinfo=UTC))
    server.put("pods", waiter)
    server.put("events", make_event(waiter, "FailedScheduling", message, datetime(2024, 5, 6, 7, 5, tzinfo=UTC)))
    service, sink = build(server)
    assert service.sync(threading.Event())
    a, b = last_pod(sink, "uid-a"), last_pod(sink, "uid-b")
    assert a is not None and a.gpu_requests == {"nvidia.com/gpu": 1}
    assert b is not None and b.phase == "Pending" and b.gpu_requests == {} and b.node is None
    events = [r.message for r in sink.of(K8S_EVENTS) if r.key == "uid-b"]
    assert [(getattr(e, "category", None), getattr(e, "message", None)) for e in events] == [
        ("scheduling_failed", message)]


def test_without_the_dra_group_nothing_changes(dra_server: FakeApiServer) -> None:
    with FakeApiServer(bookmark_interval_s=0.2) as plain:
        populate(plain)
        populate(dra_server)
        records = []
        for server in (plain, dra_server):
            service, sink = build(server)
            assert service.sync(threading.Event())
            records.append([(r.topic, r.message.model_dump(exclude={"ts", "uid", "created_at"}) if r.message else None)
                            for r in sink.records if r.topic == K8S_NODES.suffix])
            assert (service.pipeline.dra is None) == (server is plain)
        assert records[0] == records[1]  # the same cluster, with or without the group: the same nodes
        with api_client(host=plain.url) as api:
            assert not serves_dra(api)
        assert not [path for path in plain.requests if "resource.k8s.io" in path and path != "/apis/resource.k8s.io/v1"]


def test_a_role_that_may_not_list_dra_starts_the_watcher_without_it(dra_server: FakeApiServer) -> None:
    dra_server.put("nodes", make_node("gpu-0", gpus=2))
    dra_server.fail_next(1, status=403, path_contains="resourceslices")
    service, sink = build(dra_server)
    assert service.pipeline.dra is None and not service.dra_informers
    assert service.sync(threading.Event())
    node = last_node(sink, "gpu-0")
    assert node is not None and node.gpu_capacity == {"nvidia.com/gpu": 2}


def test_a_hostile_slice_never_stops_the_watcher(dra_server: FakeApiServer) -> None:
    server = dra_server
    server.put("nodes", make_node("huge", gpus=0))
    server.put("resourceslices", resource_slice("huge", [gpu_device(i, uuid=f"GPU-{i}") for i in range(10_000)]))
    junk: list[Any] = [{"name": "x" * 500}, "junk", {"name": "gpu-x", "attributes": {"type": {"int": 3}}}]
    server.put("resourceslices", resource_slice("huge", junk, name="junk", pool="junk"))
    server.put("resourceslices", resource_slice("huge", [gpu_device(0)], name="other", driver="unknown.example.com"))
    server.put("resourceclaims", {"metadata": {"name": "odd", "namespace": "ml"}, "spec": "not an object"})
    server.put("pods", make_pod("ordinary", gpus=1))
    service, sink = build(server)
    assert service.sync(threading.Event())
    node = last_node(sink, "huge")
    assert node is not None and node.truncated and len(node.dra_devices) == 1024
    assert [r for r in sink.of(K8S_PODS) if isinstance(r.message, PodState) and r.message.name == "ordinary"]
    server.put("resourceslices", resource_slice("huge", [gpu_device(0)], generation=2))
    informer(service, "resourceslices").watch_once()
    node = last_node(sink, "huge")
    assert node is not None and node.gpu_capacity == {"nvidia.com/gpu": 1}
    assert node.truncated  # the junk slice's over-long device name is still cut
    server.delete("resourceslices", "junk")
    informer(service, "resourceslices").watch_once()
    node = last_node(sink, "huge")
    assert node is not None and not node.truncated and node.gpu_capacity == {"nvidia.com/gpu": 1}


def test_a_slice_deleted_while_the_watcher_was_away_is_found_by_the_relist(dra_server: FakeApiServer) -> None:
    server = dra_server
    server.put("nodes", make_node("dra-0", gpus=0))
    server.put("resourceslices", resource_slice("dra-0", [gpu_device(0)], name="a", pool="a"))
    server.put("resourceslices", resource_slice("dra-0", [gpu_device(1)], name="b", pool="b"))
    service, sink = build(server)
    stop = threading.Event()
    assert service.sync(stop)
    node = last_node(sink, "dra-0")
    assert node is not None and node.gpu_capacity == {"nvidia.com/gpu": 2}
    slices = informer(service, "resourceslices")
    assert slices.store["a"] == {"metadata": {"name": "a", "uid": slices.store["a"]["metadata"]["uid"],
                                              "resourceVersion": slices.store["a"]["metadata"]["resourceVersion"]}}
    server.delete("resourceslices", "a")
    server.compact()
    slices.step(stop)  # 410 Gone
    slices.step(stop)  # the relist reports "a" deleted from its stub
    node = last_node(sink, "dra-0")
    assert node is not None and node.gpu_capacity == {"nvidia.com/gpu": 1}
    assert [d.device for d in node.dra_devices] == ["gpu-1"]
