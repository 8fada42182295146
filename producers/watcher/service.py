"""The watcher service: informers for nodes, pods, events (and Kueue workloads) -> translation -> Kafka.

Wiring and policy live here; protocol details are in ``informer`` and translation in
``translate``. Policy:

- start-up lists nodes first, then pods, then events, so the GPU-node set is known when pods are
  judged and the GPU-pod set is known when events are judged; then every collection is watched
  on its own thread;
- a pod is reported when it requests a GPU resource or runs on a GPU node; a node when it has GPU
  resources or GPU labels; an event when it concerns a reported pod or a GPU node (or its text
  names an ``nvidia.com/`` resource) and is a scheduling failure, preemption, eviction, OOM kill,
  successful scheduling, or any Warning;
- where the cluster serves Dynamic Resource Allocation (``resource.k8s.io/v1``, found by discovery;
  a cluster without it, or a ClusterRole that may not list it, is watched exactly as before),
  DeviceClasses, ResourceSlices and ResourceClaims are listed before nodes and pods and followed
  into a :class:`~producers.watcher.dra.DraIndex`: a node's DRA GPUs count in its capacity, a pod's
  claims in its requests (docs/dra.md), and a change to one of them republishes the nodes and pods
  it concerns;
- where the cluster serves Kueue's Workload CRD (found by discovery at start; a cluster without it
  is watched exactly as before), every Workload asking for a GPU is reported on ``k8s.workloads.v1``
  with its demand, queue and phase, so jobs that wait suspended with no pods are still seen;
- nothing is produced unless the message differs from the last one for its key (``ChangeFilter``);
- no object hides by its size: what a message carries is cut to the contract's bounds
  (``producers.watcher.bounds``: labels to a budget, the keys gpulens reads first; text, lists,
  quantities), flagged ``truncated``, counted (``watcher_trimmed_total{topic,what}``) and logged
  once per object, and a last guard shrinks a message whose encoding is still over budget;
- a pod or node that is gone produces its final state (``deleted: true``) and then a tombstone,
  exactly once, whether the API told us (DELETED) or a re-list after 410 Gone showed it vanished;
- about once a second (and only once what it emitted is delivered) a **state mark** on the
  internal control topic (``schemas.control``) says up to which offsets the pod and node changes
  observed so far were written, so that live stream workers can run a node's rules as soon as its
  own samples and the pod state are both there, not a whole allowed lateness later;
- self-metrics: watch events seen, re-lists, deletes found by re-list, errors, event lag, store
  sizes, messages produced.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, Protocol, TypeVar

import orjson

from common.backoff import Backoff
from common.kafka import BoundedProducer
from common.logs import get_logger
from common.metrics import MetricsRegistry
from common.settings import NVIDIA_DRA_DRIVERS, DraDriver, WatcherSettings
from producers.watcher.bounds import Trim, over_budget, shrink
from producers.watcher.dra import DRA_KINDS, DraChange, DraDriverTable, DraIndex
from producers.watcher.events import event_key, event_to_message
from producers.watcher.informer import (
    Clock,
    Informer,
    SystemClock,
    WatchRequestError,
    WatchSource,
    drop_managed_fields,
    name_key,
    uid_key,
)
from producers.watcher.kube_json import JsonObject
from producers.watcher.translate import (
    NODE_LABEL_PREFIXES,
    ChangeFilter,
    TranslateConfig,
    deleted_node,
    deleted_state,
    label_keys_read,
    node_to_state,
    object_time,
    pod_progress,
    pod_to_state,
)
from producers.watcher.workloads import deleted_workload, workload_to_state
from schemas.codec import encode
from schemas.control import DeliveredOffsets, state_mark_value
from schemas.messages import DEFAULT_CLUSTER, Message, scoped_key
from schemas.topics import (
    INTERNAL_CONTROL,
    K8S_EVENTS,
    K8S_NODES,
    K8S_PODS,
    K8S_WORKLOADS,
    WORKLOAD_PROGRESS,
    TopicSpec,
)

log = get_logger(__name__)


# --------------------------------------------------------------------------- sinks


class WatcherSink(Protocol):
    def emit(self, topic: TopicSpec, key: str, message: Message | None) -> None: ...

    def flush(self) -> None: ...

    def progress(self, before: datetime, cluster: str) -> None:
        """Every change observed before ``before`` has been emitted (a state mark on Kafka)."""


class WatcherKafkaSink:
    """Produces through :class:`BoundedProducer`; ``None`` is a tombstone. ``delivered``: the
    producer's delivery reports of the state topics, for the state marks (``schemas.control``)."""

    def __init__(self, producer: BoundedProducer, prefix: str, delivered: DeliveredOffsets | None = None) -> None:
        self.producer = producer
        self.prefix = prefix
        self.delivered = delivered
        self.control_topic = INTERNAL_CONTROL.name(prefix)

    def emit(self, topic: TopicSpec, key: str, message: Message | None) -> None:
        value = encode(message) if message is not None else None
        if not self.producer.produce(topic.name(self.prefix), key, value):
            log.warning("producer queue full; record dropped", topic=topic.suffix, key=key)

    def flush(self) -> None:
        self.producer.flush()

    def progress(self, before: datetime, cluster: str) -> None:
        """Deliver what was emitted, then write a state mark with the offsets it reached. Nothing
        when a record is still undelivered (the broker is away): the next round tries again, and
        the workers wait out their allowed lateness meanwhile."""
        if self.delivered is None or self.producer.flush(5.0):
            return
        value = state_mark_value(self.delivered.next_seq(), before.timestamp(), cluster, self.delivered.snapshot())
        if not self.producer.produce(self.control_topic, None, value):
            log.warning("producer queue full; state mark dropped")


