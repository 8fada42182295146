"""``gpulens sql`` and ``gpulens report``: read-only questions to ClickHouse.

Both work against a ClickHouse server, against the embedded engine directly, or — while a sink
owns the embedded engine — through the sink's local query endpoint (see sinks/query_server.py).
"""

from __future__ import annotations

import csv
import gc
import io
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from common.errors import UserError
from common.text import printable
from gpulens.commands.base import clickhouse_option, duration_s, settings_from_flags, with_common_options
from reports.analyses import ANALYSES

if TYPE_CHECKING:
    from common.settings import AdvisorSettings
    from sinks.clickhouse import QueryResult
    from sinks.query_server import ClosableSqlReader


READ_GC_THRESHOLD = 100_000
"""The collector's first-generation threshold in the read commands. Their results are hundreds of
thousands of small lists and dicts, none of them cyclic, which the default (700 allocations) has the
collector go over again and again: a month of a 1,024-GPU fleet's ``gpulens advise`` takes a quarter
less wall time with this one."""


def open_analysis_reader(clickhouse_url: str | None, flags: dict[str, Any]) -> ClosableSqlReader:
    """The read-only connection of ``sql``, ``report`` and ``advise`` (:data:`READ_GC_THRESHOLD` set)."""
    from common.settings import CommonSettings
    from sinks.clickhouse import StoreError
    from sinks.query_server import open_reader
    from sinks.readonly import ReadLimits

    settings: CommonSettings = settings_from_flags(CommonSettings, clickhouse_url=clickhouse_url, **flags)
    gc.set_threshold(READ_GC_THRESHOLD, *gc.get_threshold()[1:])
    try:
        limits = ReadLimits.from_settings(settings.clickhouse)
        return open_reader(settings.clickhouse_url(), Path(settings.data_dir), limits)
    except StoreError as exc:
        raise UserError(str(exc)) from None


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if value != int(value) or abs(value) < 1e15 else str(value)
    if isinstance(value, list | dict):
        return orjson.dumps(value).decode()
    return str(value)


