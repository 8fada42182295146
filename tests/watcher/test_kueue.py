"""Kueue workloads: translation, gang recognisers, and the watcher following ``workloads.kueue.x-k8s.io``
on the real kube-apiserver (with the CRDs Kueue v0.17.0 ships installed: scripts/kueue-crds.sh) and on
the simulated server, through the same scenario, so the simulation is held to the real behaviour.

Kueue's Workload CRD serves v1beta2 (the storage version) and v1beta1 (deprecated); the watcher reads
v1beta2 and falls back to v1beta1 where only that is served. No conversion webhook runs here (the
real Kueue controller is not started), so the tests write each version natively."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.fake_cluster import SimulatedCluster
from producers.watcher.gangs import gang_id
from producers.watcher.informer import WatchRequestError
from producers.watcher.kube import KubeSource, api_client, serves_workloads, workloads_version
from producers.watcher.service import (
    ProducedRecord,
    WatcherMemorySink,
    WatcherService,
    discover_workloads,
    kube_sources,
)
from producers.watcher.translate import TranslateConfig
from producers.watcher.workloads import workload_to_state
from schemas.messages import WorkloadState
from schemas.topics import K8S_WORKLOADS
from simulation.kube_local import KUEUE_VERSION, KUEUE_WORKLOAD_CRD, KubeApiError, LocalKube, build_binaries
from tests.conftest import REPO_ROOT
from tests.watcher.test_real_apiserver import watching

FIXTURES = Path(__file__).parent / "fixtures"
KUEUE = "/apis/kueue.x-k8s.io"
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
    """Writes Workloads through the admin, each in the version its ``apiVersion`` names."""

    def __init__(self, kube: LocalKube, version: str) -> None:
        self.admin = kube.admin()
        self.path = f"{KUEUE}/{version}"

    def create(self, namespace: str, obj: dict[str, Any]) -> None:
        self.admin.create(f"{KUEUE}/{obj['apiVersion'].split('/')[1]}/namespaces/{namespace}/workloads", obj)

    def set_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.admin.merge_patch(f"{self.path}/namespaces/{namespace}/workloads/{name}/status", {"status": status})

    def delete(self, namespace: str, name: str) -> None:
        self.admin.delete(f"{self.path}/namespaces/{namespace}/workloads/{name}", grace_period_s=0)


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


def workload(name: str, gpus: int, count: int = 2, version: str = "v1beta1") -> dict[str, Any]:
    """A Workload as Kueue writes it for a suspended Job, in ``version``'s own fields: the priority
    class is v1beta2's ``priorityClassRef``, v1beta1's ``priorityClassName`` (+ ``priorityClassSource``)."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {"requests": {"cpu": "1"}}
    priority: dict[str, Any] = {"priorityClassRef": {
        "group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "batch-high"}} if version == "v1beta2" \
        else {"priorityClassName": "batch-high", "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass"}
    return {"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "Workload",
            "metadata": {"name": name, "labels": {"team": "nlp"}},
            "spec": {"queueName": "research", **priority, "priority": 1000,
                     "podSets": [{"name": "workers", "count": count, "template": {
                         "spec": {"containers": [{"name": "main", "image": "trainer:1", "resources": resources}]}}}]}}


def states(sink: WatcherMemorySink, uid: str | None = None) -> list[ProducedRecord]:
    return [r for r in sink.of(K8S_WORKLOADS) if uid is None or r.key == uid]


def exercise(backend: Backend, service: WatcherService, sink: WatcherMemorySink, namespace: str,
             version: str = "v1beta1") -> None:
    """Queued -> admitted -> deleted: one record per change, then a tombstone; CPU-only never."""
    assert len(service.workload_informers) == 1
    backend.create(namespace, workload("cpu-only", 0, version=version))
    backend.create(namespace, workload("train", 4, version=version))
    wait_for("the queued workload", lambda: len(states(sink)) >= 1)
    (first,) = states(sink)
    queued = first.message
    assert isinstance(queued, WorkloadState)
    assert (queued.namespace, queued.name, queued.phase) == (namespace, "train", "queued")
    assert (queued.queue_name, queued.priority_class, queued.priority) == ("research", "batch-high", 1000)
    assert queued.gpus == 8 and queued.pod_sets[0].count == 2 and queued.gang_id == f"{namespace}/train"
    admitted_at = (datetime.now(UTC) + timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    # Kueue's CRD requires one assignment per pod set once quota is reserved
    assignment = {"name": "workers", "count": 2, "flavors": {"nvidia.com/gpu": "h100"},
                  "resourceUsage": {"nvidia.com/gpu": "8"}}
    backend.set_status(namespace, "train", {"admission": {"clusterQueue": "cq-gpu", "podSetAssignments": [assignment]},
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


def exercise_on_real_server(kube: LocalKube, api: Any, namespace: str, version: str) -> None:
    """The watcher on the real server reads Workloads in ``version`` (discovery's choice), and
    :func:`exercise` holds there with Workloads written in that version."""
    with watching(api, namespace) as (service, sink):
        source = service.workload_informers[0].source
        assert isinstance(source, KubeSource) and source.version == version
        exercise(RealBackend(kube, version), service, sink, namespace, version=version)


def test_the_simulated_server_serves_workloads_like_the_real_one() -> None:
    with FakeApiServer(bookmark_interval_s=0.2, kueue=True) as server:
        api = api_client(host=server.url)
        assert serves_workloads(api)
        with watching(api, "ml") as (service, sink):
            exercise(FakeBackend(server), service, sink, "ml")
        assert any("/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads" in path and "watch=true" in path
                   for path in server.requests)


def test_without_kueue_the_watcher_asks_once_and_watches_as_before() -> None:
    with FakeApiServer(bookmark_interval_s=0.2) as server:
        api = api_client(host=server.url)
        with watching(api, "ml") as (service, _sink):
            assert service.workload_informers == []
        # discovery asks for the storage version first, then the deprecated one
        assert [p for p in server.requests if "kueue" in p] == ["/apis/kueue.x-k8s.io/v1beta2",
                                                                "/apis/kueue.x-k8s.io/v1beta1"]


def test_the_simulated_cluster_of_watch_simulate_has_a_queued_workload() -> None:
    with FakeApiServer(bookmark_interval_s=0.2, kueue=True) as server:
        SimulatedCluster(server).populate()
        with watching(api_client(host=server.url), "nlp") as (_service, sink):
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


def test_the_kueue_crds_script_names_what_is_missing_and_finds_its_cache(tmp_path: Path, kueue_crd_dir: Path) -> None:
    """scripts/kueue-crds.sh: without Go it fails saying what it fetches (the Kueue tests are never
    skipped), leaving nothing behind; once cached, it needs no toolchain and prints the same directory."""
    script = REPO_ROOT / "scripts" / "kueue-crds.sh"

    def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**os.environ, **env},
                              timeout=120, check=False)

    cold = run({"GO": str(tmp_path / "no-go"), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert cold.returncode == 1 and cold.stdout == ""
    assert "Go toolchain" in cold.stderr and f"sigs.k8s.io/kueue v{KUEUE_VERSION}" in cold.stderr
    assert not list((tmp_path / "cache").glob("gpulens/kueue-*")), "nothing half-fetched is left behind"
    cached = run({"GO": "/nonexistent/go"})
    assert cached.returncode == 0 and cached.stdout.strip().splitlines()[-1] == str(kueue_crd_dir)
    names = sorted(path.name for path in kueue_crd_dir.glob("*.yaml"))
    assert KUEUE_WORKLOAD_CRD in names and len(names) == 11, names
    served = {v["name"]: (v["served"], v["storage"]) for v in workload_crd(kueue_crd_dir)["spec"]["versions"]}
    assert served == {"v1beta1": (True, False), "v1beta2": (True, True)}


def only_v1beta1(crd: dict[str, Any]) -> dict[str, Any]:
    """Kueue's Workload CRD as a release before v1beta2 serves it: v1beta1 alone, its storage version."""
    older = copy.deepcopy(crd)
    older["spec"]["versions"] = [dict(v, storage=True) for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    return older


def workload_crd(crd_dir: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((crd_dir / KUEUE_WORKLOAD_CRD).read_text()))


def install(kube: LocalKube, crd_dir: Path, workload_crd_override: dict[str, Any] | None = None) -> None:
    """Kueue's CRDs, as its release installs them (server-side apply: the Workload's 1.4 MB schema does
    not fit client-side apply's annotation), the Workload's replaced by ``workload_crd_override``;
    returns once every one is established and the Workloads are served."""
    crds = sorted(crd_dir.glob("*.yaml"))
    others = [path for path in crds if path.name != KUEUE_WORKLOAD_CRD]
    kube.kubectl("apply", "--server-side", "--field-manager=gpulens-tests", *(f"--filename={path}" for path in others))
    if workload_crd_override is None:
        kube.kubectl("apply", "--server-side", "--field-manager=gpulens-tests",
                     f"--filename={crd_dir / KUEUE_WORKLOAD_CRD}")
    else:
        kube.kubectl("create", "--filename=-", stdin=yaml.safe_dump(workload_crd_override))

    def established() -> int:
        listed = json.loads(kube.kubectl("get", "crd", "-o", "json").stdout)["items"]
        return sum(1 for crd in listed if crd["spec"]["group"] == "kueue.x-k8s.io" and any(
            c["type"] == "Established" and c["status"] == "True"
            for c in crd.get("status", {}).get("conditions") or []))

    wait_for("Kueue's CRDs established", lambda: established() == len(crds))
    api = api_client(kubeconfig=kube.kubeconfig())
    wait_for("the Workloads served", lambda: serves_workloads(api))


@pytest.fixture(scope="module")
def kueue_kube(tmp_path_factory: pytest.TempPathFactory, kueue_crd_dir: Path) -> Iterator[LocalKube]:
    """A control plane of its own with every CRD Kueue v0.17.0 ships, as a Kueue install leaves them
    (the session's shared one stays without Kueue, as most clusters are)."""
    with LocalKube(tmp_path_factory.mktemp("kube-kueue"), build_binaries()) as plane:
        install(plane, kueue_crd_dir)
        yield plane


def test_the_real_server_with_kueues_own_crds_is_read_in_v1beta2(kueue_kube: LocalKube) -> None:
    kube = kueue_kube
    namespace = f"kq-{uuid.uuid4().hex[:6]}"
    kube.ensure_namespace(namespace)
    watcher = kube.as_watcher()
    api = api_client(kubeconfig=kube.kubeconfig())
    assert workloads_version(api) == "v1beta2"
    for version in ("v1beta2", "v1beta1"):
        assert watcher.get(f"{KUEUE}/{version}/workloads?limit=1")["kind"] == "WorkloadList"
    with pytest.raises(KubeApiError) as denied:
        watcher.create(f"{KUEUE}/v1beta2/namespaces/{namespace}/workloads", workload("nope", 1, version="v1beta2"))
    assert denied.value.status == 403
    # Kueue's schema is enforced: a v1beta1 field is not a v1beta2 one
    with pytest.raises(KubeApiError) as invalid:
        kube.admin().create(f"{KUEUE}/v1beta2/namespaces/{namespace}/workloads",
                            {**workload("bad", 1, version="v1beta2"), "spec": {"podSets": []}})
    assert invalid.value.status == 422
    exercise_on_real_server(kube, api, namespace, "v1beta2")


def test_a_workload_written_in_either_version_is_the_same_queued_demand(kueue_kube: LocalKube) -> None:
    """Kueue's controllers may still write v1beta1 (and older clients do): read through v1beta2, the
    same demand. Without Kueue's conversion webhook the server only relabels the version and prunes
    what the other version's schema lacks, so a field that moved between versions does not follow:
    the priority class is the one such field the watcher reads."""
    kube = kueue_kube
    namespace = f"kq-{uuid.uuid4().hex[:6]}"
    kube.ensure_namespace(namespace)
    with watching(api_client(kubeconfig=kube.kubeconfig()), namespace) as (_s, sink):
        backend = RealBackend(kube, "v1beta2")
        backend.create(namespace, workload("train-v1beta2", 4, version="v1beta2"))
        backend.create(namespace, workload("train-v1beta1", 4, version="v1beta1"))
        wait_for("both workloads", lambda: len(states(sink)) == 2)
        by_name = {r.message.name: r.message for r in states(sink) if isinstance(r.message, WorkloadState)}
    new, old = by_name["train-v1beta2"], by_name["train-v1beta1"]
    demand = ("phase", "queue_name", "priority", "pod_sets", "gpu_requests", "gpus", "team", "project")
    assert {k: getattr(new, k) for k in demand} == {k: getattr(old, k) for k in demand}
    assert (new.phase, new.gpus, new.gpu_requests, new.queue_name) == ("queued", 8, {"nvidia.com/gpu": 8}, "research")
    # the v1beta1 object read as v1beta2: the server prunes priorityClassName, a field v1beta2 lacks;
    # Kueue's webhook would have moved it to priorityClassRef (the numeric priority is the same field)
    assert (new.priority_class, old.priority_class) == ("batch-high", None)


def test_where_only_v1beta1_is_served_the_watcher_reads_v1beta1(tmp_path: Path, kueue_crd_dir: Path) -> None:
    namespace = f"kq-{uuid.uuid4().hex[:6]}"
    with LocalKube(tmp_path / "kube", build_binaries()) as kube:
        install(kube, kueue_crd_dir, only_v1beta1(workload_crd(kueue_crd_dir)))
        kube.ensure_namespace(namespace)
        api = api_client(kubeconfig=kube.kubeconfig())
        assert workloads_version(api) == "v1beta1"
        with pytest.raises(KubeApiError) as absent:
            kube.admin().get(f"{KUEUE}/v1beta2/workloads")
        assert absent.value.status == 404
        exercise_on_real_server(kube, api, namespace, "v1beta1")


def test_the_real_server_without_kueue_is_watched_as_before(kube: LocalKube) -> None:
    api = api_client(kubeconfig=kube.kubeconfig())
    assert not serves_workloads(api)
    assert kube_sources(api, ("default",)).workloads == []