class WatcherStdoutSink:
    """One JSON line per record: ``{"topic", "key", "value"}`` (``value`` null for a tombstone)."""

    def __init__(self, prefix: str, stream: IO[str] | None = None,
                 on_closed: Callable[[], None] | None = None) -> None:
        self.prefix = prefix
        self.stream = stream or sys.stdout
        self.on_closed = on_closed
        self.closed = False
        self._lock = threading.Lock()

    def emit(self, topic: TopicSpec, key: str, message: Message | None) -> None:
        record = {"topic": topic.name(self.prefix), "key": key,
                  "value": message.model_dump(mode="json") if message is not None else None}
        with self._lock:
            if self.closed:
                return
            try:
                self.stream.write(orjson.dumps(record).decode() + "\n")
                self.stream.flush()
            except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly
                self.closed = True
                if self.on_closed is not None:
                    self.on_closed()

    def flush(self) -> None:
        if not self.closed:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self.closed = True

    def progress(self, before: datetime, cluster: str) -> None:
        pass


@dataclass
class ProducedRecord:
    topic: str
    key: str
    message: Message | None


class WatcherMemorySink:
    """Keeps records in a list (tests, the in-process demo)."""

    def __init__(self) -> None:
        self.records: list[ProducedRecord] = []
        self._lock = threading.Lock()

    def emit(self, topic: TopicSpec, key: str, message: Message | None) -> None:
        with self._lock:
            self.records.append(ProducedRecord(topic.suffix, key, message))

    def flush(self) -> None:
        pass

    def progress(self, before: datetime, cluster: str) -> None:
        pass

    def of(self, topic: TopicSpec) -> list[ProducedRecord]:
        with self._lock:
            return [r for r in self.records if r.topic == topic.suffix]


# --------------------------------------------------------------------------- metrics


