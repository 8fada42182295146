"""What the product asks of a filled history store, and what it costs, from the engine's own
``system.query_log``.

The embedded engine keeps no query log by default; :class:`LoggedEngine` starts it on the store's
directory with one (a configuration file), and every client of that directory in this process —
the CLI's own reader included — then shares that engine, so ``gpulens report`` and ``gpulens
advise`` run exactly as a user runs them (:func:`gpulens.cli.main`), and the log holds each query
they ran.

A **subject** is one thing a user runs: a CLI command (all its queries), one Grafana panel's SQL
(macros expanded as tests/deploy/test_dashboards.py expands them, for the measured range), one SQL
cookbook query of docs/sql.md, or the baseline (one full scan of one raw-samples column). Each is run
once to warm up and then :data:`RUNS` times; its **cost** is the run with the least CPU time: rows
and bytes read, CPU time (``UserTimeMicroseconds`` + ``SystemTimeMicroseconds`` of each query's
ProfileEvents), the peak memory of its largest query and that query's duration; wall time is
information only. The read-only queries run under the product's read limits
(:class:`sinks.readonly.ReadLimits`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

from gpulens.cli import main as gpulens_main
from reports.analyses import ANALYSES, LISTS, run_report
from sinks.clickhouse import ClickHouseStore
from sinks.readonly import ReadLimits

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNS = 3
QUERY_LOG_CONFIG = """<clickhouse>
  <query_log>
    <database>system</database>
    <table>query_log</table>
    <flush_interval_milliseconds>7500</flush_interval_milliseconds>
  </query_log>
</clickhouse>
"""


_UNLOGGED = {"log_queries": 0}
"""The measurement's own queries stay out of the query log."""


class LoggedEngine:
    """The embedded engine on ``path`` with ``system.query_log``, and a client of its own that logs
    nothing (the measurement's own queries stay out of the log).

    Only the benchmark needs the log, so only it starts the engine with a configuration file
    (clickhouse-connect's ``chdb_options``); the product's adapter (:mod:`sinks.clickhouse`) opens the
    same engine unchanged."""

    def __init__(self, path: Path, scratch: Path) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        config = scratch / "query_log.xml"
        config.write_text(QUERY_LOG_CONFIG)
        self.url = f"chdb://{path}"
        self.store = ClickHouseStore(self.url, engine_config=config)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.store.query(sql, settings=_UNLOGGED).rows]

    def now_us(self) -> int:
        return int(self.rows("SELECT toUnixTimestamp64Micro(now64(6))")[0][0])

    def finished_since(self, since_us: int) -> list[QueryCost]:
        self.store.command("SYSTEM FLUSH LOGS")
        return [QueryCost(int(r[0]), int(r[1]), int(r[2]) / 1e6, int(r[3]), float(r[4]) / 1000, int(r[5]), str(r[6]))
                for r in self.rows(
                    "SELECT read_rows, read_bytes, ProfileEvents['UserTimeMicroseconds'] + "
                    "ProfileEvents['SystemTimeMicroseconds'], memory_usage, query_duration_ms, result_rows, "
                    "substring(replaceRegexpAll(query, '\\\\s+', ' '), 1, 120) FROM system.query_log "
                    "WHERE type = 'QueryFinish' "
                    f"AND toUnixTimestamp64Micro(query_start_time_microseconds) >= {since_us} "
                    "AND query_kind = 'Select' AND query NOT LIKE 'SELECT formatQuerySingleLine(%' "
                    "ORDER BY query_start_time_microseconds")]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.store.close()


@dataclass(frozen=True)
class QueryCost:
    read_rows: int
    read_bytes: int
    cpu_s: float
    memory_bytes: int
    duration_s: float
    result_rows: int
    text: str


@dataclass(frozen=True)
class Cost:
    """One run of a subject: its queries added up (memory, duration: its largest query's)."""

    queries: int
    read_rows: int
    read_bytes: int
    cpu_s: float
    peak_memory_bytes: int
    max_query_s: float
    result_rows: int
    wall_s: float

    @classmethod
    def of(cls, queries: list[QueryCost], wall_s: float) -> Cost:
        return cls(len(queries), sum(q.read_rows for q in queries), sum(q.read_bytes for q in queries),
                   sum(q.cpu_s for q in queries), max((q.memory_bytes for q in queries), default=0),
                   max((q.duration_s for q in queries), default=0.0), sum(q.result_rows for q in queries), wall_s)


class Rating(Enum):
    """What a subject's cost over the long range is held to, against the same over 1 day."""

    AGGREGATE = "aggregate"
    """A fleet-, team- or node-level figure: its cost must not grow with the history."""
    PER_ROW = "per row"
    """A list of pods, alerts, hours or days: its cost per row of the answer."""
    PER_POD = "per pod"
    """A judgement or ranking of every pod of the range (the advisor, a top N of pods by cost): its
    cost per pod of the range. Its answer is exact only if every pod is weighed, so what it costs
    follows the pods the range holds, not the rows it prints."""


