"""The real kube-scheduler decides, gpulens reports: fragmentation and a partly bound gang, end to end.

A control plane of its own (etcd, kube-apiserver, kube-controller-manager without node lifecycle,
kube-scheduler; ``simulation/kube_local.py``), the node side played by ``simulation/kube_node.py``
(Nodes with GPU allocatable, bound pods set Running, ended pods deleted), the real watcher
(``gpulens watch`` with the least-privilege kubeconfig) producing to the local Kafka broker, and a
live ``gpulens worker`` (``watermark_source=clock``) whose alerts are read back from the topic. The
scheduler's own verdicts (``FailedScheduling`` events, the pod's ``PodScheduled`` condition, its
bindings) are what the stream jobs see; nothing here binds a pod or writes a scheduler message.

The simulated API server's cluster (``producers/watcher/fake_cluster.py``) and the fleet simulator word
the same verdicts; the last test holds them to what the real scheduler writes.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from common.kafka import read_to_end
from common.settings import CommonSettings, KafkaSettings, load_settings
from producers.watcher.fake_cluster import make_event, make_pod, no_fit_message, set_unschedulable
from schemas.codec import decode
from schemas.outputs import Alert
from schemas.topics import ALERTS
from simulation.kafka_replay import KafkaReplay, WorkerProcess, child_env
from simulation.kube_local import LocalKube, build_binaries
from simulation.kube_node import NodeSide, with_claim_template
from simulation.scenario import parse_scenario
from simulation.simulator import FleetSimulator
from tests.stream_jobs.live import live_ready

pytestmark = pytest.mark.kafka

T = TypeVar("T")
Obj = dict[str, Any]
THRESHOLDS = {"pending_after": "2s", "fragmentation_after": "3s", "gang_after": "3s"}
NO_FIT = re.compile(r"^0/(\d+) nodes are available: (.+)\. preemption: 0/\1 nodes are available: (.+)\.$")
"""kube-scheduler's FailedScheduling message for a pod no node fits (NodeResourcesFit's reasons, then
the preemption plugin's verdict)."""
DRA_NO_FIT = ("0/3 nodes are available: 3 cannot allocate all claims. preemption: 0/3 nodes are available: "
              "3 Preemption is not helpful for scheduling.")
"""What kube-scheduler says when no node's devices satisfy a pod's claims: the DynamicResources plugin's
reason, which it marks unresolvable, so preemption tries no node."""


def wait_for(what: str, predicate: Callable[[], T | None], timeout_s: float = 90.0,
             explain: Callable[[], str] = lambda: "") -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{explain()}")


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    """A control plane of its own: the cluster's totals (free GPUs per node) hold only this file's nodes."""
    with LocalKube(tmp_path_factory.mktemp("kube-scheduler"), build_binaries(),
                   controller_manager=True, scheduler=True) as kube:
        yield kube


def no_other_nodes(kube: LocalKube) -> None:
    """Another test's nodes are gone (each removes its own): the scheduler's "0/N nodes" counts this test's."""
    wait_for("the nodes of earlier tests gone", lambda: not kube.admin().get("/api/v1/nodes")["items"], 60)


