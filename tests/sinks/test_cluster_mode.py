"""ClickHouse cluster mode (sinks/cluster.py): every statement the migrations issue for a cluster,
checked by the engine itself, since no ClickHouse server or Keeper runs here.

- Every statement of a fresh store's migration in cluster mode (the frozen migrations run on chDB
  while each statement is recorded as the cluster receives it) is parsed and formatted by the
  engine's parser (``formatQuery``): ``ON CLUSTER`` on every DDL statement, a ``Replicated`` engine
  with the ``{shard}``/``{replica}`` macros on every MergeTree table, none on a data statement.
- Every table setting is one of the engine's ``system.merge_tree_settings``, every query setting
  one of its ``system.settings``.
- Every ``CREATE TABLE`` a replica runs (the statement without ``ON CLUSTER``, as the distributed
  DDL queue runs it there) is executed by a chDB given ``{shard}``/``{replica}`` macros and a
  cluster definition: the engine creates each Replicated table (read-only: there is no Keeper), and
  what it shows back, seen through :func:`sinks.cluster.single_server_view`, is what single-server
  mode shows for that statement, which is what the frozen rebuilds (migrations 4, 7) read.
- Single-server mode issues no cluster text (the frozen pins stay those of
  tests/sinks/test_migrations_frozen.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.errors import UserError
from common.metrics import MetricsRegistry
from common.settings import ConfigError, SinkSettings, load_settings
from sinks.batches import BatchWriter, SinkMetrics
from sinks.clickhouse import INSERT_SETTINGS, ClickHouseStore, StoreUnavailable
from sinks.cluster import (
    CLUSTER_SHARDS,
    DEDUP_WINDOW_S,
    JOURNAL_SYNC,
    UNREPLICATED_TABLES,
    ClusterDdlError,
    ClusterSetupError,
    ClusterStore,
    check_cluster,
    replicas_of,
    single_server_view,
    to_cluster,
    unreplicated_tables,
)
from sinks.ddl import DEDUP_WINDOW, TtlDays
from sinks.migrations import migrate
from sinks.service import prepare_cluster
from sinks.tables import TABLES

CLUSTER = "gpulens_replicas"

_CREATE_TABLE = re.compile(r"^CREATE TABLE (?:IF NOT EXISTS )?(\w+)")
_DDL = ("CREATE", "ALTER", "DROP", "EXCHANGE")


class Recording(ClusterStore):
    """Cluster mode's migration on chDB: each statement recorded as the cluster would receive it
    (:func:`to_cluster`) and run on chDB as single-server mode runs it, so the rebuilds read a real
    store; after each ``CREATE TABLE``, what the engine shows of the new table."""

    def __init__(self, store: ClickHouseStore) -> None:
        super().__init__(store, CLUSTER)
        self.sent: list[tuple[str, str]] = []
        self.shown: list[tuple[str, str]] = []

    def command(self, sql: str, settings: Any = None) -> None:
        cluster_sql = to_cluster(sql, CLUSTER)
        self.sent.append((sql, cluster_sql))
        self._store.command(sql, settings)
        if created := _CREATE_TABLE.match(cluster_sql):
            self.shown.append((cluster_sql, str(self._store.query(f"SHOW CREATE TABLE {created.group(1)}").rows[0][0])))


@pytest.fixture
def recorded(store: ClickHouseStore) -> Recording:
    """A fresh store's migration in cluster mode, recorded (one second; one chDB directory a process)."""
    recording = Recording(store)
    migrate(recording, TtlDays(raw=11, state=22, rollup=33))
    return recording


@pytest.fixture
def engine(recorded: Recording, store: ClickHouseStore) -> ClickHouseStore:
    return store


def _formatted(engine: ClickHouseStore, statement: str) -> str:
    return str(engine.query("SELECT formatQuery({q:String})", parameters={"q": statement}).rows[0][0])


