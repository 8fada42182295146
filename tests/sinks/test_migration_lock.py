"""One migrator at a time (:mod:`sinks.migration_lock`), against a real chDB store holding windows:

- three sinks starting together on a store whose team rollups' migration (14) is missing: exactly one
  runs it (one ``DELETE`` and one back-fill of each rollup), the others wait for it and apply
  nothing; windows the migrated sink stores while the others still wait are counted once, so the
  rollup equals the raw windows;
- a claimant that crashed (its claim left, never completed) holds the others up until its claim
  expires, then one takes over and migrates;
- a holder whose claim expired and was taken over stops before its next statement;
- a start with nothing to migrate takes no lock and does not wait, even while a claim is held.

Threads share one store (chDB: one engine per process); its statements run one at a time, so the
threads interleave statement by statement, as sinks on one server do.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from sinks.clickhouse import ClickHouseStore
from sinks.ddl import TtlDays
from sinks.migration_lock import CLAIMS, ClaimTiming, MigrationClaimLost, MigrationLock
from sinks.migrations import MIGRATIONS, migrate
from tests.sinks import factories as f

FAST = ClaimTiming(settle_s=0.2, expiry_s=30.0, renew_every_s=0.5, poll_initial_s=0.05, poll_max_s=0.2)
TEAM_ROLLUPS = ("team_hourly", "team_daily")


class Sink(ClickHouseStore):
    """One starting sink's view of the shared store: every statement it sends, recorded."""

    def __init__(self, store: ClickHouseStore) -> None:  # no connection of its own
        self._inner = store
        self.sent: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def command(self, sql: str, settings: Any = None) -> None:
        self.sent.append(sql)
        self._inner.command(sql, settings)


@pytest.fixture
def store(store: ClickHouseStore) -> ClickHouseStore:
    """A migrated store holding 3 pods' windows over 2 hours, whose migration 14 is then undone."""
    migrate(store)
    f.store_rows(store, [f.window(f"p{pod}", gpu, minute) for pod in range(3) for gpu in range(2)
                         for minute in range(0, 120, 5)])
    _undo_team_rollups(store)
    return store


def _undo_team_rollups(store: ClickHouseStore) -> None:
    for table in TEAM_ROLLUPS:
        store.command(f"DROP VIEW IF EXISTS {table}_mv")
        store.command(f"DROP TABLE IF EXISTS {table}")
    store.command("DELETE FROM schema_migrations WHERE version = 14")


def _versions(store: ClickHouseStore) -> set[int]:
    return {int(r[0]) for r in store.query("SELECT version FROM schema_migrations").rows}


def _raw_and_rolled(store: ClickHouseStore, table: str) -> tuple[list[list[Any]], list[list[Any]]]:
    raw = store.query("SELECT team, count(), sum(allocated_s), sum(busy_s), uniqExact(pod_uid) "
                      "FROM pod_windows FINAL GROUP BY team ORDER BY team").rows
    rolled = store.query(f"SELECT team, sum(windows), sum(allocated_gpu_s), sum(busy_gpu_s), uniqExactMerge(pods) "
                         f"FROM {table} GROUP BY team ORDER BY team").rows
    return raw, rolled


