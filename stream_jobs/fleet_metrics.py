"""The fleet as Prometheus series: what the stages emitted, as gauges a scrape reads.

dcgm-exporter's dashboards, recording rules and alerts are what platform teams already run, so the
per-pod figures use its metric names, units and labels where the meaning is the same
(``DCGM_FI_DEV_GPU_UTIL`` ...; labels ``gpu``, ``UUID``, ``modelName``, ``Hostname``, ``pod``,
``namespace``, ``container``); what only gpulens knows is named ``gpulens_*`` with the unit in the
name. The list of series is data (:data:`METRICS`, like dcgm-exporter's counters file); the docs'
table is generated from it.

Fed only by the stages' outputs through :class:`OutputObserver` (``observe(messages)``), never by
reading stage state: the latest closed window per pod and GPU (``PodWindow``), the latest
capacity record (``ClusterCapacity``), open ``idle_gpu`` and ``pending_gpu`` alerts. A pod's
series disappear when it ends (``PodUsage`` with ``open=False`` from the node stage, a final
``PodLifecycle`` from the cluster stage), when its alert resolves, or when no window of it came for
``STALE_WINDOWS`` window lengths of event time (its node moved to another worker). The number of
series is capped (``max_series``); series beyond the cap are not created and are counted in
``gpulens_fleet_series_dropped_total`` (one per refused series, each time its record comes).

Every series carries ``cluster`` (the message's cluster, ``default`` in a single-cluster install),
always, so a query or rule written for one cluster keeps working when a second one is added: one
worker can read several clusters, whose node and pod names may repeat, and a series without the
label would merge them. Everything the state holds is therefore keyed by cluster too: pods and
alerts by their cluster-scoped key, the capacity record and the team cost rate per cluster.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from common.metrics import Gauge, GaugeFamily, MetricsRegistry
from schemas.messages import Message, scoped_key
from schemas.outputs import Alert, ClusterCapacity, PodLifecycle, PodWindow
from stream_jobs.internal import PodUsage

MIB = 2**20
STALE_WINDOWS = 3.0
"""A pod-GPU whose newest window is this many window lengths behind the newest window seen loses
its series (its node's partition went to another worker, or its agent fell silent)."""

POD_GPU_LABELS = ("cluster", "gpu", "UUID", "modelName", "Hostname", "pod", "namespace", "container", "team")
"""dcgm-exporter's labels (with its Kubernetes mapping on) plus the pod's cluster and team."""
PENDING_LABELS = ("cluster", "namespace", "pod")

Source = Literal["window", "idle", "pending", "team", "capacity"]


@dataclass(frozen=True)
class MetricSpec:
    """One exported series family: every one is a gauge."""

    name: str
    unit: str
    help: str
    source: Source
    labels: tuple[str, ...]
    window: Callable[[PodWindow], float | None] | None = None
    """The value from a pod-GPU's latest window (source ``window``)."""
    capacity: Callable[[ClusterCapacity], float | None] | None = None
    """The value from the cluster's latest capacity record (source ``capacity``, label ``cluster``)."""
    dcgm: bool = False
    """Same name, unit and meaning as dcgm-exporter's field."""


def _fb_free(w: PodWindow) -> float | None:
    if w.mem_total_bytes is None or w.avg_mem_used_bytes is None or w.share_fraction < 1.0:
        return None
    return max(0.0, w.mem_total_bytes - w.avg_mem_used_bytes) / MIB


def _cost_rate(w: PodWindow) -> float | None:
    return w.cost_usd / w.allocated_s * 3600.0 if w.allocated_s > 0 else None


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("DCGM_FI_DEV_GPU_UTIL", "%", "GPU utilization (in %): the pod's mean SM utilisation over its "
               "latest window (the device's when it holds the GPU alone).", "window", POD_GPU_LABELS,
               window=lambda w: w.avg_sm_util_pct, dcgm=True),
    MetricSpec("DCGM_FI_DEV_FB_USED", "MiB", "Framebuffer memory used (in MiB): the pod's mean over its latest "
               "window.", "window", POD_GPU_LABELS,
               window=lambda w: w.avg_mem_used_bytes / MIB if w.avg_mem_used_bytes is not None else None, dcgm=True),
    MetricSpec("DCGM_FI_DEV_FB_FREE", "MiB", "Framebuffer memory free (in MiB): total minus the mean used over the "
               "latest window; only for a pod holding the GPU alone.", "window", POD_GPU_LABELS,
               window=_fb_free, dcgm=True),
    MetricSpec("DCGM_FI_DEV_POWER_USAGE", "W", "Power draw (in W): the device's mean over the pod's latest "
               "window.", "window", POD_GPU_LABELS, window=lambda w: w.avg_power_w, dcgm=True),
    MetricSpec("gpulens_pod_gpu_allocated_seconds", "s", "Seconds the pod held the GPU in its latest window.",
               "window", POD_GPU_LABELS, window=lambda w: w.allocated_s),
    MetricSpec("gpulens_pod_gpu_idle_seconds", "s", "Seconds the pod's GPU was idle (below the idle threshold) "
               "in its latest window.", "window", POD_GPU_LABELS, window=lambda w: w.idle_s),
    MetricSpec("gpulens_pod_gpu_cost_usd_per_hour", "USD/h", "What the pod's share of the GPU costs per hour, "
               "at the configured price, over its latest window.", "window", POD_GPU_LABELS, window=_cost_rate),
    MetricSpec("gpulens_pod_gpu_window_end_timestamp_seconds", "s", "Event-time end of the window the pod's "
               "series show (Unix time).", "window", POD_GPU_LABELS,
               window=lambda w: w.window_end.timestamp()),
    MetricSpec("gpulens_pod_gpu_idle", "1", "1 while an idle_gpu alert is open for the pod's GPU; idle_class "
               "is vram_held (a process or memory held) or no_process.", "idle",
               (*POD_GPU_LABELS, "idle_class")),
    MetricSpec("gpulens_pod_pending_since_timestamp_seconds", "s", "When a pod pending past the pending_gpu "
               "threshold was created (Unix time): time() minus it is the wait.", "pending", PENDING_LABELS),
    MetricSpec("gpulens_pod_pending_gpus", "GPUs", "GPUs requested by a pod pending past the pending_gpu "
               "threshold.", "pending", PENDING_LABELS),
    MetricSpec("gpulens_team_cost_usd_per_hour", "USD/h", "Sum of the team's pods' cost rates (latest windows).",
               "team", ("cluster", "team")),
    MetricSpec("gpulens_cluster_gpus", "GPUs", "GPUs by state at the end of the latest capacity window: state "
               "total, allocated, busy, idle_allocated, free.", "capacity", ("cluster", "state")),
    MetricSpec("gpulens_cluster_pending_pods", "pods", "GPU pods waiting to be scheduled.", "capacity", ("cluster",),
               capacity=lambda c: c.pending_pods),
    MetricSpec("gpulens_cluster_pending_gpus", "GPUs", "GPUs the pending pods request.", "capacity", ("cluster",),
               capacity=lambda c: c.pending_gpu_demand),
    MetricSpec("gpulens_cluster_stranded_gpus", "GPUs", "Free GPUs no pending pod can use where they are "
               "(fragmentation).", "capacity", ("cluster",), capacity=lambda c: c.stranded_gpus),
    MetricSpec("gpulens_cluster_largest_free_block_gpus", "GPUs", "Most free GPUs on one schedulable node.",
               "capacity", ("cluster",), capacity=lambda c: c.largest_free_block),
)
WINDOW_METRICS = tuple(m for m in METRICS if m.source == "window")
GPU_STATES = ("total", "allocated", "busy", "idle_allocated", "free")


