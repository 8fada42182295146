"""What the ``gpulens`` commands share: the common flags (``--bootstrap-servers``,
``--topic-prefix``, ``--data-dir``, ``--log-level``) and loading a component's settings from them.

Here rather than in ``gpulens/cli.py`` so that the command modules never import the CLI module
that loads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

common_options = [
    click.option("--bootstrap-servers", "bootstrap_servers", default=None,
                 help="Kafka bootstrap servers [env GPULENS_KAFKA__BOOTSTRAP_SERVERS]"),
    click.option("--topic-prefix", default=None, help="topic name prefix [env GPULENS_TOPIC_PREFIX]"),
    click.option("--data-dir", default=None, type=click.Path(path_type=Path),
                 help="local state directory [env GPULENS_DATA_DIR]"),
    click.option("--log-level", default=None, help="DEBUG|INFO|WARNING|ERROR [env GPULENS_LOG_LEVEL]"),
]


def with_common_options(func: Any) -> Any:
    for option in reversed(common_options):
        func = option(func)
    return func


def settings_from_flags(settings_type: type[Any], **flags: Any) -> Any:
    """Load ``settings_type`` with the common flags folded into their nested places."""
    from common import logs
    from common.settings import load_settings

    bootstrap = flags.pop("bootstrap_servers", None)
    settings = load_settings(settings_type, **flags)
    if bootstrap is not None:
        kafka = settings.kafka.model_copy(update={"bootstrap_servers": bootstrap})
        settings = load_settings(settings_type, **(flags | {"kafka": kafka.model_dump()}))
    logs.configure(settings.log_level, settings.log_format)
    return settings