class WatcherMetrics:
    """Prometheus self-metrics; also the informers' :class:`~producers.watcher.informer.Observer`."""

    def __init__(self, registry: MetricsRegistry | None = None) -> None:
        self.registry = registry or MetricsRegistry()
        r = self.registry
        self.events = r.counter("watcher_watch_events_total", "Watch events received", ("resource", "type"))
        self.relists = r.counter("watcher_relists_total", "Full lists (initial and after 410 Gone)",
                                 ("resource", "reason"))
        self.vanished = r.counter("watcher_relist_deletes_total",
                                  "Objects found deleted by a re-list (deleted while not watching)", ("resource",))
        self.errors = r.counter("watcher_errors_total", "List/watch/handler errors", ("resource", "kind"))
        self.lag_seconds = r.gauge("watcher_lag_seconds", "Now minus the time carried by the last event seen",
                                   ("resource",))
        self.objects = r.gauge("watcher_objects", "Objects held in the informer's store", ("resource",))
        self.messages = r.counter("watcher_messages_total", "Records produced", ("topic", "kind"))
        self.progress_malformed = r.counter("watcher_progress_malformed_total",
                                            "Malformed gpulens.io/* progress annotation values seen", ("reason",))
        self.trimmed = r.counter("watcher_trimmed_total",
                                 "Messages published cut to the contract's bounds (truncated), by topic and what "
                                 "was cut (labels, text, items, quantity, size)", ("topic", "what"))

    def event(self, resource: str, kind: str) -> None:
        self.events.labels(resource, kind).inc()

    def relist(self, resource: str, reason: str, vanished: int) -> None:
        self.relists.labels(resource, reason).inc()
        if vanished:
            self.vanished.labels(resource).inc(vanished)

    def error(self, resource: str, kind: str) -> None:
        self.errors.labels(resource, kind).inc()

    def lag(self, resource: str, seconds: float) -> None:
        self.lag_seconds.labels(resource).set(seconds)

    def store_size(self, resource: str, size: int) -> None:
        self.objects.labels(resource).set(size)

    def malformed_progress(self, reason: str) -> None:
        self.progress_malformed.labels(reason).inc()

    def trim(self, topic: TopicSpec, what: set[str]) -> None:
        for word in sorted(what):
            self.trimmed.labels(topic.suffix, word).inc()

    def produced(self, topic: TopicSpec, tombstone: bool) -> None:
        self.messages.labels(topic.suffix, "tombstone" if tombstone else "state").inc()


# --------------------------------------------------------------------------- handlers


@dataclass
class WatcherConfig:
    translate: TranslateConfig = field(default_factory=TranslateConfig)
    namespaces: tuple[str, ...] = ()
    watch_timeout_s: int = 300
    events_api: str = "events.k8s.io"
    cluster: str = DEFAULT_CLUSTER
    """Stamped on every message; keys are scoped by it (``schemas.messages.scoped_key``)."""
    state_mark_interval_s: float = 1.0
    """How often the watcher writes a state mark (``schemas.control``)."""
    dra_drivers: tuple[DraDriver, ...] = NVIDIA_DRA_DRIVERS
    """The DRA drivers whose devices are GPUs (``GPULENS_DRA_DRIVERS``; docs/dra.md)."""

    @classmethod
    def from_settings(cls, settings: WatcherSettings) -> WatcherConfig:
        return cls(
            translate=TranslateConfig(
                team_keys=tuple(settings.team_label_keys),
                project_keys=tuple(settings.project_label_keys),
                gang_keys=tuple(settings.gang_label_keys),
                extra_gpu_resources=tuple(settings.extra_gpu_resources),
            ),
            namespaces=tuple(settings.namespaces),
            watch_timeout_s=settings.watch_timeout_s,
            events_api=settings.events_api,
            cluster=settings.cluster_name(real=not settings.simulate),
            state_mark_interval_s=settings.state_mark_interval_s,
            dra_drivers=tuple(settings.dra_drivers),
        )


