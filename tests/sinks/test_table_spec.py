"""The column spec (:mod:`sinks.tables`) is the store: a migrated store's every table, column by
column (position, type, codec, default), is what the spec declares; every row builder writes the
spec's columns; the engine path for GPU samples is what :func:`sinks.sample_json.ddl` renders from
the spec. A column added to the spec without its migration (or the other way round) fails here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from sinks import sample_json
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.migrations import migrate
from sinks.rows import TABLES_BY_TOPIC, Decoded, Tombstone, rows_for
from sinks.tables import GAUGE, GPU_SAMPLES, TABLES, Column, Table
from tests.conftest import REPO_ROOT
from tests.sinks import factories as f

SPEC_DB = "spec"
COLUMNS = ("position", "name", "type", "compression_codec", "default_kind", "default_expression")


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseStore]:
    store = open_store(f"chdb://{tmp_path_factory.mktemp('spec') / 'clickhouse'}")
    try:
        migrate(store)
        yield store
    finally:
        store.close()


def _columns(store: ClickHouseStore, database: str, table: str) -> list[list[object]]:
    return store.query(f"SELECT {', '.join(COLUMNS)} FROM system.columns WHERE database = {database} "
                       f"AND table = '{table}' ORDER BY position").rows


def test_every_table_of_the_store_is_the_spec_column_by_column(migrated: ClickHouseStore) -> None:
    tables = {str(r[0]) for r in migrated.query(
        "SELECT name FROM system.tables WHERE database = currentDatabase() "
        "AND engine NOT IN ('View', 'MaterializedView')").rows} - {sample_json.TABLE}
    assert tables == set(TABLES)
    migrated.command(f"CREATE DATABASE IF NOT EXISTS {SPEC_DB}")
    try:
        for table in TABLES.values():
            # the engine writes the spec's DDL as it writes the migrations' (Delta -> Delta(8), ...)
            scratch = Table(f"{SPEC_DB}.{table.name}", table.columns)
            migrated.command(scratch.create("ENGINE = MergeTree ORDER BY tuple()"))
            spec = _columns(migrated, f"'{SPEC_DB}'", table.name)
            assert _columns(migrated, "currentDatabase()", table.name) == spec, table.name
    finally:
        migrated.command(f"DROP DATABASE IF EXISTS {SPEC_DB}")


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).replace("( ", "(").replace(" )", ")")


def test_the_engine_path_is_the_spec(migrated: ClickHouseStore) -> None:
    (live,) = migrated.query("SELECT type FROM system.columns WHERE database = currentDatabase() "
                             f"AND table = '{sample_json.TABLE}' AND name = 's'").rows[0]
    (spec,) = migrated.query(f"SELECT toTypeName(defaultValueOfTypeName('{sample_json.SAMPLE_STRUCTURE}'))").rows[0]
    assert _flat(str(live)) == _flat(str(spec))
    for name, target, columns, joins in sample_json._VIEWS:
        select = sample_json._select(columns, joins).replace("'", "\\'")
        (rendered,) = migrated.query(f"SELECT formatQuerySingleLine('{select}')").rows[0]
        (query,) = migrated.query("SELECT as_select FROM system.tables WHERE database = currentDatabase() "
                                  f"AND name = '{name}'").rows[0]
        assert str(query).replace(f"FROM {migrated.query('SELECT currentDatabase()').rows[0][0]}.", "FROM ") == \
            rendered, name
        assert tuple(columns) == TABLES[target].names, name


def _rows_by_table() -> dict[str, set[tuple[str, ...]]]:
    scenarios = [load_scenario(REPO_ROOT / "simulation" / "scenarios" / f"{name}.yaml")
                 for name in ("mig-fragmentation", "shared-gpus")]
    messages: list[Decoded] = [f.sample("n1", 1, with_xid=True), f.pod("uid-1"), f.node_state("n1"), f.event("e1"),
                f.progress("uid-1", 1, 10.0), f.window("uid-1", 0, 1), f.capacity(1), f.lifecycle("uid-1"),
                f.alert(1), Tombstone("k8s.pods.v1", "uid-1", f.T0),
                *(message for scenario in scenarios for message in run_in_process(scenario).outputs)]
    found: dict[str, set[tuple[str, ...]]] = {}
    for message in messages:
        for table, row in rows_for(message, 0, 1):
            found.setdefault(table, set()).add(tuple(row))
    return found


def test_every_row_builder_writes_the_spec_columns() -> None:
    found = _rows_by_table()
    assert set(found) == {table for tables in TABLES_BY_TOPIC.values() for table in tables}
    assert {"mig_gpu_windows", "shared_gpu_windows"} <= set(found), "the scenarios have no MIG or shared layouts"
    for table, names in found.items():
        assert len(names) == 1, (table, names)
        (row,) = names
        assert set(row) == set(TABLES[table].names), (table, set(row) ^ set(TABLES[table].names))
    for table in ("gpu_samples", "gpu_processes", "gpu_xids"):  # columnar: in the spec's order
        assert next(iter(found[table])) == TABLES[table].names


def test_a_new_column_lands_where_the_spec_lists_it(migrated: ClickHouseStore, tmp_path: Path) -> None:
    after = GPU_SAMPLES.names.index("nvlink_rx_bytes_per_s") + 1
    grown = Table("gpu_samples", (*GPU_SAMPLES.columns[:after], Column("hypothetical_gauge", GAUGE),
                                  *GPU_SAMPLES.columns[after:]))
    migrated.command("CREATE TABLE gpu_samples_grown AS gpu_samples")
    try:
        migrated.command(Table("gpu_samples_grown", grown.columns).add_columns("hypothetical_gauge"))
        names = [str(r[0]) for r in migrated.query("DESCRIBE TABLE gpu_samples_grown").rows]
        assert names == list(grown.names)
    finally:
        migrated.command("DROP TABLE IF EXISTS gpu_samples_grown")
