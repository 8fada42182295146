"""ClickHouse cluster mode: the sink's schema on every replica of a named cluster, derived from the
single-server migrations by one deterministic rewrite of each statement.

Why a rewrite and not a second copy of every migration: applied migrations are frozen text
(tests/sinks/test_migrations_frozen.py), and migrations 4 and 7 build their statements from what
the store answers. Both modes run the same migrations; in cluster mode each statement passes
through :func:`to_cluster` on its way to the server, and what the rebuilds read back passes through
:func:`single_server_view`, so the frozen code sees the tables as the single-server mode creates
them. A statement of a form the rewrite does not know fails (:class:`ClusterDdlError`) instead of
running on one replica only.

The rewrite of one statement:

- ``ENGINE = <X>MergeTree[(args)]`` becomes ``ENGINE = Replicated<X>MergeTree('/clickhouse/tables/
  {shard}/{database}/<table>', '{replica}'[, args])`` (the ``{shard}`` and ``{replica}`` macros
  of each server's configuration; ``<table>`` is the name the table is created with: a table that
  migration 4 or 7 rebuilt keeps the path of its staging table, ``<table>_m4`` or ``<table>_m7``);
- ``non_replicated_deduplication_window = N`` becomes ``replicated_deduplication_window = N,
  replicated_deduplication_window_seconds =`` :data:`DEDUP_WINDOW_S`: the same blocks remembered,
  in Keeper, so a retried insert is dropped on whichever replica it reaches;
- ``ON CLUSTER <name>`` after the object of every ``CREATE``, ``ALTER``, ``DROP`` (``DROP`` also
  ``SYNC``: a staging table's Keeper path is free again at once, so a rebuild repeated after a crash
  can create it anew) and ``EXCHANGE TABLES``;
- ``INSERT``, ``DELETE`` and reads unchanged: a Replicated table replicates its data and lightweight
  deletes itself, and ``ON CLUSTER`` would run them once per replica.

Supported topology: one shard of N replicas. The sink inserts into the tables of the replica its URL
reaches (syncing its batch journal from Keeper before reading it: :data:`JOURNAL_SYNC`), and every
reader (report, ``gpulens sql``, Grafana) reads the tables and views of any one replica, which holds
all the data. Several shards are refused at start (:func:`check_cluster`):
``FINAL`` and the natural-key deduplication work within a shard only.
"""

from __future__ import annotations

import re
from typing import Any

from common.errors import UserError
from common.settings import CLICKHOUSE_IDENTIFIER
from sinks.clickhouse import ClickHouseStore, QueryResult

CLUSTER_NAME = re.compile(rf"^{CLICKHOUSE_IDENTIFIER}$")
"""A cluster name the rewrite writes unquoted (``GPULENS_CLICKHOUSE__CLUSTER`` is validated alike)."""

REPLICA_PATH = "/clickhouse/tables/{shard}/{database}/"
"""Keeper path of a table's replicas, before the table's name."""

DEDUP_WINDOW_S = 30 * 24 * 3600
"""How long Keeper keeps a block's deduplication hash: as long as the sink's batch journal keeps a
planned range (``sink_batches``' TTL), so the number of blocks (10000, as in single-server mode)
is what bounds the window, as ``non_replicated_deduplication_window`` does on one server."""

_ENGINE = re.compile(r"ENGINE = (\w*)MergeTree(?:\(([^()]*)\))?(?=\s|$)")
_REPLICATED_ENGINE = re.compile(r"ENGINE = Replicated(\w*MergeTree)\('[^']*', '[^']*'(?:, ([^()]*))?\)")
_DEDUP = re.compile(r"\bnon_replicated_deduplication_window = (\d+)")
_REPLICATED_DEDUP = re.compile(
    rf"\breplicated_deduplication_window = (\d+), replicated_deduplication_window_seconds = {DEDUP_WINDOW_S}\b")
_NAME = r"(?:`[^`]+`|[\w.]+)"
_OBJECT = re.compile(
    rf"^(CREATE (?:OR REPLACE )?(?:TABLE|VIEW|MATERIALIZED VIEW)(?: IF NOT EXISTS)? |ALTER TABLE )({_NAME})")
_DROP = re.compile(rf"^(DROP (?:TABLE|VIEW)(?: IF EXISTS)? )({_NAME})$")
_EXCHANGE = re.compile(rf"^EXCHANGE TABLES {_NAME} AND {_NAME}$")
_UNCHANGED = re.compile(r"^(INSERT INTO|DELETE FROM|SELECT|WITH|SHOW|DESCRIBE) ")


JOURNAL_SYNC = "SYSTEM SYNC REPLICA sink_batches LIGHTWEIGHT"
"""What the sink runs before it reads its batch journal in cluster mode: this replica first fetches
every part of ``sink_batches`` that Keeper knows of, so a range journalled through another replica
before a crash is seen, and the replayed batch is the same block with the same deduplication token.
(A part whose only replica is down is waited for: the read fails as unavailable and is retried.)"""


class ClusterDdlError(ValueError):
    """A statement the cluster rewrite has no form for."""


