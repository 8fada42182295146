"""The ``gpulens`` command line: one entry point for every part of the product.

Each part contributes a click command from ``gpulens/commands`` (registered by name in
``gpulens/commands/__init__.py``; the flags they share are in ``gpulens/commands/base.py``, so no
command module imports this one). Settings are loaded and validated once per command (flags over
``GPULENS_*`` environment over defaults). This module alone turns errors into exit codes:
:class:`~common.errors.UserError` (bad flags, bad configuration — ``ConfigError`` is one — a
broker that is down) prints one clear line and exits 2; a traceback means a bug.

Start-up is kept short (``gpulens --help`` and ``gpulens <command> --help`` well under 0.3 s): this
module imports only click, a part's command module is imported when that command is called
(:class:`LazyGroup`), and settings, Kafka, ClickHouse and the other clients are imported inside
the commands that use them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from common.errors import UserError
from gpulens import __version__
from gpulens.commands import PART_COMMANDS, load_part_command
from gpulens.commands.base import settings_from_flags, with_common_options


class LazyGroup(click.Group):
    """The top-level group: each part's commands are imported only when one of them is called."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(PART_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in PART_COMMANDS:
            self.add_command(load_part_command(cmd_name))
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``--help`` without importing any part (its one-line help is in the table)."""
        limit = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows = []
        for name in self.list_commands(ctx):
            if name in self.commands:
                rows.append((name, self.commands[name].get_short_help_str(limit)))
            else:
                rows.append((name, click.utils.make_default_short_help(PART_COMMANDS[name][1], limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpulens")
def cli() -> None:
    """gpulens: see what a Kubernetes GPU fleet is really doing."""


@cli.group()
def kafka() -> None:
    """Run the local single-node Kafka broker (KRaft) for the embedded default."""


def _kafka_command(action: str) -> Any:
    @with_common_options
    @click.option("--port", type=int, default=None, help="broker port [env GPULENS_LOCAL_KAFKA__PORT]")
    @click.option("--controller-port", type=int, default=None, help="KRaft controller port")
    def command(port: int | None, controller_port: int | None, **flags: Any) -> None:
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

    command.__doc__ = {"up": "Fetch (once) and start the broker; reuse it if running.",
                       "down": "Stop the broker gpulens started.",
                       "status": "Say whether the broker runs."}[action]
    return command


for _action in ("up", "down", "status"):
    kafka.command(_action)(_kafka_command(_action))


@cli.group()
def topics() -> None:
    """Kafka topics of this install."""


@topics.command("create")
@with_common_options
@click.option("--replication-factor", type=click.IntRange(1, 16), default=1, show_default=True,
              help="replicas per partition (3 on a production cluster)")
def topics_create(replication_factor: int, **flags: Any) -> None:
    """Create every topic with its partitions and cleanup policy (idempotent)."""
    from common.kafka import BrokerUnavailable, broker_unavailable, ensure_topics
    from common.settings import CommonSettings
    from schemas.topics import ALL_TOPICS

    settings = settings_from_flags(CommonSettings, **flags)
    try:
        report = ensure_topics(settings.kafka, ALL_TOPICS, settings.topic_prefix, replication_factor)
    except BrokerUnavailable as exc:
        raise broker_unavailable(exc) from None
    for name in report.created:
        click.echo(f"created  {name}")
    for name in report.existing:
        click.echo(f"exists   {name}")
    for line in report.mismatched:
        click.echo(f"DIFFERS  {line}")
    if not report.created:
        click.echo(f"nothing to change: all {len(report.existing)} topics exist" if not report.mismatched
                   else "some topics differ from the registry; not changed")
    else:
        click.echo(f"created {len(report.created)}, already present {len(report.existing)}")


@topics.command("list")
@click.option("--topic-prefix", default=None)
def topics_list(topic_prefix: str | None) -> None:
    """Show the topic registry: name, key, partitions, cleanup policy."""
    from common.settings import CommonSettings, load_settings
    from schemas.topics import ALL_TOPICS

    settings = load_settings(CommonSettings, topic_prefix=topic_prefix)
    for spec in ALL_TOPICS:
        click.echo(f"{spec.name(settings.topic_prefix):40} key={spec.key:14} partitions={spec.partitions:<3} "
                   f"cleanup={spec.cleanup_policy}")


@cli.group()
def schemas() -> None:
    """JSON Schema documents of every topic."""


@schemas.command("export")
@click.argument("directory", type=click.Path(path_type=Path))
def schemas_export(directory: Path) -> None:
    """Write one JSON Schema per topic into DIRECTORY."""
    from schemas.json_schema import export as export_schemas

    for path in export_schemas(directory):
        click.echo(str(path))


@cli.group()
def config() -> None:
    """Configuration."""


@config.command("show")
@click.option("--service", type=click.Choice(["common", "agent", "watcher", "worker", "sink", "alerts"]),
              default="common")
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

    settings_type = {"common": CommonSettings, "agent": AgentSettings, "watcher": WatcherSettings,
                     "worker": WorkerSettings, "sink": SinkSettings, "alerts": AlertForwardSettings}[service]
    click.echo(orjson.dumps(redacted(load_settings(settings_type)), option=orjson.OPT_INDENT_2).decode())


def _register_part_commands() -> None:
    """Import every part's commands now (tests and docs checks that walk the whole tree)."""
    for name in PART_COMMANDS:
        cli.get_command(click.Context(cli), name)


EXTRA_OF_MODULE = {
    "pynvml": "agent", "grpc": "agent", "google": "agent", "h2": "agent",
    "kubernetes": "watcher",
    "faust": "worker", "mode": "worker", "aiokafka": "worker",
    "clickhouse_connect": "sink", "chdb": "sink",
    "yaml": "cli", "rich": "cli",
}
"""Third-party module -> the extra of pyproject.toml that installs it."""


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    return EXTRA_OF_MODULE.get((exc.name or "").split(".")[0])


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="gpulens", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "gpulens"
        click.echo(f"gpulens: {exc.format_message()} (see `{where} --help`)", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except UserError as exc:  # its text may quote cluster data (a cluster name, a value): no control characters
        from common.text import printable

        click.echo(f"gpulens: {printable(str(exc), multiline=True)}", err=True)
        return 2
    except OSError as exc:
        # a path from the configuration (data dir, cache dir, a file flag) that cannot be used
        if exc.filename is None:
            raise
        click.echo(f"gpulens: cannot use {exc.filename}: {exc.strerror} (check GPULENS_DATA_DIR, "
                   "GPULENS_LOCAL_KAFKA__CACHE_DIR and the paths given as flags)", err=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:
        extra = _missing_extra(exc)
        if extra is None:
            raise
        click.echo(f'gpulens: this command needs {exc.name}, which is not installed here; '
                   f'install it with: pip install "gpulens[{extra}]" (or "gpulens[all]")', err=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
