"""The watcher against a real kube-apiserver and etcd (``simulation/kube_local.py``), with the token
bound to exactly the ClusterRole that ``deploy/k8s/watcher.yaml`` ships: what the simulated server
stands in for, checked on the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from producers.watcher.fake_cluster import iso, make_node, make_pod, set_finished, set_running
from producers.watcher.kube import api_client
from producers.watcher.service import (
    ProducedRecord,
    WatcherConfig,
    WatcherMemorySink,
    WatcherMetrics,
    WatcherService,
    kube_sources,
)
from schemas.messages import K8sEvent, NodeState, PodState
from schemas.topics import K8S_EVENTS, K8S_NODES, K8S_PODS
from simulation.kube_local import KubeApiError, LocalKube
from tests.conftest import REPO_ROOT


class CountingMetrics(WatcherMetrics):
    """The service's metrics, with watch event types and errors also counted where a test can see."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_events: Counter[tuple[str, str]] = Counter()
        self.seen_errors: Counter[tuple[str, str]] = Counter()
        self.seen_relists: list[tuple[str, str, int]] = []

    def event(self, resource: str, kind: str) -> None:
        super().event(resource, kind)
        self.seen_events[(resource, kind)] += 1

    def error(self, resource: str, kind: str) -> None:
        super().error(resource, kind)
        self.seen_errors[(resource, kind)] += 1

    def relist(self, resource: str, reason: str, vanished: int) -> None:
        super().relist(resource, reason, vanished)
        self.seen_relists.append((resource, reason, vanished))


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = 45.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def suffix() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture
def namespace(kube: LocalKube) -> str:
    name = f"ml-{suffix()}"
    kube.ensure_namespace(name)
    return name


class Running:
    def __init__(self, service: WatcherService, sink: WatcherMemorySink, metrics: CountingMetrics) -> None:
        self.service = service
        self.sink = sink
        self.metrics = metrics

    def pods(self, uid: str) -> list[ProducedRecord]:
        return [r for r in self.sink.of(K8S_PODS) if r.key == uid]


@contextmanager
def watching(api: Any, namespace: str, metrics: CountingMetrics | None = None
             ) -> Iterator[tuple[WatcherService, WatcherMemorySink]]:
    """``WatcherService`` on the real server for ``namespace``, in its threads, its initial lists
    done; shut down after the block."""
    sink = WatcherMemorySink()
    service = WatcherService(kube_sources(api, (namespace,)), sink,
                             WatcherConfig(namespaces=(namespace,), watch_timeout_s=3), metrics=metrics)
    stop = threading.Event()
    service.start(stop)
    try:
        wait_for("the initial lists", lambda: all(i.synced for i in service.informers))
        yield service, sink
    finally:
        service.shutdown(stop, timeout_s=10)


@pytest.fixture
def running(kube: LocalKube, namespace: str) -> Iterator[Running]:
    """``WatcherService`` on the real server through the watcher's kubeconfig, in its threads."""
    metrics = CountingMetrics()
    with watching(api_client(kubeconfig=kube.kubeconfig()), namespace, metrics) as (service, sink):
        yield Running(service, sink, metrics)


def running_status(pod: dict[str, Any], node: str) -> dict[str, Any]:
    copy = json.loads(json.dumps(pod))
    set_running(copy, node, datetime.now(UTC))
    return dict(copy["status"])


def test_the_server_is_real_and_the_watcher_holds_only_its_deployed_role(kube: LocalKube) -> None:
    assert kube.admin().get("/version")["gitVersion"] == "v1.37.2"
    watcher = kube.as_watcher()
    for path in ("/api/v1/pods", "/api/v1/nodes", "/api/v1/events", "/apis/events.k8s.io/v1/events"):
        assert watcher.get(path + "?limit=1")["kind"].endswith("List")
    denied = []
    for method, path in (("GET", "/api/v1/secrets"), ("GET", "/api/v1/configmaps"),
                         ("POST", "/api/v1/namespaces/default/pods"), ("DELETE", "/api/v1/nodes/any")):
        try:
            watcher.request(method, path, {} if method == "POST" else None)
        except KubeApiError as exc:
            denied.append(exc.status)
    assert denied == [403, 403, 403, 403]