@dataclass
class Loop:
    """The watcher and a live stream worker on one topic prefix, with the node side of ``namespace``."""

    kube: LocalKube
    nodes: NodeSide
    namespace: str
    replay: KafkaReplay
    watcher: WorkerProcess
    seen: list[Alert] = field(default_factory=list)

    def alerts(self) -> list[Alert]:
        self.replay.supervise(print)
        assert self.watcher.alive(), f"the watcher stopped:\n{self.watcher.tail()}"
        self.seen = [decode(r.value, Alert) for r in read_to_end(self.replay.kafka, ALERTS.name(self.replay.prefix))
                     if r.value is not None]
        return self.seen

    def alert(self, kind: str, state: str, name: str) -> Alert | None:
        return next((a for a in self.alerts() if (a.type, a.state, a.subject.name) == (kind, state, name)), None)

    def wait_alert(self, kind: str, state: str, name: str, timeout_s: float = 90.0) -> Alert:
        return wait_for(f"{kind} {state} for {name}", lambda: self.alert(kind, state, name), timeout_s,
                        lambda: self.explain())

    def explain(self) -> str:
        return (f"alerts: {[(a.type, a.state, a.subject.name) for a in self.seen]}\n"
                f"watcher:\n{self.watcher.tail(15)}\nworker:\n{self.replay.worker.tail(15)}")

    def gpu_pod(self, name: str, gpus: int, node: str | None = None, labels: dict[str, str] | None = None) -> Obj:
        pod = _for_server(make_pod(name, namespace=self.namespace, gpus=gpus, labels=labels))
        if node is not None:
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        return self.nodes.create_pod(pod)

    def claim_pod(self, name: str, template: str, node: str | None = None) -> Obj:
        """A pod asking its GPUs through a claim made from ``template`` (DRA), no extended resource."""
        pod = with_claim_template(_for_server(make_pod(name, namespace=self.namespace, gpus=0)), template)
        if node is not None:
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        return self.nodes.create_pod(pod)

    def bound_to(self, name: str) -> str | None:
        pod = self.nodes.pod(self.namespace, name)
        return pod["spec"].get("nodeName") if pod["status"].get("phase") == "Running" else None

    def failed_scheduling(self, name: str) -> Obj | None:
        """The scheduler's latest FailedScheduling event for pod ``name`` (core/v1 view)."""
        events = self.kube.admin().get(f"/api/v1/namespaces/{self.namespace}/events")["items"]
        mine = [e for e in events if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == name]
        return mine[-1] if mine else None


@pytest.fixture
def loop(plane: LocalKube, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> Iterator[Loop]:
    no_other_nodes(plane)
    namespace = f"sched-{uuid.uuid4().hex[:6]}"
    plane.ensure_namespace(namespace)
    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump(), data_dir=tmp_path)
    config = parse_scenario({"name": "real-scheduler", "duration": "60s", "sample_interval": "2s", "window": "10s",
                             "thresholds": THRESHOLDS})
    replay = KafkaReplay(config, settings, topic_prefix=topic_prefix, work_dir=tmp_path / "stream",
                         worker_settings={"GPULENS_WATERMARK_SOURCE": "clock", "GPULENS_CLOCK_INTERVAL_S": "1",
                                          "GPULENS_LATENESS_S": "2"})
    watcher = WorkerProcess(child_env(settings, topic_prefix, tmp_path / "watcher", {
        "GPULENS_CLUSTER": "default", "GPULENS_WATCH_TIMEOUT_S": "30"}), tmp_path / "watcher.log",
        ("watch", "--kubeconfig", str(plane.kubeconfig()), "--namespace", namespace))
    nodes = NodeSide(plane, (namespace,))
    loop = Loop(plane, nodes, namespace, replay, watcher)
    try:
        replay.create_topics()
        replay.start_workers()
        watcher.start()
        wait_for("the live worker and the watcher's first state mark", lambda: live_ready(replay), 180,
                 loop.explain)
        nodes.start()
        yield loop
    finally:
        watcher.stop()
        replay.close(keep_work_dir=True)
        nodes.remove()
        replay.remove_topics()


