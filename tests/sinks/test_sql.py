"""``gpulens sql`` is read-only, prints table/CSV/JSON; the schema migrates idempotently; the cost
views answer shared-GPU and per-unit-of-work questions (real chDB engine, no broker needed)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gpulens.cli import main
from schemas.messages import Message
from sinks.clickhouse import ClickHouseStore, StoreError, open_store
from sinks.ddl import TtlDays
from sinks.migrations import MIGRATIONS, migrate
from sinks.readonly import ReadOnlyViolation
from sinks.rows import TableColumns, rows_for
from sinks.service import load_prices
from tests.sinks import factories as f


@pytest.mark.parametrize("sql", ["INSERT INTO t VALUES (1)", "DROP TABLE pod_windows", "ALTER TABLE t DROP COLUMN a",
                                 "SELECT 1; SELECT 2"])
def test_cli_refuses_with_one_clear_line(sql: str, store: ClickHouseStore, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", sql, "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpulens: refused:"), err


@pytest.fixture
def store(store: ClickHouseStore) -> ClickHouseStore:
    migrate(store)
    return store


def _insert(store: ClickHouseStore, messages: list[Message], token: str = "test") -> None:
    tables: dict[str, TableColumns] = {}
    for offset, message in enumerate(messages):
        for table, row in rows_for(message, 0, offset):
            tables.setdefault(table, TableColumns()).append(row)
    for table, columns in tables.items():
        store.insert(table, columns.columns, dedup_token=f"{token}:{table}")


def test_migrations_are_idempotent_and_ttls_follow_settings(store: ClickHouseStore) -> None:
    assert migrate(store) == []
    migrate(store, TtlDays(raw=3, state=400, rollup=730))
    engines = dict(store.query("SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()").rows)
    assert "toIntervalDay(3)" in str(engines["gpu_samples"]) and "toIntervalDay(730)" in str(engines["rollup_daily"])
    versions = store.query("SELECT version FROM schema_migrations FINAL ORDER BY version").rows
    assert versions == [[m.version] for m in MIGRATIONS] == [[v] for v in range(1, len(MIGRATIONS) + 1)]


def test_the_gpu_rollup_is_back_filled_once_for_a_store_from_before_it(store: ClickHouseStore) -> None:
    """Migration 13 on a store that holds samples already (its version 13 not recorded: a store from
    before it, or a migration that crashed before recording itself) rolls each sample up once."""
    def rolled() -> list[list[object]]:
        return store.query("SELECT node, sum(samples), sum(sampled_s), sum(allocated_samples) FROM gpu_hourly "
                           "GROUP BY node ORDER BY node").rows

    _insert(store, [f.sample("n1", seq) for seq in range(30)])
    fed_by_the_view = rolled()
    assert fed_by_the_view == [["n1", 240, 2400.0, 120]]  # 8 GPUs, 4 allocated
    store.command("DELETE FROM schema_migrations WHERE version = 13")
    assert migrate(store) == [13]
    assert rolled() == fed_by_the_view
    store.command("DROP VIEW gpu_hourly_mv")
    store.command("DROP TABLE gpu_hourly")
    store.command("DELETE FROM schema_migrations WHERE version = 13")
    _insert(store, [f.sample("n2", seq) for seq in range(6)], "later")  # stored while no view existed
    assert migrate(store) == [13]
    assert rolled() == [["n1", 240, 2400.0, 120], ["n2", 48, 480.0, 24]]


def test_a_read_only_client_cannot_write_even_past_the_parser(store: ClickHouseStore) -> None:
    reader = open_store(store.url, read_only=True)
    try:
        with pytest.raises(ReadOnlyViolation, match="INSERT statements are refused"):
            reader.query("INSERT INTO gpu_prices VALUES ('x', 1, now())")
        with pytest.raises(StoreError, match="readonly"):  # the parser lets it by; the engine refuses it
            reader.query("SELECT 1 SETTINGS readonly = 0")
    finally:
        reader.close()
    assert store.query("SELECT count() FROM gpu_prices").rows == [[0]]


def test_cost_views_shared_gpus_and_cost_per_step(store: ClickHouseStore) -> None:
    load_prices(store, {f.H100: 3.0})
    # two pods share GPU 0 for 10 minutes; a busies it twice as much as b. c owns GPU 1 and reports steps.
    windows = [f.window("a", 0, m, busy_s=40.0) for m in range(10)]
    windows += [f.window("b", 0, m, busy_s=20.0) for m in range(10)]
    windows += [f.window("c", 1, m, busy_s=60.0, cost_usd=0.05) for m in range(10)]
    _insert(store, [*f.stamped(windows), *(f.progress("c", m, steps=100.0 * m) for m in range(11))])

    shared = {r["pod_uid"]: r for r in store.query("SELECT * FROM v_shared_gpu_cost").dicts()}
    assert set(shared) == {"a", "b"}
    gpu_hour_cost = 10 / 60 * 3.0
    assert shared["a"]["usage_based_cost_usd"] == pytest.approx(gpu_hour_cost * 2 / 3)
    assert shared["b"]["usage_based_cost_usd"] == pytest.approx(gpu_hour_cost / 3)
    assert shared["a"]["request_based_cost_usd"] == pytest.approx(gpu_hour_cost)

    unit = store.query("SELECT pod_uid, steps, cost_usd, cost_per_step_usd FROM v_cost_per_unit").dicts()
    assert unit == [{"pod_uid": "c", "steps": 1000.0, "cost_usd": pytest.approx(0.5),
                     "cost_per_step_usd": pytest.approx(0.5 / 1000)}]
    team = store.query("SELECT team, gpu_hours, cost_usd, list_cost_usd FROM v_cost_by_team").dicts()
    assert team == [{"team": "nlp", "gpu_hours": pytest.approx(0.5), "cost_usd": pytest.approx(0.5 + 2 * 10 * 2.5 / 60),
                     "list_cost_usd": pytest.approx(1.5)}]


def test_sql_prints_table_csv_and_json(store: ClickHouseStore, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    load_prices(store, {"NVIDIA L4": 0.8, f.H100: 2.5})
    store.close()  # a CLI in this process opens the engine itself (no sink runs)
    query = "SELECT gpu_model, usd_per_gpu_hour FROM gpu_prices FINAL ORDER BY gpu_model"
    args = ["--data-dir", str(tmp_path)]
    assert main(["sql", query, *args]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["gpu_model", "usd_per_gpu_hour"] and table[2].split()[-1] == "2.5"
    assert main(["sql", query, "--format", "csv", *args]) == 0
    assert capsys.readouterr().out.splitlines() == ["gpu_model,usd_per_gpu_hour", "NVIDIA H100 80GB HBM3,2.5",
                                                    "NVIDIA L4,0.8"]
    assert main(["sql", query, "--format", "json", *args]) == 0
    assert orjson.loads(capsys.readouterr().out) == [{"gpu_model": f.H100, "usd_per_gpu_hour": 2.5},
                                                      {"gpu_model": "NVIDIA L4", "usd_per_gpu_hour": 0.8}]
    assert main(["sql", "SELECT nope FROM gpu_prices", *args]) == 2
    assert "nope" in capsys.readouterr().err


def test_an_alert_still_firing_has_no_resolved_at(store: ClickHouseStore) -> None:
    _insert(store, [f.alert(1), f.alert(2), f.alert(2, state="resolved")])
    rows = {r["id"]: r for r in store.query("SELECT id, current_state, resolved_at, first_at FROM v_alerts").dicts()}
    assert rows["alert-1"]["current_state"] == "firing" and rows["alert-1"]["resolved_at"] is None
    assert rows["alert-2"]["current_state"] == "resolved"
    assert rows["alert-2"]["resolved_at"] > rows["alert-2"]["first_at"]
