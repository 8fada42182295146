"""Kueue workloads: translation, gang recognisers, and the watcher following ``workloads.kueue.x-k8s.io``
on the real kube-apiserver (with the Workload CRD of ``tests/data/kueue`` installed) and on the
simulated server, through the same scenario, so the simulation is held to the real behaviour."""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.fake_cluster import SimulatedCluster
from producers.watcher.gangs import gang_id
from producers.watcher.informer import WatchRequestError
from producers.watcher.kube import api_client, serves_workloads
from producers.watcher.service import (
    ProducedRecord,
    WatcherConfig,
    WatcherMemorySink,
    WatcherService,
    discover_workloads,
    kube_sources,
)
from producers.watcher.translate import TranslateConfig
from producers.watcher.workloads import workload_to_state
from schemas.messages import WorkloadState
from schemas.topics import K8S_WORKLOADS
from simulation.kube_local import KubeApiError, LocalKube
from tests.conftest import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures"
CRD = REPO_ROOT / "tests" / "data" / "kueue" / "workload-crd.yaml"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1"
TS = datetime(2024, 5, 6, 8, 0, tzinfo=UTC)


def queued_fixture() -> dict[str, Any]:
    return dict(json.loads((FIXTURES / "kueue_workload_queued.json").read_text()))


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


# --------------------------------------------------------------------------- translation


def test_a_queued_jobset_workload_reports_its_demand_queue_and_reason() -> None:
    state = workload_to_state(queued_fixture(), TS)
    assert state is not None
    assert state.phase == "queued"  # evicted and requeued: QuotaReserved and Admitted are False
    assert [(s.name, s.count, s.gpu_requests_per_pod) for s in state.pod_sets] == [
        ("driver", 1, {}), ("workers", 4, {"nvidia.com/gpu": 8})]
    assert state.gpu_requests == {"nvidia.com/gpu": 32} and state.gpus == 32
    assert (state.queue_name, state.priority_class, state.priority) == ("research", "batch-high", 1000)
    assert state.gang_id == "research/train-llm"  # the owning JobSet, like its pods' jobset-name label
    assert state.team == "nlp" and state.project == "research"
    assert state.pending_reason is not None and "insufficient unused quota" in state.pending_reason
    assert state.admitted_at is None and state.wait_s is None and state.cluster_queue is None


def test_admission_sets_the_wait_and_the_cluster_queue() -> None:
    obj = queued_fixture()
    obj["status"] = {"admission": {"clusterQueue": "gpu-h100"}, "conditions": [
        {"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2024-05-06T07:29:00Z"},
        {"type": "Admitted", "status": "True", "lastTransitionTime": "2024-05-06T07:30:00Z"}]}
    state = workload_to_state(obj, TS)
    assert state is not None and state.phase == "admitted"
    assert state.cluster_queue == "gpu-h100" and state.pending_reason is None
    assert state.admitted_at == datetime(2024, 5, 6, 7, 30, tzinfo=UTC) and state.wait_s == 1800.0
    assert state.quota_reserved_at == datetime(2024, 5, 6, 7, 29, tzinfo=UTC)


@pytest.mark.parametrize(("change", "phase"), [
    (lambda o: o["status"]["conditions"].append({"type": "Finished", "status": "True"}), "finished"),
    (lambda o: o["spec"].update(active=False), "inactive"),
    (lambda o: o["status"]["conditions"].append({"type": "QuotaReserved", "status": "True"}) or
     o["status"]["conditions"].pop(0), "quota_reserved"),
])
def test_phases(change: Callable[[dict[str, Any]], Any], phase: str) -> None:
    obj = queued_fixture()
    change(obj)
    state = workload_to_state(obj, TS)
    assert state is not None and state.phase == phase


def test_a_workload_without_gpus_or_identity_is_not_reported() -> None:
    obj = queued_fixture()
    obj["spec"]["podSets"] = obj["spec"]["podSets"][:1]
    assert workload_to_state(obj, TS) is None
    nameless = queued_fixture()
    del nameless["metadata"]["uid"]
    assert workload_to_state(nameless, TS) is None


def test_a_workload_with_no_recognised_group_is_its_own_gang() -> None:
    obj = queued_fixture()
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "x", "uid": "u"}]
    state = workload_to_state(obj, TS)
    assert state is not None and state.gang_id == "research/jobset-train-llm-3f9a1"


# --------------------------------------------------------------------------- gang recognisers


KEYS = TranslateConfig().gang_keys


