"""``gpulens top``: a live terminal view of the fleet, read from the pipeline's topics.

:class:`FleetView` folds messages (capacity windows, pod windows, pod states, scheduling events,
alerts) into the figures an operator looks at — GPUs by state, usage by team, the idlest pods,
pending pods with their reasons, active alerts — and is plain Python so tests drive it directly.
:func:`render` turns it into rich renderables; :func:`run_top` feeds it from Kafka and redraws.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from common.kafka import make_consumer, read_to_end, topic_names
from common.settings import KafkaSettings
from common.text import printable
from schemas import codec
from schemas.messages import DEFAULT_CLUSTER, K8sEvent, Message, PodState
from schemas.outputs import Alert, ClusterCapacity, DeadLetter, PodWindow
from schemas.topics import ALERTS, CLUSTER_CAPACITY, DEADLETTER, K8S_EVENTS, K8S_PODS, POD_WINDOWS, TopicSpec

VIEW_TOPICS: tuple[TopicSpec, ...] = (CLUSTER_CAPACITY, POD_WINDOWS, K8S_PODS, K8S_EVENTS, ALERTS)


@dataclass
class PodUsageRow:
    namespace: str
    pod: str
    team: str
    node: str
    gpus: set[str] = field(default_factory=set)
    allocated_s: float = 0.0
    idle_s: float = 0.0
    busy_s: float = 0.0
    last_util_pct: float | None = None


@dataclass
class FleetView:
    """The latest state of the fleet as the pipeline reports it."""

    capacity: ClusterCapacity | None = None
    pods: dict[str, PodState] = field(default_factory=dict)
    usage: dict[str, PodUsageRow] = field(default_factory=dict)
    pending_reason: dict[str, str] = field(default_factory=dict)
    alerts: dict[str, Alert] = field(default_factory=dict)
    messages_seen: int = 0
    alert_transitions: int = 0
    fired_by_type: Counter[str] = field(default_factory=Counter)
    cluster: str | None = None
    """The cluster shown (``--cluster``); unset: the first one seen. Node names and pod uids repeat
    across clusters, so the others are listed in :attr:`clusters_seen` and never mixed in."""
    clusters_seen: set[str] = field(default_factory=set)
    deadletters: Counter[str] = field(default_factory=Counter)
    """Records the pipeline refused (the dead-letter topic), by reason code, of every cluster: a
    refused record cannot always name its cluster. The live view says them so no loss is silent."""

    def apply(self, message: Message | None, key: str | None = None) -> None:
        if isinstance(message, DeadLetter):
            self.deadletters[str(message.reason)] += 1
            return
        self.messages_seen += 1
        if message is None:
            self._apply_tombstone(key)
            return
        self.clusters_seen.add(message.cluster)
        if self.cluster is None:
            self.cluster = message.cluster
        if message.cluster != self.cluster:
            return
        if isinstance(message, ClusterCapacity):
            if self.capacity is None or message.window_end >= self.capacity.window_end:
                self.capacity = message
        elif isinstance(message, PodState):
            self._apply_pod(message)
        elif isinstance(message, PodWindow):
            self._apply_window(message)
        elif isinstance(message, K8sEvent):
            if message.category == "scheduling_failed" and message.involved_uid:
                self.pending_reason[message.involved_uid] = message.message
        elif isinstance(message, Alert):
            self._apply_alert(message)

    def _apply_tombstone(self, key: str | None) -> None:
        """A pod's tombstone, keyed <cluster>/<uid> (the bare uid in the default cluster)."""
        if key is None:
            return
        cluster, _, uid = key.rpartition("/")
        if (cluster or DEFAULT_CLUSTER) == self.cluster:
            self.pods.pop(uid, None)
            self.usage.pop(uid, None)

    def _apply_pod(self, pod: PodState) -> None:
        if pod.deleted or pod.phase in ("Succeeded", "Failed"):
            self.pods.pop(pod.uid, None)
            self.usage.pop(pod.uid, None)
        else:
            self.pods[pod.uid] = pod

    def _apply_alert(self, alert: Alert) -> None:
        self.alert_transitions += 1
        if alert.state != "firing":
            self.alerts.pop(alert.id, None)
            return
        if alert.id not in self.alerts:
            self.fired_by_type[alert.type] += 1
        self.alerts[alert.id] = alert

    def _apply_window(self, window: PodWindow) -> None:
        usage = self.usage.get(window.pod_uid)
        if usage is None:
            usage = self.usage[window.pod_uid] = PodUsageRow(
                window.namespace, window.pod, window.team or window.namespace, window.node
            )
        usage.gpus.add(window.gpu_uuid)
        usage.allocated_s += window.allocated_s
        usage.idle_s += window.idle_s
        usage.busy_s += window.busy_s
        usage.last_util_pct = window.avg_sm_util_pct

    # ------------------------------------------------------------------ figures

    def gpus_by_state(self) -> dict[str, int]:
        cap = self.capacity
        if cap is None:
            return {}
        return {
            "busy": cap.gpus_busy,
            "idle allocated": cap.gpus_idle_allocated,
            "unallocated": cap.gpus_free - cap.stranded_gpus,
            "stranded": cap.stranded_gpus,
        }

    def usage_by_team(self) -> list[tuple[str, int, float]]:
        """(team, GPUs held now, busy share of allocated time) sorted by GPUs held."""
        gpus: dict[str, int] = defaultdict(int)
        busy: dict[str, float] = defaultdict(float)
        allocated: dict[str, float] = defaultdict(float)
        for pod_uid, usage in self.usage.items():
            if pod_uid in self.pods:
                gpus[usage.team] += len(usage.gpus)
            busy[usage.team] += usage.busy_s
            allocated[usage.team] += usage.allocated_s
        rows = [(team, gpus[team], busy[team] / allocated[team] if allocated[team] else 0.0) for team in allocated]
        return sorted(rows, key=lambda row: (-row[1], row[0]))

    def idlest_pods(self, limit: int = 8) -> list[PodUsageRow]:
        live = [u for uid, u in self.usage.items() if uid in self.pods and u.allocated_s > 0]
        return sorted(live, key=lambda u: (-u.idle_s, u.namespace, u.pod))[:limit]

    def pending_pods(self) -> list[tuple[PodState, str]]:
        pending = [p for p in self.pods.values() if p.phase == "Pending" and not p.node]
        pending.sort(key=lambda p: p.created_at)
        return [(p, self.pending_reason.get(p.uid, p.status_reason or "")) for p in pending]

    def active_alerts(self) -> list[Alert]:
        return sorted(self.alerts.values(), key=lambda a: (a.started_at, a.type, a.id))


