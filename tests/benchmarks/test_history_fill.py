"""The history benchmark's bulk fill (benchmarks/history/fill.py) writes exactly the tables the sink
writes: a small fill (2 fleet copies of an 18-GPU template, 3 days in miniature, 2 of them played)
against the same template days stored through the sink's write path
(:func:`simulation.store.store_in_process`), each in a store of its own.

- the played days hold the sink's rows, table by table, by natural key (the table's sorting key)
  and value; only where a record sat on Kafka (partition, offset) and the agent's boot id (a random
  id of each simulator run) differ; a node's state is the newest (a later day's), and the
  fleet-wide capacity windows are the copies' sums (checked below by count and GPU totals);
- every copied (fleet copy, day) holds its variant's rows once: no copy's natural key collides with
  another's (counts under ``FINAL`` equal the sum of the copies);
- every table has the sink's columns, in order (the column spec of sinks/tables.py);
- a cached store of an older schema is migrated forward, not filled again;
- the store is priced: every GPU model it sampled has a list price, so the report's money is known.
"""

from __future__ import annotations

import shutil
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from benchmarks.history.fill import TABLES, FillOutcome, FillSpec, fill, sink_settings, template_scenario
from reports.analyses import scoped
from reports.notes import price_gaps
from simulation.replay import run_in_process
from simulation.store import store_in_process
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.migrations import MIGRATIONS
from sinks.tables import TABLES as SPEC

SPEC_SMALL = FillSpec(gpus=32, days=3, day_s=600, template_nodes=4, gpus_per_node=4, variants=2)
IGNORED = frozenset({"kafka_partition", "kafka_offset", "agent_boot_id"})
LATEST_ONLY = frozenset({"node_states"})
"""Tables that keep a node's newest state only: a later day's state replaces a played day's."""
TIME_COLUMN = {"node_states": "ts", "state_tombstones": "at", "pod_states": "ts", "alerts": "started_at",
               "gpu_xids": "ts", "pod_lifecycle": "created_at"}


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> FillOutcome:
    return fill(SPEC_SMALL, tmp_path_factory.mktemp("history-cache"))


@pytest.fixture(scope="module")
def through_sink(tmp_path_factory: pytest.TempPathFactory, filled: FillOutcome) -> dict[int, Path]:
    """Each played template day through the sink's write path, in a store of its own."""
    stores = {}
    for variant in range(SPEC_SMALL.played_days):
        path = tmp_path_factory.mktemp(f"sink-{variant}") / "clickhouse"
        scenario = template_scenario(SPEC_SMALL, variant)
        outcome = store_in_process(scenario, run_in_process(scenario), sink_settings(SPEC_SMALL, path))
        assert outcome.rejected == 0
        stores[variant] = path
    return stores


def _columns(store: ClickHouseStore, table: str) -> list[str]:
    return [str(r[0]) for r in store.query(
        "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {t:String} ORDER BY position",
        {"t": table}).rows]


def _time_column(store: ClickHouseStore, table: str) -> str:
    if table in TIME_COLUMN:
        return TIME_COLUMN[table]
    return next(str(r[0]) for r in store.query(
        "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {t:String} "
        "AND type LIKE 'DateTime%' ORDER BY position LIMIT 1", {"t": table}).rows)