class OutputObserver(Protocol):
    """What the stream runtime calls with each batch of stage outputs (public and internal)."""

    def observe(self, messages: Sequence[Message]) -> None: ...


def metric_table() -> str:
    """The Markdown table of :data:`METRICS` (docs/prometheus.md holds it verbatim)."""
    lines = ["| metric | unit | labels | dcgm-exporter | meaning |", "|---|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        lines.append(f"| `{m.name}` | {m.unit} | {labels} | {'same' if m.dcgm else '-'} | {m.help} |")
    return "\n".join(lines)


@dataclass
class _PodGpu:
    window: PodWindow
    labels: tuple[str, ...]
    stale_at: float
    """Event time (Unix s) after which the series is stale: ``STALE_WINDOWS`` window lengths past its end."""


def _pod_gpu_labels(w: PodWindow) -> tuple[str, ...]:
    return (w.cluster, "" if w.gpu_index is None else str(w.gpu_index), w.gpu_uuid, w.gpu_model, w.node, w.pod,
            w.namespace, w.container or "", w.team or "")


class FleetSeries:
    """The exported state: latest window per pod-GPU, open idle/pending alerts, latest capacity."""

    def __init__(self, registry: MetricsRegistry, max_series: int) -> None:
        self.max_series = max_series
        self._lock = threading.Lock()
        self._pod_gpus: dict[tuple[str, str], _PodGpu] = {}
        """(cluster-scoped pod uid, GPU uuid) -> its latest window"""
        self._gpus_of: dict[str, set[str]] = {}
        self._by_name: dict[tuple[str, str, str, str], tuple[str, str]] = {}
        """(cluster, namespace, pod, GPU uuid) -> key of ``_pod_gpus``: what an alert's subject names"""
        self._teams: Counter[tuple[str, str]] = Counter()
        """(cluster, team) -> pod-GPUs exported: one cost-rate series each"""
        self._idle: dict[str, tuple[str, tuple[str, ...]]] = {}
        """cluster-scoped alert id -> (cluster-scoped pod uid, labels incl. idle_class)"""
        self._idle_unplaced: dict[tuple[str, str, str, str], Alert] = {}
        """Open idle alerts of pod-GPUs without an exported window yet (by cluster, namespace, pod, GPU)."""
        self._pending: dict[str, tuple[str, str, str, tuple[str, ...], float, float]] = {}
        """cluster-scoped alert id -> (cluster, namespace, pod, labels, created (Unix s), GPUs)"""
        self._capacity: dict[str, ClusterCapacity] = {}
        """cluster -> its latest capacity record: each cluster keeps its own gauges"""
        self._newest_end = 0.0
        self._next_stale = float("inf")
        """No series is stale before this event time (a lower bound): the series are looked over only
        once the newest window passes it, not at every batch (a worker observes a batch per mark and
        partition; looking over every series each time was 3 % of a worker's CPU)."""
        self.dropped = registry.counter("fleet_series_dropped_total",
                                        "fleet series not exported because of the series cap (one per refused "
                                        "series, each time its record comes)")
        self.series: Gauge = registry.gauge("fleet_series", "fleet series exported now (the cap counts these)")
        registry.add_collector(self.collect)

    # ------------------------------------------------------------------ input

    def observe(self, messages: Sequence[Message]) -> None:
        if self.max_series <= 0:
            return
        with self._lock:
            for message in messages:  # windows first: an alert or an end in the batch may be about them
                if isinstance(message, PodWindow):
                    self._window(message)
            for message in messages:
                if isinstance(message, ClusterCapacity):
                    current = self._capacity.get(message.cluster)
                    if current is None or message.window_start >= current.window_start:
                        self._capacity[message.cluster] = message
                elif isinstance(message, Alert):
                    self._alert(message)
                elif isinstance(message, PodUsage) and not message.open:
                    self._forget_pod(scoped_key(message.cluster, message.pod_uid), None)
                elif isinstance(message, PodLifecycle) and message.end_reason not in ("Running", "Pending"):
                    self._forget_pod(scoped_key(message.cluster, message.pod_uid),
                                     (message.cluster, message.namespace, message.name))
            if self._newest_end > self._next_stale:
                self._expire()
            self.series.set(self._count())

    def _count(self) -> int:
        capacity = len(self._capacity) * (len(GPU_STATES) + 4)
        return (len(self._pod_gpus) * len(WINDOW_METRICS) + len(self._teams) + len(self._idle)
                + 2 * len(self._pending) + capacity)

    def _admit(self, cost: int) -> bool:
        if self._count() + cost <= self.max_series:
            return True
        self.dropped.inc(cost)
        return False

    def _window(self, w: PodWindow) -> None:
        key = (scoped_key(w.cluster, w.pod_uid), w.gpu_uuid)
        current = self._pod_gpus.get(key)
        end = w.window_end.timestamp()
        self._newest_end = max(self._newest_end, end)
        if current is not None:
            if w.window_start >= current.window.window_start:
                labels = _pod_gpu_labels(w)
                if labels == current.labels:  # the same series, newer figures (every window but a pod's first)
                    current.window, current.stale_at = w, self._note_stale_at(w, end)
                else:
                    self._drop(key)
                    self._put(key, w, end, labels)
        elif self._admit(len(WINDOW_METRICS) + (0 if (w.cluster, w.team or "") in self._teams else 1)):
            self._put(key, w, end, _pod_gpu_labels(w))

    def _note_stale_at(self, w: PodWindow, end: float) -> float:
        """When the series of window ``w`` (ending at ``end``) goes stale, lowering ``_next_stale`` to it if earlier."""
        stale_at = end + STALE_WINDOWS * (end - w.window_start.timestamp())
        self._next_stale = min(self._next_stale, stale_at)
        return stale_at

    def _put(self, key: tuple[str, str], w: PodWindow, end: float, labels: tuple[str, ...]) -> None:
        self._pod_gpus[key] = _PodGpu(w, labels, self._note_stale_at(w, end))
        self._gpus_of.setdefault(key[0], set()).add(key[1])
        self._by_name[(w.cluster, w.namespace, w.pod, w.gpu_uuid)] = key
        self._teams[(w.cluster, w.team or "")] += 1
        if self._idle_unplaced:
            alert = self._idle_unplaced.pop((w.cluster, w.namespace, w.pod, w.gpu_uuid), None)
            if alert is not None:
                self._alert(alert)

    def _drop(self, key: tuple[str, str]) -> None:
        w = self._pod_gpus.pop(key).window
        gpus = self._gpus_of[key[0]]
        gpus.discard(key[1])
        if not gpus:
            del self._gpus_of[key[0]]
        name = (w.cluster, w.namespace, w.pod, w.gpu_uuid)
        if self._by_name.get(name) == key:
            del self._by_name[name]
        team = (w.cluster, w.team or "")
        self._teams[team] -= 1
        if self._teams[team] <= 0:
            del self._teams[team]

    def _alert(self, alert: Alert) -> None:
        subject = alert.subject
        name = (alert.cluster, subject.namespace or "", subject.name or "", subject.gpu_uuid or "")
        alert_id = scoped_key(alert.cluster, alert.id)
        if alert.state == "resolved":
            self._idle.pop(alert_id, None)
            self._pending.pop(alert_id, None)
            if self._idle_unplaced.get(name) is not None and self._idle_unplaced[name].id == alert.id:
                del self._idle_unplaced[name]
            return
        if alert.type == "idle_gpu" and subject.gpu_uuid and alert_id not in self._idle:
            key = self._by_name.get(name)
            if key is None:
                self._idle_unplaced[name] = alert
            elif self._admit(1):
                self._idle[alert_id] = (key[0], (*self._pod_gpus[key].labels,
                                                 str(alert.details.get("idle_class", ""))))
        elif alert.type == "pending_gpu" and alert_id not in self._pending and self._admit(2):
            created = alert.at.timestamp() - float(alert.details.get("pending_s", 0.0))
            namespace, pod = subject.namespace or "", subject.name or ""
            self._pending[alert_id] = (alert.cluster, namespace, pod, (alert.cluster, namespace, pod), created,
                                       float(alert.details.get("gpus", 0)))

    def _forget_pod(self, uid: str, name: tuple[str, str, str] | None) -> None:
        """Drop the series of the pod ``uid`` (cluster-scoped); ``name`` (cluster, namespace, pod) also
        drops its pending series, which name the pod but not its uid."""
        for gpu in list(self._gpus_of.get(uid, ())):
            self._drop((uid, gpu))
        if self._idle:
            for alert_id in [a for a, (pod_uid, _labels) in self._idle.items() if pod_uid == uid]:
                del self._idle[alert_id]
        if name is not None and self._pending:
            for alert_id in [a for a, entry in self._pending.items() if (entry[0], entry[1], entry[2]) == name]:
                del self._pending[alert_id]

    def _expire(self) -> None:
        newest = self._newest_end
        stale = [key for key, p in self._pod_gpus.items() if p.stale_at < newest]
        for key in stale:
            self._forget_pod(key[0], None)
        self._next_stale = min((p.stale_at for p in self._pod_gpus.values()), default=float("inf"))

    # ------------------------------------------------------------------ output

    def collect(self) -> Iterable[GaugeFamily]:
        with self._lock:
            snapshot = _Snapshot(list(self._pod_gpus.values()), list(self._idle.values()),
                                 list(self._pending.values()), sorted(self._capacity.items()))
        for spec in METRICS:
            family = GaugeFamily(spec.name, spec.help, spec.labels)
            for labels, value in snapshot.series(spec):
                family.add(labels, value)
            yield family


@dataclass(frozen=True)
class _Snapshot:
    """The series' sources as one scrape reads them (copied under the lock)."""

    pod_gpus: list[_PodGpu]
    idle: list[tuple[str, tuple[str, ...]]]
    pending: list[tuple[str, str, str, tuple[str, ...], float, float]]
    capacities: list[tuple[str, ClusterCapacity]]

    def series(self, spec: MetricSpec) -> Iterable[tuple[tuple[str, ...], float]]:
        """The labels and value of each series of ``spec``."""
        if spec.source == "window":
            assert spec.window is not None
            window = spec.window
            return ((p.labels, value) for p in self.pod_gpus if (value := window(p.window)) is not None)
        if spec.source == "idle":
            return ((labels, 1.0) for _uid, labels in self.idle)
        if spec.source == "pending":
            since = spec.name.endswith("timestamp_seconds")
            return ((labels, created if since else gpus) for _cluster, _ns, _pod, labels, created, gpus in self.pending)
        if spec.source == "team":
            return self._team_costs()
        return self._capacity_series(spec)

    def _team_costs(self) -> Iterable[tuple[tuple[str, ...], float]]:
        teams: dict[tuple[str, str], float] = {}
        for p in self.pod_gpus:
            rate = _cost_rate(p.window)
            if rate is not None:
                team = (p.window.cluster, p.window.team or "")
                teams[team] = teams.get(team, 0.0) + rate
        return sorted(teams.items())

    def _capacity_series(self, spec: MetricSpec) -> Iterable[tuple[tuple[str, ...], float]]:
        for cluster, capacity in self.capacities:
            if spec.labels == ("cluster", "state"):
                counts = (capacity.gpus_total, capacity.gpus_allocated, capacity.gpus_busy,
                          capacity.gpus_idle_allocated, capacity.gpus_free)
                for state, count in zip(GPU_STATES, counts, strict=True):
                    yield (cluster, state), float(count)
            else:
                assert spec.capacity is not None
                value = spec.capacity(capacity)
                if value is not None:
                    yield (cluster,), value