def test_every_statement_is_parsed_and_formatted_by_the_engine(recorded: Recording, engine: ClickHouseStore) -> None:
    assert _formatted(engine, JOURNAL_SYNC) == JOURNAL_SYNC
    statements = [cluster_sql for _, cluster_sql in recorded.sent]
    kinds = {" ".join(s.split()[:2]) for s in statements}
    assert kinds == {"CREATE TABLE", "CREATE VIEW", "CREATE MATERIALIZED", "CREATE OR", "ALTER TABLE", "DROP TABLE",
                     "DROP VIEW", "EXCHANGE TABLES", "INSERT INTO", "DELETE FROM"}, kinds
    assert len(statements) >= 160, len(statements)
    for statement in statements:
        formatted = _formatted(engine, statement)  # raises on a statement the parser refuses
        head = formatted.split("(")[0]
        if statement.startswith(_DDL):
            assert f" ON CLUSTER {CLUSTER}" in head, formatted[:300]
        else:
            assert "ON CLUSTER" not in formatted, formatted[:300]
            assert statement.startswith(("INSERT INTO", "DELETE FROM")), formatted[:300]
        if statement.startswith("DROP"):
            assert formatted.endswith(" SYNC"), formatted
        assert "non_replicated_deduplication_window" not in formatted, formatted[:300]


def test_every_mergetree_table_is_replicated_with_the_macros(recorded: Recording, engine: ClickHouseStore) -> None:
    created = 0
    for _, statement in recorded.sent:
        table = _CREATE_TABLE.match(statement)
        if table is None:
            continue
        formatted = _formatted(engine, statement)
        engine_clause = re.search(r"^ENGINE = (.*)$", formatted, re.MULTILINE)
        assert engine_clause is not None, formatted
        if engine_clause.group(1) == "`Null`":  # gpu_samples_json: the engine path's entry, no storage
            continue
        created += 1
        path = f"'/clickhouse/tables/{{shard}}/{{database}}/{table.group(1)}', '{{replica}}'"
        assert re.fullmatch(rf"Replicated(Replacing|Aggregating|)MergeTree\({re.escape(path)}(, \w+)?\)",
                            engine_clause.group(1)), engine_clause.group(1)
        if table.group(1) not in ("gpu_prices", "schema_migrations"):  # no Kafka-fed inserts
            assert (f"replicated_deduplication_window = {DEDUP_WINDOW}, "
                    f"replicated_deduplication_window_seconds = {DEDUP_WINDOW_S}") in formatted, formatted[-300:]
    # every table of the store (sinks.tables.TABLES: migrations' tables and schema_migrations), the
    # staging tables of migration 4 (2) and 7 (14), and migration 16's gpu_tenancy_daily (17 drops it)
    assert created == len(TABLES) + 2 + 14 + 1, created


def _settings_of(formatted: str) -> dict[str, str]:
    clause = re.search(r"^SETTINGS (.*)$", formatted, re.MULTILINE)
    if clause is None:
        return {}
    return dict(pair.split(" = ", 1) for pair in clause.group(1).split(", "))


def test_every_setting_is_one_the_engine_knows(recorded: Recording, engine: ClickHouseStore) -> None:
    table_settings = {str(r[0]): str(r[1]) for r in engine.query(
        "SELECT name, type FROM system.merge_tree_settings").rows}
    query_settings = {str(r[0]) for r in engine.query("SELECT name FROM system.settings").rows}
    used_table: set[str] = set()
    used_query: set[str] = set()
    for _, statement in recorded.sent:
        formatted = _formatted(engine, statement)
        if _CREATE_TABLE.match(statement):
            used_table |= set(_settings_of(formatted))
        elif statement.startswith("ALTER"):
            used_query |= set(_settings_of(formatted.replace(") SETTINGS ", ")\nSETTINGS ")))
    assert {"replicated_deduplication_window", "replicated_deduplication_window_seconds"} <= used_table
    assert used_table <= set(table_settings), used_table - set(table_settings)
    assert table_settings["replicated_deduplication_window"] == table_settings[
        "replicated_deduplication_window_seconds"] == "UInt64"
    # what each insert of the sink sets: deduplication by token works on Replicated tables as on one server
    used_query |= {*INSERT_SETTINGS, "insert_deduplication_token", "insert_deduplicate"}
    assert used_query <= query_settings, used_query - query_settings


def test_the_grants_cluster_mode_needs_are_the_engines(engine: ClickHouseStore) -> None:
    """docs/sink.md and docs/operations.md name them: ``ON CLUSTER`` needs ``CLUSTER`` (global), the
    journal's sync ``SYSTEM SYNC REPLICA`` (on the table)."""
    levels = dict(engine.query("SELECT privilege, toString(level) FROM system.privileges "
                               "WHERE privilege IN ('CLUSTER', 'SYSTEM SYNC REPLICA')").rows)
    assert levels == {"CLUSTER": "GLOBAL", "SYSTEM SYNC REPLICA": "TABLE"}