_STATE_STYLE = {"busy": "green", "idle allocated": "yellow", "unallocated": "blue", "stranded": "red"}


def plain(value: object) -> Text:
    """Cluster text (names, teams, reasons, summaries) as a rich cell: never read as markup
    (``[/x]``, ``[link=...]``) or emoji codes, control characters shown escaped (:func:`printable`)."""
    return Text(printable(str(value)))


def deadletter_line(view: FleetView) -> Text | None:
    """"dead letters: N (reason n, ...)" when the pipeline refused records (None when it refused none)."""
    if not view.deadletters:
        return None
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(view.deadletters.items(), key=lambda r: (-r[1], r[0])))
    return Text(f"\ndead letters: {sum(view.deadletters.values())} records refused ({reasons}); not in these "
                "figures: see the deadletter topic, docs/operations.md for each reason", style="bold red")


def render(view: FleetView, title: str = "gpulens top") -> RenderableType:
    cap = view.capacity
    header = Text(f"{title} — ", style="bold")
    refused = deadletter_line(view)
    if cap is None:
        header.append("waiting for the first capacity window…", style="dim")
        if refused is not None:
            header.append_text(refused)
        return Panel(header)
    if len(view.clusters_seen) > 1:
        others = ", ".join(sorted(view.clusters_seen))
        header.append(printable(f"cluster {view.cluster} (of {others}: --cluster)   "), style="bold yellow")
    header.append(f"window ending {cap.window_end:%Y-%m-%d %H:%M:%S}Z   {cap.gpus_total} GPUs   "
                  f"{cap.pending_pods} pending pods wanting {cap.pending_gpu_demand} GPUs   "
                  f"largest free block {cap.largest_free_block}")
    if refused is not None:
        header.append_text(refused)

    states = Table(title="GPUs by state", expand=True)
    states.add_column("state")
    states.add_column("GPUs", justify="right")
    states.add_column("", ratio=3)
    total = max(cap.gpus_total, 1)
    for state, count in view.gpus_by_state().items():
        states.add_row(state, str(count), Text("█" * int(40 * count / total), style=_STATE_STYLE[state]))

    teams = Table(title="Usage by team", expand=True)
    for column in ("team", "GPUs held", "busy %"):
        teams.add_column(column, justify="left" if column == "team" else "right")
    for team, gpus, busy in view.usage_by_team()[:8]:
        teams.add_row(plain(team), str(gpus), f"{100 * busy:.0f}")

    idle = Table(title="Idlest pods (idle GPU-minutes)", expand=True)
    for column in ("pod", "team", "GPUs", "idle min", "util %"):
        idle.add_column(column, justify="left" if column in ("pod", "team") else "right")
    for usage in view.idlest_pods():
        util = "" if usage.last_util_pct is None else f"{usage.last_util_pct:.0f}"
        idle.add_row(plain(f"{usage.namespace}/{usage.pod}"), plain(usage.team), str(len(usage.gpus)),
                     f"{usage.idle_s / 60:.0f}", util)

    pending = Table(title="Pending GPU pods", expand=True)
    pending.add_column("pod")
    pending.add_column("GPUs", justify="right")
    pending.add_column("reason", ratio=3)
    for pod, reason in view.pending_pods()[:8]:
        pending.add_row(plain(f"{pod.namespace}/{pod.name}"), str(sum(pod.gpu_requests.values())), plain(reason))

    alerts = Table(title=f"Active alerts ({len(view.alerts)})", expand=True)
    alerts.add_column("since")
    alerts.add_column("type")
    alerts.add_column("severity")
    alerts.add_column("summary", ratio=3)
    for alert in view.active_alerts()[-10:]:
        alerts.add_row(f"{alert.started_at:%H:%M:%S}", plain(alert.type), alert.severity, plain(alert.summary))

    return Group(Panel(header), states, teams, idle, pending, alerts)


