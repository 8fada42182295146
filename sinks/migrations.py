"""The ClickHouse schema as versioned migrations, applied idempotently when the sink starts.

Why migrations and not "CREATE IF NOT EXISTS" alone: a deployed ClickHouse outlives sink versions.
Each migration has a number; ``schema_migrations`` records which ones ran, so a new sink applies
only what is missing, and every statement is itself idempotent (``IF NOT EXISTS``) so a crash in
the middle of a migration is repaired by simply starting again.

Design of the tables (the cookbook in docs/sql.md shows the queries they serve):

- Time series columns use codecs chosen for them: ``DoubleDelta`` for regularly spaced
  timestamps, ``Delta``/``T64`` for counters and integers, ``Gorilla`` for float gauges, then
  ``ZSTD``. Names and labels are ``LowCardinality``. Raw data is partitioned by day.
- Every fact table is a ``ReplacingMergeTree`` whose sorting key holds the fact's natural key
  (samples: node, GPU, time, agent boot id, seq; processes: node, GPU, time, pid; windows,
  capacity, lifecycle, alerts: their deterministic ids), so a record delivered twice at two offsets
  (producer retry, worker replay) is one row after merges and under ``FINAL`` — which the report and
  the documented queries apply. Changing states (pods, nodes, alerts) keep their newest version.
  Migration 4 rebuilt the samples and processes tables (``MergeTree`` in migration 1).
- Every table carries ``kafka_partition``/``kafka_offset`` (where the row came from) and has
  ``non_replicated_deduplication_window`` set, so an insert retried with the same
  ``insert_deduplication_token`` (topic, partition, first and last offset) is dropped by the
  engine — on chDB as on a server.
- Rollups are materialized views over ``pod_windows`` into ``AggregatingMergeTree`` tables;
  dependent views deduplicate retried blocks too.
- TTLs come from settings and are re-applied at start when they change.
- Several clusters share one store: migration 7 put ``cluster`` (rows from before it: ``default``)
  first in every table's sorting key, since node names and pod uids repeat across clusters, and
  into every view's grouping and joins. It rebuilds each table once (``INSERT ... SELECT``, as
  migration 4 did): ClickHouse cannot add a column with a default to an existing sorting key.

Applied migrations are frozen: their SQL is committed text (:mod:`sinks.migration_core`,
:mod:`sinks.migration_rebuilds`, :mod:`sinks.migration_additions`) that tests/sinks/test_migrations_frozen.py
pins, so a change to the code never changes what an old migration does. A new migration derives its
DDL from the column spec (:mod:`sinks.tables`: ``Table.add_columns``, ``Table.create``; the engine
path's :func:`sinks.sample_json.ddl_update`) and is pinned in its turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from common.logs import get_logger
from sinks import migration_additions as additions
from sinks import migration_core as core
from sinks import migration_rebuilds as rebuilds
from sinks import rollups, tables
from sinks.clickhouse import ClickHouseStore
from sinks.cluster import ClusterStore
from sinks.ddl import TtlDays
from sinks.migration_lock import ClaimTiming, MigrationLock, timing_for

log = get_logger(__name__)


def render(statements: tuple[str, ...], ttl: TtlDays) -> list[str]:
    """Committed statements with the configured TTLs in place of their ``{raw_ttl_days}``,
    ``{state_ttl_days}`` and ``{rollup_ttl_days}``."""
    return [statement.replace("{raw_ttl_days}", str(ttl.raw)).replace("{state_ttl_days}", str(ttl.state))
            .replace("{rollup_ttl_days}", str(ttl.rollup)) for statement in statements]


def committed(statements: tuple[str, ...]) -> Callable[[TtlDays], list[str]]:
    return lambda ttl: render(statements, ttl)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: Callable[[TtlDays], list[str]]
    apply: Callable[[ClickHouseStore, TtlDays], None] | None = None
    """Steps that need to look at the store first (run after ``statements``)."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "core tables", committed(core.M1_CORE)),
    Migration(2, "hourly and daily rollups", committed(core.M2_ROLLUPS)),
    Migration(3, "prices and cost views", committed(core.M3_COSTS)),
    Migration(4, "one row per fact: samples and processes deduplicate on their natural key",
              committed(()), rebuilds.m4_one_row_per_fact),
    Migration(5, "v_alerts: no resolved_at while firing", committed(rebuilds.M5_ALERTS_RESOLVED_AT)),
    Migration(6, "v_advise_windows: the advisor's per-pod GPU windows", committed(rebuilds.M6_ADVISE_WINDOWS)),
    Migration(7, "cluster: a column of every table, first in every sorting key, in every view",
              committed(()), rebuilds.m7_cluster),
    Migration(8, "fragmentation: MIG and shared-VRAM capacity figures, mig_gpu_windows, shared_gpu_windows",
              committed(additions.M8_FRAGMENTATION)),
    Migration(9, "allocator figures (reserved but unused, retries, OOMs) in pod windows and lifecycle",
              committed(additions.M9_ALLOCATOR)),
    Migration(10, "gpu_samples_json: GPU samples unpacked into rows by the engine",
              committed(additions.M10_SAMPLE_JSON)),
    Migration(11, "gpu_samples_json: no check view, the schemas bound what the columns cannot hold",
              committed(additions.M11_SAMPLE_JSON_UNCHECKED)),
    Migration(12, "sink_batches: the group a journalled range was stored in", committed(additions.M12_BATCH_GROUP)),
    Migration(13, "gpu_hourly: GPU samples per GPU and hour, back-filled, then fed by a view",
              committed(rollups.GPU_HOURLY.migration())),
    Migration(14, "team_hourly, team_daily: pod windows per team and idle class, back-filled, then fed by views",
              committed((*rollups.TEAM_HOURLY.migration(), *rollups.TEAM_DAILY.migration()))),
    Migration(15, "pod_hourly, pod_daily, progress_daily: pod windows per pod and GPU, progress per pod, "
                  "back-filled, then fed by views; v_cost_per_unit reads them",
              committed((*rollups.POD_HOURLY.migration(), *rollups.POD_DAILY.migration(),
                         *rollups.PROGRESS_DAILY.migration(), rollups.COST_PER_UNIT_VIEW))),
    Migration(16, "gpu_tenancy_daily: the first and last window and least share of each pod per GPU and day, "
                  "back-filled, then fed by a view; v_shared_gpu_cost reads the windows it may share",
              committed((*rollups.GPU_TENANCY_DAILY.migration(), *additions.M16_SHARED_GPU_COST))),
    Migration(17, "pod_windows: the stamps of the pod's and the GPU's windows of the same start; pod_active_hourly, "
                  "shared_gpu_daily: a pod's active windows and its windows on shared GPUs, back-filled, then fed "
                  "by views; v_shared_gpu_cost reads shared_gpu_daily, and gpu_tenancy_daily goes",
              committed((tables.POD_WINDOWS.add_columns("pod_busy_s", "gpu_pods", "gpu_busy_s", "gpu_allocated_s"),
                         *rollups.POD_ACTIVE_HOURLY.migration(), *rollups.SHARED_GPU_DAILY.migration(),
                         rollups.SHARED_GPU_COST_VIEW, "DROP VIEW IF EXISTS gpu_tenancy_daily_mv",
                         "DROP TABLE IF EXISTS gpu_tenancy_daily"))),
    Migration(18, "gpu_daily, pod_active_daily: GPU samples per GPU and day, a pod's active windows per GPU and "
                  "day, back-filled from their hourly rollups, then fed by views",
              committed((*rollups.GPU_DAILY.migration(), *rollups.POD_ACTIVE_DAILY.migration()))),
)
"""Every migration in order. A new one: ``Migration(17, "what it adds", lambda ttl: [...])`` with
statements from the spec (``tables.GPU_SAMPLES.add_columns("name")``, ``sample_json.ddl_update()``),
then its hash pinned in tests/sinks/test_migrations_frozen.py."""