@dataclass(frozen=True)
class Subject:
    name: str
    kind: str
    """``cli``, ``section`` (one section of ``gpulens report``), ``panel``, ``cookbook``, ``baseline``."""
    run: Callable[[], object]
    rating: Rating | None = Rating.AGGREGATE
    """None: told by its answer (:func:`rating_of`)."""


def rating_of(subject: Subject, short: Cost, long: Cost) -> Rating:
    """How ``subject`` is rated, given its costs over 1 day (``short``) and over the long range: as
    declared, or where undeclared (the cookbook's free-form queries) as an aggregate unless its long
    answer has at least twice the rows of its 1-day answer, as a list of pods or alerts or a row per
    hour or day has."""
    if subject.rating is not None:
        return subject.rating
    return Rating.AGGREGATE if long.result_rows < 2 * max(short.result_rows, 1) else Rating.PER_ROW


def measure(engine: LoggedEngine, subject: Subject, runs: int = RUNS) -> Cost:
    """The best (least CPU) of ``runs`` warm runs of ``subject``."""
    subject.run()  # warm-up: the engine's caches and the interpreter's imports
    costs = []
    for _ in range(runs):
        since = engine.now_us()
        started = time.perf_counter()
        subject.run()
        wall = time.perf_counter() - started
        costs.append(Cost.of(engine.finished_since(since), wall))
    return min(costs, key=lambda c: c.cpu_s)


# --------------------------------------------------------------------------- what is measured


def cli(args: list[str], url: str) -> Callable[[], object]:
    """``gpulens ARGS --clickhouse-url URL`` in this process (output discarded; a failure raises)."""

    def run() -> object:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = gpulens_main([*args, "--clickhouse-url", url])
        if status != 0:
            raise RuntimeError(f"gpulens {' '.join(args)} exited {status}: {err.getvalue()[-2000:]}")
        return out.getvalue()
    return run


def section(reader: ClickHouseStore, name: str) -> Callable[[], object]:
    """One section of ``gpulens report``, as the CLI runs it."""
    return lambda: run_report(reader, [name])


def sql(store: ClickHouseStore, text: str) -> Callable[[], object]:
    return lambda: store.query(text)


