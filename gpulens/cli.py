"""The ``gpulens`` command line: one entry point for every part of the product.

This module only assembles: every command and command group is a module of ``gpulens/commands``
(registered by name in ``gpulens/commands/__init__.py``; the flags they share are in
``gpulens/commands/base.py``, so no command module imports this one). Settings are loaded and
validated once per command (flags over ``GPULENS_*`` environment over defaults). This module alone
turns errors into exit codes: :class:`~common.errors.UserError` (bad flags, bad configuration —
``ConfigError`` is one — a broker that is down) prints one clear line and exits 2; a traceback
means a bug.

Start-up is kept short (``gpulens --help`` and ``gpulens <command> --help`` well under 0.3 s): this
module imports only click, a command's module is imported when that command is called
(:class:`LazyGroup`), and settings, Kafka, ClickHouse and the other clients are imported inside
the commands that use them.
"""

from __future__ import annotations

import sys

import click

from common.errors import UserError
from gpulens import __version__
from gpulens.commands import PART_COMMANDS, load_part_command


class LazyGroup(click.Group):
    """The top-level group: a command's module is imported only when that command is called."""

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


def _register_part_commands() -> None:
    """Import every command now (tests and docs checks that walk the whole tree)."""
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
