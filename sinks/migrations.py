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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from common.logs import get_logger
from sinks import sample_json
from sinks.clickhouse import ClickHouseStore
from sinks.ddl import LC, TtlDays
from sinks.migration_core import PRICE, ROLLUP_SELECT, m1_core, m2_rollups, m3_costs
from sinks.migration_fragmentation import m8_fragmentation

log = get_logger(__name__)

REBUILT_AS_REPLACING: dict[str, str] = {
    "gpu_samples": "ORDER BY (node, gpu_uuid, ts, agent_boot_id, seq)",
    "gpu_processes": "ORDER BY (node, gpu_uuid, ts, pid)",
}
"""Tables migration 4 rebuilds as ``ReplacingMergeTree`` on their natural key (query prefix first)."""


def _m4_replacing_definition(store: ClickHouseStore, table: str, new_name: str) -> str:
    create = str(store.query(f"SHOW CREATE TABLE {table}").rows[0][0])
    head, _, tail = create.partition("ENGINE = MergeTree")
    if not tail:
        raise ValueError(f"{table} is not a MergeTree table: {create[:200]}")
    clauses = [REBUILT_AS_REPLACING[table] if line.startswith("ORDER BY") else line for line in tail.splitlines()]
    head = head.replace(f"CREATE TABLE {store.query('SELECT currentDatabase()').rows[0][0]}.{table}",
                        f"CREATE TABLE {new_name}", 1)
    return head + "ENGINE = ReplacingMergeTree" + "\n".join(clauses)


def _m4_one_row_per_fact(store: ClickHouseStore, ttl: TtlDays) -> None:
    """Rebuild samples and processes as ReplacingMergeTree; safe to re-run after a crash at any step."""
    engines = dict(store.query("SELECT name, engine FROM system.tables WHERE database = currentDatabase()").rows)
    for table in REBUILT_AS_REPLACING:
        staging = f"{table}_m4"
        store.command(f"DROP TABLE IF EXISTS {staging}")
        if engines.get(table) == "ReplacingMergeTree":
            continue  # exchanged already (a crash came before the old copy was dropped)
        store.command(_m4_replacing_definition(store, table, staging))
        store.command(f"INSERT INTO {staging} SELECT * FROM {table}")
        store.command(f"EXCHANGE TABLES {table} AND {staging}")
        store.command(f"DROP TABLE {staging}")


def _m5_open_alerts_have_no_resolved_at(ttl: TtlDays) -> list[str]:
    """``v_alerts.resolved_at`` is NULL while an alert fires (it was 1970-01-01: maxIf over no row)."""
    return ["""CREATE OR REPLACE VIEW v_alerts AS
SELECT id, any(a.type) AS alert_type, argMax(a.severity, a.at) AS current_severity,
       argMax(a.state, a.at) AS current_state, any(a.started_at) AS first_at,
       if(countIf(a.state = 'resolved') = 0, NULL, maxIf(a.at, a.state = 'resolved')) AS resolved_at,
       max(a.at) AS last_at,
       any(a.subject_kind) AS kind, any(a.subject_namespace) AS namespace,
       any(a.subject_name) AS name, any(a.subject_node) AS node,
       any(a.subject_gpu_uuid) AS gpu_uuid, argMax(a.summary, a.at) AS last_summary,
       argMax(a.details_json, a.at) AS last_details_json
FROM alerts AS a FINAL GROUP BY id"""]