def test_gpu_pod_lifecycle_on_the_real_server_is_reported_once_per_change(
        kube: LocalKube, namespace: str, running: Running) -> None:
    tag = suffix()
    gpu_node, cpu_node = f"gpu-{tag}", f"cpu-{tag}"
    kube.create_node(make_node(gpu_node, gpus=8))
    kube.create_node(make_node(cpu_node, gpus=0))
    pod = make_pod("train-0", namespace=namespace, gpus=2, labels={"team": "vision"})
    created = kube.create_pod(pod)
    uid = created["metadata"]["uid"]
    cpu_uid = kube.create_pod(make_pod("web", namespace=namespace, gpus=0))["metadata"]["uid"]
    kube.bind(namespace, "web", cpu_node)
    wait_for("the pending GPU pod", lambda: len(running.pods(uid)) == 1)

    kube.post_event({
        "metadata": {"name": f"train-0.{tag}", "namespace": namespace},
        "eventTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": "default-scheduler", "reportingInstance": "default-scheduler-test",
        "action": "Scheduling", "reason": "FailedScheduling", "type": "Warning",
        "note": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": "train-0", "uid": uid},
    })
    kube.bind(namespace, "train-0", gpu_node)
    wait_for("the binding", lambda: running.pods(uid)[-1].message.node == gpu_node)  # type: ignore[union-attr]
    kube.set_pod_status(namespace, "train-0", running_status(created, gpu_node))
    wait_for("Running", lambda: running.pods(uid)[-1].message.phase == "Running")  # type: ignore[union-attr]
    finished = json.loads(json.dumps(created))
    finished["status"] = running_status(created, gpu_node)
    set_finished(finished, datetime.now(UTC))
    kube.set_pod_status(namespace, "train-0", finished["status"])
    wait_for("Succeeded", lambda: running.pods(uid)[-1].message.phase == "Succeeded")  # type: ignore[union-attr]
    kube.delete_pod(namespace, "train-0")
    wait_for("the tombstone", lambda: running.pods(uid)[-1].message is None)
    # a change the namespaced pod watch filters out moves its version by a BOOKMARK, emitting nothing;
    # events come straight from etcd (no watch cache): never a bookmark there
    emitted = len(running.sink.records)
    pods = running.service.pod_informers[0]
    version = int(pods.resource_version or 0)
    kube.create_pod(make_pod("elsewhere", namespace=f"other-{tag}", gpus=1))
    wait_for("a bookmark on the pod watch", lambda: running.metrics.seen_events[(pods.resource, "BOOKMARK")] > 0
             and int(pods.resource_version or 0) > version, timeout_s=30)
    assert not [key for key in running.metrics.seen_events if key[0].startswith("events") and key[1] == "BOOKMARK"]
    assert len(running.sink.records) == emitted

    records = running.pods(uid)
    states = [r.message for r in records[:-1]]
    assert all(isinstance(s, PodState) for s in states)
    pod_states: list[PodState] = [s for s in states if isinstance(s, PodState)]
    # a bound pod's deletion is graceful even at 0 s: MODIFIED with deletionTimestamp, then DELETED
    assert [s.phase for s in pod_states] == ["Pending", "Pending", "Running", "Succeeded", "Succeeded", "Succeeded"]
    assert [s.deleted for s in pod_states] == [False, False, False, False, False, True]
    first, bound, started, done, deleting, gone = pod_states
    assert deleting.deleted_at is not None and done.deleted_at is None
    assert first.node is None and first.gpu_requests == {"nvidia.com/gpu": 2} and first.team == "vision"
    assert bound.node == gpu_node and bound.scheduled_at is not None
    assert started.started_at is not None and done.finished_at is not None and gone.deleted_at is not None
    assert created["metadata"]["creationTimestamp"] == iso(first.created_at)
    assert [r.key for r in running.sink.of(K8S_PODS)].count(cpu_uid) == 0  # a CPU pod on a CPU node

    gpu_records = [r for r in running.sink.of(K8S_NODES) if r.key == gpu_node]
    assert gpu_records and all(isinstance(r.message, NodeState) for r in gpu_records)
    assert gpu_records[-1].message.gpu_capacity == {"nvidia.com/gpu": 8}  # type: ignore[union-attr]
    assert len({r.message.model_dump_json(exclude={"ts"}) for r in gpu_records}) == len(gpu_records)  # type: ignore[union-attr]
    assert not [r for r in running.sink.of(K8S_NODES) if r.key == cpu_node]

    events = [r.message for r in running.sink.of(K8S_EVENTS) if isinstance(r.message, K8sEvent)
              and r.message.involved_uid == uid]
    assert [(e.category, e.reason) for e in events] == [("scheduling_failed", "FailedScheduling")]
    assert "Insufficient nvidia.com/gpu" in events[0].message
    kube.delete_node(gpu_node)
    kube.delete_node(cpu_node)
    wait_for("the node's tombstone", lambda: running.sink.of(K8S_NODES)[-1].message is None)
    final, tombstone = [r for r in running.sink.of(K8S_NODES) if r.key == gpu_node][-2:]
    assert isinstance(final.message, NodeState) and final.message.deleted and tombstone.message is None
    assert not [r for r in running.sink.of(K8S_NODES) if r.key == cpu_node]


