"""A scenario played through a real control plane, compared with the in-process replay.

The in-process replay translates the simulator's Kubernetes objects with the watcher's own code;
this plays the same scenario at real speed against a real kube-apiserver (``simulation/kube_local.py``):
the simulator's nodes (with their GPU capacity) and pods become API objects, pods are bound through
``pods/binding``, their status is written as a kubelet would, scheduling failures are posted as
Events and pods with a ``delete`` time are deleted. The watcher (``WatcherService`` through the least-privilege
kubeconfig) turns what the server serves into records; those, with the simulator's GPU samples and
progress records, feed the same pipeline stages, and the report is built the same way.
A scenario with DRA writes the DRA driver's DeviceClasses and ResourceSlices, the users'
ResourceClaimTemplates, and every ResourceClaim with the allocation and reservations the scheduler
and the resourceclaim controller would write into its status (``resourceclaims/status``).

The server owns uids and stamps creation, binding and deletion times itself at 1-second
resolution, so the scenario starts at a whole second from now, each tick is applied at its
wall-clock time, and the watcher runs on a clock of the same resolution (its records carry the
second they were seen in, as the in-process replay stamps the tick's time); a tick whose writes
and watch events take more than a second would show as a difference. Pod uids are the server's:
the simulator's pod takes the server's uid as soon as it is created, so its samples, progress
records and bookkeeping name the same pod.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from producers.watcher.informer import SystemClock
from producers.watcher.kube import api_client
from producers.watcher.service import WatcherConfig, WatcherMemorySink, WatcherService, kube_sources
from schemas.codec import decode, encode
from schemas.messages import K8sEvent, Message, NodeState, PodState
from schemas.topics import K8S_EVENTS, K8S_NODES, K8S_PODS
from simulation.fleet_state import SimClaim, SimNode, SimPod, SimulatedRecord
from simulation.k8s_objects import (
    DRA_API,
    claim_object,
    claim_template_object,
    device_class_objects,
    resource_slice_object,
    slot_devices,
)
from simulation.kube_local import KubeApi, KubeApiError, LocalKube
from simulation.replay import ReplayResult, build_report, engine_config
from simulation.scenario import Scenario
from simulation.simulator import FleetSimulator
from stream_jobs.pipeline import LocalPipeline
from stream_jobs.timeutil import epoch

K8S_TOPICS = {K8S_PODS.suffix, K8S_NODES.suffix, K8S_EVENTS.suffix}
STATUS_FIELDS = ("phase", "conditions", "startTime", "containerStatuses", "reason", "message",
                 "resourceClaimStatuses", "extendedResourceClaimStatus")
DRA_PATH = f"/apis/{DRA_API}"


class ApiServerSimulator(FleetSimulator):
    """The fleet simulator writing its Kubernetes objects to a real API server as it builds them."""

    def __init__(self, scenario: Scenario, kube: LocalKube) -> None:
        super().__init__(scenario)
        self.kube = kube
        self._created: set[int] = set()
        self._bound: set[int] = set()
        self._status: dict[int, dict[str, Any]] = {}
        self._nodes: set[str] = set()
        self._claims: dict[str, dict[str, Any]] = {}
        """Claims written, by the simulator's uid: the status last written."""

    def _node_object(self, node: SimNode, ts: datetime) -> dict[str, Any]:
        obj = super()._node_object(node, ts)
        if node.spec.name not in self._nodes:
            self.kube.create_node(obj)
            self._nodes.add(node.spec.name)
        return obj

    def _create_pod(self, pod: SimPod, ts: datetime) -> None:
        """Create the pod on the server once; from then on it carries the server's uid."""
        if pod.index not in self._created:
            body = super()._pod_object(pod, ts)
            body["spec"].pop("nodeName", None)
            pod.uid = self.kube.create_pod(body)["metadata"]["uid"]
            self._created.add(pod.index)

    def _pod_object(self, pod: SimPod, ts: datetime) -> dict[str, Any]:
        index = pod.index
        namespace, name = pod.spec.namespace, pod.spec.name
        self._create_pod(pod, ts)
        obj = super()._pod_object(pod, ts)
        node = obj["spec"].get("nodeName")
        if node and index not in self._bound:
            self.kube.bind(namespace, name, node)
            self._bound.add(index)
        if pod.deleted:
            self.kube.delete_pod(namespace, name)
            return obj
        status = {key: obj["status"][key] for key in STATUS_FIELDS if key in obj["status"]}
        if status != self._status.get(index, {"phase": "Pending", "conditions": []}):
            self.kube.set_pod_status(namespace, name, status)
            self._status[index] = status
        return obj

    def _event_object(self, pod: SimPod, ts: datetime) -> dict[str, Any]:
        obj = super()._event_object(pod, ts)
        body = {key: value for key, value in obj.items() if key not in ("apiVersion", "kind")}
        body["metadata"] = {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]}
        self.kube.admin().create(f"/api/v1/namespaces/{pod.spec.namespace}/events",
                                 {"apiVersion": "v1", "kind": "Event", **body})
        return obj

    def delete_removed_nodes(self) -> None:
        for node in self.nodes.values():
            if node.removed and node.spec.name in self._nodes:
                self.kube.delete_node(node.spec.name)
                self._nodes.discard(node.spec.name)
                if node.spec.dra:  # the driver's slice goes with its node
                    self.kube.admin().delete(f"{DRA_PATH}/resourceslices/{self._slice_name(node)}")

    # ------------------------------------------------------------------ DRA objects

    def _slice_name(self, node: SimNode) -> str:
        return str(resource_slice_object(node, self.scenario.start)["metadata"]["name"])

    def _publish_dra(self, ts: datetime) -> None:
        if self.dra is not None:
            api = self.kube.admin()
            for obj in device_class_objects(self.scenario.start, self.scenario.dra_extended_resources):
                _create(api, f"{DRA_PATH}/deviceclasses", obj)
            for node in self.nodes.values():
                if node.spec.dra:
                    _create(api, f"{DRA_PATH}/resourceslices", resource_slice_object(node, self.scenario.start))
            for spec in self.scenario.claims:
                self.kube.ensure_namespace(spec.namespace)
                if spec.template:
                    _create(api, f"{DRA_PATH}/namespaces/{spec.namespace}/resourceclaimtemplates",
                            claim_template_object(spec, self.scenario.name, self.scenario.start))
        super()._publish_dra(ts)

    def _relayouts(self, t: float, ts: datetime) -> list[SimulatedRecord]:
        before = {name: node.slice_generation for name, node in self.nodes.items()}
        out = super()._relayouts(t, ts)
        for name, node in self.nodes.items():
            if node.slice_generation != before[name]:  # the driver republishes its devices
                obj = resource_slice_object(node, self.scenario.start, node.slice_generation)
                self.kube.admin().merge_patch(f"{DRA_PATH}/resourceslices/{self._slice_name(node)}",
                                              {"spec": obj["spec"]})
        return out

    def _flush_claims(self, ts: datetime, dirty: list[SimClaim]) -> None:
        by_index = {p.index: p for p in self.pods}
        for claim in {c.uid: c for c in dirty}.values():
            for index in claim.reserved:  # reservedFor names the pods by the server's uids
                self._create_pod(by_index[index], ts)
            self._write_claim(claim, ts, by_index)
        super()._flush_claims(ts, dirty)

    def _write_claim(self, claim: SimClaim, ts: datetime, by_index: dict[int, SimPod]) -> None:
        """The claim as the resourceclaim controller creates and deletes it and the scheduler
        allocates and reserves it (its owner reference left out: the pod may not exist yet)."""
        api = self.kube.admin()
        path = f"{DRA_PATH}/namespaces/{claim.spec.namespace}/resourceclaims"
        if claim.deleted:
            if self._claims.pop(claim.uid, None) is not None:
                api.delete(f"{path}/{claim.name}", grace_period_s=0)
            return
        devices = slot_devices(self.nodes[claim.node]) if claim.node is not None else []
        obj = claim_object(claim, ts, self.scenario.start, devices, by_index)
        if claim.uid not in self._claims:
            meta = {key: obj["metadata"][key] for key in ("name", "namespace", "annotations")
                    if key in obj["metadata"]}
            api.create(path, {"apiVersion": DRA_API, "kind": "ResourceClaim", "metadata": meta, "spec": obj["spec"]})
            self._claims[claim.uid] = {}
        status = {"allocation": obj["status"].get("allocation"), "reservedFor": obj["status"].get("reservedFor")}
        if status != self._claims[claim.uid]:
            api.merge_patch(f"{path}/{claim.name}/status", {"status": status})
            self._claims[claim.uid] = status