def _m6_advise_windows(ttl: TtlDays) -> list[str]:
    """``v_advise_windows``: the per-pod, per-GPU windows the reclaimable-capacity advisor reads
    (docs/advise.md), with whether the pod computed on any of its GPUs in the window, the window's
    idle class and the GPU-hour price (list price, else the rate the stream jobs charged)."""
    return [f"""CREATE OR REPLACE VIEW v_advise_windows AS
WITH w AS (SELECT * FROM pod_windows FINAL),
a AS (SELECT pod_uid, window_start, max(busy_s) > 0 AS pod_active FROM pod_windows FINAL GROUP BY pod_uid, window_start)
SELECT w.pod_uid AS pod_uid, w.namespace AS namespace, w.pod AS pod, w.team AS team, w.project AS project,
       w.node AS node, w.gpu_uuid AS gpu_uuid, w.gpu_model AS gpu_model, w.window_start AS window_start,
       w.window_end AS window_end, w.allocated_s AS allocated_s, w.busy_s AS busy_s, w.idle_s AS idle_s,
       w.gap_s AS gap_s, w.max_sm_util_pct AS max_sm_util_pct, w.max_mem_used_bytes AS max_mem_used_bytes,
       w.share_fraction AS share_fraction, w.allocated_s * w.share_fraction AS held_gpu_s, w.cost_usd AS cost_usd,
       a.pod_active AS pod_active,
       multiIf(w.busy_s > 0, 'busy', coalesce(w.max_mem_used_bytes, 0) = 0, 'no_process', 'vram_held') AS idle_class,
       coalesce(p.usd_per_gpu_hour,
                w.cost_usd / nullIf(w.allocated_s * w.share_fraction / 3600, 0)) AS usd_per_gpu_hour
FROM w
INNER JOIN a ON a.pod_uid = w.pod_uid AND a.window_start = w.window_start
LEFT JOIN {PRICE} AS p ON p.gpu_model = w.gpu_model"""]


CLUSTER_TABLES: tuple[str, ...] = (
    "gpu_samples", "gpu_processes", "gpu_xids", "pod_states", "node_states", "state_tombstones", "k8s_events",
    "workload_progress", "pod_windows", "cluster_capacity", "pod_lifecycle", "alerts", "rollup_hourly",
    "rollup_daily",
)
"""Tables migration 7 rebuilds with ``cluster`` first in their sorting (deduplication) key. Not
``gpu_prices`` (prices are per GPU model, for every cluster) nor the sink's own bookkeeping."""

CLUSTER_COLUMN = f"`cluster` {LC} DEFAULT 'default'"


def _m7_definition(store: ClickHouseStore, table: str, new_name: str) -> str:
    """``table``'s definition as ``new_name`` with ``cluster`` as first column and first key column.
    (ClickHouse cannot add a column with a default to an existing sorting key: hence a rebuild.)"""
    create = str(store.query(f"SHOW CREATE TABLE {table}").rows[0][0])
    database = store.query("SELECT currentDatabase()").rows[0][0]
    head, paren, body = create.partition("(\n")
    if not paren:
        raise ValueError(f"unexpected definition of {table}: {create[:200]}")
    head = head.replace(f"CREATE TABLE {database}.{table}", f"CREATE TABLE {new_name}", 1)
    lines = []
    for line in body.splitlines():
        for clause in ("ORDER BY ", "PRIMARY KEY "):
            if line.startswith(clause):
                key = line.removeprefix(clause).strip()
                key = key[1:-1] if key.startswith("(") and key.endswith(")") else key
                line = f"{clause}(cluster, {key})"
        lines.append(line)
    return f"{head}(\n    {CLUSTER_COLUMN},\n" + "\n".join(lines)


def _m7_cluster(store: ClickHouseStore, ttl: TtlDays) -> None:
    """Rebuild every fact table with ``cluster`` (existing rows: ``default``) first in its sorting
    key, then the rollup views and every view with it; safe to re-run after a crash at any step."""
    for view in ("rollup_hourly_mv", "rollup_daily_mv"):
        store.command(f"DROP VIEW IF EXISTS {view}")
    for table in CLUSTER_TABLES:
        staging = f"{table}_m7"
        store.command(f"DROP TABLE IF EXISTS {staging}")
        columns = [str(row[0]) for row in store.query(f"DESCRIBE TABLE {table}").rows]
        if "cluster" in columns:
            continue  # exchanged already (a crash came before the old copy was dropped)
        store.command(_m7_definition(store, table, staging))
        names = ", ".join(f"`{name}`" for name in columns)
        store.command(f"INSERT INTO {staging} ({names}) SELECT {names} FROM {table}")
        store.command(f"EXCHANGE TABLES {table} AND {staging}")
        store.command(f"DROP TABLE {staging}")
    for statement in _m7_views():
        store.command(statement)


_ROLLUP_SELECT_C = ROLLUP_SELECT.replace("    namespace, team,", "    cluster, namespace, team,", 1)