def test_410_after_compaction_and_restart_relists_and_deletes_what_vanished_once(
        kube: LocalKube, namespace: str) -> None:
    uids = {name: kube.create_pod(make_pod(name, namespace=namespace, gpus=1))["metadata"]["uid"]
            for name in ("keep", "gone-1", "gone-2")}
    sink = WatcherMemorySink()
    metrics = CountingMetrics()
    api = api_client(kubeconfig=kube.kubeconfig())
    service = WatcherService(kube_sources(api, (namespace,)), sink,
                             WatcherConfig(namespaces=(namespace,), watch_timeout_s=1), metrics=metrics)
    stop = threading.Event()
    assert service.sync(stop)
    informer = service.pod_informers[0]
    old_version = informer.resource_version
    assert Counter(r.key for r in sink.of(K8S_PODS)) == Counter({uid: 1 for uid in uids.values()})

    # while the watcher is away: two pods go, one comes; then history is compacted and the server restarts
    kube.delete_pod(namespace, "gone-1")
    kube.delete_pod(namespace, "gone-2")
    new_uid = kube.create_pod(make_pod("new", namespace=namespace, gpus=4))["metadata"]["uid"]
    kube.compact()
    kube.restart_apiserver()
    before = len(sink.records)

    informer.step(stop)  # watch from the compacted version: ERROR 410 Expired
    assert not informer.synced and metrics.seen_errors[(informer.resource, "gone")] == 1
    informer.step(stop)  # re-list
    assert informer.synced and informer.resource_version != old_version
    assert metrics.seen_relists[-1] == (informer.resource, "gone", 2)
    fresh = sink.records[before:]
    by_key: dict[str, list[ProducedRecord]] = {}
    for record in fresh:
        by_key.setdefault(record.key, []).append(record)
    for name in ("gone-1", "gone-2"):
        final, tombstone = by_key.pop(uids[name])
        assert isinstance(final.message, PodState) and final.message.deleted and tombstone.message is None
    assert list(by_key) == [new_uid]  # the kept pod did not change: nothing re-emitted
    informer.step(stop)  # the watch goes on from the re-list's version
    assert informer.synced


def test_apiserver_restart_mid_watch_resumes_without_losing_or_repeating(
        kube: LocalKube, namespace: str, running: Running) -> None:
    before_uid = kube.create_pod(make_pod("before", namespace=namespace, gpus=1))["metadata"]["uid"]
    wait_for("the first pod", lambda: len(running.pods(before_uid)) == 1)
    kube.restart_apiserver()
    after_uid = kube.create_pod(make_pod("after", namespace=namespace, gpus=1))["metadata"]["uid"]
    kube.delete_pod(namespace, "before")
    wait_for("the pod created after the restart", lambda: len(running.pods(after_uid)) == 1, timeout_s=90)
    wait_for("the deletion after the restart", lambda: running.pods(before_uid)[-1].message is None, timeout_s=90)
    assert len(running.pods(after_uid)) == 1
    states = [(s.deleted, s.deleted_at is not None) if isinstance(s, PodState) else None
              for s in (r.message for r in running.pods(before_uid))]
    # created, then (when the watch resumed in time to see it) being deleted, then deleted and a
    # tombstone, once each; a watch that resumed after a 410 re-lists and sees the pod gone
    assert states in ([(False, False), (False, True), (True, True), None], [(False, False), (True, True), None])
    assert sum(n for (_, kind), n in running.metrics.seen_errors.items() if kind.startswith("watch")) >= 1


def test_gpulens_watch_loads_kubeconfig_from_the_environment(kube: LocalKube, namespace: str) -> None:
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig()), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "gpulens.cli", "watch", "--stdout", "--namespace", namespace],
                               cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        uid = kube.create_pod(make_pod("cli", namespace=namespace, gpus=1))["metadata"]["uid"]
        assert process.stdout is not None
        found: dict[str, Any] | None = None
        deadline = time.monotonic() + 60
        while found is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            record = json.loads(line)
            if record["topic"] == "gpulens.k8s.pods.v1" and record["key"] == uid:
                found = record
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert found is not None, stderr[-2000:]
    assert found["value"]["namespace"] == namespace and found["value"]["gpu_requests"] == {"nvidia.com/gpu": 1}
