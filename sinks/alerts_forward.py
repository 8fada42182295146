"""``gpulens alerts forward``: alert transitions from ``alerts.v1`` into Alertmanager and webhooks.

Platform teams route alerts through Alertmanager (silences, inhibition, routes to Slack or
PagerDuty) or a chat webhook; gpulens publishes alerts on Kafka. This consumer bridges the two:

- **Mapping.** Each transition becomes one Alertmanager v2 alert (``POST /api/v2/alerts``): a
  firing one with ``startsAt`` (when it fired) and ``endsAt`` ``firing_hold_s`` ahead, so
  Alertmanager keeps it firing until its resolved transition (it would otherwise resolve it after
  its own ``resolve_timeout``); a resolved one with ``endsAt`` = when it resolved. Labels:
  ``alertname``, ``severity``, ``namespace``, ``pod``, ``team`` (the alert's, else the pod's from
  the watcher's pod states on ``k8s.pods.v1``), ``node``, ``cluster`` (plus
  ``gpu_uuid`` / ``gang`` / ``workload`` (a queued Kueue workload) when the subject has one, so
  two alerts on two GPUs of one pod stay two alerts); annotations ``summary``, ``description`` and
  ``runbook_url`` (docs/alerts.md's section of the type). A generic webhook gets the gpulens alert
  with those labels and annotations, or a Slack-compatible body. In the Slack body every string from
  the alert (type, summary, subject) is escaped by Slack's rules (:func:`slack_escape`), so no
  ``<!channel>`` command or ``<url|text>`` link can come from cluster data; the runbook link is the
  only markup. The JSON body and Alertmanager's labels and annotations carry the data as it is.
- **At least once.** Records are consumed in batches; the offsets of a batch are committed only
  after every record of it was delivered to every destination (or dead-lettered, and the dead
  letter acknowledged by Kafka). A failed delivery is retried with jittered exponential backoff
  (:class:`common.backoff.Backoff`); after ``max_attempts`` failures to one destination, or at once
  when the destination rejects the request as malformed (HTTP 4xx other than 408 / 429), the
  record goes to ``deadletter.v1`` (:func:`schemas.dead_letters.dead_letter`) with the code
  ``undeliverable`` (``invalid`` for a record that is no alert) and the destination and error as
  detail. A crash between delivery and commit delivers the batch again: Alertmanager identifies an
  alert by its labels, so a repeated transition changes nothing it shows or notifies.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from common.backoff import Backoff
from common.errors import GpulensError
from common.kafka import BoundedProducer, Consumer, KafkaException, TopicFollower, commit_offsets, make_consumer
from common.logs import get_logger
from common.metrics import MetricsRegistry
from common.settings import AlertForwardSettings
from schemas.codec import MessageError, decode, encode
from schemas.dead_letters import Headers, dead_letter, dead_letter_headers
from schemas.messages import DEFAULT_CLUSTER, PodState, scoped_key
from schemas.outputs import KNOWN_ALERT_TYPES, Alert, DeadLetterReason
from schemas.topics import ALERTS, DEADLETTER, K8S_PODS
from sinks.batches import ConsumedRecord

log = get_logger(__name__)

DestinationKind = Literal["alertmanager", "webhook"]

SLACK_ICONS = {"critical": ":red_circle:", "warning": ":large_orange_circle:", "info": ":large_blue_circle:"}


# --------------------------------------------------------------------------- mapping


def runbook_url(base_url: str, alert_type: str) -> str:
    """docs/alerts.md's section of ``alert_type`` (its heading is the type, so the anchor is too);
    a type this version does not know points at the catalogue itself."""
    return f"{base_url}#{alert_type}" if alert_type in KNOWN_ALERT_TYPES else base_url


def alert_labels(alert: Alert, cluster: str, team: str | None = None) -> dict[str, str]:
    """Alertmanager's identity of the alert: the same labels for its firing and resolved transitions.
    ``team``: the pod's team (from its pod state) when the alert's details do not name one."""
    subject = alert.subject
    labels = {"alertname": alert.type, "severity": alert.severity, "cluster": cluster}
    if subject.namespace:
        labels["namespace"] = subject.namespace
    if subject.kind == "pod" and subject.name:
        labels["pod"] = subject.name
    if subject.kind == "gang" and subject.name:
        labels["gang"] = subject.name
    if subject.kind == "workload" and subject.name:
        labels["workload"] = subject.name
    if subject.node:
        labels["node"] = subject.node
    elif subject.kind == "node" and subject.name:
        labels["node"] = subject.name
    if subject.gpu_uuid:
        labels["gpu_uuid"] = subject.gpu_uuid
    named = alert.details.get("team")
    team = named if isinstance(named, str) and named else team
    if team:
        labels["team"] = team
    return labels


def alert_annotations(alert: Alert, runbook_base_url: str) -> dict[str, str]:
    details = ", ".join(f"{k}={v}" for k, v in sorted(alert.details.items()) if v is not None and v != "")
    description = f"{alert.summary} (gpulens alert {alert.id}, {alert.state} at {alert.at.isoformat()}"
    description += f"; {details})" if details else ")"
    return {"summary": alert.summary, "description": description[:4000],
            "runbook_url": runbook_url(runbook_base_url, alert.type)}


def _rfc3339(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


def alertmanager_alert(alert: Alert, *, cluster: str, runbook_base_url: str, firing_hold_s: float,
                       now: datetime, team: str | None = None) -> dict[str, Any]:
    """One element of the body of ``POST /api/v2/alerts``."""
    if alert.state == "firing":
        ends_at = max(now, alert.at) + timedelta(seconds=firing_hold_s)
    else:
        ends_at = max(alert.at, alert.started_at)
    return {
        "labels": alert_labels(alert, cluster, team),
        "annotations": alert_annotations(alert, runbook_base_url),
        "startsAt": _rfc3339(alert.started_at),
        "endsAt": _rfc3339(ends_at),
    }


def slack_escape(text: str) -> str:
    """``text`` as literal Slack text: ``&``, ``<`` and ``>`` as entities (Slack's escaping rules), so
    data can never open a link (``<https://x|click>``), a mention or a command (``<!channel>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def webhook_body(alert: Alert, *, cluster: str, runbook_base_url: str,
                 body_format: Literal["json", "slack"], team: str | None = None) -> dict[str, Any]:
    labels = alert_labels(alert, cluster, team)
    annotations = alert_annotations(alert, runbook_base_url)
    if body_format == "json":
        return alert.model_dump(mode="json") | {"labels": labels, "annotations": annotations}
    state = "FIRING" if alert.state == "firing" else "RESOLVED"
    icon = SLACK_ICONS[alert.severity] if alert.state == "firing" else ":white_check_mark:"
    # every piece of data is escaped; the icon, the layout and the runbook link are the only markup
    text = f"{icon} [{state}] {slack_escape(alert.type)} ({alert.severity}): {slack_escape(alert.summary)}"
    where = ", ".join(f"{k}={slack_escape(labels[k])}"
                      for k in ("cluster", "namespace", "pod", "gang", "workload", "node") if k in labels)
    runbook = slack_escape(annotations["runbook_url"]).replace("|", "%7C")
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"{where} | <{runbook}|runbook>"}]},
        ],
    }