def _m7_views() -> list[str]:
    """Every view, per cluster: grouped and joined on ``cluster`` as well as their natural keys."""
    return [
        f"""CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_hourly_mv TO rollup_hourly AS
SELECT toStartOfHour(window_start) AS hour,
{_ROLLUP_SELECT_C}
GROUP BY hour, cluster, namespace, team, project, node, gpu_model""",
        f"""CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_daily_mv TO rollup_daily AS
SELECT toDate(window_start) AS day,
{_ROLLUP_SELECT_C}
GROUP BY day, cluster, namespace, team, project, node, gpu_model""",
        f"""CREATE OR REPLACE VIEW v_cost_daily AS
SELECT r.day AS day, r.cluster AS cluster, r.namespace AS namespace, r.team AS team, r.project AS project,
       r.node AS node, r.gpu_model AS gpu_model,
       r.allocated_gpu_hours AS allocated_gpu_hours, r.busy_gpu_hours AS busy_gpu_hours,
       r.idle_gpu_hours AS idle_gpu_hours, r.energy_kwh AS energy_kwh,
       r.cost_usd AS window_cost_usd,
       coalesce(p.usd_per_gpu_hour, 0) AS usd_per_gpu_hour,
       r.allocated_gpu_hours * coalesce(p.usd_per_gpu_hour, 0) AS list_cost_usd,
       r.idle_gpu_hours * coalesce(p.usd_per_gpu_hour, 0) AS idle_cost_usd
FROM (
    SELECT day, cluster, namespace, team, project, node, gpu_model,
           sum(allocated_gpu_hours) AS allocated_gpu_hours, sum(busy_gpu_hours) AS busy_gpu_hours,
           sum(idle_gpu_hours) AS idle_gpu_hours, sum(energy_kwh) AS energy_kwh, sum(cost_usd) AS cost_usd
    FROM rollup_daily GROUP BY day, cluster, namespace, team, project, node, gpu_model
) AS r
LEFT JOIN {PRICE} AS p ON p.gpu_model = r.gpu_model""",
        """CREATE OR REPLACE VIEW v_cost_by_team AS
SELECT cluster, team, sum(allocated_gpu_hours) AS gpu_hours, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(window_cost_usd) AS cost_usd, sum(list_cost_usd) AS list_cost_usd, sum(idle_cost_usd) AS idle_cost_usd
FROM v_cost_daily GROUP BY cluster, team""",
        """CREATE OR REPLACE VIEW v_cost_by_project AS
SELECT cluster, team, project, sum(allocated_gpu_hours) AS gpu_hours, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(window_cost_usd) AS cost_usd, sum(list_cost_usd) AS list_cost_usd, sum(idle_cost_usd) AS idle_cost_usd
FROM v_cost_daily GROUP BY cluster, team, project""",
        """CREATE OR REPLACE VIEW v_idle_cost AS
SELECT day, cluster, team, project, namespace, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(idle_cost_usd) AS idle_cost_usd
FROM v_cost_daily GROUP BY day, cluster, team, project, namespace""",
        f"""CREATE OR REPLACE VIEW v_shared_gpu_cost AS
WITH w AS (SELECT * FROM pod_windows FINAL),
g AS (
    SELECT cluster, gpu_uuid, window_start, count() AS pods_on_gpu, sum(busy_s) AS gpu_busy_s,
           max(allocated_s) AS gpu_window_s, max(share_fraction < 1) AS any_shared
    FROM w GROUP BY cluster, gpu_uuid, window_start
)
SELECT w.cluster AS cluster, w.namespace AS namespace, w.team AS team, w.project AS project, w.pod AS pod,
       w.pod_uid AS pod_uid,
       sum(w.allocated_s * w.share_fraction) / 3600 AS requested_gpu_hours,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600 AS usage_gpu_hours,
       sum(w.allocated_s * w.share_fraction) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS request_based_cost_usd,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600
           * any(coalesce(p.usd_per_gpu_hour, 0)) AS usage_based_cost_usd
FROM w
INNER JOIN g ON g.cluster = w.cluster AND g.gpu_uuid = w.gpu_uuid AND g.window_start = w.window_start
LEFT JOIN {PRICE} AS p ON p.gpu_model = w.gpu_model
WHERE g.pods_on_gpu > 1 OR g.any_shared
GROUP BY cluster, namespace, team, project, pod, pod_uid""",
        f"""CREATE OR REPLACE VIEW v_cost_per_unit AS
WITH c AS (
    SELECT cluster, pod_uid, any(namespace) AS namespace, any(pod) AS pod, any(team) AS team,
           any(project) AS project,
           sum(allocated_s) / 3600 AS gpu_hours, sum(cost_usd) AS cost_usd,
           sum(allocated_s) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
           sum(steps) AS window_steps, sum(tokens) AS window_tokens
    FROM (SELECT * FROM pod_windows FINAL) AS w
    LEFT JOIN {PRICE} AS p ON p.gpu_model = w.gpu_model
    GROUP BY cluster, pod_uid
),
u AS (
    SELECT cluster, pod_uid, max(steps_total) - min(steps_total) AS steps,
           max(tokens_total) - min(tokens_total) AS tokens, max(samples_total) - min(samples_total) AS samples
    FROM workload_progress FINAL GROUP BY cluster, pod_uid
)
SELECT c.cluster AS cluster, c.namespace AS namespace, c.pod AS pod, c.pod_uid AS pod_uid, c.team AS team,
       c.project AS project,
       c.gpu_hours AS gpu_hours, greatest(c.cost_usd, c.list_cost_usd) AS cost_usd,
       coalesce(nullIf(u.steps, 0), nullIf(c.window_steps, 0)) AS steps,
       coalesce(nullIf(u.tokens, 0), nullIf(c.window_tokens, 0)) AS tokens,
       greatest(c.cost_usd, c.list_cost_usd) / steps AS cost_per_step_usd,
       greatest(c.cost_usd, c.list_cost_usd) / tokens * 1000 AS cost_per_1k_tokens_usd
FROM c LEFT JOIN u ON u.cluster = c.cluster AND u.pod_uid = c.pod_uid
WHERE steps > 0 OR tokens > 0""",
        """CREATE OR REPLACE VIEW v_pods AS
SELECT * FROM pod_states FINAL
WHERE (cluster, uid) NOT IN (SELECT cluster, key FROM state_tombstones WHERE topic = 'k8s.pods.v1')""",
        """CREATE OR REPLACE VIEW v_alerts AS
SELECT id, any(a.cluster) AS cluster, any(a.type) AS alert_type, argMax(a.severity, a.at) AS current_severity,
       argMax(a.state, a.at) AS current_state, any(a.started_at) AS first_at,
       if(countIf(a.state = 'resolved') = 0, NULL, maxIf(a.at, a.state = 'resolved')) AS resolved_at,
       max(a.at) AS last_at,
       any(a.subject_kind) AS kind, any(a.subject_namespace) AS namespace,
       any(a.subject_name) AS name, any(a.subject_node) AS node,
       any(a.subject_gpu_uuid) AS gpu_uuid, argMax(a.summary, a.at) AS last_summary,
       argMax(a.details_json, a.at) AS last_details_json
FROM alerts AS a FINAL GROUP BY id""",
        f"""CREATE OR REPLACE VIEW v_advise_windows AS
WITH w AS (SELECT * FROM pod_windows FINAL),
a AS (SELECT cluster, pod_uid, window_start, max(busy_s) > 0 AS pod_active FROM pod_windows FINAL
      GROUP BY cluster, pod_uid, window_start)
SELECT w.cluster AS cluster, w.pod_uid AS pod_uid, w.namespace AS namespace, w.pod AS pod, w.team AS team,
       w.project AS project,
       w.node AS node, w.gpu_uuid AS gpu_uuid, w.gpu_model AS gpu_model, w.window_start AS window_start,
       w.window_end AS window_end, w.allocated_s AS allocated_s, w.busy_s AS busy_s, w.idle_s AS idle_s,
       w.gap_s AS gap_s, w.max_sm_util_pct AS max_sm_util_pct, w.max_mem_used_bytes AS max_mem_used_bytes,
       w.share_fraction AS share_fraction, w.allocated_s * w.share_fraction AS held_gpu_s, w.cost_usd AS cost_usd,
       a.pod_active AS pod_active,
       multiIf(w.busy_s > 0, 'busy', coalesce(w.max_mem_used_bytes, 0) = 0, 'no_process', 'vram_held') AS idle_class,
       coalesce(p.usd_per_gpu_hour,
                w.cost_usd / nullIf(w.allocated_s * w.share_fraction / 3600, 0)) AS usd_per_gpu_hour
FROM w
INNER JOIN a ON a.cluster = w.cluster AND a.pod_uid = w.pod_uid AND a.window_start = w.window_start
LEFT JOIN {PRICE} AS p ON p.gpu_model = w.gpu_model""",
    ]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: Callable[[TtlDays], list[str]]
    apply: Callable[[ClickHouseStore, TtlDays], None] | None = None
    """Steps that need to look at the store first (run after ``statements``)."""


