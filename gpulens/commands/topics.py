"""``gpulens topics create|list``: the Kafka topics of this install, from the registry
:data:`schemas.topics.ALL_TOPICS` (names, keys, partitions, cleanup policies)."""

from __future__ import annotations

from typing import Any

import click

from gpulens.commands.base import settings_from_flags, with_common_options


@click.group("topics")
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


COMMANDS = [topics]
