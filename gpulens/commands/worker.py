"""``gpulens worker``: run the stream jobs (faust) — route + node stage, cluster stage, or all.

The worker creates its internal topics if missing (idempotent), serves ``/metrics`` on
``--metrics-port`` and keeps its faust state under ``<data dir>/stream-jobs/<app id>`` (the
tables themselves are changelog-backed in Kafka, so a restarted or moved worker resumes exactly).
Live fleets use the default ``--watermark-source clock``; ``gpulens replay --kafka`` and the demo
start workers with ``control`` and drive event time themselves (see docs/stream_jobs.md).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from gpulens.commands.base import settings_from_flags, with_common_options

if TYPE_CHECKING:
    from common.settings import WorkerSettings


@click.command("worker")
@click.option("--stage", type=click.Choice(["node", "cluster", "all"]), default=None,
              help="node = route + node stage, cluster = cluster stage, all = both (default) [env GPULENS_STAGE]")
@click.option("--metrics-port", type=int, default=None, help="/metrics port, 0 = off [env GPULENS_METRICS_PORT]")
@click.option("--web-port", type=int, default=None,
              help="faust web server port (on GPULENS_WEB_BIND, default 127.0.0.1), 0 = off (default) "
                   "[env GPULENS_WEB_PORT]")
@click.option("--watermark-source", type=click.Choice(["clock", "control"]), default=None,
              help="clock (live) or control (a replay/demo driver marks event time) [env GPULENS_WATERMARK_SOURCE]")
@click.option("--lateness", "lateness_s", type=float, default=None,
              help="allowed lateness in seconds (default 30) [env GPULENS_LATENESS_S]")
@click.option("--app-id", default=None, help="faust app id / consumer group [env GPULENS_APP_ID]")
@with_common_options
def worker(**flags: Any) -> None:
    """Run the stream jobs: samples + pods -> windows, capacity, lifecycle, alerts."""
    from common.kafka import BrokerUnavailable, broker_unavailable, ensure_topics
    from common.logs import get_logger
    from common.settings import ConfigError, WorkerSettings
    from schemas.topics import GPU_SAMPLES, node_stage_topics
    from stream_jobs.faust_app import WorkerMetrics, app_id, changelog_topics, run_worker
    from stream_jobs.fleet_metrics import FleetSeries

    log = get_logger(__name__)
    settings: WorkerSettings = settings_from_flags(WorkerSettings, **flags)
    deadline = time.monotonic() + settings.broker_wait_s
    delay = 1.0
    while True:
        try:
            report = ensure_topics(settings.kafka, node_stage_topics(settings.node_input_partitions),
                                   settings.topic_prefix, timeout_s=3.0)
            ensure_topics(settings.kafka, changelog_topics(settings), app_id(settings), timeout_s=3.0)
            break
        except BrokerUnavailable as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise broker_unavailable(exc) from None
            log.warning("waiting for the Kafka broker", retry_in_s=min(delay, remaining), error=str(exc),
                        gives_up_in_s=round(remaining))
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 30.0)
    if report.mismatched:  # the node stage reads samples and node-inputs partition by partition
        raise ConfigError(f"GPULENS_NODE_INPUT_PARTITIONS ({settings.node_input_partitions}) must be the partition "
                          f"count of {GPU_SAMPLES.name(settings.topic_prefix)}, and the internal topics must have "
                          f"it too: {'; '.join(report.mismatched)}")
    metrics = WorkerMetrics()
    fleet = FleetSeries(metrics.registry, settings.fleet_metrics_max_series)
    if settings.metrics_port:
        port = metrics.registry.serve(settings.metrics_port, settings.metrics_addr)
        log.info("metrics served", port=port)
    run_worker(settings, metrics, fleet)


COMMANDS = [worker]