def test_sinks_starting_together_migrate_once_and_the_rollups_equal_the_raw_windows(
        store: ClickHouseStore) -> None:
    sinks = [Sink(store) for _ in range(3)]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(sinks) + 1)
    late_windows = [f.window("late", gpu, minute, team="vision") for gpu in range(2) for minute in range(0, 60, 5)]

    def start_sink(n: int) -> None:
        try:
            start.wait()
            results[n] = migrate(sinks[n], timing=FAST)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    def consume() -> None:
        """The migrated sink consumes at once: windows stored while the other sinks still wait."""
        try:
            start.wait()
            deadline = time.monotonic() + 60
            while 14 not in _versions(store) and time.monotonic() < deadline:
                time.sleep(0.01)
            for window in late_windows:
                f.store_rows(store, [window])
                time.sleep(0.01)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start_sink, args=(n,)) for n in range(len(sinks))]
    threads.append(threading.Thread(target=consume))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert sorted(results.values()) == [[], [], [14]], results
    # only the holder ran the migration's statements: one delete and one back-fill of each rollup
    for table in TEAM_ROLLUPS:
        deletes = [s for sink in sinks for s in sink.sent if s.startswith(f"DELETE FROM {table} ")]
        backfills = [s for sink in sinks for s in sink.sent if s.startswith(f"INSERT INTO {table} ")]
        assert len(deletes) == len(backfills) == 1, table
    assert _versions(store) == {m.version for m in MIGRATIONS}
    assert int(store.query(f"SELECT count() FROM {CLAIMS}").rows[0][0]) == 0  # every claim withdrawn
    for table in TEAM_ROLLUPS:
        raw, rolled = _raw_and_rolled(store, table)
        assert raw == rolled, table
        assert [row[:2] for row in raw] == [["nlp", 144], ["vision", 24]]


def test_a_crashed_claimant_is_taken_over_after_its_claim_expires(
        store: ClickHouseStore, caplog: pytest.LogCaptureFixture) -> None:
    # a sink that claimed, started migrating and died: its claim stays, version 14 is not recorded
    store.command(f"INSERT INTO {CLAIMS} (claimant, claimed_at, expires_at) "
                  "SELECT 'crashed-sink', now64(3), now64(3) + toIntervalMillisecond(1500)")
    create, _delete, backfill, _view = MIGRATIONS[13].statements(TtlDays())[:4]
    store.command(create)  # its work so far: team_hourly back-filled, no view yet
    store.command(backfill)
    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        assert migrate(Sink(store), timing=FAST) == [14]
    assert time.monotonic() - started >= 1.2  # it waited for the claim to expire
    waits = [r for r in caplog.records if r.getMessage().startswith("waiting for another sink's migrations")]
    assert waits, [r.getMessage() for r in caplog.records]
    for table in TEAM_ROLLUPS:
        raw, rolled = _raw_and_rolled(store, table)
        assert raw == rolled, table


def test_a_holder_whose_claim_was_taken_over_stops_before_its_next_statement(store: ClickHouseStore) -> None:
    lock = MigrationLock(store, ClaimTiming(settle_s=0.0, expiry_s=30.0, renew_every_s=0.0), claimant="slow-sink")
    lock.create_table()
    # its claim expired during a long statement, and another sink's claim holds the lock now
    store.command(f"INSERT INTO {CLAIMS} (claimant, claimed_at, expires_at) "
                  "SELECT 'slow-sink', now64(3) - toIntervalSecond(60), now64(3) - toIntervalSecond(30)")
    store.command(f"INSERT INTO {CLAIMS} (claimant, claimed_at, expires_at) "
                  "SELECT 'other-sink', now64(3) - toIntervalSecond(20), now64(3) + toIntervalSecond(30)")
    with pytest.raises(MigrationClaimLost, match="other-sink holds it now"):
        lock.renew()


def test_a_start_with_nothing_to_migrate_takes_no_lock_and_does_not_wait(store: ClickHouseStore) -> None:
    assert migrate(store, timing=FAST) == [14]
    store.command(f"INSERT INTO {CLAIMS} (claimant, claimed_at, expires_at) "
                  "SELECT 'migrating-sink', now64(3), now64(3) + toIntervalSecond(600)")
    sink = Sink(store)
    started = time.monotonic()
    assert migrate(sink, timing=ClaimTiming(settle_s=5.0, poll_initial_s=5.0)) == []
    assert time.monotonic() - started < 3
    assert not [s for s in sink.sent if CLAIMS in s and not s.startswith("CREATE TABLE")]
    assert store.query(f"SELECT claimant FROM {CLAIMS}").rows == [["migrating-sink"]]