class WholeSecondClock(SystemClock):
    """The watcher's clock at the server's own resolution (whole seconds): a record is stamped
    with the second its change was applied in, as the server stamps creation, binding and deletion,
    not with the milliseconds the HTTP round trips took after the tick's instant."""

    def now(self) -> datetime:
        return datetime.now(UTC).replace(microsecond=0)


def starting_now(scenario: Scenario, lead_s: float = 2.0) -> Scenario:
    """The scenario moved to start at a whole second ``lead_s`` or a little more from now."""
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=int(lead_s) + 1)
    return dataclasses.replace(scenario, start=start)


def _essence(message: Message | None) -> Any:
    """What the watcher must have caught up with before a tick's records are fed."""
    if message is None:
        return None
    if isinstance(message, PodState):
        return (message.phase, message.node, message.deleted)
    return getattr(message, "deleted", True)


def run_through_apiserver(scenario: Scenario, kube: LocalKube, lateness_s: float = 30.0,
                          catch_up_s: float = 30.0) -> ReplayResult:
    """Play ``scenario`` (its ``start`` should be :func:`starting_now`) through ``kube``."""
    for namespace in sorted({pod.namespace for pod in scenario.pods}):
        kube.ensure_namespace(namespace)
    simulator = ApiServerSimulator(scenario, kube)
    pipeline = LocalPipeline(engine_config(scenario))
    namespaces = tuple(sorted({pod.namespace for pod in scenario.pods}))
    sink = WatcherMemorySink()
    api = api_client(kubeconfig=kube.kubeconfig())
    service = WatcherService(kube_sources(api, namespaces), sink,
                             WatcherConfig(namespaces=namespaces, watch_timeout_s=30), clock=WholeSecondClock())
    stop = threading.Event()
    service.start(stop)
    if datetime.now(UTC) >= scenario.start:
        service.shutdown(stop)
        raise ValueError(f"scenario start {scenario.start.isoformat()} has passed: the server stamps times "
                         "itself, so the scenario must start in the future (starting_now, with more lead)")
    fed = len(sink.records)
    try:
        ticks = simulator.run()
        for index in range(scenario.ticks):
            _sleep_until(scenario.start + timedelta(seconds=index * scenario.sample_interval_s))
            tick = next(ticks)
            simulator.delete_removed_nodes()
            wanted = {(r.topic, r.key): _essence(_decode(r.topic, r.value))
                      for r in tick.records if r.topic in K8S_TOPICS}
            _wait(functools.partial(_caught_up, sink, wanted), catch_up_s, f"the watcher at t={tick.offset_s:g}s")
            fresh, fed = sink.records[fed:], len(sink.records)
            for record in fresh:
                value = encode(record.message) if record.message is not None else None
                pipeline.feed(record.topic, value, at=tick.ts, key=record.key)
            for raw in tick.records:
                if raw.topic not in K8S_TOPICS:
                    pipeline.feed(raw.topic, raw.value, at=tick.ts, key=raw.key)
            pipeline.advance(epoch(tick.ts) - lateness_s)
    finally:
        service.shutdown(stop, timeout_s=10)
    end = scenario.start + timedelta(seconds=scenario.end_offset_s)
    pipeline.flush(epoch(end))
    report = build_report(scenario, pipeline.outputs, simulator.pod_uids(), pipeline.stats())
    return ReplayResult(report, pipeline.outputs, pipeline.deadletters)


def _create(api: KubeApi, path: str, obj: dict[str, Any]) -> None:
    """Create a DRA object as served (less what the server owns); one already there is kept."""
    meta = {key: value for key, value in obj["metadata"].items()
            if key not in ("uid", "creationTimestamp", "ownerReferences")}
    try:
        api.create(path, {**obj, "metadata": meta})
    except KubeApiError as exc:
        if exc.status != 409:
            raise


def _decode(topic: str, value: bytes | None) -> Message | None:
    if value is None:
        return None
    types: dict[str, type[Message]] = {K8S_PODS.suffix: PodState, K8S_NODES.suffix: NodeState,
                                       K8S_EVENTS.suffix: K8sEvent}
    return decode(value, types[topic])


def _caught_up(sink: WatcherMemorySink, wanted: dict[tuple[str, str | None], Any]) -> bool:
    latest = {(record.topic, record.key): _essence(record.message) for record in list(sink.records)}
    return all(key in latest and (key[0] == K8S_EVENTS.suffix or latest[key] == essence)
               for key, essence in wanted.items())


def _sleep_until(at: datetime) -> None:
    delay = (at - datetime.now(UTC)).total_seconds()
    if delay > 0:
        time.sleep(delay)


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)