def test_single_server_mode_sends_no_cluster_text(store: ClickHouseStore) -> None:
    sent: list[str] = []

    class Plain(ClickHouseStore):
        def __init__(self) -> None:
            self._inner = store

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def command(self, sql: str, settings: Any = None) -> None:
            sent.append(sql)
            self._inner.command(sql, settings)

    migrate(Plain(), TtlDays(), cluster="")
    assert sent and not [s for s in sent if "ON CLUSTER" in s or "Replicated" in s or " SYNC" in s]
    assert any("non_replicated_deduplication_window = 10000" in s for s in sent)


def test_in_cluster_mode_the_journal_is_synced_from_keeper_before_it_is_read(engine: ClickHouseStore) -> None:
    metrics = SinkMetrics(MetricsRegistry())
    starts = {("gpulens.gpu.samples.v1", 0): 0}
    assert BatchWriter(engine, metrics, "gpulens").pending_plans(starts) == {("gpulens.gpu.samples.v1", 0): []}
    # chDB's sink_batches is a single-server table: the engine refuses the sync, so it was sent
    with pytest.raises(StoreUnavailable, match=r"sink_batches .* is not replicated"):
        BatchWriter(engine, metrics, "gpulens", replicated=True).pending_plans(starts)


def test_rewrite_refuses_what_it_has_no_form_for() -> None:
    for statement in ("RENAME TABLE a TO b", "TRUNCATE TABLE gpu_samples", "CREATE DATABASE x",
                      "OPTIMIZE TABLE gpu_samples FINAL"):
        with pytest.raises(ClusterDdlError, match="no cluster form"):
            to_cluster(statement, CLUSTER)
    with pytest.raises(ClusterDdlError, match="not a ClickHouse cluster name"):
        to_cluster("DROP TABLE t", "a cluster; DROP TABLE x")


def test_the_cluster_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_CLICKHOUSE__URL", "http://ch-0.ch:8123/gpulens")
    monkeypatch.setenv("GPULENS_CLICKHOUSE__CLUSTER", CLUSTER)
    assert load_settings(SinkSettings).clickhouse.cluster == CLUSTER
    monkeypatch.setenv("GPULENS_CLICKHOUSE__CLUSTER", "gpu-lens")
    with pytest.raises(ConfigError, match="GPULENS_CLICKHOUSE__CLUSTER: String should match pattern"):
        load_settings(SinkSettings)
    monkeypatch.setenv("GPULENS_CLICKHOUSE__CLUSTER", CLUSTER)
    monkeypatch.setenv("GPULENS_CLICKHOUSE__URL", "chdb:///tmp/x")
    with pytest.raises(ConfigError, match="GPULENS_CLICKHOUSE__CLUSTER: Value error, a cluster needs a ClickHouse"):
        load_settings(SinkSettings)
    monkeypatch.delenv("GPULENS_CLICKHOUSE__CLUSTER")
    assert load_settings(SinkSettings).clickhouse.cluster == ""


def test_start_refuses_an_unknown_cluster_and_single_server_tables(engine: ClickHouseStore) -> None:
    with pytest.raises(ClusterSetupError, match="knows no such cluster"):
        check_cluster(engine, CLUSTER)
    assert "gpu_samples" in unreplicated_tables(engine)  # the chDB store migrated in single-server mode
    with pytest.raises(UserError, match=f"GPULENS_CLICKHOUSE__CLUSTER={CLUSTER}"):
        prepare_cluster(engine, CLUSTER)
    with pytest.raises(ClusterSetupError, match="2 shards"):
        replicas_of(CLUSTER, [[1, 2], [2, 2]])
    assert replicas_of(CLUSTER, [[1, 3]]) == 3


