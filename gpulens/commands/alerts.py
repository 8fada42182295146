"""``gpulens alerts forward``: deliver alert transitions to Alertmanager and/or a webhook
(see sinks/alerts_forward.py for the mapping and the delivery guarantees)."""

from __future__ import annotations

from typing import Any

import click

from common.errors import UserError
from gpulens.commands.base import settings_from_flags, with_common_options


@click.group("alerts")
def alerts() -> None:
    """Alert routing: forward alerts.v1 to Alertmanager and webhooks."""


@alerts.command("forward")
@with_common_options
@click.option("--alertmanager-url", default=None,
              help="Alertmanager base URL, e.g. http://alertmanager:9093 [env GPULENS_ALERTMANAGER_URL]")
@click.option("--webhook-url", default=None,
              help="a webhook receiving one POST per transition [env GPULENS_WEBHOOK_URL]")
@click.option("--webhook-format", default=None, type=click.Choice(["json", "slack"]),
              help="webhook body: the gpulens alert (json) or a Slack-compatible body [env GPULENS_WEBHOOK_FORMAT]")
@click.option("--cluster", default=None, help="value of the cluster label [env GPULENS_CLUSTER]")
@click.option("--runbook-base-url", default=None,
              help="where docs/alerts.md is published; runbook_url = this + #<type> [env GPULENS_RUNBOOK_BASE_URL]")
@click.option("--group-id", default=None, help="consumer group [env GPULENS_GROUP_ID]")
@click.option("--max-attempts", type=int, default=None,
              help="failed deliveries to one destination before dead-lettering [env GPULENS_MAX_ATTEMPTS]")
@click.option("--metrics-port", type=int, default=None, help="/metrics port, 0 = off [env GPULENS_METRICS_PORT]")
@click.option("--exit-when-idle", "exit_when_idle_s", type=float, default=None,
              help="exit once nothing arrived for this many seconds")
def forward(exit_when_idle_s: float | None, **flags: Any) -> None:
    """Consume alerts.v1 and deliver each transition (at least once; dead letter after N failures)."""
    from common.kafka import KafkaException
    from common.settings import AlertForwardSettings
    from sinks.alerts_forward import run_forwarder

    settings: AlertForwardSettings = settings_from_flags(AlertForwardSettings, **flags)
    try:
        totals = run_forwarder(settings, exit_when_idle_s=exit_when_idle_s)
    except KafkaException as exc:
        raise UserError(f"Kafka: {exc}") from None
    delivered = ", ".join(f"{kind} {n}" for kind, n in sorted(totals.delivered.items())) or "nothing"
    click.echo(f"alert forwarder stopped: delivered {delivered}; dead letters {totals.dead_letters}", err=True)


COMMANDS = [alerts]
