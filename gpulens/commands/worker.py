"""``gpulens worker``: run the stream jobs (faust) — route + node stage, cluster stage, or all.

The worker (:func:`stream_jobs.service.run_worker`) creates its internal topics if missing
(idempotent), serves ``/metrics`` on ``--metrics-port`` and keeps its faust state under
``<data dir>/stream-jobs/<app id>`` (the tables themselves are changelog-backed in Kafka, so a
restarted or moved worker resumes exactly).
Live fleets use the default ``--watermark-source clock``; ``gpulens replay --kafka`` and the demo
start workers with ``control`` and drive event time themselves (see docs/stream_jobs.md).
"""

from __future__ import annotations

from typing import Any

import click

from gpulens.commands.base import settings_from_flags, with_common_options


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
    from common.settings import WorkerSettings
    from stream_jobs.service import run_worker

    run_worker(settings_from_flags(WorkerSettings, **flags))


COMMANDS = [worker]