class PodTeams:
    """(cluster, namespace, name) -> team, kept current from the watcher's compacted pod states
    (``k8s.pods.v1``), so pod alerts carry the ``team`` label; call :meth:`refresh` before delivering
    a batch. Pods are held by record key (``<cluster>/<uid>``), which their tombstones carry too."""

    def __init__(self, follower: TopicFollower | None) -> None:
        self.follower = follower
        self._by_key: dict[str, tuple[str, str, str, str | None]] = {}
        self._by_name: dict[tuple[str, str, str], str | None] = {}

    def refresh(self) -> None:
        if self.follower is None:
            return
        for record in self.follower.catch_up(10.0, partial=True):
            key = record.key.decode(errors="replace") if record.key else ""
            if record.value is None:  # tombstone: the pod is gone
                self._by_key.pop(key, None)
                continue
            try:
                state = decode(record.value, PodState)
            except MessageError:
                continue  # the sink and workers dead-letter bad pod states; here a team is only a label
            self._by_key[key or scoped_key(state.cluster, state.uid)] = (
                state.cluster, state.namespace, state.name, state.team)
        self._by_name = {(cluster, ns, name): team for cluster, ns, name, team in self._by_key.values()}

    def team(self, alert: Alert) -> str | None:
        subject = alert.subject
        if subject.kind != "pod" or not subject.namespace or not subject.name:
            return None
        return self._by_name.get((alert.cluster, subject.namespace, subject.name))

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()


