"""A scenario played through a real control plane, compared with the in-process replay.

The in-process replay translates the simulator's Kubernetes objects with the watcher's own code;
this plays the same scenario at real speed against a real kube-apiserver (``simulation/kube_local.py``):
the simulator's nodes (with their GPU capacity) and pods become API objects, pods are bound through
``pods/binding``, their status is written as a kubelet would, scheduling failures are posted as
Events and pods with a ``delete`` time are deleted. The watcher (``WatcherService`` through the least-privilege
kubeconfig) turns what the server serves into records; those, with the simulator's GPU samples and
progress records, feed the same pipeline stages, and the report is built the same way.

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
from simulation.fleet_state import SimNode, SimPod
from simulation.kube_local import LocalKube
from simulation.replay import ReplayResult, build_report, engine_config
from simulation.scenario import Scenario
from simulation.simulator import FleetSimulator
from stream_jobs.pipeline import LocalPipeline
from stream_jobs.timeutil import epoch

K8S_TOPICS = {K8S_PODS.suffix, K8S_NODES.suffix, K8S_EVENTS.suffix}
STATUS_FIELDS = ("phase", "conditions", "startTime", "containerStatuses", "reason", "message")


class ApiServerSimulator(FleetSimulator):
    """The fleet simulator writing its Kubernetes objects to a real API server as it builds them."""

    def __init__(self, scenario: Scenario, kube: LocalKube) -> None:
        super().__init__(scenario)
        self.kube = kube
        self._created: set[int] = set()
        self._bound: set[int] = set()
        self._status: dict[int, dict[str, Any]] = {}
        self._nodes: set[str] = set()

    def _node_object(self, node: SimNode, ts: datetime) -> dict[str, Any]:
        obj = super()._node_object(node, ts)
        if node.spec.name not in self._nodes:
            self.kube.create_node(obj)
            self._nodes.add(node.spec.name)
        return obj

    def _pod_object(self, pod: SimPod, ts: datetime) -> dict[str, Any]:
        index = pod.index
        namespace, name = pod.spec.namespace, pod.spec.name
        if index not in self._created:
            body = super()._pod_object(pod, ts)
            body["spec"].pop("nodeName", None)
            pod.uid = self.kube.create_pod(body)["metadata"]["uid"]
            self._created.add(index)
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
