"""``gpulens topics create|list``: the Kafka topics of this install, from the registry
:data:`schemas.topics.ALL_TOPICS` (names, keys, partitions, cleanup policies), replicated as the
``GPULENS_TOPICS__*`` settings say (:class:`common.settings.TopicSettings`)."""

from __future__ import annotations

from typing import Any

import click

from gpulens.commands.base import settings_from_flags, with_common_options


@click.group("topics")
def topics() -> None:
    """Kafka topics of this install."""


@topics.command("create")
@with_common_options
@click.option("--replication-factor", default=None, metavar="auto|N",
              help="replicas per partition; auto: 3, or one per broker on a smaller cluster "
                   "[env GPULENS_TOPICS__REPLICATION_FACTOR; default auto]")
@click.option("--min-insync-replicas", type=int, default=None,
              help="min.insync.replicas of topics with 2 replicas or more "
                   "[env GPULENS_TOPICS__MIN_INSYNC_REPLICAS; default 2]")
def topics_create(replication_factor: str | None, min_insync_replicas: int | None, **flags: Any) -> None:
    """Create every topic with its partitions, cleanup policy and replication (idempotent)."""
    from common.kafka import BrokerUnavailable, broker_unavailable, ensure_topics
    from common.settings import CommonSettings
    from schemas.topics import ALL_TOPICS

    given = {key: value for key, value in (("replication_factor", replication_factor),
                                           ("min_insync_replicas", min_insync_replicas)) if value is not None}
    settings = settings_from_flags(CommonSettings, **flags, topics=given or None)
    try:
        report = ensure_topics(settings.kafka, ALL_TOPICS, settings.topic_prefix, settings.topics)
    except BrokerUnavailable as exc:
        raise broker_unavailable(exc) from None
    for name in report.created:
        click.echo(f"created  {name}")
    for name in report.existing:
        click.echo(f"exists   {name}")
    for line in report.mismatched:
        click.echo(f"DIFFERS  {line}")
    for line in report.fewer_replicas:
        click.echo(f"REPLICAS {line}")
    insync = "broker default" if report.min_insync_replicas is None else report.min_insync_replicas
    if not report.created:
        click.echo(f"nothing to change: all {len(report.existing)} topics exist" if not report.mismatched
                   else "some topics differ from the registry; not changed")
    else:
        click.echo(f"created {len(report.created)} (replication factor {report.replication_factor}, "
                   f"min.insync.replicas {insync}), already present {len(report.existing)}")


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
