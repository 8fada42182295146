"""Migrations 4-7 of the sink's schema, frozen: the rebuilds that look at the store first (4: samples
and processes as ``ReplacingMergeTree`` on their natural key; 7: ``cluster`` first in every table's
sorting key) and the views of 5, 6 and 7 as committed SQL.

Why frozen: a migration runs on stores created long after it was written, and must do there exactly
what it did on the first one, so nothing here is built from code that later changes.
tests/sinks/test_migrations_frozen.py pins the text of this module and of every migration's
statements: never edit one, add a migration.
"""

from __future__ import annotations

from sinks.clickhouse import ClickHouseStore
from sinks.ddl import TtlDays

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


def m4_one_row_per_fact(store: ClickHouseStore, ttl: TtlDays) -> None:
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


CLUSTER_TABLES: tuple[str, ...] = (
    "gpu_samples", "gpu_processes", "gpu_xids", "pod_states", "node_states", "state_tombstones", "k8s_events",
    "workload_progress", "pod_windows", "cluster_capacity", "pod_lifecycle", "alerts", "rollup_hourly",
    "rollup_daily",
)
"""Tables migration 7 rebuilds with ``cluster`` first in their sorting (deduplication) key. Not
``gpu_prices`` (prices are per GPU model, for every cluster) nor the sink's own bookkeeping."""

CLUSTER_COLUMN = "`cluster` LowCardinality(String) DEFAULT 'default'"


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


def m7_cluster(store: ClickHouseStore, ttl: TtlDays) -> None:
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
    for statement in M7_VIEWS:
        store.command(statement)


M5_ALERTS_RESOLVED_AT: tuple[str, ...] = (
    """CREATE OR REPLACE VIEW v_alerts AS
SELECT id, any(a.type) AS alert_type, argMax(a.severity, a.at) AS current_severity,
       argMax(a.state, a.at) AS current_state, any(a.started_at) AS first_at,
       if(countIf(a.state = 'resolved') = 0, NULL, maxIf(a.at, a.state = 'resolved')) AS resolved_at,
       max(a.at) AS last_at,
       any(a.subject_kind) AS kind, any(a.subject_namespace) AS namespace,
       any(a.subject_name) AS name, any(a.subject_node) AS node,
       any(a.subject_gpu_uuid) AS gpu_uuid, argMax(a.summary, a.at) AS last_summary,
       argMax(a.details_json, a.at) AS last_details_json
FROM alerts AS a FINAL GROUP BY id""",
)
"""Migration 5: v_alerts: no resolved_at while firing."""


M6_ADVISE_WINDOWS: tuple[str, ...] = (
    """CREATE OR REPLACE VIEW v_advise_windows AS
WITH w AS (SELECT * FROM pod_windows FINAL),
a AS (SELECT pod_uid, window_start, max(busy_s) > 0 AS pod_active FROM pod_windows FINAL GROUP BY pod_uid, \
window_start)
SELECT w.pod_uid AS pod_uid, w.namespace AS namespace, w.pod AS pod, w.team AS team, w.project AS project,
       w.node AS node, w.gpu_uuid AS gpu_uuid, w.gpu_model AS gpu_model, w.window_start AS window_start,
       w.window_end AS window_end, w.allocated_s AS allocated_s, w.busy_s AS busy_s, w.idle_s AS idle_s,
       w.gap_s AS gap_s, w.max_sm_util_pct AS max_sm_util_pct, w.max_mem_used_bytes AS max_mem_used_bytes,
       w.share_fraction AS share_fraction, w.allocated_s * w.share_fraction AS held_gpu_s, w.cost_usd AS \
cost_usd,
       a.pod_active AS pod_active,
       multiIf(w.busy_s > 0, 'busy', coalesce(w.max_mem_used_bytes, 0) = 0, 'no_process', 'vram_held') AS \
idle_class,
       coalesce(p.usd_per_gpu_hour,
                w.cost_usd / nullIf(w.allocated_s * w.share_fraction / 3600, 0)) AS usd_per_gpu_hour
FROM w
INNER JOIN a ON a.pod_uid = w.pod_uid AND a.window_start = w.window_start
LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices GROUP \
BY gpu_model) AS p ON p.gpu_model = w.gpu_model""",
)
"""Migration 6: v_advise_windows: the advisor's per-pod GPU windows."""