class Pipeline:
    """The state shared by the three handlers: GPU nodes, reported pods, change filters."""

    def __init__(self, sink: WatcherSink, config: WatcherConfig, clock: Clock, metrics: WatcherMetrics) -> None:
        self.sink = sink
        self.config = config
        self.clock = clock
        self.metrics = metrics
        self.lock = threading.RLock()
        self.gpu_nodes: set[str] = set()
        self.pods = ChangeFilter()
        self.nodes = ChangeFilter()
        self.events = ChangeFilter()
        self.workloads = ChangeFilter()
        self.progress: dict[str, tuple[float | None, float | None, float | None]] = {}
        """Last totals emitted per pod uid from its annotations (emit only on change)."""
        self.progress_warned: dict[str, frozenset[tuple[str, str]]] = {}
        """Malformed annotations last logged per pod uid (log once per pod, not per update)."""
        self.trim_warned: dict[tuple[str, str], frozenset[str]] = {}
        """What was last logged as cut per (topic, key): log once per object and set of cuts."""
        self.pod_stores: list[Callable[[], list[JsonObject]]] = []
        self.pod_lookups: list[Callable[[str], JsonObject | None]] = []
        """Each pod informer's object by uid (to republish a pod its claims changed)."""
        self.node_lookup: Callable[[str], JsonObject | None] = lambda name: None
        self.dra: DraIndex | None = None
        """Set when the cluster serves DRA and the watcher follows it."""
        self.pod_handler = _PodHandler(self)
        self.node_handler = _NodeHandler(self)
        self.event_handler = _EventHandler(self)
        self.workload_handler = _WorkloadHandler(self)

    def emit(self, topic: TopicSpec, key: str, message: Message | None, trim: Trim | None = None) -> None:
        cluster = self.config.cluster
        if message is not None and cluster != DEFAULT_CLUSTER:
            message = message.model_copy(update={"cluster": cluster})
        if message is not None and over_budget(message):  # the budgets of the fields combined: rare
            keep = label_keys_read(self.config.translate) if topic is not K8S_NODES else ()
            message = shrink(message, keep, NODE_LABEL_PREFIXES if topic is K8S_NODES else ())
            trim = trim if trim is not None else Trim()
            trim.note("size")
        if message is None:
            self.trim_warned.pop((topic.suffix, key), None)
        elif trim:
            self._trimmed(topic, key, message, trim)
        self.sink.emit(topic, scoped_key(cluster, key), message)
        self.metrics.produced(topic, message is None)

    def _trimmed(self, topic: TopicSpec, key: str, message: Message, trim: Trim) -> None:
        self.metrics.trim(topic, trim.what)
        what = frozenset(trim.what)
        if self.trim_warned.get((topic.suffix, key)) == what:
            return
        if len(self.trim_warned) >= 100_000:  # bounded however many objects are cut
            self.trim_warned.clear()
        self.trim_warned[(topic.suffix, key)] = what
        log.warning("published trimmed to the message bounds", topic=topic.suffix, key=key,
                    name=getattr(message, "name", None) or getattr(message, "node", None),
                    namespace=getattr(message, "namespace", None), cut=sorted(what))

    def forget_trim(self, topic: TopicSpec, key: str) -> None:
        self.trim_warned.pop((topic.suffix, key), None)

    def republish(self, change: DraChange) -> None:
        """Translate again the nodes and pods a DRA change concerns (the change filter drops those
        whose message stays the same). Called under the lock."""
        for name in sorted(change.nodes):
            node = self.node_lookup(name)
            if node is not None:
                self.node_handler.upsert(node)
        uids = set(change.pods)
        if change.all_pods and self.dra is not None:
            uids.update(self.dra.tracked_pods())
        for uid in sorted(uids):
            for lookup in self.pod_lookups:
                pod = lookup(uid)
                if pod is not None:
                    self.pod_handler.upsert(pod)
                    break