GRAFANA_STEPS_S = (60, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
"""The steps ``$__timeInterval`` is given: the range over about 1,000 points (a panel's width),
rounded down to one of these, at least 60 s (the step tests/deploy/test_dashboards.py uses)."""


def grafana_step_s(range_s: float) -> int:
    return max(s for s in GRAFANA_STEPS_S if s <= max(60.0, range_s / 1000))


def expand_macros(sql_text: str, start: datetime, end: datetime) -> str:
    """The grafana-clickhouse-datasource macros and the dashboards' variables ("All" selected), as
    tests/deploy/test_dashboards.py expands them, for the range ``start`` .. ``end``."""
    all_ = "'__all'"
    sql_text = sql_text.replace("${team:singlequote}", all_).replace("${namespace:singlequote}", all_)
    sql_text = sql_text.replace("${cluster:singlequote}", "'default'")
    lo, hi = f"{start:%Y-%m-%d %H:%M:%S}", f"{end:%Y-%m-%d %H:%M:%S}"
    sql_text = re.sub(r"\$__timeFilter\(([^)]+)\)",
                      rf"\1 >= toDateTime64('{lo}', 3, 'UTC') AND \1 <= toDateTime64('{hi}', 3, 'UTC')", sql_text)
    sql_text = sql_text.replace("$__fromTime", f"toDateTime('{lo}', 'UTC')")
    sql_text = sql_text.replace("$__toTime", f"toDateTime('{hi}', 'UTC')")
    step = grafana_step_s((end - start).total_seconds())
    sql_text = re.sub(r"\$__timeInterval\(([^)]+)\)", rf"toStartOfInterval(toDateTime(\1), INTERVAL {step} second)",
                      sql_text)
    if "$__" in sql_text or "${" in sql_text:
        raise ValueError(f"unexpanded macro or variable in {sql_text[:200]}")
    return sql_text


def panels() -> list[tuple[str, str, str]]:
    """(dashboard, title, raw SQL) of every panel of the ClickHouse dashboards."""
    found = []
    for path in sorted((REPO_ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            targets = panel.get("targets") or []
            if targets and targets[0].get("rawSql"):
                found.append((path.stem, str(panel["title"]), str(targets[0]["rawSql"])))
    return found


RANKS_PODS = re.compile(r"GROUP BY namespace, pod\b[^;]*?ORDER BY [^;]*?LIMIT \d+\s*$", re.DOTALL)
"""A panel's or cookbook query's SQL that ranks the range's pods and keeps the top N (:attr:`Rating.PER_POD`)."""
RANKING_SECTIONS = frozenset({"top_pods", "cost_per_unit_of_work", "shared_gpu_cost"})
"""The report's sections that rank the range's pods and keep the top N (:attr:`Rating.PER_POD`)."""

LISTING_PANELS = re.compile(r"active alerts|pending pods|reserved but unused|retries", re.IGNORECASE)
"""Panels whose answer is a list of pods or alerts (cost per row of the answer), not an aggregate."""

POINT_PER_WINDOW = re.compile(r"\bwindow_start AS time\b")
"""Time series with a point per stored capacity window (not per ``$__timeInterval``): the answer has
a row per minute of the range, so it is rated per row of the answer, like a list."""


def cookbook() -> list[tuple[str, str]]:
    """(heading, SQL) of every SQL block of docs/sql.md."""
    text = (REPO_ROOT / "docs" / "sql.md").read_text()
    found, heading = [], ""
    for block in re.finditer(r"^(#+ [^\n]*)$|^```sql\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        if block.group(1):
            heading = block.group(1).lstrip("# ").strip()
        elif block.group(2):
            found.append((heading, block.group(2).strip().rstrip(";")))
    return found


def subjects(url: str, reader: ClickHouseStore, start: datetime, end: datetime, since_days: int,
             scratch: Path) -> list[Subject]:
    """Everything measured on the store at ``url`` for the range ``start`` .. ``end``."""
    html = scratch / "report.html"
    found = [
        Subject("baseline: one raw column, full scan", "baseline",
                sql(reader, "SELECT sum(gpu_util_pct) FROM gpu_samples")),
        Subject("gpulens report (text)", "cli", cli(["report"], url)),
        Subject("gpulens report --json", "cli", cli(["report", "--json"], url)),
        Subject("gpulens report --html", "cli", cli(["report", "--html", str(html)], url)),
        Subject("gpulens advise --since <range>", "cli", cli(["advise", "--since", f"{since_days}d"], url),
                rating=Rating.PER_POD),
        Subject("gpulens report --json --since 1d", "cli", cli(["report", "--json", "--since", "1d"], url)),
    ]
    for name in ANALYSES:
        rating = (Rating.PER_POD if name in RANKING_SECTIONS else Rating.PER_ROW if name in LISTS
                  else Rating.AGGREGATE)
        found.append(Subject(f"report section {name}", "section", section(reader, name), rating))
    for dashboard, title, raw in panels():
        rating = (Rating.PER_POD if RANKS_PODS.search(raw) else
                  Rating.PER_ROW if LISTING_PANELS.search(title) or POINT_PER_WINDOW.search(raw) else Rating.AGGREGATE)
        found.append(Subject(f"panel {dashboard}: {title}", "panel", sql(reader, expand_macros(raw, start, end)),
                             rating))
    for i, (heading, text) in enumerate(cookbook(), start=1):
        found.append(Subject(f"sql.md #{i} {heading}", "cookbook", sql(reader, text),
                             Rating.PER_POD if RANKS_PODS.search(text) else None))
    return found


@contextlib.contextmanager
def quiet_environment() -> Iterator[None]:
    """The CLI's dead-letter note asks Kafka (up to 3 s); the benchmark measures the store only."""
    saved = os.environ.get("GPULENS_DEAD_LETTERS_TIMEOUT_S")
    os.environ["GPULENS_DEAD_LETTERS_TIMEOUT_S"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("GPULENS_DEAD_LETTERS_TIMEOUT_S", None)
        else:
            os.environ["GPULENS_DEAD_LETTERS_TIMEOUT_S"] = saved


def bytes_on_disk(engine: LoggedEngine) -> dict[str, int]:
    """Active parts' bytes on disk per table."""
    return {str(r[0]): int(r[1]) for r in engine.rows(
        "SELECT table, sum(bytes_on_disk) FROM system.parts WHERE active AND database = currentDatabase() "
        "GROUP BY table ORDER BY table")}


def pods_of(engine: LoggedEngine) -> int:
    """Distinct pods that held a GPU in the store."""
    return int(engine.rows("SELECT uniqExact(cluster, namespace, pod) FROM pod_daily")[0][0])


@dataclass
class StoreFigures:
    days: int
    gpus: int
    costs: dict[str, Cost]
    subjects: dict[str, Subject]
    disk: dict[str, int]
    pods: int
    """Pods of the range (the store's whole history), the size of a :attr:`Rating.PER_POD` question."""


def measure_store(path: Path, days: int, gpus: int, start: datetime, end: datetime, scratch: Path,
                  runs: int = RUNS, only: Callable[[Subject], bool] | None = None) -> StoreFigures:
    """Every subject on the store at ``path`` (``days`` of ``gpus`` GPUs, ``start`` .. ``end``)."""
    engine = LoggedEngine(path, scratch)
    reader = ClickHouseStore(engine.url, read_only=True, limits=ReadLimits())
    try:
        with quiet_environment():
            chosen = [s for s in subjects(engine.url, reader, start, end, days, scratch) if only is None or only(s)]
            costs = {s.name: measure(engine, s, runs) for s in chosen}
        return StoreFigures(days, gpus, costs, {s.name: s for s in chosen}, bytes_on_disk(engine), pods_of(engine))
    finally:
        reader.close()
        engine.close()
