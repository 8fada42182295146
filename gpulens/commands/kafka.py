"""``gpulens kafka up|down|status``: the local single-node Kafka broker (KRaft) of the embedded
default (:mod:`gpulens.kafka_local` runs it)."""

from __future__ import annotations

from typing import Any, Literal

import click

from gpulens.commands.base import settings_from_flags, with_common_options

Action = Literal["up", "down", "status"]

_HELP: dict[Action, str] = {
    "up": "Fetch (once) and start the broker; reuse it if running.",
    "down": "Stop the broker gpulens started.",
    "status": "Say whether the broker runs.",
}


@click.group("kafka")
def kafka() -> None:
    """Run the local single-node Kafka broker (KRaft) for the embedded default."""


def _run(action: Action, port: int | None, controller_port: int | None, flags: dict[str, Any]) -> None:
    import dataclasses

    from common.settings import CommonSettings
    from gpulens.kafka_local import LocalKafka

    settings = settings_from_flags(CommonSettings, **flags)
    local = LocalKafka.from_settings(settings)
    if port:
        local = dataclasses.replace(local, port=port)
    if controller_port:
        local = dataclasses.replace(local, controller_port=controller_port)
    if action == "up":
        click.echo(local.up(timeout_s=settings.local_kafka.start_timeout_s))
    elif action == "down":
        click.echo(local.down())
    else:
        click.echo(local.status())


def _action_command(action: Action) -> click.Command:
    @with_common_options
    @click.option("--port", type=int, default=None, help="broker port [env GPULENS_LOCAL_KAFKA__PORT]")
    @click.option("--controller-port", type=int, default=None, help="KRaft controller port")
    def command(port: int | None, controller_port: int | None, **flags: Any) -> None:
        _run(action, port, controller_port, flags)

    command.__doc__ = _HELP[action]
    return kafka.command(action)(command)


for _action in _HELP:
    _action_command(_action)

COMMANDS = [kafka]