def _m9_allocator(ttl: TtlDays) -> list[str]:
    """The pods' caching-allocator figures (workload.allocator.v1 through the stream jobs) in their
    windows and lifecycle records. Added columns only (no rebuild): rows from before read NULL, as
    do pods that report no allocator statistics. Independent of migration 8 (another change), so
    the two apply in either order."""
    return [
        "ALTER TABLE pod_windows ADD COLUMN IF NOT EXISTS alloc_reserved_bytes Nullable(UInt64), "
        "ADD COLUMN IF NOT EXISTS alloc_allocated_bytes Nullable(UInt64), "
        "ADD COLUMN IF NOT EXISTS max_reserved_unused_bytes Nullable(UInt64), "
        "ADD COLUMN IF NOT EXISTS alloc_retries Nullable(UInt64), "
        "ADD COLUMN IF NOT EXISTS alloc_ooms Nullable(UInt64)",
        "ALTER TABLE pod_lifecycle ADD COLUMN IF NOT EXISTS max_reserved_unused_bytes Nullable(UInt64), "
        "ADD COLUMN IF NOT EXISTS alloc_retries Nullable(UInt64), "
        "ADD COLUMN IF NOT EXISTS alloc_ooms Nullable(UInt64)",
    ]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "core tables", m1_core),
    Migration(2, "hourly and daily rollups", m2_rollups),
    Migration(3, "prices and cost views", m3_costs),
    Migration(4, "one row per fact: samples and processes deduplicate on their natural key",
              lambda ttl: [], _m4_one_row_per_fact),
    Migration(5, "v_alerts: no resolved_at while firing", _m5_open_alerts_have_no_resolved_at),
    Migration(6, "v_advise_windows: the advisor's per-pod GPU windows", _m6_advise_windows),
    Migration(7, "cluster: a column of every table, first in every sorting key, in every view",
              lambda ttl: [], _m7_cluster),
    Migration(8, "fragmentation: MIG and shared-VRAM capacity figures, mig_gpu_windows, shared_gpu_windows",
              m8_fragmentation),
    Migration(9, "allocator figures (reserved but unused, retries, OOMs) in pod windows and lifecycle",
              _m9_allocator),
    Migration(10, "gpu_samples_json: GPU samples unpacked into rows by the engine", lambda ttl: sample_json.ddl()),
    Migration(11, "gpu_samples_json: no check view, the schemas bound what the columns cannot hold",
              lambda ttl: sample_json.ddl_without_the_check()),
    Migration(12, "sink_batches: the group a journalled range was stored in",
              lambda ttl: ["ALTER TABLE sink_batches ADD COLUMN IF NOT EXISTS batch_group String DEFAULT ''"]),
)

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
}


def applied_versions(store: ClickHouseStore) -> set[int]:
    store.command(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version UInt32, name String, "
        "applied_at DateTime64(3, 'UTC')) ENGINE = ReplacingMergeTree ORDER BY version"
    )
    return {int(str(row[0])) for row in store.query("SELECT version FROM schema_migrations").rows}


def migrate(store: ClickHouseStore, ttl: TtlDays | None = None) -> list[int]:
    """Apply every missing migration in order; returns the versions applied now (idempotent)."""
    ttl = ttl or TtlDays()
    done = applied_versions(store)
    applied: list[int] = []
    for migration in MIGRATIONS:
        if migration.version in done:
            continue
        for statement in migration.statements(ttl):
            store.command(statement)
        if migration.apply is not None:
            migration.apply(store, ttl)
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        name = migration.name.replace("'", "")
        store.command(
            f"INSERT INTO schema_migrations (version, name, applied_at) "
            f"VALUES ({migration.version}, '{name}', '{now}')"
        )
        log.info("migration applied", version=migration.version, name=migration.name)
        applied.append(migration.version)
    apply_ttls(store, ttl)
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