def test_fragmentation_decided_by_the_real_scheduler_fires_and_resolves_when_it_binds(loop: Loop) -> None:
    """3 nodes x 4 GPUs with 2 used on each: 6 free, at most 2 on a node. The scheduler leaves a 4-GPU
    pod Pending with its own message; the fragmentation alert fires with it, and resolves once a
    2-GPU pod ends and the scheduler binds the big one where it freed GPUs."""
    for index in range(3):
        loop.nodes.register_node(f"gpu-{index}", gpus=4)
    for index in range(3):
        loop.gpu_pod(f"small-{index}", gpus=2, node=f"gpu-{index}")
    wait_for("the small pods bound and running", lambda: all(
        loop.bound_to(f"small-{index}") == f"gpu-{index}" for index in range(3)))

    loop.gpu_pod("big", gpus=4)
    event = wait_for("the scheduler's FailedScheduling", lambda: loop.failed_scheduling("big"))
    message = event["message"]
    assert message == no_fit_message("nvidia.com/gpu", 4, {f"gpu-{index}": 4 for index in range(3)}) == (
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
        "available: 3 No preemption victims found for incoming pod."), message
    condition = wait_for("the pod's PodScheduled condition",
                         lambda: scheduled_condition(loop.nodes, loop.namespace, "big"))
    assert (condition["status"], condition["reason"], condition["message"]) == ("False", "Unschedulable", message)

    pending = loop.wait_alert("pending_gpu", "firing", "big")
    assert pending.details["last_scheduler_reason"] == message
    assert pending.details["would_fit_unfragmented"] is True
    fired = loop.wait_alert("fragmentation", "firing", "big")
    assert (fired.subject.kind, fired.subject.namespace) == ("pod", loop.namespace)
    assert fired.details["free_gpus"] == 6 and fired.details["largest_free_block"] == 2
    assert fired.details["free_gpus_by_node"] == {"gpu-0": 2, "gpu-1": 2, "gpu-2": 2}
    assert fired.summary == "big needs 4 GPUs; 6 are free but at most 2 on one node"

    loop.nodes.delete_pod(loop.namespace, "small-1")
    assert wait_for("the scheduler to bind the big pod", lambda: loop.bound_to("big")) == "gpu-1"
    resolved = loop.wait_alert("fragmentation", "resolved", "big")
    assert resolved.id == fired.id
    # the freed GPUs reach the cluster stage a clock mark before the binding as a rule ("fits on a
    # node"), or in the same mark ("scheduled on gpu-1"); pending_gpu ends with the binding either way
    assert resolved.details["resolved_reason"] in ("fits on a node", "scheduled on gpu-1"), resolved.details
    assert loop.wait_alert("pending_gpu", "resolved", "big").details["resolved_reason"] == "scheduled on gpu-1"


def test_a_dra_claim_the_real_scheduler_cannot_allocate_is_fragmentation_too(loop: Loop) -> None:
    """The same cluster with its GPUs published by a DRA driver: 3 nodes whose ResourceSlices hold 4
    GPUs each, 2 allocated on each to claims made from a 2-GPU template; a pod whose claim template
    asks 4 stays Pending with the DynamicResources plugin's reason, the fragmentation alert fires, and
    resolves once a pod ends, the controller-manager releases its claim and the scheduler allocates."""
    loop.nodes.create_device_class()
    loop.nodes.create_claim_template(loop.namespace, "two-gpus", 2)
    loop.nodes.create_claim_template(loop.namespace, "four-gpus", 4)
    for index in range(3):
        loop.nodes.register_node(f"dra-{index}", gpus=0)
        loop.nodes.publish_slice(f"dra-{index}", 4)
    for index in range(3):
        loop.claim_pod(f"small-{index}", "two-gpus", node=f"dra-{index}")
    wait_for("the small pods bound and running", lambda: all(
        loop.bound_to(f"small-{index}") == f"dra-{index}" for index in range(3)))
    real_claims = loop.nodes.claims(loop.namespace)
    assert sorted(len(c["status"]["allocation"]["devices"]["results"]) for c in real_claims) == [2, 2, 2]

    loop.claim_pod("big", "four-gpus")
    event = wait_for("the scheduler's FailedScheduling", lambda: loop.failed_scheduling("big"))
    message = event["message"]
    (claim,) = [c for c in loop.nodes.claims(loop.namespace)
                if c["metadata"]["annotations"].get("resource.kubernetes.io/pod-claim-name") == "gpus"
                and c["metadata"]["ownerReferences"][0]["name"] == "big"]
    assert "allocation" not in claim.get("status", {}), claim  # created from the template, not allocated
    assert message == DRA_NO_FIT, message

    compare_with_the_simulator(real_claims, claim, message)

    pending = loop.wait_alert("pending_gpu", "firing", "big")
    assert pending.details["last_scheduler_reason"] == message
    assert pending.details["request"] == {"nvidia.com/gpu": 4}
    fired = loop.wait_alert("fragmentation", "firing", "big")
    assert fired.details["free_gpus"] == 6 and fired.details["largest_free_block"] == 2
    assert fired.details["free_gpus_by_node"] == {"dra-0": 2, "dra-1": 2, "dra-2": 2}

    loop.nodes.delete_pod(loop.namespace, "small-1")
    assert wait_for("the scheduler to allocate the big pod's claim", lambda: loop.bound_to("big")) == "dra-1"
    resolved = loop.wait_alert("fragmentation", "resolved", "big")
    assert resolved.id == fired.id
    assert resolved.details["resolved_reason"] in ("scheduled on dra-1", "fits on a node"), resolved.details