def format_table(columns: list[str], rows: list[list[Any]], max_width: int = 60) -> str:
    """The text table of ``sql``, ``report`` and ``advise``: each cell on one line, its control
    characters (a hostile pod name's escape sequences, its newlines) shown escaped."""
    columns = [printable(c) for c in columns]
    cells = [[printable(_cell(v))[:max_width] for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def format_csv(columns: list[str], rows: list[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([[_cell(v) for v in row] for row in rows])
    return out.getvalue().rstrip("\n")


def render(result: QueryResult, fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps(result.dicts(), option=orjson.OPT_INDENT_2).decode()
    if fmt == "csv":
        return format_csv(result.columns, result.rows)
    return format_table(result.columns, result.rows)


def query_interruptibly(reader: ClosableSqlReader, sql: str) -> QueryResult:
    """Run ``sql`` so that Ctrl-C cancels it in the engine, not only in this process.

    Through the sink's endpoint, closing the connection is enough (the endpoint kills the query of
    a client that went away); on the engine itself the query runs off the main thread (the engine
    call does not return for signals) and Ctrl-C kills it.
    """
    from sinks.clickhouse import ClickHouseStore

    if not isinstance(reader, ClickHouseStore):
        return reader.query(sql)
    cancel = threading.Event()
    outcome: list[QueryResult | BaseException] = []

    def work() -> None:
        try:
            outcome.append(reader.query(sql, cancel=cancel))
        except BaseException as exc:  # handed to the main thread as is
            outcome.append(exc)

    worker = threading.Thread(target=work, name="sql-query", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except KeyboardInterrupt:
        cancel.set()
        worker.join(10)
        raise UserError("interrupted: the query was cancelled") from None
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


@click.command("sql")
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@clickhouse_option
@with_common_options
def sql(query: str, fmt: str, clickhouse_url: str | None, **flags: Any) -> None:
    """Run one read-only SQL query (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) against ClickHouse."""
    from sinks.clickhouse import StoreError
    from sinks.readonly import ReadOnlyViolation

    reader = open_analysis_reader(clickhouse_url, flags)
    try:
        result = query_interruptibly(reader, query)
    except ReadOnlyViolation as exc:
        raise UserError(f"refused: {exc}") from None
    except StoreError as exc:
        raise UserError(str(exc)) from None
    finally:
        reader.close()
    click.echo(render(result, fmt))


@click.command("report")
@click.option("--json", "as_json", is_flag=True, help="one JSON object: section name -> list of rows")
@click.option("--section", "sections", multiple=True, type=click.Choice(list(ANALYSES)),
              help="only these sections (repeatable)")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write a self-contained HTML report with charts to FILE (all sections)")
@click.option("--cluster", default=None,
              help="the cluster to report on; required when the store holds several (figures are per cluster)")
@click.option("--since", default=None,
              help="only the last part of the history, counted back from the latest data, e.g. 30d, 12h "
                   "(default: the whole history; the advisor's section: its own period, 7d)")
@clickhouse_option
@with_common_options
def report(as_json: bool, sections: tuple[str, ...], html_path: Path | None, cluster: str | None, since: str | None,
           clickhouse_url: str | None, **flags: Any) -> None:
    """Canned analyses: top consumers, idle GPU-hours, pending, fragmentation, scale-down, cost."""
    from common.settings import AdvisorSettings
    from reports.analyses import TITLES, ClusterError, report_period, run_report, scoped
    from reports.html.page import write_html_report
    from reports.notes import gap_notes, period_start, price_gaps, unknown_money_in_report
    from reports.packing import iso_utc
    from sinks.clickhouse import StoreError

    if html_path is not None and (as_json or sections):
        raise UserError("--html writes the whole report; it cannot be combined with --json or --section")
    since_s = duration_s(since, "--since")
    settings = settings_from_flags(AdvisorSettings, **flags)
    reader = open_analysis_reader(clickhouse_url, flags)
    try:
        scope = scoped(reader, cluster)
        period = report_period(scope, since_s)
        gaps = price_gaps(scope, period)
        notes = dead_letter_notes(settings, period.start or period_start(scope)) + gap_notes(gaps)
        if html_path is not None:
            written = write_html_report(reader, html_path, settings.advise, cluster, period)
            click.echo(f"HTML report written to {written}")
            echo_notes(notes, err=True)
            return
        data = run_report(reader, list(sections) or None, settings.advise, cluster, period)
        unknown_money_in_report(data, gaps)
    except OSError as exc:
        raise UserError(f"cannot write {html_path}: {exc.strerror or exc}") from None
    except (StoreError, ClusterError) as exc:
        raise UserError(str(exc)) from None
    finally:
        reader.close()
    if as_json:
        click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        echo_notes(notes, err=True)
        return
    if period.start is not None and period.end is not None:
        click.echo(f"period: {iso_utc(period.start)} .. {iso_utc(period.end)} "
                   "(--since counts back from the latest data)")
    for name, rows in data.items():
        click.echo(f"\n== {TITLES.get(name, name)}")
        if not rows:
            click.echo("(no data)")
            continue
        columns = list(rows[0])
        click.echo(format_table(columns, [[human(c, row.get(c), bool(gaps)) for c in columns] for row in rows]))
    echo_notes(notes, err=False)


def dead_letter_notes(settings: AdvisorSettings, since: datetime | None) -> list[str]:
    """The note on the dead letters written since ``since`` (the period's start), counted on Kafka
    within ``dead_letters_timeout_s`` (0: not counted, no note)."""
    from common.kafka import broker_reachable, header_counts_since
    from reports.notes import dead_letter_note
    from schemas.topics import DEADLETTER

    timeout_s = settings.dead_letters_timeout_s
    if since is None or timeout_s <= 0:
        return []
    topic = DEADLETTER.name(settings.topic_prefix)
    counts = None
    if broker_reachable(settings.kafka, timeout_s):
        counts = header_counts_since(settings.kafka, topic, int(since.timestamp() * 1000), "reason", timeout_s)
    note = dead_letter_note(counts, topic, since, settings.kafka.bootstrap_servers)
    return [note] if note else []


def echo_notes(notes: list[str], err: bool) -> None:
    """The notes of :mod:`reports.notes` after the figures (on stderr beside JSON, which stays as is)."""
    if notes and not err:
        click.echo("")
    for note in notes:
        click.echo(printable(note), err=err)


def human(column: str, value: Any, money_unknown: bool = False) -> Any:
    """A report figure in the unit its column name gives, for people (``--json`` keeps raw numbers);
    the same formats as the HTML report's. With ``money_unknown`` (GPU models without a list price,
    :mod:`reports.notes`), a money figure without a value reads "unknown"."""
    from reports.html.format import fmt_duration, fmt_gib, fmt_pct, fmt_usd

    if value is None and money_unknown and column.endswith("_usd"):
        return "unknown"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return value
    for suffix, fmt in (("_bytes", fmt_gib), ("_usd", fmt_usd), ("_pct", fmt_pct), ("_s", fmt_duration)):
        if column.endswith(suffix):
            return fmt(value)
    return value


COMMANDS = [sql, report]
