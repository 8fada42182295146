"""The mapping of a gpulens alert transition onto Alertmanager's v2 API and webhook bodies, and
the delivery rules (retry, give up after N, dead-letter at once on a rejection), driven without Kafka."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common.kafka import ReadRecord
from common.metrics import MetricsRegistry
from common.settings import AlertForwardSettings, ConfigError, load_settings
from schemas.codec import encode
from schemas.messages import PodState
from schemas.outputs import KNOWN_ALERT_TYPES, Alert, AlertSubject
from sinks.alerts_forward import (
    AlertForwarder,
    DeliveryFailed,
    ForwardMetrics,
    PodTeams,
    alert_labels,
    alertmanager_alert,
    runbook_url,
    webhook_body,
)
from sinks.batches import ConsumedRecord
from tests.conftest import REPO_ROOT

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _alert(state: str = "firing", **overrides: Any) -> Alert:
    fields: dict[str, Any] = {
        "id": "a1", "type": "idle_gpu", "severity": "warning", "state": state,
        "at": T0 + timedelta(minutes=10 if state == "firing" else 30), "started_at": T0 + timedelta(minutes=10),
        "subject": AlertSubject(kind="pod", namespace="ml", name="train-0", node="gpu-a", gpu_uuid="GPU-1"),
        "summary": "ml/train-0: GPU 0 on gpu-a below 5% SM for 10m", "details": {"idle_class": "no_process"},
    }
    return Alert(**(fields | overrides))


def test_pod_alert_labels_identify_pod_and_gpu() -> None:
    assert alert_labels(_alert(), "prod-eu") == {
        "alertname": "idle_gpu", "severity": "warning", "cluster": "prod-eu", "namespace": "ml",
        "pod": "train-0", "node": "gpu-a", "gpu_uuid": "GPU-1"}


def test_node_gang_and_team_labels() -> None:
    node = _alert(type="idle_node", severity="info", subject=AlertSubject(kind="node", name="gpu-b", node="gpu-b"))
    assert alert_labels(node, "c") == {"alertname": "idle_node", "severity": "info", "cluster": "c", "node": "gpu-b"}
    gang = _alert(type="gang_partial", subject=AlertSubject(kind="gang", namespace="ml", name="job-7"),
                  details={"team": "vision"})
    assert alert_labels(gang, "c") == {"alertname": "gang_partial", "severity": "warning", "cluster": "c",
                                       "namespace": "ml", "gang": "job-7", "team": "vision"}


def test_a_queued_workload_alert_is_told_apart_from_a_pod_of_the_same_name() -> None:
    queued = _alert(type="pending_gpu", subject=AlertSubject(kind="workload", namespace="ml", name="train-0"),
                    details={"team": "nlp", "queue": "research"})
    assert alert_labels(queued, "c") == {"alertname": "pending_gpu", "severity": "warning", "cluster": "c",
                                         "namespace": "ml", "workload": "train-0", "team": "nlp"}


def test_firing_and_resolved_share_labels_so_alertmanager_pairs_them() -> None:
    firing = alertmanager_alert(_alert(), cluster="c", runbook_base_url="u", firing_hold_s=3600, now=NOW)
    resolved = alertmanager_alert(_alert("resolved"), cluster="c", runbook_base_url="u", firing_hold_s=3600, now=NOW)
    assert firing["labels"] == resolved["labels"]
    assert firing["startsAt"] == resolved["startsAt"] == "2026-01-05T09:10:00Z"
    assert firing["endsAt"] == "2026-03-01T13:00:00Z", "firing: held open from now, not from a past event time"
    assert resolved["endsAt"] == "2026-01-05T09:30:00Z"


def test_every_known_type_has_a_runbook_section_in_docs_alerts_md() -> None:
    headings = set(re.findall(r"^## (\w+)$", (REPO_ROOT / "docs" / "alerts.md").read_text(), flags=re.M))
    for alert_type in KNOWN_ALERT_TYPES:
        url = runbook_url("https://x/alerts.md", alert_type)
        assert url == f"https://x/alerts.md#{alert_type}" and alert_type in headings
    assert runbook_url("https://x/alerts.md", "new_type") == "https://x/alerts.md", "an unknown type has no section"
    annotations = alertmanager_alert(_alert(), cluster="c", runbook_base_url="https://x/alerts.md",
                                     firing_hold_s=60, now=NOW)["annotations"]
    assert annotations["runbook_url"] == "https://x/alerts.md#idle_gpu"
    assert annotations["summary"] == _alert().summary and "idle_class=no_process" in annotations["description"]


def test_webhook_bodies() -> None:
    plain = webhook_body(_alert(), cluster="c", runbook_base_url="u", body_format="json")
    assert plain["id"] == "a1" and plain["state"] == "firing" and plain["labels"]["pod"] == "train-0"
    slack = webhook_body(_alert("resolved"), cluster="c", runbook_base_url="u", body_format="slack")
    assert slack["text"].startswith(":white_check_mark: [RESOLVED] idle_gpu (warning)")
    assert "<u#idle_gpu|runbook>" in slack["blocks"][1]["elements"][0]["text"]


def test_settings_name_what_is_missing_or_wrong() -> None:
    with pytest.raises(ConfigError, match="GPULENS_ALERTMANAGER_URL and/or GPULENS_WEBHOOK_URL"):
        load_settings(AlertForwardSettings)
    with pytest.raises(ConfigError, match=r"GPULENS_ALERTMANAGER_URL: .*http"):
        load_settings(AlertForwardSettings, alertmanager_url="alertmanager:9093")
    with pytest.raises(ConfigError, match="GPULENS_MAX_ATTEMPTS"):
        load_settings(AlertForwardSettings, webhook_url="http://h/x", max_attempts=0)


class FlakyPoster:
    """A destination that fails with ``failures`` (in order) and then accepts."""

    def __init__(self, *failures: DeliveryFailed) -> None:
        self.failures = list(failures)
        self.calls: list[tuple[str, Any]] = []

    def __call__(self, url: str, payload: Any, timeout_s: float) -> None:
        self.calls.append((url, payload))
        if self.failures:
            raise self.failures.pop(0)


def _forwarder(post: FlakyPoster, **settings: Any) -> AlertForwarder:
    s = load_settings(AlertForwardSettings, **({"alertmanager_url": "http://am:9093", "retry_initial_s": 0.001,
                                                 "retry_max_s": 0.002} | settings))
    return AlertForwarder(s, ForwardMetrics(MetricsRegistry()), post=post, now=lambda: NOW)


def _record(value: bytes | None) -> ConsumedRecord:
    return ConsumedRecord("p.alerts.v1", 0, 7, b"a1", value, None)


def test_transient_failures_are_retried_until_delivered() -> None:
    post = FlakyPoster(DeliveryFailed("unreachable"), DeliveryFailed("HTTP 503"))
    forwarder = _forwarder(post, max_attempts=3)
    assert forwarder.deliver(_record(encode(_alert()))) == []
    assert [url for url, _ in post.calls] == ["http://am:9093/api/v2/alerts"] * 3
    assert forwarder.totals.delivered == {"alertmanager": 1}


def test_after_max_attempts_the_record_is_to_be_dead_lettered() -> None:
    post = FlakyPoster(*[DeliveryFailed("HTTP 500 from x")] * 5)
    reasons = _forwarder(post, max_attempts=2).deliver(_record(encode(_alert())))
    assert reasons == ["alertmanager delivery failed 2 times: HTTP 500 from x"] and len(post.calls) == 2


def test_a_rejected_request_is_dead_lettered_at_once_and_other_destinations_still_get_it() -> None:
    post = FlakyPoster(DeliveryFailed("HTTP 400 from am: bad labels", permanent=True))
    forwarder = _forwarder(post, webhook_url="http://hook/x", max_attempts=5)
    reasons = forwarder.deliver(_record(encode(_alert())))
    assert reasons == ["alertmanager delivery rejected: HTTP 400 from am: bad labels"]
    assert [url for url, _ in post.calls] == ["http://am:9093/api/v2/alerts", "http://hook/x"]


def test_an_undecodable_record_is_dead_lettered_with_the_reason() -> None:
    post = FlakyPoster()
    [reason] = _forwarder(post).deliver(_record(b'{"id": "x"}'))
    assert reason.startswith("undecodable alert:") and post.calls == []


class ListFollower:
    """Hands out prepared pod-state records, as TopicFollower.catch_up does from k8s.pods.v1."""

    def __init__(self) -> None:
        self.pending: list[ReadRecord] = []

    def catch_up(self, timeout_s: float = 30.0, partial: bool = False) -> list[ReadRecord]:
        out, self.pending = self.pending, []
        return out

    def close(self) -> None:
        return None


def _pod_record(uid: str, value: bytes | None, offset: int) -> ReadRecord:
    return ReadRecord("p.k8s.pods.v1", 0, offset, uid.encode(), value, {})


def test_pod_alerts_get_the_team_of_the_pods_state_until_it_is_deleted() -> None:
    follower = ListFollower()
    teams = PodTeams(follower)  # type: ignore[arg-type]
    state = PodState(uid="u1", namespace="ml", name="train-0", ts=T0, phase="Running", team="vision", created_at=T0)
    follower.pending = [_pod_record("u1", encode(state), 0), _pod_record("u2", b"not json", 1)]
    teams.refresh()
    assert teams.team(_alert()) == "vision"
    assert alert_labels(_alert(), "c", teams.team(_alert()))["team"] == "vision"
    assert alert_labels(_alert(details={"team": "nlp"}), "c", "vision")["team"] == "nlp", "the alert's own wins"
    gang = _alert(subject=AlertSubject(kind="gang", namespace="ml", name="train-0"))
    assert teams.team(gang) is None
    follower.pending = [_pod_record("u1", None, 2)]
    teams.refresh()
    assert teams.team(_alert()) is None and "team" not in alert_labels(_alert(), "c", teams.team(_alert()))


def test_pod_teams_are_per_cluster_and_a_tombstone_removes_only_its_clusters_pod() -> None:
    follower = ListFollower()
    teams = PodTeams(follower)  # type: ignore[arg-type]
    here = PodState(uid="u1", namespace="ml", name="train-0", ts=T0, phase="Running", team="vision", created_at=T0)
    there = here.model_copy(update={"cluster": "east", "team": "nlp"})
    follower.pending = [_pod_record("u1", encode(here), 0), _pod_record("east/u1", encode(there), 1)]
    teams.refresh()
    assert (teams.team(_alert()), teams.team(_alert(cluster="east"))) == ("vision", "nlp")
    follower.pending = [_pod_record("east/u1", None, 2)]
    teams.refresh()
    assert (teams.team(_alert()), teams.team(_alert(cluster="east"))) == ("vision", None)