# table -> (TTL column expression, which TTL) for re-applying configured TTLs: the DateTime64
# columns themselves, whose sums with an interval do not wrap (a table created with
# ``toDateTime(column)``, whose sums wrap past 2106 to the 1970s, is brought to this form at start)
TTL_TABLES: dict[str, tuple[str, str]] = {
    "gpu_samples": ("ts", "raw"),
    "gpu_processes": ("ts", "raw"),
    "gpu_xids": ("at", "state"),
    "pod_states": ("created_at", "state"),
    "state_tombstones": ("at", "state"),
    "k8s_events": ("ts", "state"),
    "workload_progress": ("ts", "state"),
    "pod_windows": ("window_start", "state"),
    "cluster_capacity": ("window_start", "state"),
    "mig_gpu_windows": ("window_start", "state"),
    "shared_gpu_windows": ("window_start", "state"),
    "pod_lifecycle": ("created_at", "state"),
    "alerts": ("started_at", "state"),
    "rollup_hourly": ("hour", "rollup"),
    "rollup_daily": ("day", "rollup"),
    **{rollup.table.name: (rollup.period, "rollup") for rollup in rollups.ROLLUPS},
}


CREATE_SCHEMA_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (version UInt32, name String, "
    "applied_at DateTime64(3, 'UTC')) ENGINE = ReplacingMergeTree ORDER BY version"
)