def compare_with_the_simulator(real_claims: list[Obj], real_pending: Obj, real_message: str) -> None:
    """The fleet simulator's twin of the DRA cluster above: its claims' status has the real ones'
    shape (allocation results naming driver, pool and device; reservedFor naming the pod), the
    pending pod's claim carries no allocation, and its FailedScheduling text is the real one's first
    sentence (the simulator stops before the preemption verdict, as its goldens hold)."""
    scenario = parse_scenario({
        "name": "dra-twin", "duration": "10s", "sample_interval": "1s",
        "nodes": [{"name": f"dra-{i}", "gpus": 4, "dra": True} for i in range(3)],
        "claims": [{"name": "two-gpus", "count": 2, "template": True},
                   {"name": "four-gpus", "count": 4, "template": True}],
        "pods": [*({"name": f"small-{i}", "claim": "two-gpus", "node": f"dra-{i}"} for i in range(3)),
                 {"name": "big", "claim": "four-gpus", "create": "1s"}]})
    simulator = FleetSimulator(scenario)
    served: dict[str, Obj] = {}
    assert simulator.dra is not None
    apply = simulator.dra.apply

    def capture(kind: str, obj: Obj, deleted: bool = False) -> Any:
        if kind == "resourceclaims":
            served[obj["metadata"]["name"]] = obj
        return apply(kind, obj, deleted)

    simulator.dra.apply = capture  # type: ignore[method-assign]
    simulated = next(p.last_message for _tick in simulator.run() for p in simulator.pods
                     if p.spec.name == "big" and p.last_message)
    assert simulated == "0/3 nodes are available: 3 cannot allocate all claims."
    assert real_message.startswith(simulated + " preemption: ")
    owner = {name: obj["metadata"]["ownerReferences"][0]["name"] for name, obj in served.items()}
    sim_allocated = [obj for name, obj in served.items() if owner[name] != "big"]
    (sim_pending,) = [obj for name, obj in served.items() if owner[name] == "big"]
    def by_pod(claim: Obj) -> str:
        return str(claim["metadata"]["ownerReferences"][0]["name"])

    for real, sim in zip(sorted(real_claims, key=by_pod), sorted(sim_allocated, key=by_pod), strict=True):
        assert set(sim["status"]) == set(real["status"]) == {"allocation", "reservedFor"}, (sim, real)
        real_results, sim_results = (c["status"]["allocation"]["devices"]["results"] for c in (real, sim))
        assert [set(r) for r in sim_results] == [set(r) for r in real_results], (sim_results, real_results)
        assert [(r["driver"], r["pool"]) for r in sim_results] == [(r["driver"], r["pool"]) for r in real_results]
        assert sim["status"]["allocation"]["nodeSelector"] == real["status"]["allocation"]["nodeSelector"]
        assert [set(r) for r in sim["status"]["reservedFor"]] == [set(r) for r in real["status"]["reservedFor"]]
        for key in ("annotations", "generateName"):  # the claim made from the pod's template
            assert sim["metadata"][key] == real["metadata"][key], (key, sim["metadata"][key], real["metadata"][key])
    assert "allocation" not in sim_pending["status"] and "allocation" not in real_pending.get("status", {})