# --------------------------------------------------------------------------- delivery


class DeliveryFailed(GpulensError):
    """One POST did not succeed; ``permanent`` when retrying the same request cannot help."""

    def __init__(self, reason: str, permanent: bool = False) -> None:
        super().__init__(reason)
        self.permanent = permanent


def post_json(url: str, payload: Any, timeout_s: float) -> None:
    """POST ``payload`` as JSON; raises :class:`DeliveryFailed` unless the answer is 2xx."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()[:300].decode(errors="replace").strip()
        permanent = 400 <= exc.code < 500 and exc.code not in (408, 429)
        raise DeliveryFailed(f"HTTP {exc.code} from {url}: {body}", permanent) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise DeliveryFailed(f"{url} unreachable: {reason}") from None


Poster = Callable[[str, Any, float], None]


@dataclass(frozen=True)
class Destination:
    kind: DestinationKind
    url: str
    """The URL posted to (Alertmanager's ``/api/v2/alerts``)."""


def destinations(settings: AlertForwardSettings) -> list[Destination]:
    found: list[Destination] = []
    if settings.alertmanager_url:
        found.append(Destination("alertmanager", settings.alertmanager_url.rstrip("/") + "/api/v2/alerts"))
    if settings.webhook_url:
        found.append(Destination("webhook", settings.webhook_url))
    return found


class ForwardMetrics:
    def __init__(self, registry: MetricsRegistry) -> None:
        self.registry = registry
        self.delivered = registry.counter(
            "alerts_forward_delivered_total", "Alert transitions delivered", ("destination", "state"))
        self.failed = registry.counter(
            "alerts_forward_failures_total", "Failed delivery attempts", ("destination",))
        self.dead_letters = registry.counter(
            "alerts_forward_dead_letters_total",
            "Transitions sent to the dead-letter topic, by the destination that failed (none: undecodable)",
            ("destination",))
        self.latency = registry.histogram(
            "alerts_forward_latency_seconds", "From the transition's Kafka timestamp to its delivery",
            ("destination",))
        self.backoff = registry.gauge(
            "alerts_forward_retry_backoff_seconds", "Current wait before the next retry (0 when delivering)")


@dataclass
class ForwardTotals:
    delivered: dict[str, int] = field(default_factory=dict)
    """Deliveries per destination kind."""
    failures: int = 0
    dead_letters: int = 0
    batches: int = 0


class ForwarderStopped(GpulensError):
    """Stop was requested while a delivery was failing: leave without committing."""


class AlertForwarder:
    """Delivers transitions; Kafka-free, so tests drive :meth:`deliver` directly."""

    def __init__(self, settings: AlertForwardSettings, metrics: ForwardMetrics, *, post: Poster = post_json,
                 stop: threading.Event | None = None, now: Callable[[], datetime] | None = None,
                 teams: PodTeams | None = None) -> None:
        self.settings = settings
        self.teams = teams or PodTeams(None)
        self.metrics = metrics
        self.post = post
        self.stop = stop or threading.Event()
        self.now = now or (lambda: datetime.now(UTC))
        self.destinations = destinations(settings)
        self.backoff = Backoff(base_s=settings.retry_initial_s, cap_s=settings.retry_max_s)
        self.totals = ForwardTotals()

    def payload(self, alert: Alert, destination: Destination) -> Any:
        s = self.settings
        team = self.teams.team(alert)
        cluster = alert.cluster if alert.cluster != DEFAULT_CLUSTER else s.cluster
        if destination.kind == "alertmanager":
            return [alertmanager_alert(alert, cluster=cluster, runbook_base_url=s.runbook_base_url,
                                       firing_hold_s=s.firing_hold_s, now=self.now(), team=team)]
        return webhook_body(alert, cluster=cluster, runbook_base_url=s.runbook_base_url,
                            body_format=s.webhook_format, team=team)

    def deliver(self, record: ConsumedRecord) -> list[str]:
        """Deliver one record to every destination; returns the reasons to dead-letter it (none
        when it was delivered everywhere). Raises :class:`ForwarderStopped` on stop."""
        return [detail for _code, detail in self.deliver_coded(record)]

    def deliver_coded(self, record: ConsumedRecord) -> list[tuple[DeadLetterReason, str]]:
        """:meth:`deliver` with each dead letter's code: ``undeliverable`` for a destination that
        never accepted the alert, ``invalid`` for a record that is no alert."""
        if record.value is None:
            return []  # not a transition (a tombstone): nothing to deliver
        try:
            alert = decode(record.value, Alert)
        except MessageError as exc:
            self.metrics.dead_letters.labels("none").inc()
            return [(exc.code, f"undecodable alert: {exc}")]
        reasons = []
        for destination in self.destinations:
            reason = self._deliver_to(destination, alert, record)
            if reason is not None:
                reasons.append((DeadLetterReason.UNDELIVERABLE, reason))
                self.metrics.dead_letters.labels(destination.kind).inc()
        return reasons

    def _deliver_to(self, destination: Destination, alert: Alert, record: ConsumedRecord) -> str | None:
        attempts = 0
        while True:
            try:
                self.post(destination.url, self.payload(alert, destination), self.settings.request_timeout_s)
            except DeliveryFailed as exc:
                attempts += 1
                self.totals.failures += 1
                self.metrics.failed.labels(destination.kind).inc()
                if exc.permanent or attempts >= self.settings.max_attempts:
                    why = "rejected" if exc.permanent else f"failed {attempts} times"
                    return f"{destination.kind} delivery {why}: {exc}"
                delay = self.backoff.next_delay_s()
                self.metrics.backoff.set(delay)
                log.warning("alert delivery failed; retrying", destination=destination.kind, alert=alert.id,
                            state=alert.state, attempt=attempts, retry_in_s=round(delay, 2), error=str(exc))
                if self.stop.wait(delay):
                    raise ForwarderStopped from None
                continue
            self.backoff.reset()
            self.metrics.backoff.set(0)
            self.metrics.delivered.labels(destination.kind, alert.state).inc()
            self.totals.delivered[destination.kind] = self.totals.delivered.get(destination.kind, 0) + 1
            if record.timestamp_ms:
                self.metrics.latency.labels(destination.kind).observe(
                    max(0.0, time.time() - record.timestamp_ms / 1000))
            log.info("alert delivered", destination=destination.kind, alert=alert.id, type=alert.type,
                     state=alert.state, attempts=attempts + 1)
            return None


# --------------------------------------------------------------------------- the consumer


def run_forwarder(settings: AlertForwardSettings, *, stop: threading.Event | None = None,
                  exit_when_idle_s: float | None = None, post: Poster = post_json,
                  metrics: ForwardMetrics | None = None) -> ForwardTotals:
    """Consume ``alerts.v1`` and deliver until ``stop`` (or idle for ``exit_when_idle_s``)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    metrics = metrics or ForwardMetrics(MetricsRegistry())
    if settings.metrics_port:
        port = metrics.registry.serve(settings.metrics_port, settings.metrics_addr)
        log.info("metrics endpoint", port=port, path="/metrics")
    teams = PodTeams(TopicFollower(settings.kafka, K8S_PODS.name(settings.topic_prefix)))
    forwarder = AlertForwarder(settings, metrics, post=post, stop=stop, teams=teams)
    topic = ALERTS.name(settings.topic_prefix)
    dlq_topic = DEADLETTER.name(settings.topic_prefix)
    consumer = make_consumer(settings.kafka, settings.group_id)
    producer = BoundedProducer(settings.kafka, settings.producer)
    consumer.subscribe([topic], on_assign=lambda _c, parts: log.info(
        "partitions assigned", partitions=sorted(p.partition for p in parts)))
    log.info("alert forwarder started", topic=topic, group=settings.group_id,
             destinations=[f"{d.kind} {d.url}" for d in forwarder.destinations])
    idle_since = time.monotonic()
    try:
        while not stop.is_set():
            records = _poll(consumer, topic, settings.batch_max_records)
            if not records:
                if exit_when_idle_s is not None and time.monotonic() - idle_since >= exit_when_idle_s:
                    break
                continue
            idle_since = time.monotonic()
            _refresh(teams)
            try:
                _forward_batch(forwarder, records, producer, dlq_topic)
            except ForwarderStopped:
                log.info("stopped while delivering: the batch is not committed and will be delivered again")
                break
            _commit(consumer, records)
            forwarder.totals.batches += 1
            idle_since = time.monotonic()
    finally:
        consumer.close()
        producer.close(10.0)
        teams.close()
    return forwarder.totals


def _poll(consumer: Consumer, topic: str, batch_max_records: int) -> list[ConsumedRecord]:
    """Wait for one record, then take what has already arrived: no waiting for a full batch."""
    first = consumer.poll(0.5)
    messages = [] if first is None else [first]
    if first is not None and batch_max_records > 1:
        messages += consumer.consume(batch_max_records - 1, 0)
    return [ConsumedRecord(m.topic() or topic, int(m.partition() or 0), int(m.offset() or 0),
                           _bytes(m.key()), m.value(), m.timestamp()[1])
            for m in messages if m.error() is None]


def _refresh(teams: PodTeams) -> None:
    try:
        teams.refresh()
    except (KafkaException, TimeoutError) as exc:  # a missing team label is no reason to hold alerts
        log.warning("pod states not read; alerts go without a fresh team label", error=str(exc))


def _commit(consumer: Consumer, records: list[ConsumedRecord]) -> None:
    offsets: dict[tuple[str, int], int] = {}
    for r in records:
        offsets[(r.topic, r.partition)] = max(offsets.get((r.topic, r.partition), 0), r.offset + 1)
    try:
        commit_offsets(consumer, offsets)
    except KafkaException as exc:  # e.g. a rebalance took the partition: delivered again, harmless
        log.warning("offset commit failed", error=str(exc))


def encoded_dead_letter(record: ConsumedRecord, code: DeadLetterReason, detail: str) -> tuple[bytes, Headers]:
    """``record``'s dead letter with ``code`` and ``detail``, encoded, with its headers."""
    letter = dead_letter(detail, record.topic, record.value, datetime.now(UTC), record.partition, record.offset,
                         reason=code)
    return encode(letter), dead_letter_headers(letter)


def _bytes(key: str | bytes | None) -> bytes | None:
    return key.encode() if isinstance(key, str) else key


def _forward_batch(forwarder: AlertForwarder, records: list[ConsumedRecord], producer: BoundedProducer,
                   dlq_topic: str) -> None:
    letters: list[tuple[ConsumedRecord, bytes, Headers]] = []
    for record in records:
        for code, reason in forwarder.deliver_coded(record):
            value, headers = encoded_dead_letter(record, code, reason)
            letters.append((record, value, headers))
            log.error("alert dead-lettered", partition=record.partition, offset=record.offset, code=code.value,
                      reason=reason[:300])
    while letters:  # the dead letters must be in Kafka before the batch is committed
        failed_before = producer.stats.failed
        for record, value, headers in letters:
            while not producer.produce(dlq_topic, record.key, value, headers):
                producer.poll(0.5)
        if producer.flush(30.0) == 0 and producer.stats.failed == failed_before:
            forwarder.totals.dead_letters += len(letters)
            return
        delay = forwarder.backoff.next_delay_s()
        log.warning("dead-letter delivery failed; retrying", retry_in_s=round(delay, 2),
                    error=producer.stats.last_error)
        if forwarder.stop.wait(delay):
            raise ForwarderStopped