def _rows(store: ClickHouseStore, table: str, variant: int | None) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Natural key -> the other compared values, of ``table`` under FINAL; ``variant``: only the
    rows of that played day and of fleet copy 0 (no renamed name in any column)."""
    names = [n for n in _columns(store, table) if n not in IGNORED]
    key_text = str(store.query("SELECT sorting_key FROM system.tables WHERE database = currentDatabase() "
                               "AND name = {t:String}", {"t": table}).rows[0][0])
    key = [k.strip() for k in key_text.split(",") if k.strip() not in IGNORED]
    where = "1"
    if variant is not None:
        start = SPEC_SMALL.start + timedelta(seconds=variant * SPEC_SMALL.day_s)
        end = start + timedelta(seconds=SPEC_SMALL.day_s)
        column = _time_column(store, table)
        where = "" if table in LATEST_ONLY else (
            f"{column} >= toDateTime64('{start:%Y-%m-%d %H:%M:%S}', 3, 'UTC') "
            f"AND {column} < toDateTime64('{end:%Y-%m-%d %H:%M:%S}', 3, 'UTC') AND ")
        where += (f"position(toString(tuple({', '.join(f'`{n}`' for n in names)})), '~') = 0")
    result = store.query(f"SELECT {', '.join(f'`{n}`' for n in names)} FROM {table} FINAL WHERE {where}")
    rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in result.rows:
        values = dict(zip(names, row, strict=True))
        natural = tuple(str(values[k]) for k in key)
        assert natural not in rows, f"{table}: natural key {natural} twice under FINAL"
        rows[natural] = tuple(str(v) for v in row)
    return rows


def test_played_days_hold_the_sinks_rows(filled: FillOutcome, through_sink: dict[int, Path]) -> None:
    expected: dict[int, dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]] = {}
    for variant, path in through_sink.items():
        with closing(open_store(f"chdb://{path}")) as store:
            expected[variant] = {table: _rows(store, table, None) for table in TABLES if table != "cluster_capacity"}
    with closing(open_store(f"chdb://{filled.path}")) as store:
        for variant, tables in expected.items():
            for table, rows in tables.items():
                actual = _rows(store, table, variant)
                if table in LATEST_ONLY:  # the same nodes, in a later day's state
                    assert set(actual) == set(rows), table
                    continue
                assert actual == rows, (f"{table}, day {variant}: {len(actual)} rows, the sink's {len(rows)}; "
                                        f"missing {list(set(rows) - set(actual))[:3]}, "
                                        f"extra {list(set(actual) - set(rows))[:3]}")
        # at least the GPU samples, windows and lifecycle are not empty: the comparison compares something
        assert all(expected[0][t] for t in ("gpu_samples", "gpu_processes", "pod_windows", "pod_lifecycle"))


def test_every_copy_holds_its_variants_rows_once(filled: FillOutcome, through_sink: dict[int, Path]) -> None:
    per_variant: dict[int, dict[str, int]] = {}
    for variant, path in through_sink.items():
        with closing(open_store(f"chdb://{path}")) as store:
            counts = {t: int(store.query(f"SELECT count() FROM {t} FINAL").rows[0][0]) for t in TABLES}
            counts["gpus_total"] = int(store.query("SELECT max(gpus_total) FROM cluster_capacity").rows[0][0])
            counts["gpus"] = int(store.query("SELECT uniqExact(gpu_uuid) FROM gpu_samples").rows[0][0])
            per_variant[variant] = counts
    spec = SPEC_SMALL
    with closing(open_store(f"chdb://{filled.path}")) as store:
        for table in ("gpu_samples", "gpu_processes", "pod_windows", "pod_lifecycle", "pod_states", "alerts",
                      "workload_progress", "mig_gpu_windows", "shared_gpu_windows"):
            expected = sum(per_variant[(d + k) % spec.played_days][table]
                           for k in range(spec.copies) for d in range(spec.days))
            assert int(store.query(f"SELECT count() FROM {table} FINAL").rows[0][0]) == expected, table
        # the fleet-wide capacity: one window per minute of each day, the copies' GPUs added up
        windows = store.query("SELECT count(), uniqExact(window_id), min(gpus_total), max(gpus_total) "
                              "FROM cluster_capacity FINAL").rows[0]
        played = per_variant[0]["cluster_capacity"]
        assert windows[0] == windows[1] == spec.days * played
        assert windows[2] == windows[3] == spec.copies * per_variant[0]["gpus_total"]
        # GPUs (and MIG devices): every copy's
        gpus = store.query("SELECT uniqExact(gpu_uuid) FROM gpu_samples").rows[0][0]
        assert gpus == spec.copies * per_variant[0]["gpus"]


def test_every_table_has_the_sinks_columns(filled: FillOutcome, through_sink: dict[int, Path]) -> None:
    with closing(open_store(f"chdb://{through_sink[0]}")) as store:
        sink_columns = {table: _columns(store, table) for table in (*TABLES, "rollup_hourly", "rollup_daily")}
    with closing(open_store(f"chdb://{filled.path}")) as store:
        for table, columns in sink_columns.items():
            assert _columns(store, table) == columns == list(SPEC[table].names), table
        assert not [r for r in store.query("SELECT name FROM system.tables WHERE database = currentDatabase() "
                                           "AND name LIKE 'tmpl_%'").rows], "the fill's staging tables are left"


def test_a_cached_store_of_an_older_schema_is_migrated_not_filled_again(filled: FillOutcome,
                                                                       tmp_path: Path) -> None:
    """A cached store one migration behind (the last migration not applied) is copied and brought
    forward by the store's own migrations: the copy's rows are the original's (the last migration's
    back-fill counted once), and the older entry is left as it was."""
    last = MIGRATIONS[-1].version
    older = tmp_path / SPEC_SMALL.key().replace(f"-m{last}-", f"-m{last - 1}-", 1)
    shutil.copytree(filled.path.parent, older, symlinks=True)
    with closing(open_store(f"chdb://{older / 'clickhouse'}")) as store:
        store.command(f"DELETE FROM schema_migrations WHERE version = {last}")

    outcome = fill(SPEC_SMALL, tmp_path)

    assert outcome.cached and outcome.upgraded_from == older.name
    assert outcome.path.parent.name == SPEC_SMALL.key()
    assert outcome.rows == filled.rows
    with closing(open_store(f"chdb://{outcome.path}")) as store:
        applied = [int(r[0]) for r in store.query("SELECT version FROM schema_migrations ORDER BY version").rows]
    assert applied == [m.version for m in MIGRATIONS]
    with closing(open_store(f"chdb://{older / 'clickhouse'}")) as store:
        assert last not in [int(r[0]) for r in store.query("SELECT version FROM schema_migrations").rows]
    assert fill(SPEC_SMALL, tmp_path).upgraded_from == older.name  # cached now, not migrated again


def test_the_store_is_priced_as_an_installation_is(filled: FillOutcome) -> None:
    """Every GPU model the fleet sampled has a list price in ``gpu_prices`` (the sink loads the
    configured prices at start), so the report's money over the filled history is known."""
    with closing(open_store(f"chdb://{filled.path}")) as store:
        sampled = {str(r[0]) for r in store.query("SELECT DISTINCT gpu_model FROM gpu_samples "
                                                  "WHERE mig_parent_uuid = ''").rows}
        priced = {str(r[0]) for r in store.query("SELECT gpu_model FROM gpu_prices WHERE usd_per_gpu_hour > 0").rows}
    assert len(sampled) >= 2 and sampled <= priced
    with closing(ClickHouseStore(f"chdb://{filled.path}", read_only=True)) as reader:
        assert not price_gaps(scoped(reader)), "the report would show the money as unknown"