def applied_versions(store: ClickHouseStore, settings: dict[str, Any] | None = None) -> set[int]:
    rows = store.query("SELECT version FROM schema_migrations", settings=settings).rows
    return {int(str(row[0])) for row in rows}


def migrate(store: ClickHouseStore, ttl: TtlDays | None = None, cluster: str = "",
            timing: ClaimTiming | None = None) -> list[int]:
    """Apply every missing migration in order; returns the versions applied now (idempotent).
    ``cluster``: run every statement on each replica of that ClickHouse cluster, with replicated
    engines (:mod:`sinks.cluster`); empty: one server.

    One sink migrates at a time (:mod:`sinks.migration_lock`): a sink that finds a migration missing
    claims the lock and either migrates or waits until the holder has applied every migration (then
    returns ``[]``). A sink with nothing to migrate takes no lock and does not wait. ``timing``: the
    lock's settle time, expiry and polling (default: :func:`sinks.migration_lock.timing_for`)."""
    ttl = ttl or TtlDays()
    lock = MigrationLock(store if not cluster else ClusterStore(store, cluster), timing or timing_for(store),
                         replicated=bool(cluster))
    store = lock.store
    lock.create_table()
    store.command(CREATE_SCHEMA_MIGRATIONS)

    def pending() -> bool:
        done = applied_versions(store, lock.read_settings)
        return any(migration.version not in done for migration in MIGRATIONS)

    applied: list[int] = []
    if pending():
        applied = lock.run_exclusively(pending, lambda renew: _apply_missing(store, ttl, lock, renew), [])
    apply_ttls(store, ttl)
    return applied


def _apply_missing(store: ClickHouseStore, ttl: TtlDays, lock: MigrationLock, renew: Callable[[], None]) -> list[int]:
    """Every missing migration, by the sink holding the lock (``renew``: called between statements)."""
    done = applied_versions(store, lock.read_settings)
    applied: list[int] = []
    for migration in MIGRATIONS:
        if migration.version in done:
            continue
        for statement in migration.statements(ttl):
            renew()
            store.command(statement)
        if migration.apply is not None:
            renew()
            migration.apply(store, ttl)
        renew()
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        name = migration.name.replace("'", "")
        store.command(
            f"INSERT INTO schema_migrations (version, name, applied_at) "
            f"VALUES ({migration.version}, '{name}', '{now}')", lock.insert_settings
        )
        log.info("migration applied", version=migration.version, name=migration.name)
        applied.append(migration.version)
    return applied


def apply_ttls(store: ClickHouseStore, ttl: TtlDays) -> list[str]:
    """Bring every table's TTL to the configured number of days; returns the tables changed."""
    rows = store.query(
        "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()"
    ).rows
    engines = {str(r[0]): str(r[1]) for r in rows}
    changed = []
    for table, (expr, kind) in TTL_TABLES.items():
        days = getattr(ttl, kind)
        if table in engines and f"TTL {expr} + toIntervalDay({days})" not in engines[table]:
            store.command(
                f"ALTER TABLE {table} MODIFY TTL {expr} + INTERVAL {days} DAY "
                "SETTINGS materialize_ttl_after_modify = 0"
            )
            changed.append(table)
    if changed:
        log.info("ttl changed", tables=changed, ttl_days=vars(ttl))
    return changed
