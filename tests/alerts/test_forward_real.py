"""``gpulens alerts forward`` on the real broker into a real Alertmanager (built from the Go
module proxy by scripts/alertmanager-build.sh) whose webhook receiver is a small HTTP server in the
test: the scenario's alerts arrive firing and then resolved with the right labels; an Alertmanager
that is down, a webhook that always fails and a forwarder killed mid-delivery lose nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.kafka import BoundedProducer, ensure_topics, group_lag, read_to_end
from common.settings import KafkaSettings
from schemas.codec import decode, encode
from schemas.messages import PodState
from schemas.outputs import Alert, DeadLetter
from schemas.topics import ALERTS, DEADLETTER, K8S_PODS
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from sinks.alerts_forward import DeliveryFailed, post_json
from tests.alerts.helpers import (
    Alertmanager,
    Received,
    Receiver,
    alertmanager_binary,
    forwarder_env,
    free_port,
    start_forwarder,
    wait_for,
)
from tests.child_process import GpulensChild
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.kafka

RUNBOOK = "https://docs.example/gpulens/alerts.md"
TEAM = "vision"


@pytest.fixture(scope="module")
def am_binary() -> Path:
    return alertmanager_binary()


@pytest.fixture(scope="module")
def scenario_alerts() -> list[Alert]:
    """The crashloop scenario's transitions as the stream jobs emit them: a crash-looping pod
    (critical) whose two GPUs also go idle (two alerts that differ only by GPU), all resolved."""
    result = run_in_process(load_scenario(REPO_ROOT / "simulation" / "scenarios" / "crashloop.yaml"))
    alerts = [m for m in result.outputs if isinstance(m, Alert)]
    assert [a.state for a in alerts].count("firing") == 3 and [a.state for a in alerts].count("resolved") == 3
    return alerts


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def topics(kafka_settings: KafkaSettings, topic_prefix: str) -> str:
    ensure_topics(kafka_settings, [ALERTS, DEADLETTER], topic_prefix)
    return ALERTS.name(topic_prefix)


def _produce(kafka: KafkaSettings, topic: str, alerts: list[Alert]) -> None:
    producer = BoundedProducer(kafka)
    for alert in alerts:
        assert producer.produce(topic, alert.id, encode(alert))
    assert producer.flush(30) == 0 and producer.stats.failed == 0


def _expected_labels(alert: Alert, team: str | None = None) -> dict[str, str]:
    labels = {"alertname": alert.type, "severity": alert.severity, "cluster": "test-cluster",
              "namespace": "ml", "pod": "bad-cuda", "node": "gpu-a"}
    if team:
        labels["team"] = team
    if alert.subject.gpu_uuid:
        labels["gpu_uuid"] = alert.subject.gpu_uuid
    return labels


def _notifications(receiver: Receiver) -> list[tuple[str, dict[str, Any]]]:
    """(status, alert) for every alert of every Alertmanager notification, in arrival order."""
    return [(a["status"], a) for body in receiver.bodies() for a in body["alerts"]]


def _seen(receiver: Receiver, alert: Alert, status: str, team: str | None = None) -> list[dict[str, Any]]:
    want = _expected_labels(alert, team)
    return [a for s, a in _notifications(receiver) if s == status and a["labels"] == want]


def _has(receiver: Receiver, alert: Alert, status: str, team: str | None = None) -> Callable[[], bool]:
    return lambda: bool(_seen(receiver, alert, status, team))


def _lag(kafka: KafkaSettings, prefix: str) -> int:
    return group_lag(kafka, f"{prefix}-forward", [ALERTS.name(prefix)])


def test_scenario_alerts_arrive_firing_then_resolved_with_labels_and_runbooks(
        kafka_settings: KafkaSettings, topic_prefix: str, topics: str, am_binary: Path, receiver: Receiver,
        scenario_alerts: list[Alert]) -> None:
    # the watcher's state of the scenario's pod, with its team (the alerts themselves carry none)
    ensure_topics(kafka_settings, [K8S_PODS], topic_prefix)
    pod = PodState(uid="uid-bad-cuda", namespace="ml", name="bad-cuda", ts=scenario_alerts[0].at, phase="Running",
                   team="vision", created_at=scenario_alerts[0].started_at)
    producer = BoundedProducer(kafka_settings)
    assert producer.produce(K8S_PODS.name(topic_prefix), pod.uid, encode(pod)) and producer.flush(30) == 0
    am = Alertmanager(am_binary, receiver.url)
    am.start()
    forwarder = start_forwarder(forwarder_env(kafka_settings, topic_prefix, alertmanager_url=am.url))
    try:
        forwarder.wait_assigned()
        # paced: the transitions in the stream's order, one at a time; a resolved one only once
        # its firing notification went out (as in a live fleet, where minutes separate them)
        for alert in scenario_alerts:
            if alert.state == "resolved":
                wait_for(_has(receiver, alert, "firing", TEAM), 60, f"{alert.type} firing")
            _produce(kafka_settings, topics, [alert])
            time.sleep(0.3)
        for alert in scenario_alerts:
            wait_for(_has(receiver, alert, alert.state, TEAM), 60, f"{alert.type} {alert.state}")
        wait_for(lambda: _lag(kafka_settings, topic_prefix) == 0, 30, "offsets committed")
    finally:
        code = forwarder.stop()
        am.stop()
    assert code == 0, forwarder.log()
    for alert in scenario_alerts:
        firing = _seen(receiver, alert, "firing", TEAM)
        resolved = _seen(receiver, alert, "resolved", TEAM)
        assert len(firing) == 1 and len(resolved) == 1, (alert.type, alert.state, _notifications(receiver))
        assert firing[0]["annotations"]["runbook_url"] == f"{RUNBOOK}#{alert.type}"
        assert firing[0]["startsAt"].startswith(alert.started_at.strftime("%Y-%m-%dT%H:%M:%S"))
        if alert.state == "firing":
            assert firing[0]["annotations"]["summary"] == alert.summary
        else:
            assert resolved[0]["endsAt"].startswith(alert.at.strftime("%Y-%m-%dT%H:%M:%S"))
    # firing before resolved for each alert
    order = [(s, tuple(sorted(a["labels"].items()))) for s, a in _notifications(receiver)]
    for alert in scenario_alerts:
        key = tuple(sorted(_expected_labels(alert, TEAM).items()))
        assert order.index(("firing", key)) < order.index(("resolved", key))
    assert read_to_end(kafka_settings, DEADLETTER.name(topic_prefix)) == []


def test_alertmanager_down_then_up_loses_nothing_and_commits_only_after_delivery(
        kafka_settings: KafkaSettings, topic_prefix: str, topics: str, am_binary: Path, receiver: Receiver,
        scenario_alerts: list[Alert]) -> None:
    am = Alertmanager(am_binary, receiver.url, port=free_port())  # not started yet
    forwarder = start_forwarder(forwarder_env(kafka_settings, topic_prefix, alertmanager_url=am.url,
                                               max_attempts="1000"))
    firing = [a for a in scenario_alerts if a.state == "firing"]
    try:
        forwarder.wait_assigned()
        _produce(kafka_settings, topics, firing)
        wait_for(lambda: forwarder.logged("alert delivery failed; retrying") >= 3, 60, "retries while down")
        assert _lag(kafka_settings, topic_prefix) == len(firing), "offsets committed before delivery"
        am.start()
        for alert in firing:
            wait_for(_has(receiver, alert, "firing"), 60, f"{alert.type} firing after the outage")
        wait_for(lambda: _lag(kafka_settings, topic_prefix) == 0, 30, "offsets committed after delivery")
        resolved = [a for a in scenario_alerts if a.state == "resolved"]
        _produce(kafka_settings, topics, resolved)
        for alert in resolved:
            wait_for(_has(receiver, alert, "resolved"), 60, f"{alert.type} resolved")
    finally:
        forwarder.stop()
        am.stop()
    assert forwarder.proc.returncode == 0, forwarder.log()
    assert read_to_end(kafka_settings, DEADLETTER.name(topic_prefix)) == []


def test_a_webhook_that_always_fails_gets_dead_letters_after_n_attempts(
        kafka_settings: KafkaSettings, topic_prefix: str, topics: str, scenario_alerts: list[Alert]) -> None:
    failing = Receiver(status=503)
    forwarder = start_forwarder(forwarder_env(kafka_settings, topic_prefix, webhook_url=failing.url,
                                               max_attempts="3"))
    sent = scenario_alerts[:2]
    try:
        forwarder.wait_assigned()
        _produce(kafka_settings, topics, sent)
        wait_for(lambda: len(read_to_end(kafka_settings, DEADLETTER.name(topic_prefix))) >= len(sent), 60,
                 "dead letters")
        wait_for(lambda: _lag(kafka_settings, topic_prefix) == 0, 30, "offsets committed after the dead letters")
        assert forwarder.proc.poll() is None, "the forwarder must keep running"
    finally:
        forwarder.stop()
        failing.close()
    letters = [decode(r.value, DeadLetter) for r in read_to_end(kafka_settings, DEADLETTER.name(topic_prefix))]
    assert len(letters) == len(sent)
    for letter, alert in zip(sorted(letters, key=lambda x: x.source_offset or 0), sent, strict=True):
        assert letter.source_topic == topics
        assert "webhook delivery failed 3 times" in letter.error and "HTTP 503" in letter.error
        assert letter.reason == "undeliverable", "the code of an alert no destination accepted"
        assert letter.payload_text is not None and decode(letter.payload_text.encode(), Alert).id == alert.id
    attempts = [b["id"] for b in failing.bodies()]
    assert sorted(attempts) == sorted([a.id for a in sent] * 3), "exactly N attempts per transition"


def test_a_duplicate_delivery_after_a_forwarder_kill_is_harmless(
        kafka_settings: KafkaSettings, topic_prefix: str, topics: str, am_binary: Path, receiver: Receiver,
        scenario_alerts: list[Alert]) -> None:
    am = Alertmanager(am_binary, receiver.url)
    am.start()
    # a proxy in front of Alertmanager: the first request reaches Alertmanager, then the
    # forwarder is killed before it hears the answer, so that transition is delivered but not committed
    proxy = Receiver()
    state: dict[str, GpulensChild] = {}

    def pass_through(item: Received) -> None:
        try:
            post_json(f"{am.url}/api/v2/alerts", item.body, 10)
        except DeliveryFailed as exc:
            raise AssertionError(exc) from None
        if "first" in state:
            state.pop("first").kill()

    proxy.before_answer = pass_through
    alert = scenario_alerts[0]
    resolved = next(a for a in scenario_alerts if a.id == alert.id and a.state == "resolved")
    env = forwarder_env(kafka_settings, topic_prefix, alertmanager_url=proxy.url.rstrip("/"))
    first = state["first"] = start_forwarder(env)
    second = None
    try:
        first.wait_assigned()
        _produce(kafka_settings, topics, [alert])
        wait_for(lambda: first.proc.poll() is not None, 60, "the first forwarder killed mid-delivery")
        assert _lag(kafka_settings, topic_prefix) == 1, "the unacknowledged delivery must not be committed"
        wait_for(lambda: bool(_seen(receiver, alert, "firing")), 60, "firing notification")
        second = start_forwarder(env)
        second.wait_assigned()
        wait_for(lambda: len(proxy.received) >= 2, 60, "the transition delivered again")
        wait_for(lambda: _lag(kafka_settings, topic_prefix) == 0, 30, "offsets committed")
        time.sleep(4)  # several group intervals: a second notification would have gone out by now
        assert len(_seen(receiver, alert, "firing")) == 1, _notifications(receiver)
        same = [a for a in am.alerts() if a["labels"] == _expected_labels(alert)]
        assert len(same) == 1
        _produce(kafka_settings, topics, [resolved])
        wait_for(lambda: bool(_seen(receiver, alert, "resolved")), 60, "resolved notification")
    finally:
        if second is not None:
            second.stop()
        if first.proc.poll() is None:
            first.stop()
        am.stop()
        proxy.close()
    assert len(_seen(receiver, alert, "resolved")) == 1
    assert [b[0]["labels"] for b in proxy.bodies()][:2] == [_expected_labels(alert)] * 2