class _PodHandler:
    def __init__(self, pipeline: Pipeline) -> None:
        self.p = pipeline

    def slim(self, obj: JsonObject) -> JsonObject:
        """Store a pod we do not report as a stub (identity, node, phase, containers): most pods of a
        mixed cluster hold no GPU, and the store must not grow with their full specs. The stub is
        enough to report the pod if its node turns out to be a GPU node (conditions arrive with its
        next change)."""
        uid = uid_key(obj)
        if uid in self.p.pods or (self.p.dra is not None and obj.get("spec", {}).get("resourceClaims")):
            return drop_managed_fields(obj)  # reported, or may be once its claims are seen: kept whole
        meta = obj.get("metadata", {})
        spec = obj.get("spec", {})
        status = obj.get("status", {})
        return {
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp",
                                              "labels", "ownerReferences") if k in meta},
            "spec": {"nodeName": spec.get("nodeName"),
                     "containers": [{"name": c.get("name"), "image": c.get("image")}
                                    for c in spec.get("containers", [])]},
            "status": {"phase": status.get("phase"), "startTime": status.get("startTime"),
                       "containerStatuses": [{k: c.get(k) for k in ("name", "containerID", "restartCount", "state")}
                                             for c in status.get("containerStatuses", [])]},
        }

    def progress(self, uid: str, obj: JsonObject) -> None:
        """Emit the progress the pod's annotations publish when a total changed.

        The pod's writers are trusted here (anyone who may patch it may set them), unlike the
        agent's kernel-attributed paths; a malformed value is counted and logged once per pod.
        """
        p = self.p
        message, bad = pod_progress(obj, p.clock.now())
        if bad:
            seen = frozenset(bad.items())
            for reason in bad.values():
                p.metrics.malformed_progress(reason)
            if p.progress_warned.get(uid) != seen:
                p.progress_warned[uid] = seen
                meta = obj.get("metadata", {})
                log.warning("malformed progress annotations", uid=uid, namespace=meta.get("namespace"),
                            pod=meta.get("name"), reasons=dict(bad))
        if message is None:
            return
        totals = (message.steps_total, message.tokens_total, message.samples_total)
        if p.progress.get(uid) == totals:
            return
        p.progress[uid] = totals
        p.emit(WORKLOAD_PROGRESS, message.pod_uid, message)

    def upsert(self, obj: JsonObject) -> None:
        p = self.p
        with p.lock:
            uid = uid_key(obj)
            self.progress(uid, obj)
            others = p.dra.track_pod(obj) if p.dra is not None else DraChange()
            trim = Trim()
            state = pod_to_state(obj, p.clock.now(), p.config.translate, p.gpu_nodes, trim, dra=p.dra)
            if state is None:
                if uid in p.pods:  # no longer relevant (its node lost its GPUs): drop it downstream
                    p.emit(K8S_PODS, uid, None)
                    p.pods.forget(uid)
            elif p.pods.changed(uid, state):
                p.emit(K8S_PODS, uid, state, trim)
            if others:  # pods sharing a claim with it: which of them counts the claim may have changed
                p.republish(others)

    def delete(self, obj: JsonObject, observed: str) -> None:
        p = self.p
        with p.lock:
            uid = uid_key(obj)
            p.progress.pop(uid, None)
            p.progress_warned.pop(uid, None)
            if p.dra is not None:  # its final state keeps what its claims counted while it was live
                p.dra.end_pod(uid)
            if uid in p.pods:  # reported: its final state (with what its claims counted), then a tombstone
                now = p.clock.now()
                trim = Trim()
                state = pod_to_state(obj, now, p.config.translate,
                                     p.gpu_nodes | {str(obj.get("spec", {}).get("nodeName"))}, trim, dra=p.dra)
                if state is not None:
                    p.emit(K8S_PODS, uid, deleted_state(state, now), trim)
                p.emit(K8S_PODS, uid, None)
                p.pods.forget(uid)
                log.debug("pod gone", uid=uid, name=obj.get("metadata", {}).get("name"), observed=observed)
            others = p.dra.forget_pod(uid) if p.dra is not None else DraChange()
            if others:  # the pods sharing its claims: one of them may count them now
                p.republish(others)


