"""Migration 9: the allocator figures of pod windows and lifecycle records reach their columns, and
rows without them read NULL (real chDB engine)."""

from __future__ import annotations

import pytest

from sinks.clickhouse import ClickHouseStore
from sinks.ddl import TtlDays
from sinks.migrations import MIGRATIONS, migrate
from sinks.rows import TableColumns, rows_for
from tests.sinks import factories as f

GIB = 2**30


@pytest.fixture
def store(store: ClickHouseStore) -> ClickHouseStore:
    migrate(store)
    return store


def test_allocator_figures_are_stored_and_absent_ones_are_null(store: ClickHouseStore) -> None:
    fragmented = f.window("a", 0, 0).model_copy(update={
        "alloc_reserved_bytes": 60 * GIB, "alloc_allocated_bytes": 12 * GIB,
        "max_reserved_unused_bytes": 48 * GIB, "alloc_retries": 4, "alloc_ooms": 1})
    plain = f.window("b", 1, 0)
    tables: dict[str, TableColumns] = {}
    for offset, message in enumerate([fragmented, plain]):
        for table, row in rows_for(message, 0, offset):
            tables.setdefault(table, TableColumns()).append(row)
    for table, columns in tables.items():
        store.insert(table, columns.columns, dedup_token=f"test:{table}")
    rows = store.query("SELECT pod_uid, alloc_reserved_bytes, alloc_allocated_bytes, max_reserved_unused_bytes, "
                       "alloc_retries, alloc_ooms FROM pod_windows FINAL ORDER BY pod_uid").rows
    assert rows == [["a", 60 * GIB, 12 * GIB, 48 * GIB, 4, 1], ["b", None, None, None, None, None]]
    names = store.query("SELECT name FROM system.columns WHERE database = currentDatabase() "
                        "AND table = 'pod_lifecycle' AND name LIKE 'alloc%'").rows
    assert sorted(r[0] for r in names) == ["alloc_ooms", "alloc_retries"]


def test_migration_9_can_run_again_after_a_crash_in_the_middle(store: ClickHouseStore) -> None:
    (m9,) = [m for m in MIGRATIONS if m.version == 9]
    before = store.query("SELECT count() FROM system.columns WHERE database = currentDatabase()").rows
    for statement in m9.statements(TtlDays()):  # as if the sink died before recording version 9
        store.command(statement)
    assert store.query("SELECT count() FROM system.columns WHERE database = currentDatabase()").rows == before
    assert migrate(store) == []