M7_VIEWS: tuple[str, ...] = (
    """CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_hourly_mv TO rollup_hourly AS
SELECT toStartOfHour(window_start) AS hour,
    cluster, namespace, team, project, node, gpu_model,
    sum(allocated_s) / 3600 AS allocated_gpu_hours,
    sum(busy_s) / 3600 AS busy_gpu_hours,
    sum(idle_s) / 3600 AS idle_gpu_hours,
    sum(gap_s) / 3600 AS gap_gpu_hours,
    sumIf(coalesce(avg_sm_util_pct, 0) * allocated_s, avg_sm_util_pct IS NOT NULL) / 3600 AS util_pct_x_hours,
    sumIf(allocated_s, avg_sm_util_pct IS NOT NULL) / 3600 AS util_hours,
    max(coalesce(max_mem_used_bytes, 0)) AS peak_mem_bytes,
    sum(coalesce(energy_j, 0)) / 3600000 AS energy_kwh,
    sum(cost_usd) AS cost_usd,
    count() AS windows
FROM pod_windows
GROUP BY hour, cluster, namespace, team, project, node, gpu_model""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_daily_mv TO rollup_daily AS
SELECT toDate(window_start) AS day,
    cluster, namespace, team, project, node, gpu_model,
    sum(allocated_s) / 3600 AS allocated_gpu_hours,
    sum(busy_s) / 3600 AS busy_gpu_hours,
    sum(idle_s) / 3600 AS idle_gpu_hours,
    sum(gap_s) / 3600 AS gap_gpu_hours,
    sumIf(coalesce(avg_sm_util_pct, 0) * allocated_s, avg_sm_util_pct IS NOT NULL) / 3600 AS util_pct_x_hours,
    sumIf(allocated_s, avg_sm_util_pct IS NOT NULL) / 3600 AS util_hours,
    max(coalesce(max_mem_used_bytes, 0)) AS peak_mem_bytes,
    sum(coalesce(energy_j, 0)) / 3600000 AS energy_kwh,
    sum(cost_usd) AS cost_usd,
    count() AS windows
FROM pod_windows
GROUP BY day, cluster, namespace, team, project, node, gpu_model""",
    """CREATE OR REPLACE VIEW v_cost_daily AS
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
LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices GROUP \
BY gpu_model) AS p ON p.gpu_model = r.gpu_model""",
    """CREATE OR REPLACE VIEW v_cost_by_team AS
SELECT cluster, team, sum(allocated_gpu_hours) AS gpu_hours, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(window_cost_usd) AS cost_usd, sum(list_cost_usd) AS list_cost_usd, sum(idle_cost_usd) AS \
idle_cost_usd
FROM v_cost_daily GROUP BY cluster, team""",
    """CREATE OR REPLACE VIEW v_cost_by_project AS
SELECT cluster, team, project, sum(allocated_gpu_hours) AS gpu_hours, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(window_cost_usd) AS cost_usd, sum(list_cost_usd) AS list_cost_usd, sum(idle_cost_usd) AS \
idle_cost_usd
FROM v_cost_daily GROUP BY cluster, team, project""",
    """CREATE OR REPLACE VIEW v_idle_cost AS
SELECT day, cluster, team, project, namespace, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(idle_cost_usd) AS idle_cost_usd
FROM v_cost_daily GROUP BY day, cluster, team, project, namespace""",
    """CREATE OR REPLACE VIEW v_shared_gpu_cost AS
WITH w AS (SELECT * FROM pod_windows FINAL),
g AS (
    SELECT cluster, gpu_uuid, window_start, count() AS pods_on_gpu, sum(busy_s) AS gpu_busy_s,
           max(allocated_s) AS gpu_window_s, max(share_fraction < 1) AS any_shared
    FROM w GROUP BY cluster, gpu_uuid, window_start
)
SELECT w.cluster AS cluster, w.namespace AS namespace, w.team AS team, w.project AS project, w.pod AS pod,
       w.pod_uid AS pod_uid,
       sum(w.allocated_s * w.share_fraction) / 3600 AS requested_gpu_hours,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600 AS \
usage_gpu_hours,
       sum(w.allocated_s * w.share_fraction) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS \
request_based_cost_usd,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600
           * any(coalesce(p.usd_per_gpu_hour, 0)) AS usage_based_cost_usd
FROM w
INNER JOIN g ON g.cluster = w.cluster AND g.gpu_uuid = w.gpu_uuid AND g.window_start = w.window_start
LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices GROUP \
BY gpu_model) AS p ON p.gpu_model = w.gpu_model
WHERE g.pods_on_gpu > 1 OR g.any_shared
GROUP BY cluster, namespace, team, project, pod, pod_uid""",
    """CREATE OR REPLACE VIEW v_cost_per_unit AS
WITH c AS (
    SELECT cluster, pod_uid, any(namespace) AS namespace, any(pod) AS pod, any(team) AS team,
           any(project) AS project,
           sum(allocated_s) / 3600 AS gpu_hours, sum(cost_usd) AS cost_usd,
           sum(allocated_s) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
           sum(steps) AS window_steps, sum(tokens) AS window_tokens
    FROM (SELECT * FROM pod_windows FINAL) AS w
    LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices \
GROUP BY gpu_model) AS p ON p.gpu_model = w.gpu_model
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
    """CREATE OR REPLACE VIEW v_advise_windows AS
WITH w AS (SELECT * FROM pod_windows FINAL),
a AS (SELECT cluster, pod_uid, window_start, max(busy_s) > 0 AS pod_active FROM pod_windows FINAL
      GROUP BY cluster, pod_uid, window_start)
SELECT w.cluster AS cluster, w.pod_uid AS pod_uid, w.namespace AS namespace, w.pod AS pod, w.team AS team,
       w.project AS project,
       w.node AS node, w.gpu_uuid AS gpu_uuid, w.gpu_model AS gpu_model, w.window_start AS window_start,
       w.window_end AS window_end, w.allocated_s AS allocated_s, w.busy_s AS busy_s, w.idle_s AS idle_s,
       w.gap_s AS gap_s, w.max_sm_util_pct AS max_sm_util_pct, w.max_mem_used_bytes AS max_mem_used_bytes,
       w.share_fraction AS share_fraction, w.allocated_s * w.share_fraction AS held_gpu_s, w.cost_usd AS \
cost_usd,
       a.pod_active AS pod_active,
       multiIf(w.busy_s > 0, 'busy', coalesce(w.max_mem_used_bytes, 0) = 0, 'no_process', 'vram_held') AS \
idle_class,
       coalesce(p.usd_per_gpu_hour,
                w.cost_usd / nullIf(w.allocated_s * w.share_fraction / 3600, 0)) AS usd_per_gpu_hour
FROM w
INNER JOIN a ON a.cluster = w.cluster AND a.pod_uid = w.pod_uid AND a.window_start = w.window_start
LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices GROUP \
BY gpu_model) AS p ON p.gpu_model = w.gpu_model""",
)
"""Migration 7's views (after the rebuilds): per cluster."""