class _NodeHandler:
    def __init__(self, pipeline: Pipeline) -> None:
        self.p = pipeline

    def upsert(self, obj: JsonObject) -> None:
        p = self.p
        with p.lock:
            name = name_key(obj)
            trim = Trim()
            state = node_to_state(obj, p.clock.now(), p.config.translate, trim, dra=p.dra)
            if state is None:
                if name in p.nodes:
                    p.gpu_nodes.discard(name)
                    p.emit(K8S_NODES, name, None)
                    p.nodes.forget(name)
                return
            newly_gpu = name not in p.gpu_nodes
            p.gpu_nodes.add(name)
            if p.nodes.changed(name, state):
                p.emit(K8S_NODES, name, state, trim)
            if newly_gpu:
                # pods already on this node that requested no GPU become relevant now
                for store in p.pod_stores:
                    for pod in store():
                        if pod.get("spec", {}).get("nodeName") == name:
                            p.pod_handler.upsert(pod)

    def delete(self, obj: JsonObject, observed: str) -> None:
        p = self.p
        with p.lock:
            name = name_key(obj)
            p.gpu_nodes.discard(name)
            if name not in p.nodes:
                return
            now = p.clock.now()
            trim = Trim()
            state = node_to_state(obj, now, p.config.translate, trim, dra=p.dra)
            if state is not None:
                p.emit(K8S_NODES, name, deleted_node(state, now), trim)
            p.emit(K8S_NODES, name, None)
            p.nodes.forget(name)


class _EventHandler:
    def __init__(self, pipeline: Pipeline) -> None:
        self.p = pipeline

    def upsert(self, obj: JsonObject) -> None:
        p = self.p
        trim = Trim()
        message = event_to_message(obj, trim)
        if message is None:
            return
        if message.category == "other" and message.type != "Warning":
            return
        with p.lock:
            if message.involved_kind == "Pod":
                relevant = (message.involved_uid or "") in p.pods or "nvidia.com/" in message.message
            elif message.involved_kind == "Node":
                relevant = message.involved_name in p.gpu_nodes
            else:
                relevant = False
            if relevant and p.events.changed(message.uid, message):
                p.emit(K8S_EVENTS, event_key(message), message, trim)

    def delete(self, obj: JsonObject, observed: str) -> None:
        with self.p.lock:
            self.p.events.forget(uid_key(obj))  # events expire; the events topic keeps its history
            message = event_to_message(obj)
            if message is not None:
                self.p.forget_trim(K8S_EVENTS, event_key(message))


class _DraHandler:
    """One DRA collection (``resourceslices``, ``resourceclaims``, ``deviceclasses``) into the index."""

    def __init__(self, pipeline: Pipeline, kind: str) -> None:
        self.p = pipeline
        self.kind = kind

    def upsert(self, obj: JsonObject) -> None:
        self._apply(obj, deleted=False)

    def delete(self, obj: JsonObject, observed: str) -> None:
        self._apply(obj, deleted=True)

    def _apply(self, obj: JsonObject, deleted: bool) -> None:
        p = self.p
        if p.dra is None:
            return
        with p.lock:
            p.republish(p.dra.apply(self.kind, obj, deleted))


class _WorkloadHandler:
    def __init__(self, pipeline: Pipeline) -> None:
        self.p = pipeline

    def upsert(self, obj: JsonObject) -> None:
        p = self.p
        with p.lock:
            uid = uid_key(obj)
            trim = Trim()
            state = workload_to_state(obj, p.clock.now(), p.config.translate, trim)
            if state is None:
                if uid in p.workloads:  # its pod sets no longer ask for a GPU
                    p.emit(K8S_WORKLOADS, uid, None)
                    p.workloads.forget(uid)
                return
            if p.workloads.changed(uid, state):
                p.emit(K8S_WORKLOADS, uid, state, trim)

    def delete(self, obj: JsonObject, observed: str) -> None:
        p = self.p
        with p.lock:
            uid = uid_key(obj)
            if uid not in p.workloads:
                return
            now = p.clock.now()
            trim = Trim()
            state = workload_to_state(obj, now, p.config.translate, trim)
            if state is not None:
                p.emit(K8S_WORKLOADS, uid, deleted_workload(state, now), trim)
            p.emit(K8S_WORKLOADS, uid, None)
            p.workloads.forget(uid)


# --------------------------------------------------------------------------- the service


