"""``gpulens config show``: the effective configuration of a service (flags aside: environment
over defaults), every secret masked (:func:`common.settings.redacted`)."""

from __future__ import annotations

import click

SERVICES = ("common", "agent", "watcher", "worker", "sink", "alerts")


@click.group("config")
def config() -> None:
    """Configuration."""


@config.command("show")
@click.option("--service", type=click.Choice(SERVICES), default="common")
def config_show(service: str) -> None:
    """Print the effective configuration (secrets masked)."""
    import orjson

    from common.settings import (
        AgentSettings,
        AlertForwardSettings,
        CommonSettings,
        SinkSettings,
        WatcherSettings,
        WorkerSettings,
        load_settings,
        redacted,
    )

    settings_type: type[CommonSettings] = {
        "common": CommonSettings, "agent": AgentSettings, "watcher": WatcherSettings, "worker": WorkerSettings,
        "sink": SinkSettings, "alerts": AlertForwardSettings}[service]
    click.echo(orjson.dumps(redacted(load_settings(settings_type)), option=orjson.OPT_INDENT_2).decode())


COMMANDS = [config]
