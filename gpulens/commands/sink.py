"""``gpulens sink``: every topic into ClickHouse exactly once (see sinks/sink.py for how)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from common.errors import UserError
from gpulens.commands.base import clickhouse_option, settings_from_flags, with_common_options


@click.command("sink")
@with_common_options
@clickhouse_option
@click.option("--group-id", default=None, help="consumer group [env GPULENS_GROUP_ID]")
@click.option("--batch-max-rows", type=int, default=None, help="records per batch [env GPULENS_BATCH_MAX_ROWS]")
@click.option("--batch-max-age-s", type=float, default=None, help="max age of a batch [env GPULENS_BATCH_MAX_AGE_S]")
@click.option("--batch-group-max-rows", type=int, default=None,
              help="records per insert of several partitions' GPU-sample batches [env GPULENS_BATCH_GROUP_MAX_ROWS]")
@click.option("--metrics-port", type=int, default=None, help="/metrics port, 0 = off [env GPULENS_METRICS_PORT]")
@click.option("--exit-when-idle", "exit_when_idle_s", type=float, default=None,
              help="exit once caught up and idle for this many seconds (one-shot catch-up)")
def sink(exit_when_idle_s: float | None, **flags: Any) -> None:
    """Consume every gpulens topic into ClickHouse (embedded chDB by default)."""
    from common.kafka import BrokerUnavailable, broker_unavailable
    from common.settings import SinkSettings
    from sinks.clickhouse import StoreError, StoreLocked
    from sinks.service import run_sink

    settings: SinkSettings = settings_from_flags(SinkSettings, **flags)
    try:
        totals = run_sink(settings, exit_when_idle_s=exit_when_idle_s)
    except BrokerUnavailable as exc:
        raise broker_unavailable(exc) from None
    except StoreLocked as exc:
        raise UserError(f"{exc}; is another `gpulens sink` running on {Path(settings.data_dir)}?") from None
    except StoreError as exc:
        raise UserError(str(exc)) from None
    rows = ", ".join(f"{table} {n}" for table, n in sorted(totals.rows_by_table.items())) or "no rows"
    click.echo(f"sink stopped: {rows}; dead letters {totals.dead_letters}", err=True)


COMMANDS = [sink]