def to_cluster(statement: str, cluster: str) -> str:
    """``statement`` as it runs on every replica of ``cluster`` (see the module docstring)."""
    if not CLUSTER_NAME.match(cluster):
        raise ClusterDdlError(f"not a ClickHouse cluster name: {cluster!r}")
    text = statement.strip()
    on = f" ON CLUSTER {cluster}"
    if _UNCHANGED.match(text):
        return statement
    if _EXCHANGE.match(text):
        return text + on
    if drop := _DROP.match(text):
        return f"{drop.group(1)}{drop.group(2)}{on} SYNC"
    target = _OBJECT.match(text)
    if target is None:
        raise ClusterDdlError(f"no cluster form for this statement: {text[:200]}")
    name = target.group(2)
    text = f"{target.group(1)}{name}{on}{text[target.end():]}"
    if text.startswith("CREATE") and " TABLE " in text[:40]:
        table = name.strip("`").rsplit(".", 1)[-1]

        def replicated(engine: re.Match[str]) -> str:
            args = f", {engine.group(2)}" if engine.group(2) else ""
            return f"ENGINE = Replicated{engine.group(1)}MergeTree('{REPLICA_PATH}{table}', '{{replica}}'{args})"

        text = _ENGINE.sub(replicated, text, count=1)
    return _DEDUP.sub(
        rf"replicated_deduplication_window = \1, replicated_deduplication_window_seconds = {DEDUP_WINDOW_S}", text)


def single_server_view(text: str) -> str:
    """The inverse of :func:`to_cluster`'s engine and settings rewrite on a table definition the server
    shows (``SHOW CREATE TABLE``, ``system.tables.engine``): what single-server mode would show."""
    text = _REPLICATED_ENGINE.sub(lambda m: f"ENGINE = {m.group(1)}" + (f"({m.group(2)})" if m.group(2) else ""),
                                  text)
    text = _REPLICATED_DEDUP.sub(r"non_replicated_deduplication_window = \1", text)
    replicated_engine = re.fullmatch(r"Replicated(\w*MergeTree)", text)
    return replicated_engine.group(1) if replicated_engine else text


class ClusterStore(ClickHouseStore):
    """The store the migrations run on in cluster mode: every statement rewritten by :func:`to_cluster`,
    every text a query returns seen through :func:`single_server_view`. Shares the connection of
    ``store`` (everything else is the wrapped store's)."""

    def __init__(self, store: ClickHouseStore, cluster: str) -> None:  # no connection of its own
        self._store = store
        self.cluster = cluster

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def command(self, sql: str, settings: Any = None) -> None:
        self._store.command(to_cluster(sql, self.cluster), settings)

    def query(self, sql: str, parameters: Any = None, settings: Any = None, cancel: Any = None) -> QueryResult:
        result = self._store.query(sql, parameters, settings, cancel)
        rows = [[single_server_view(v) if isinstance(v, str) else v for v in row] for row in result.rows]
        return QueryResult(result.columns, result.types, rows)


class ClusterSetupError(UserError):
    """The server's clusters or tables do not fit the configured cluster mode."""


CLUSTER_SHARDS = ("SELECT shard_num, count() FROM system.clusters WHERE cluster = {cluster:String} "
                  "GROUP BY shard_num ORDER BY shard_num")
"""Each shard of a cluster with its number of replicas, as the server's configuration defines them."""

UNREPLICATED_TABLES = ("SELECT name FROM system.tables WHERE database = currentDatabase() AND engine LIKE '%MergeTree' "
                       "AND engine NOT LIKE 'Replicated%' AND NOT is_temporary ORDER BY name")
"""Tables of the current database whose engine is a MergeTree but not a Replicated one."""


def check_cluster(store: ClickHouseStore, cluster: str) -> int:
    """The number of replicas of ``cluster`` as the server knows it (``system.clusters``); raises
    :class:`ClusterSetupError` when it is unknown there or has several shards."""
    return replicas_of(cluster, store.query(CLUSTER_SHARDS, parameters={"cluster": cluster}).rows)


def replicas_of(cluster: str, rows: list[list[Any]]) -> int:
    """The replicas of ``cluster`` from its :data:`CLUSTER_SHARDS` rows (see :func:`check_cluster`)."""
    if not rows:
        raise ClusterSetupError(
            f"GPULENS_CLICKHOUSE__CLUSTER={cluster}: the server knows no such cluster (system.clusters); "
            "name a cluster of its remote_servers configuration, or leave it empty for one server")
    if len(rows) > 1:
        raise ClusterSetupError(
            f"GPULENS_CLICKHOUSE__CLUSTER={cluster}: the cluster has {len(rows)} shards; the sink supports one "
            "shard of any number of replicas (ReplacingMergeTree deduplicates within a shard only)")
    return int(rows[0][1])


def unreplicated_tables(store: ClickHouseStore) -> list[str]:
    """Tables of the sink's database whose engine is a MergeTree but not a Replicated one: created by
    single-server mode, they would hold data on this replica only."""
    return [str(row[0]) for row in store.query(UNREPLICATED_TABLES).rows]