@dataclass
class Sources:
    nodes: WatchSource
    pods: Sequence[WatchSource]
    events: Sequence[WatchSource]
    workloads: Sequence[WatchSource] = ()
    """Kueue Workloads; empty where the cluster does not serve the CRD."""
    dra: Mapping[str, Sequence[WatchSource]] = field(default_factory=dict)
    """DRA collections by kind (``producers.watcher.dra.DRA_KINDS``); empty where the cluster does
    not serve ``resource.k8s.io/v1``."""

    def all(self) -> list[WatchSource]:
        return [*(s for kind in DRA_KINDS for s in self.dra.get(kind, ())), self.nodes, *self.pods, *self.events,
                *self.workloads]


class WatcherService:
    """Runs one informer per source; ``run`` blocks until ``stop`` is set."""

    def __init__(self, sources: Sources, sink: WatcherSink, config: WatcherConfig | None = None, *,
                 clock: Clock | None = None, metrics: WatcherMetrics | None = None,
                 backoff_factory: Callable[[], Backoff] = Backoff) -> None:
        self.sources = sources
        self.config = config or WatcherConfig()
        self.clock = clock or SystemClock()
        self.metrics = metrics or WatcherMetrics()
        self.pipeline = Pipeline(sink, self.config, self.clock, self.metrics)
        p = self.pipeline

        def informer(source: WatchSource, handler: Any, key: Callable[[JsonObject], str],
                     time_of: Callable[[JsonObject], Any] | None = None,
                     slim: Callable[[JsonObject], JsonObject] | None = None) -> Informer:
            return Informer(source, handler, key, clock=self.clock, backoff=backoff_factory(),
                            watch_timeout_s=self.config.watch_timeout_s, observer=self.metrics, time_of=time_of,
                            slim=slim)

        if sources.dra:
            p.dra = DraIndex(DraDriverTable(self.config.dra_drivers))
        self.dra_informers = [informer(s, _DraHandler(p, kind), name_key, slim=_event_stub)
                              for kind in DRA_KINDS for s in sources.dra.get(kind, ())]
        self.node_informer = informer(sources.nodes, p.node_handler, name_key)
        p.node_lookup = self.node_informer.store.get
        self.pod_informers = [informer(s, p.pod_handler, uid_key, slim=p.pod_handler.slim) for s in sources.pods]
        self.event_informers = [informer(s, p.event_handler, uid_key, object_time, slim=_event_stub)
                                for s in sources.events]
        self.workload_informers = [informer(s, p.workload_handler, uid_key, object_time, slim=drop_managed_fields)
                                   for s in sources.workloads]
        for pod_informer in self.pod_informers:
            p.pod_stores.append(_store_reader(pod_informer))
            p.pod_lookups.append(pod_informer.store.get)
        self._threads: list[threading.Thread] = []

    @property
    def informers(self) -> list[Informer]:
        return [*self.dra_informers, self.node_informer, *self.pod_informers, *self.event_informers,
                *self.workload_informers]

    def sync(self, stop: threading.Event) -> bool:
        """The ordered initial lists (DRA's, nodes, pods, events, workloads); False when stopped first."""
        return all(inf.sync(stop) for inf in self.informers)

    def start(self, stop: threading.Event) -> None:
        """Initial lists, then one watch thread per informer (returns once they run)."""
        if not self.sync(stop):
            return
        for inf in self.informers:
            thread = threading.Thread(target=inf.run, args=(stop,), name=f"watch-{inf.resource}", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("watching", resources=[inf.resource for inf in self.informers],
                 gpu_nodes=len(self.pipeline.gpu_nodes), gpu_pods=len(self.pipeline.pods))

    def shutdown(self, stop: threading.Event, timeout_s: float = 5.0) -> None:
        stop.set()
        for source in self.sources.all():
            source.interrupt()
        for thread in self._threads:
            thread.join(timeout_s)
        self.pipeline.sink.flush()

    def progress(self) -> None:
        """A state mark. The handlers hold the pipeline's lock from reading the clock to emitting,
        so once the mark's time is read under it, every change dated before it is with the
        producer; the sink delivers them (outside the lock: the handlers go on meanwhile, and what
        they add only makes the mark's offsets cover more)."""
        p = self.pipeline
        with p.lock:
            before = p.clock.now()
        p.sink.progress(before, self.config.cluster)

    def run(self, stop: threading.Event) -> None:
        self.start(stop)
        try:
            while not stop.wait(self.config.state_mark_interval_s):
                self.progress()
        finally:
            self.shutdown(stop)


def _event_stub(obj: JsonObject) -> JsonObject:
    """Events are only needed in the store to notice that they expired; DRA's objects to notice that
    they are gone (the index keeps what it reads of them)."""
    meta = obj.get("metadata", {})
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}}