@pytest.mark.parametrize(("meta", "expected"), [
    ({"labels": {"leaderworkerset.sigs.k8s.io/name": "llama", "leaderworkerset.sigs.k8s.io/group-index": "2"}},
     "ns/llama-2"),
    ({"labels": {"leaderworkerset.sigs.k8s.io/name": "llama"}}, "ns/llama"),
    ({"labels": {"volcano.sh/job-name": "mpi-bert"}}, "ns/mpi-bert"),
    ({"labels": {"kueue.x-k8s.io/pod-group-name": "pg-1"}}, "ns/pg-1"),
    ({"ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js"}]}, "ns/js"),
    ({"ownerReferences": [{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "l"}]},
     "ns/l"),
    ({"ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "pt"}]}, None),
    ({"labels": {"training.kubeflow.org/job-name": "pt"}}, "ns/pt"),
    ({"ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "vj"}]}, "ns/vj"),
    ({"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "plain"}]}, None),
    ({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs"}]}, None),
    ({"annotations": {"scheduling.k8s.io/group-name": "vg"},
      "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "vj"}]}, "ns/vg"),
    ({"labels": {"jobset.sigs.k8s.io/jobset-name": "js", "volcano.sh/job-name": "other"}}, "ns/js"),
])
def test_gang_recognisers(meta: dict[str, Any], expected: str | None) -> None:
    assert gang_id(meta, "ns", KEYS) == expected


# --------------------------------------------------------------------------- the watcher on two servers


class Backend(Protocol):
    def create(self, namespace: str, obj: dict[str, Any]) -> None: ...

    def set_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...

    def delete(self, namespace: str, name: str) -> None: ...


class RealBackend:
    def __init__(self, kube: LocalKube) -> None:
        self.admin = kube.admin()

    def create(self, namespace: str, obj: dict[str, Any]) -> None:
        self.admin.create(f"{WORKLOADS}/namespaces/{namespace}/workloads", obj)

    def set_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.admin.merge_patch(f"{WORKLOADS}/namespaces/{namespace}/workloads/{name}/status", {"status": status})

    def delete(self, namespace: str, name: str) -> None:
        self.admin.delete(f"{WORKLOADS}/namespaces/{namespace}/workloads/{name}", grace_period_s=0)


class FakeBackend:
    def __init__(self, server: FakeApiServer) -> None:
        self.server = server

    def create(self, namespace: str, obj: dict[str, Any]) -> None:
        stored = copy.deepcopy(obj)
        stored["metadata"]["namespace"] = namespace
        stored.pop("status", None)  # as on the real server: status is written through its subresource
        self.server.put("workloads", stored)

    def set_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.server.patch("workloads", f"{namespace}/{name}", lambda obj: obj.__setitem__("status", status))

    def delete(self, namespace: str, name: str) -> None:
        self.server.delete("workloads", f"{namespace}/{name}")


def workload(name: str, gpus: int, count: int = 2) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {"requests": {"cpu": "1"}}
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "labels": {"team": "nlp"}},
            "spec": {"queueName": "research", "podSets": [{"name": "workers", "count": count, "template": {
                "spec": {"containers": [{"name": "main", "image": "trainer:1", "resources": resources}]}}}]}}


@contextmanager
def watch(api: Any, namespace: str) -> Iterator[tuple[WatcherService, WatcherMemorySink]]:
    sink = WatcherMemorySink()
    service = WatcherService(kube_sources(api, (namespace,)), sink,
                             WatcherConfig(namespaces=(namespace,), watch_timeout_s=3))
    stop = threading.Event()
    service.start(stop)
    try:
        wait_for("the initial lists", lambda: all(i.synced for i in service.informers))
        yield service, sink
    finally:
        service.shutdown(stop, timeout_s=10)


def states(sink: WatcherMemorySink, uid: str | None = None) -> list[ProducedRecord]:
    return [r for r in sink.of(K8S_WORKLOADS) if uid is None or r.key == uid]


def exercise(backend: Backend, service: WatcherService, sink: WatcherMemorySink, namespace: str) -> None:
    """Queued -> admitted -> deleted: one record per change, then a tombstone; CPU-only never."""
    assert len(service.workload_informers) == 1
    backend.create(namespace, workload("cpu-only", 0))
    backend.create(namespace, workload("train", 4))
    wait_for("the queued workload", lambda: len(states(sink)) >= 1)
    (first,) = states(sink)
    queued = first.message
    assert isinstance(queued, WorkloadState)
    assert (queued.namespace, queued.name, queued.phase) == (namespace, "train", "queued")
    assert queued.queue_name == "research"
    assert queued.gpus == 8 and queued.pod_sets[0].count == 2 and queued.gang_id == f"{namespace}/train"
    admitted_at = (datetime.now(UTC) + timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    backend.set_status(namespace, "train", {"admission": {"clusterQueue": "cq-gpu", "podSetAssignments": []},
                                            "conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "reserved",
         "lastTransitionTime": admitted_at},
        {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "admitted",
         "lastTransitionTime": admitted_at}]})
    wait_for("the admission", lambda: len(states(sink, first.key)) >= 2)
    admitted = states(sink, first.key)[1].message
    assert isinstance(admitted, WorkloadState) and admitted.phase == "admitted"
    assert admitted.cluster_queue == "cq-gpu" and admitted.wait_s is not None and admitted.wait_s >= 5
    backend.delete(namespace, "train")
    wait_for("the deletion", lambda: len(states(sink, first.key)) >= 4)
    records = states(sink, first.key)
    final = records[2].message
    assert isinstance(final, WorkloadState) and final.deleted and final.phase == "admitted"
    assert records[3].message is None
    time.sleep(1.0)
    assert len(states(sink)) == 4, "one record per change, nothing for the CPU-only workload"


def test_the_simulated_server_serves_workloads_like_the_real_one() -> None:
    with FakeApiServer(bookmark_interval_s=0.2, kueue=True) as server:
        api = api_client(host=server.url)
        assert serves_workloads(api)
        with watch(api, "ml") as (service, sink):
            exercise(FakeBackend(server), service, sink, "ml")
        assert any("/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads" in path and "watch=true" in path
                   for path in server.requests)


def test_without_kueue_the_watcher_asks_once_and_watches_as_before() -> None:
    with FakeApiServer(bookmark_interval_s=0.2) as server:
        api = api_client(host=server.url)
        with watch(api, "ml") as (service, _sink):
            assert service.workload_informers == []
        assert [p for p in server.requests if "kueue" in p] == ["/apis/kueue.x-k8s.io/v1beta1"]


def test_the_simulated_cluster_of_watch_simulate_has_a_queued_workload() -> None:
    with FakeApiServer(bookmark_interval_s=0.2, kueue=True) as server:
        SimulatedCluster(server).populate()
        with watch(api_client(host=server.url), "nlp") as (_service, sink):
            wait_for("the queued workload", lambda: len(states(sink)) == 1)
        state = states(sink)[0].message
        assert isinstance(state, WorkloadState)
        assert (state.name, state.phase, state.gpus, state.queue_name) == ("nlp-pretrain-queued", "queued", 16, "nlp")


def test_discovery_retries_a_failing_server_then_goes_on_without_workloads() -> None:
    answers: list[bool | Exception] = [WatchRequestError("503", 503), WatchRequestError("refused"), True]

    def ask() -> bool:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sleeps: list[float] = []
    assert discover_workloads(ask, sleep=sleeps.append) is True and len(sleeps) == 2

    def down() -> bool:
        raise WatchRequestError("connection refused")

    assert discover_workloads(down, attempts=3, sleep=sleeps.append) is False
    with FakeApiServer(kueue=True) as server:
        server.fail_next(1, status=503, path_contains="kueue")
        assert len(kube_sources(api_client(host=server.url), ("ml",)).workloads) == 1


@pytest.fixture
def kueue_crd(kube: LocalKube) -> Iterator[None]:
    """The Workload CRD on the shared control plane for one test, removed after it (other tests
    then find no Kueue, as before)."""
    admin = kube.admin()
    api = api_client(kubeconfig=kube.kubeconfig())
    crd = yaml.safe_load(CRD.read_text())
    try:
        admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    except KubeApiError as exc:
        if exc.status != 409:
            raise
    wait_for("the CRD to be served", lambda: serves_workloads(api))
    try:
        yield
    finally:
        admin.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}")
        wait_for("the CRD to be gone", lambda: not serves_workloads(api), timeout_s=120)


def test_the_real_server_with_the_workload_crd(kube: LocalKube, kueue_crd: None) -> None:
    namespace = f"kq-{uuid.uuid4().hex[:6]}"
    kube.ensure_namespace(namespace)
    watcher = kube.as_watcher()
    assert watcher.get(f"{WORKLOADS}/workloads?limit=1")["kind"] == "WorkloadList"
    with pytest.raises(KubeApiError) as denied:
        watcher.create(f"{WORKLOADS}/namespaces/{namespace}/workloads", workload("nope", 1))
    assert denied.value.status == 403
    with watch(api_client(kubeconfig=kube.kubeconfig()), namespace) as (service, sink):
        exercise(RealBackend(kube), service, sink, namespace)


def test_the_real_server_without_kueue_is_watched_as_before(kube: LocalKube) -> None:
    api = api_client(kubeconfig=kube.kubeconfig())
    assert not serves_workloads(api)
    assert kube_sources(api, ("default",)).workloads == []