REPLICA = """
import json, os, re, sys
import chdb
config, statements, journal_sync, queries = json.load(sys.stdin)
connection = chdb.connect(f":memory:?config-file={config}")
cursor = connection.cursor()
out = {"created": [], "queries": []}
for statement in statements:
    name = re.match(r"CREATE TABLE (?:IF NOT EXISTS )?(\\w+)", statement).group(1)
    try:
        cursor.execute(statement)
        cursor.execute(f"SHOW CREATE TABLE {name}")
        shown = cursor.fetchall()[0][0]
        cursor.execute(f"SELECT engine, replica_path, is_readonly FROM system.tables AS t "
                       f"LEFT JOIN system.replicas AS r ON r.database = t.database AND r.table = t.name "
                       f"WHERE t.database = currentDatabase() AND t.name = '{name}'")
        out["created"].append({"shown": shown, "replica": list(cursor.fetchall()[0])})
    except Exception as exc:
        out["created"].append({"error": str(exc)[:800]})
try:
    cursor.execute(journal_sync)
    out["journal_sync"] = "done"
except Exception as exc:
    out["journal_sync"] = str(exc)[:800]
for query, cluster in queries:
    cursor.execute(query.replace("{cluster:String}", repr(cluster)))
    out["queries"].append([list(row) for row in cursor.fetchall()])
sys.stdout.write(json.dumps(out))
sys.stdout.flush()
os._exit(0)  # chDB with a Keeper section aborts in its exit handlers; the answer is written
"""
"""A replica: chDB with ``{shard}``=01, ``{replica}``=r1 and two clusters; runs the statements it is
given, then the queries (``{cluster:String}`` filled in)."""

REPLICA_CONFIG = """<clickhouse>
  <zookeeper><implementation>testkeeper</implementation></zookeeper>
  <macros><shard>01</shard><replica>r1</replica></macros>
  <remote_servers>
    <gpulens_replicas>
      <shard><replica><host>ch-0</host><port>9000</port></replica><replica><host>ch-1</host><port>9000</port></replica></shard>
    </gpulens_replicas>
    <two_shards>
      <shard><replica><host>ch-0</host><port>9000</port></replica></shard>
      <shard><replica><host>ch-1</host><port>9000</port></replica></shard>
    </two_shards>
  </remote_servers>
</clickhouse>
"""


def test_a_replica_creates_every_table_and_shows_it_back_as_single_server_mode_reads_it(
        recorded: Recording, tmp_path: Path) -> None:
    config = tmp_path / "replica.xml"
    config.write_text(REPLICA_CONFIG)
    creates = [cluster_sql for cluster_sql, _ in recorded.shown]
    on_replica = [s.replace(f" ON CLUSTER {CLUSTER}", "", 1) for s in creates]
    queries = [(CLUSTER_SHARDS, CLUSTER), (CLUSTER_SHARDS, "two_shards"), (UNREPLICATED_TABLES, "")]
    given = json.dumps([str(config), on_replica, JOURNAL_SYNC, queries])
    done = subprocess.run([sys.executable, "-c", REPLICA], input=given, capture_output=True, text=True, timeout=300,
                          check=False)
    answer = json.loads(done.stdout or "null")
    assert answer is not None, done.stderr[-2000:]
    # the tables above (migration 16's gpu_tenancy_daily among them) and the engine path's Null table
    # (created by migrations 10 and 11)
    assert len(answer["created"]) == len(creates) == len(TABLES) + 2 + 14 + 1 + 2
    for (statement, shown), created in zip(recorded.shown, answer["created"], strict=True):
        assert "error" not in created, (statement[:200], created)
        name = _CREATE_TABLE.match(statement).group(1)  # type: ignore[union-attr]
        engine_name, replica_path, _ = created["replica"]
        if engine_name != "Null":
            assert engine_name.startswith("Replicated"), engine_name
            assert replica_path == f"/clickhouse/tables/01/default/{name}/replicas/r1"
        single_server = shown.replace("CREATE TABLE ", "", 1).split("\n", 1)
        replica = created["shown"].replace("CREATE TABLE ", "", 1).split("\n", 1)
        # the database differs (chDB's store and the replica's default one); the rest is equal
        assert single_server_view(replica[1]) == single_server[1], (name, replica[1][-600:])
    # the replica's sink_batches is replicated: the sync gets as far as Keeper, which is not there
    assert "TABLE_IS_READ_ONLY" in answer["journal_sync"], answer["journal_sync"]
    clusters, two_shards, unreplicated = answer["queries"]
    assert replicas_of(CLUSTER, clusters) == 2
    with pytest.raises(ClusterSetupError, match="2 shards"):
        replicas_of("two_shards", two_shards)
    assert unreplicated == []
