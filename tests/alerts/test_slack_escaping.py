"""Cluster data cannot command a Slack channel: in the Slack body every string from the alert is
escaped by Slack's rules (``&``, ``<``, ``>``), so an annotation like ``<!channel> <https://evil|...>``
neither pings the channel nor becomes a link; the runbook link stays the only markup. The JSON body
and Alertmanager's labels and annotations keep the data as it is. An alert no destination accepts
is dead-lettered with the code ``undeliverable``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from common.metrics import MetricsRegistry
from common.settings import AlertForwardSettings, load_settings
from schemas.codec import decode, encode
from schemas.outputs import Alert, AlertSubject
from sinks import alerts_forward
from sinks.alerts_forward import AlertForwarder, DeliveryFailed, ForwardMetrics, alertmanager_alert, webhook_body
from sinks.batches import ConsumedRecord

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
EVIL = "<!channel> <https://evil.example/login|Your GPU quota expires> & <@U123> <!subteam^S1>"
SLACK_MARKUP = re.compile(r"<[^>]*>")


def _hostile(kind: Literal["gang", "pod"] = "gang") -> Alert:
    return Alert(id="a1", type="gang_partial", severity="warning", state="firing", at=T0 + timedelta(minutes=5),
                 started_at=T0 + timedelta(minutes=5),
                 subject=AlertSubject(kind=kind, namespace=f"ml{EVIL}", name=f"job-7{EVIL}", node=f"gpu-a{EVIL}"),
                 summary=f"gang {EVIL}: 2 of 4 members pending", details={"team": f"vision{EVIL}"})


def _texts(body: dict[str, Any]) -> list[str]:
    return [body["text"], body["blocks"][0]["text"]["text"], body["blocks"][1]["elements"][0]["text"]]


def test_slack_text_escapes_commands_mentions_and_links_from_alert_data() -> None:
    kinds: tuple[Literal["gang", "pod"], ...] = ("gang", "pod")
    for kind in kinds:
        body = webhook_body(_hostile(kind), cluster="c", runbook_base_url="https://docs/alerts.md",
                            body_format="slack")
        text, section, context = _texts(body)
        for part in (text, section):
            assert SLACK_MARKUP.findall(part) == [], part
            assert "&lt;!channel&gt; &lt;https://evil.example/login|Your GPU quota expires&gt; &amp; " in part
        assert SLACK_MARKUP.findall(context) == ["<https://docs/alerts.md#gang_partial|runbook>"], context
        assert f"{kind}=job-7&lt;!channel&gt;" in context
        assert "<!" not in " ".join(_texts(body))


def test_json_webhook_and_alertmanager_carry_the_data_as_it_is() -> None:
    plain = webhook_body(_hostile(), cluster="c", runbook_base_url="u", body_format="json")
    assert plain["summary"] == _hostile().summary and plain["labels"]["gang"] == f"job-7{EVIL}"
    am = alertmanager_alert(_hostile(), cluster="c", runbook_base_url="u", firing_hold_s=60, now=T0)
    assert am["labels"]["team"] == f"vision{EVIL}" and am["annotations"]["summary"] == _hostile().summary


class FakeProducer:
    """What ``_forward_batch`` needs of :class:`common.kafka.BoundedProducer`."""

    class Stats:
        failed = 0
        last_error = None

    def __init__(self) -> None:
        self.stats = self.Stats()
        self.sent: list[tuple[str, bytes | None, bytes, list[tuple[str, Any]]]] = []

    def produce(self, topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, Any]]) -> bool:
        self.sent.append((topic, key, value, headers))
        return True

    def poll(self, timeout_s: float) -> None:
        return None

    def flush(self, timeout_s: float) -> int:
        return 0


def test_an_alert_no_destination_accepts_is_dead_lettered_as_undeliverable() -> None:
    from schemas.outputs import DeadLetter, DeadLetterReason  # here: the other tests run on older trees too

    def reject(url: str, payload: Any, timeout_s: float) -> None:
        raise DeliveryFailed("HTTP 400 from hook: no", permanent=True)

    settings = load_settings(AlertForwardSettings, webhook_url="http://hook/x", webhook_format="slack")
    forwarder = AlertForwarder(settings, ForwardMetrics(MetricsRegistry()), post=reject)
    producer = FakeProducer()
    records = [ConsumedRecord("p.alerts.v1", 0, 7, b"a1", encode(_hostile())),
               ConsumedRecord("p.alerts.v1", 0, 8, b"x", b'{"id": "x"}')]
    alerts_forward._forward_batch(forwarder, records, producer, "p.deadletter.v1")  # type: ignore[arg-type]
    letters = [decode(value, DeadLetter) for _topic, _key, value, _headers in producer.sent]
    assert [(d.reason, d.source_offset) for d in letters] == [
        (DeadLetterReason.UNDELIVERABLE, 7), (DeadLetterReason.INVALID, 8)]
    assert letters[0].error == "webhook delivery rejected: HTTP 400 from hook: no"
    assert dict(producer.sent[0][3])["reason"] == "undeliverable"