def _store_reader(informer: Informer) -> Callable[[], list[JsonObject]]:
    return lambda: list(informer.store.values())


T = TypeVar("T")


def _asked(ask: Callable[[], T], what: str, attempts: int, sleep: Callable[[float], None]) -> T | None:
    """``ask()``, retried with back-off while the server cannot be reached: a server briefly away is
    not taken for "not served"; one that stays away gives None (said: ``what`` is not followed)."""
    backoff = Backoff()
    for attempt in range(1, attempts + 1):
        try:
            return ask()
        except WatchRequestError as exc:
            if attempt == attempts:
                log.warning("discovery failed; not followed", what=what, error=str(exc))
                return None
            sleep(backoff.next_delay_s())
    return None


def discover_workloads(ask: Callable[[], bool], attempts: int = 4, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether Kueue's Workloads are served, asked with retries (:func:`_asked`); a server that stays
    unreachable starts the watcher without workloads (pods, nodes and events matter more)."""
    served = _asked(ask, "kueue workloads", attempts, sleep)
    if served is not None:
        log.info("kueue workloads", served=served)
    return bool(served)


def discover_dra(api: Any, namespaces: Sequence[str] = (), attempts: int = 4,
                 sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether to follow DRA: the server serves ``resource.k8s.io/v1`` (discovery, with retries like
    :func:`discover_workloads`) and this identity may list its three collections; a ClusterRole
    without them starts the watcher without DRA, with a warning naming what to grant."""
    from producers.watcher.kube import DRA_RESOURCES, may_list, serves_dra

    def ask() -> tuple[bool, list[str]]:
        """(served, the collections this identity may not list)."""
        if not serves_dra(api):
            return False, []
        scopes: list[str | None] = list(namespaces) or [None]
        return True, [resource for resource in DRA_RESOURCES
                      for ns in (scopes if resource == "resourceclaims" else [None]) if not may_list(api, resource, ns)]

    found = _asked(ask, "dra", attempts, sleep)
    if found is None:
        return False
    served, denied = found
    if served and denied:
        log.warning("dra served but not readable; DRA GPUs are not counted: grant get/list/watch on "
                    "resource.k8s.io resourceslices, resourceclaims and deviceclasses (docs/dra.md)",
                    denied=sorted(set(denied)))
        return False
    log.info("dra", served=served)
    return served


def kube_sources(api: Any, namespaces: Sequence[str] = (), events_api: str = "events.k8s.io",
                 workloads: bool | None = None, dra: bool | None = None) -> Sources:
    """Sources over the real client (``producers.watcher.kube``) for all or some namespaces.

    ``workloads``: follow Kueue Workloads; ``dra``: follow DRA's collections; None asks the server
    (discovery) whether it serves them."""
    from producers.watcher.kube import KubeSource, serves_workloads

    if workloads is None:
        workloads = discover_workloads(lambda: serves_workloads(api))
    if dra is None:
        dra = discover_dra(api, namespaces)

    event_resource = "events" if events_api == "events.k8s.io" else "core-events"
    scopes: list[str | None] = list(namespaces) or [None]
    return Sources(
        nodes=KubeSource(api, "nodes"),
        pods=[KubeSource(api, "pods", ns) for ns in scopes],
        events=[KubeSource(api, event_resource, ns) for ns in scopes],
        workloads=[KubeSource(api, "workloads", ns) for ns in scopes] if workloads else [],
        dra={"deviceclasses": [KubeSource(api, "deviceclasses")], "resourceslices": [KubeSource(api, "resourceslices")],
             "resourceclaims": [KubeSource(api, "resourceclaims", ns) for ns in scopes]} if dra else {},
    )