def read_view_once(kafka: KafkaSettings, prefix: str, timeout_s: float = 60.0,
                   cluster: str | None = None) -> FleetView:
    """The view of everything now in the topics (to each partition's end). Pod states are applied last,
    so a pod that ended is gone from the view even when its last windows came after its tombstone."""
    view = FleetView(cluster=cluster)
    for spec in sorted(VIEW_TOPICS, key=lambda s: s is K8S_PODS):
        for record in read_to_end(kafka, spec.name(prefix), timeout_s):
            key = record.key.decode(errors="replace") if record.key is not None else None
            try:
                view.apply(None if record.value is None else codec.decode(record.value, spec.message), key)
            except codec.MessageError:
                continue  # the stream workers dead-letter bad input; the view just skips it
    return view


def prefixes_with_data(kafka: KafkaSettings) -> list[str]:
    """Topic prefixes on the broker that hold a gpulens pipeline's outputs (e.g. a demo's per-run one)."""
    suffix = "." + ALERTS.suffix
    return [name[: -len(suffix)] for name in topic_names(kafka) if name.endswith(suffix)]


def drain_topics(
    kafka: KafkaSettings, prefix: str, view: FleetView, should_stop: Callable[[], bool],
    on_batch: Callable[[], None] | None = None, poll_s: float = 0.5,
) -> None:
    """Read the view's topics and the dead letters from the beginning into ``view`` until ``should_stop()``."""
    specs = {spec.name(prefix): spec for spec in (*VIEW_TOPICS, DEADLETTER)}
    consumer = make_consumer(kafka, group_id=f"gpulens-top-{uuid.uuid4().hex[:8]}")
    consumer.subscribe(list(specs))
    try:
        while not should_stop():
            for record in consumer.consume(500, poll_s):
                if record.error():
                    continue
                spec = specs[record.topic() or ""]
                raw_key = record.key()
                key = raw_key.decode(errors="replace") if isinstance(raw_key, bytes) else raw_key
                value = record.value()
                try:
                    view.apply(None if value is None else codec.decode(value, spec.message), key)
                except codec.MessageError:
                    continue  # the stream workers dead-letter bad input; the view just skips it
            if on_batch is not None:
                on_batch()
    finally:
        consumer.close()


def run_top(kafka: KafkaSettings, prefix: str, refresh_s: float = 1.0, duration_s: float | None = None,
            cluster: str | None = None) -> None:
    view = FleetView(cluster=cluster)
    deadline = None if duration_s is None else time.monotonic() + duration_s
    with Live(render(view), refresh_per_second=max(1, int(1 / refresh_s)), screen=False) as live:
        drain_topics(kafka, prefix, view,
                     should_stop=lambda: deadline is not None and time.monotonic() >= deadline,
                     on_batch=lambda: live.update(render(view)))
