"""``gpulens kafka up|down|status``: the local Kafka of the embedded default (KRaft): one broker,
or with ``--brokers 3`` three replicating nodes (:mod:`gpulens.kafka_local` runs them)."""

from __future__ import annotations

from typing import Any, Literal

import click

from gpulens.commands.base import settings_from_flags, with_common_options

Action = Literal["up", "down", "status"]

_HELP: dict[Action, str] = {
    "up": "Fetch (once) and start the broker, or every node of the cluster; reuse what runs.",
    "down": "Stop the broker or the cluster gpulens started.",
    "status": "Say whether the broker (each node of the cluster) runs.",
}


@click.group("kafka")
def kafka() -> None:
    """Run the local Kafka (KRaft; one broker, or three with --brokers 3) for the embedded default."""


def _run(action: Action, local_flags: dict[str, int | None], flags: dict[str, Any]) -> None:
    from common.settings import CommonSettings
    from gpulens.kafka_local import LocalKafka

    given = {key: value for key, value in local_flags.items() if value is not None}
    settings = settings_from_flags(CommonSettings, **flags, local_kafka=given or None)
    local = LocalKafka.from_settings(settings)
    if action == "up":
        click.echo(local.up(timeout_s=settings.local_kafka.start_timeout_s))
    elif action == "down":
        click.echo(local.down())
    else:
        click.echo(local.status())


def _action_command(action: Action) -> click.Command:
    @with_common_options
    @click.option("--brokers", type=int, default=None,
                  help="1, or 3 nodes replicating every topic [env GPULENS_LOCAL_KAFKA__BROKERS; default 1]")
    @click.option("--port", type=int, default=None,
                  help="client port of the first node; node i listens on PORT+2i [env GPULENS_LOCAL_KAFKA__PORT]")
    @click.option("--controller-port", type=int, default=None,
                  help="KRaft controller port of the first node; node i uses it +2i "
                       "[env GPULENS_LOCAL_KAFKA__CONTROLLER_PORT]")
    def command(brokers: int | None, port: int | None, controller_port: int | None, **flags: Any) -> None:
        _run(action, {"brokers": brokers, "port": port, "controller_port": controller_port}, flags)

    command.__doc__ = _HELP[action]
    return kafka.command(action)(command)


for _action in _HELP:
    _action_command(_action)

COMMANDS = [kafka]
