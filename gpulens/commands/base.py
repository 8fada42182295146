"""What the ``gpulens`` commands share: the common flags (``--bootstrap-servers``,
``--topic-prefix``, ``--data-dir``, ``--log-level``), the ``--clickhouse-url`` flag, and loading a
component's settings from them.

A flag that sets a nested setting (``--bootstrap-servers`` is ``kafka.bootstrap_servers``,
``--clickhouse-url`` is ``clickhouse.url``) is declared here once, with its place in
:data:`NESTED_FLAGS`; :func:`settings_from_flags` folds it there, over the environment, so a
command never does. Here rather than in ``gpulens/cli.py`` so that the command modules never
import the CLI module that loads them. Only click is imported at module level (``--help`` stays fast).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from common.settings import CommonSettings

F = TypeVar("F", bound=Callable[..., object])
S = TypeVar("S", bound="CommonSettings")

common_options = [
    click.option("--bootstrap-servers", "bootstrap_servers", default=None,
                 help="Kafka bootstrap servers [env GPULENS_KAFKA__BOOTSTRAP_SERVERS]"),
    click.option("--topic-prefix", default=None, help="topic name prefix [env GPULENS_TOPIC_PREFIX]"),
    click.option("--data-dir", default=None, type=click.Path(path_type=Path),
                 help="local state directory [env GPULENS_DATA_DIR]"),
    click.option("--log-level", default=None, help="DEBUG|INFO|WARNING|ERROR [env GPULENS_LOG_LEVEL]"),
]

clickhouse_option = click.option(
    "--clickhouse-url", "clickhouse_url", default=None,
    help="chdb:///path or http(s)://user:pass@host:port/db [env GPULENS_CLICKHOUSE__URL]; "
         "default: embedded under the data dir")
"""``--clickhouse-url``, for every command that reads or writes the history."""

NESTED_FLAGS: dict[str, tuple[str, str]] = {
    "bootstrap_servers": ("kafka", "bootstrap_servers"),
    "clickhouse_url": ("clickhouse", "url"),
}
"""A flag's parameter name -> (settings section, field) it sets."""


def with_common_options(func: F) -> F:
    for option in reversed(common_options):
        func = option(func)
    return func


def settings_from_flags(settings_type: type[S], **flags: Any) -> S:
    """Load ``settings_type`` with the flags (``None``: not given) over the environment, each of
    :data:`NESTED_FLAGS` folded into its section; then configure logging from them."""
    from common import logs
    from common.settings import load_settings

    for flag, (section, name) in NESTED_FLAGS.items():
        value = flags.pop(flag, None)
        if value is not None:
            flags[section] = {**flags.get(section, {}), name: value}
    settings = load_settings(settings_type, **flags)
    logs.configure(settings.log_level, settings.log_format)
    return settings


def duration_s(value: str | None, flag: str) -> float | None:
    """``7d``, ``36h``, ``90m``, ``600s`` or bare seconds; a clear one-line error otherwise."""
    from simulation.scenario import parse_duration

    return None if value is None else parse_duration(value, flag, allow_zero=False)