def test_a_gang_partly_bound_by_the_real_scheduler_fires_gang_partial_until_all_run(loop: Loop) -> None:
    """A 3-pod gang of 4 GPUs each on 2 nodes of 4: the scheduler binds two, the third waits with its
    own message; gang_partial fires, and resolves once a third node joins and the scheduler binds it."""
    for index in range(2):
        loop.nodes.register_node(f"gang-{index}", gpus=4)
    group = {"scheduling.x-k8s.io/pod-group": "trainer"}
    for index in range(3):
        loop.gpu_pod(f"trainer-{index}", gpus=4, labels=group)

    def split() -> tuple[list[str], list[str]] | None:
        bound = [f"trainer-{i}" for i in range(3) if loop.bound_to(f"trainer-{i}")]
        waiting = [f"trainer-{i}" for i in range(3) if f"trainer-{i}" not in bound]
        return (bound, waiting) if len(bound) == 2 and loop.failed_scheduling(waiting[0]) else None

    bound, (waiting,) = wait_for("two members bound, the third refused", split)
    message = (loop.failed_scheduling(waiting) or {})["message"]
    assert message == no_fit_message("nvidia.com/gpu", 4, {"gang-0": 4, "gang-1": 4}) == (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
        "available: 2 No preemption victims found for incoming pod."), message

    fired = loop.wait_alert("gang_partial", "firing", "trainer")
    assert (fired.subject.kind, fired.subject.namespace) == ("gang", loop.namespace)
    assert sorted(fired.details["running"]) == bound and fired.details["pending"] == [waiting]
    assert (fired.details["gpus_held"], fired.details["gpus_waiting"]) == (8, 4)
    assert loop.alert("fragmentation", "firing", waiting) is None  # no GPU is free: the cluster is full

    loop.nodes.register_node("gang-2", gpus=4)
    assert wait_for("the scheduler to bind the third member", lambda: loop.bound_to(waiting)) == "gang-2"
    resolved = loop.wait_alert("gang_partial", "resolved", "trainer")
    assert resolved.id == fired.id and resolved.details["resolved_reason"] == "all members running"


@pytest.fixture
def node_side(plane: LocalKube) -> Iterator[NodeSide]:
    """The node side alone (no watcher, no Kafka), in a fresh namespace."""
    no_other_nodes(plane)
    namespace = f"word-{uuid.uuid4().hex[:6]}"
    plane.ensure_namespace(namespace)
    with NodeSide(plane, (namespace,)) as nodes:
        yield nodes


def test_the_simulated_side_words_the_scheduler_as_the_real_one_does(plane: LocalKube, node_side: NodeSide) -> None:
    """The real scheduler's FailedScheduling and Scheduled events and its Unschedulable condition,
    against what the simulated API server's cluster (``fake_cluster``) writes for the same cluster,
    and the fleet simulator's wording of the same verdict."""
    namespace = node_side.namespaces[0]
    node_side.register_node("word-0", gpus=4)
    node_side.register_node("word-1", gpus=4)
    node_side.register_node("word-cpu", gpus=0)
    for index in range(2):
        pod = make_pod(f"holder-{index}", namespace=namespace, gpus=3)
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": f"word-{index}"}
        node_side.create_pod(_for_server(pod))
    wanting = make_pod("wants-2", namespace=namespace, gpus=2)
    node_side.create_pod(_for_server(wanting))

    def events(reason: str, name: str) -> Obj | None:
        items = plane.admin().get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return next((e for e in items if e["reason"] == reason and e["involvedObject"]["name"] == name), None)

    real = wait_for("the scheduler's FailedScheduling", lambda: events("FailedScheduling", "wants-2"))
    scheduled = wait_for("the scheduler's Scheduled", lambda: events("Scheduled", "holder-0"))
    real_condition = wait_for("the pod's PodScheduled condition",
                              lambda: scheduled_condition(node_side, namespace, "wants-2"))

    # the message, word for word
    expected = no_fit_message("nvidia.com/gpu", 2, {"word-0": 4, "word-1": 4, "word-cpu": 0})
    assert real["message"] == expected == (
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
        "1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod.")
    assert NO_FIT.match(real["message"])
    # the fleet simulator words the first sentence alike and stops before the preemption verdict (its
    # goldens hold that wording)
    simulator = FleetSimulator(parse_scenario({
        "name": "wording", "duration": "10s", "sample_interval": "1s",
        "nodes": [{"name": "word-0", "gpus": 4}, {"name": "word-1", "gpus": 4}, {"name": "word-cpu", "gpus": 0}],
        "pods": [{"name": "holder-0", "gpus": 3, "node": "word-0"}, {"name": "holder-1", "gpus": 3, "node": "word-1"},
                 {"name": "wants-2", "gpus": 2, "create": "1s"}]}))
    simulated = next(p.last_message for _tick in simulator.run() for p in simulator.pods
                     if p.spec.name == "wants-2" and p.last_message)
    assert simulated == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert real["message"].startswith(simulated + " preemption: ")

    # the events' shape, as the core/v1 API serves the scheduler's events.k8s.io/v1 writes
    now = datetime.now(UTC)
    for real_event, fake_event in (
            (real, make_event({"metadata": {"name": "wants-2", "namespace": namespace, "uid": "u"}},
                              "FailedScheduling", expected, now)),
            (scheduled, make_event({"metadata": {"name": "holder-0", "namespace": namespace, "uid": "u"}},
                                   "Scheduled", scheduled["message"], now, type_="Normal"))):
        assert set(fake_event) <= set(real_event), set(fake_event) - set(real_event)
        for key in ("type", "reason", "action", "reportingComponent", "source", "firstTimestamp", "lastTimestamp"):
            assert fake_event[key] == real_event[key], (key, fake_event[key], real_event[key])
        assert real_event["reportingInstance"].startswith("default-scheduler-")
        assert fake_event["reportingInstance"].startswith("default-scheduler-")
        assert "count" not in real_event and "count" not in fake_event
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", real_event["eventTime"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", fake_event["eventTime"])
    assert scheduled["message"] == f"Successfully assigned {namespace}/holder-0 to word-0"

    # the pod's condition
    unschedulable: Obj = {"status": {}}
    set_unschedulable(unschedulable, expected, now)
    (fake_condition,) = unschedulable["status"]["conditions"]
    assert set(fake_condition) == set(real_condition)
    assert {k: fake_condition[k] for k in ("type", "status", "reason", "message", "lastProbeTime")} == \
        {k: real_condition[k] for k in ("type", "status", "reason", "message", "lastProbeTime")}


def scheduled_condition(nodes: NodeSide, namespace: str, name: str) -> Obj | None:
    """The pod's PodScheduled condition once the scheduler has written it: the scheduler records its
    FailedScheduling event and patches the pod's status separately, so either can be seen first."""
    conditions = nodes.pod(namespace, name)["status"].get("conditions", [])
    return next((c for c in conditions if c["type"] == "PodScheduled"), None)


def _for_server(pod: Obj) -> Obj:
    """A builder's pod as a client creates it: the server sets uid and creation time."""
    pod["metadata"].pop("uid")
    pod["metadata"].pop("creationTimestamp")
    pod["spec"]["containers"][0]["image"] = "gpulens-test/trainer:1"
    return pod
