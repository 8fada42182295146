"""Migrations 1-3 of the sink's schema as committed SQL: the core tables, the rollups over pod
windows, the cost views.

Why literal text: a migration runs on stores created long after it was written, and must do there
exactly what it did on the first one. Nothing here is built from code that later changes (the
column spec :mod:`sinks.tables`, the DDL building blocks of :mod:`sinks.ddl`), and
tests/sinks/test_migrations_frozen.py pins every applied migration's text: never edit one, add a
migration. ``{raw_ttl_days}``, ``{state_ttl_days}`` and ``{rollup_ttl_days}`` are the configured
TTLs (:func:`sinks.migrations.render`).
"""

from __future__ import annotations

M1_CORE: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS gpu_samples (
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    node LowCardinality(String),
    gpu_uuid LowCardinality(String),
    gpu_index UInt16 CODEC(T64, ZSTD(1)),
    gpu_model LowCardinality(String),
    mig_parent_uuid LowCardinality(String),
    mig_profile LowCardinality(String),
    agent_boot_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    sample_interval_s Float32 CODEC(ZSTD(1)),
    driver_version LowCardinality(String),
    cuda_driver_version LowCardinality(String),
    gpu_util_pct Nullable(Float32) CODEC(Gorilla, ZSTD(1)),
    mem_util_pct Nullable(Float32) CODEC(Gorilla, ZSTD(1)),
    mem_used_bytes Nullable(UInt64) CODEC(T64, ZSTD(1)),
    mem_total_bytes Nullable(UInt64) CODEC(T64, ZSTD(1)),
    power_w Nullable(Float32) CODEC(Gorilla, ZSTD(1)),
    temperature_c Nullable(Float32) CODEC(Gorilla, ZSTD(1)),
    sm_clock_mhz Nullable(UInt32) CODEC(T64, ZSTD(1)),
    mem_clock_mhz Nullable(UInt32) CODEC(T64, ZSTD(1)),
    pcie_tx_bytes_per_s Nullable(Float32) CODEC(ZSTD(1)),
    pcie_rx_bytes_per_s Nullable(Float32) CODEC(ZSTD(1)),
    nvlink_tx_bytes_per_s Nullable(Float32) CODEC(ZSTD(1)),
    nvlink_rx_bytes_per_s Nullable(Float32) CODEC(ZSTD(1)),
    health LowCardinality(String),
    health_reason LowCardinality(String),
    xids Array(UInt32) CODEC(ZSTD(1)),
    critical_xid Bool,
    pod_uids Array(String) CODEC(ZSTD(1)),
    pod_namespaces Array(LowCardinality(String)),
    pod_names Array(String) CODEC(ZSTD(1)),
    process_count UInt16 CODEC(T64, ZSTD(1)),
    shared Bool,
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, gpu_uuid, ts)
TTL toDateTime(ts) + INTERVAL {raw_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS gpu_processes (
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    node LowCardinality(String),
    gpu_uuid LowCardinality(String),
    pid UInt32 CODEC(T64, ZSTD(1)),
    process_name LowCardinality(String),
    container_id String CODEC(ZSTD(1)),
    container_name LowCardinality(String),
    pod_uid String CODEC(ZSTD(1)),
    pod_namespace LowCardinality(String),
    pod_name String CODEC(ZSTD(1)),
    mem_used_bytes Nullable(UInt64) CODEC(T64, ZSTD(1)),
    sm_util_pct Nullable(Float32) CODEC(Gorilla, ZSTD(1)),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, gpu_uuid, ts, pid)
TTL toDateTime(ts) + INTERVAL {raw_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS gpu_xids (
    at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node LowCardinality(String),
    gpu_uuid LowCardinality(String),
    gpu_model LowCardinality(String),
    xid UInt32,
    critical Bool,
    message String CODEC(ZSTD(1)),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(at)
ORDER BY (node, gpu_uuid, at, xid)
TTL toDateTime(at) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS pod_states (
    uid String,
    namespace LowCardinality(String),
    name String,
    ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node LowCardinality(String),
    phase LowCardinality(String),
    team LowCardinality(String),
    project LowCardinality(String),
    gang_id String,
    gpu_requests Map(LowCardinality(String), UInt32),
    gpus_requested UInt32,
    owner_kinds Array(LowCardinality(String)),
    owner_names Array(String),
    labels Map(LowCardinality(String), String),
    images Array(String),
    container_ids Array(String),
    restarts UInt32,
    last_termination_reason LowCardinality(String),
    last_exit_code Nullable(Int32),
    status_reason LowCardinality(String),
    priority_class LowCardinality(String),
    conditions_json String CODEC(ZSTD(1)),
    deleted Bool,
    created_at DateTime64(3, 'UTC'),
    scheduled_at Nullable(DateTime64(3, 'UTC')) CODEC(ZSTD(1)),
    started_at Nullable(DateTime64(3, 'UTC')) CODEC(ZSTD(1)),
    finished_at Nullable(DateTime64(3, 'UTC')) CODEC(ZSTD(1)),
    deleted_at Nullable(DateTime64(3, 'UTC')) CODEC(ZSTD(1)),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree(ts)
PARTITION BY toYYYYMM(created_at)
ORDER BY uid
TTL toDateTime(created_at) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS node_states (
    node String,
    ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    uid String,
    gpu_capacity Map(LowCardinality(String), UInt32),
    gpu_allocatable Map(LowCardinality(String), UInt32),
    gpus_capacity UInt32,
    gpus_allocatable UInt32,
    gpu_product LowCardinality(String),
    gpu_memory_bytes Nullable(UInt64),
    driver_version LowCardinality(String),
    cuda_driver_version LowCardinality(String),
    mig_strategy LowCardinality(String),
    ready Bool,
    unschedulable Bool,
    taints Array(String),
    labels Map(LowCardinality(String), String),
    deleted Bool,
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree(ts)
ORDER BY node
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS state_tombstones (
    topic LowCardinality(String),
    key String,
    at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree
ORDER BY (topic, key, kafka_partition, kafka_offset)
TTL toDateTime(at) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS k8s_events (
    uid String,
    ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    category LowCardinality(String),
    reason LowCardinality(String),
    message String CODEC(ZSTD(3)),
    type LowCardinality(String),
    count UInt32,
    involved_kind LowCardinality(String),
    involved_uid String,
    involved_namespace LowCardinality(String),
    involved_name String,
    source LowCardinality(String),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree(ts)
ORDER BY uid
TTL toDateTime(ts) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS workload_progress (
    pod_uid String,
    namespace LowCardinality(String),
    pod String,
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    steps_total Nullable(Float64) CODEC(Delta, ZSTD(1)),
    tokens_total Nullable(Float64) CODEC(Delta, ZSTD(1)),
    samples_total Nullable(Float64) CODEC(Delta, ZSTD(1)),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (pod_uid, ts)
TTL toDateTime(ts) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS pod_windows (
    window_id String,
    pod_uid String,
    namespace LowCardinality(String),
    pod String,
    node LowCardinality(String),
    gpu_uuid LowCardinality(String),
    gpu_model LowCardinality(String),
    window_start DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    window_end DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    team LowCardinality(String),
    project LowCardinality(String),
    allocated_s Float32 CODEC(ZSTD(1)),
    busy_s Float32 CODEC(ZSTD(1)),
    idle_s Float32 CODEC(ZSTD(1)),
    gap_s Float32 CODEC(ZSTD(1)),
    samples UInt32 CODEC(T64, ZSTD(1)),
    avg_sm_util_pct Nullable(Float32) CODEC(Gorilla, ZSTD(1)),
    max_sm_util_pct Nullable(Float32) CODEC(Gorilla, ZSTD(1)),
    avg_mem_used_bytes Nullable(Float64) CODEC(Gorilla, ZSTD(1)),
    max_mem_used_bytes Nullable(UInt64) CODEC(T64, ZSTD(1)),
    energy_j Nullable(Float64) CODEC(Gorilla, ZSTD(1)),
    share_fraction Float32,
    share_estimated Bool,
    cost_usd Float64 CODEC(Gorilla, ZSTD(1)),
    steps Nullable(Float64),
    tokens Nullable(Float64),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(window_start)
ORDER BY (namespace, pod_uid, gpu_uuid, window_start, window_id)
TTL toDateTime(window_start) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS cluster_capacity (
    window_id String,
    window_start DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    window_end DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    gpus_total UInt32,
    gpus_allocated UInt32,
    gpus_busy UInt32,
    gpus_idle_allocated UInt32,
    gpus_free UInt32,
    free_gpus_by_node Map(LowCardinality(String), UInt32),
    largest_free_block UInt32,
    stranded_gpus UInt32,
    pending_pods UInt32,
    pending_gpu_demand UInt32,
    gpu_s_total Nullable(Float64),
    gpu_s_allocated Nullable(Float64),
    gpu_s_busy Nullable(Float64),
    gpu_s_idle_allocated Nullable(Float64),
    gpu_s_free Nullable(Float64),
    stranded_gpus_max Nullable(UInt32),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_start, window_id)
TTL toDateTime(window_start) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS pod_lifecycle (
    pod_uid String,
    namespace LowCardinality(String),
    name String,
    team LowCardinality(String),
    project LowCardinality(String),
    node LowCardinality(String),
    gpus UInt32,
    gpu_model LowCardinality(String),
    created_at DateTime64(3, 'UTC'),
    scheduled_at Nullable(DateTime64(3, 'UTC')) CODEC(ZSTD(1)),
    started_at Nullable(DateTime64(3, 'UTC')) CODEC(ZSTD(1)),
    finished_at Nullable(DateTime64(3, 'UTC')) CODEC(ZSTD(1)),
    pending_reasons Array(String),
    pending_s Float64,
    running_s Float64,
    gpu_hours Float64,
    idle_gpu_hours Float64,
    peak_mem_bytes Nullable(UInt64),
    avg_sm_util_pct Nullable(Float32),
    cost_usd Float64,
    end_reason LowCardinality(String),
    steps Nullable(Float64),
    cost_per_step_usd Nullable(Float64),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(created_at)
ORDER BY (namespace, pod_uid)
TTL toDateTime(created_at) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS alerts (
    id String,
    type LowCardinality(String),
    severity LowCardinality(String),
    state LowCardinality(String),
    at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    started_at DateTime64(3, 'UTC'),
    subject_kind LowCardinality(String),
    subject_namespace LowCardinality(String),
    subject_name String,
    subject_node LowCardinality(String),
    subject_gpu_uuid LowCardinality(String),
    summary String CODEC(ZSTD(3)),
    details_json String CODEC(ZSTD(3)),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree(at)
PARTITION BY toYYYYMM(started_at)
ORDER BY (type, id, state)
TTL toDateTime(started_at) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS sink_batches (
    topic LowCardinality(String),
    partition UInt16,
    first_offset UInt64,
    last_offset UInt64,
    planned_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1))
) ENGINE = MergeTree
ORDER BY (topic, partition, last_offset)
TTL toDateTime(planned_at) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000""",
)
"""Migration 1: core tables."""


M2_ROLLUPS: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS rollup_hourly (
    hour DateTime('UTC'),
    namespace LowCardinality(String),
    team LowCardinality(String),
    project LowCardinality(String),
    node LowCardinality(String),
    gpu_model LowCardinality(String),
    allocated_gpu_hours SimpleAggregateFunction(sum, Float64),
    busy_gpu_hours SimpleAggregateFunction(sum, Float64),
    idle_gpu_hours SimpleAggregateFunction(sum, Float64),
    gap_gpu_hours SimpleAggregateFunction(sum, Float64),
    util_pct_x_hours SimpleAggregateFunction(sum, Float64),
    util_hours SimpleAggregateFunction(sum, Float64),
    peak_mem_bytes SimpleAggregateFunction(max, UInt64),
    energy_kwh SimpleAggregateFunction(sum, Float64),
    cost_usd SimpleAggregateFunction(sum, Float64),
    windows SimpleAggregateFunction(sum, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, namespace, team, project, node, gpu_model)
TTL hour + INTERVAL {rollup_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_hourly_mv TO rollup_hourly AS
SELECT toStartOfHour(window_start) AS hour,
    namespace, team, project, node, gpu_model,
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
GROUP BY hour, namespace, team, project, node, gpu_model""",
    """CREATE TABLE IF NOT EXISTS rollup_daily (
    day Date,
    namespace LowCardinality(String),
    team LowCardinality(String),
    project LowCardinality(String),
    node LowCardinality(String),
    gpu_model LowCardinality(String),
    allocated_gpu_hours SimpleAggregateFunction(sum, Float64),
    busy_gpu_hours SimpleAggregateFunction(sum, Float64),
    idle_gpu_hours SimpleAggregateFunction(sum, Float64),
    gap_gpu_hours SimpleAggregateFunction(sum, Float64),
    util_pct_x_hours SimpleAggregateFunction(sum, Float64),
    util_hours SimpleAggregateFunction(sum, Float64),
    peak_mem_bytes SimpleAggregateFunction(max, UInt64),
    energy_kwh SimpleAggregateFunction(sum, Float64),
    cost_usd SimpleAggregateFunction(sum, Float64),
    windows SimpleAggregateFunction(sum, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (day, namespace, team, project, node, gpu_model)
TTL day + INTERVAL {rollup_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_daily_mv TO rollup_daily AS
SELECT toDate(window_start) AS day,
    namespace, team, project, node, gpu_model,
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
GROUP BY day, namespace, team, project, node, gpu_model""",
)
"""Migration 2: hourly and daily rollups."""


M3_COSTS: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS gpu_prices (
    gpu_model String,
    usd_per_gpu_hour Float64,
    updated_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(updated_at)
ORDER BY gpu_model""",
    """CREATE VIEW IF NOT EXISTS v_cost_daily AS
SELECT r.day AS day, r.namespace AS namespace, r.team AS team, r.project AS project, r.node AS node,
       r.gpu_model AS gpu_model,
       r.allocated_gpu_hours AS allocated_gpu_hours, r.busy_gpu_hours AS busy_gpu_hours,
       r.idle_gpu_hours AS idle_gpu_hours, r.energy_kwh AS energy_kwh,
       r.cost_usd AS window_cost_usd,
       coalesce(p.usd_per_gpu_hour, 0) AS usd_per_gpu_hour,
       r.allocated_gpu_hours * coalesce(p.usd_per_gpu_hour, 0) AS list_cost_usd,
       r.idle_gpu_hours * coalesce(p.usd_per_gpu_hour, 0) AS idle_cost_usd
FROM (
    SELECT day, namespace, team, project, node, gpu_model,
           sum(allocated_gpu_hours) AS allocated_gpu_hours, sum(busy_gpu_hours) AS busy_gpu_hours,
           sum(idle_gpu_hours) AS idle_gpu_hours, sum(energy_kwh) AS energy_kwh, sum(cost_usd) AS cost_usd
    FROM rollup_daily GROUP BY day, namespace, team, project, node, gpu_model
) AS r
LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices GROUP \
BY gpu_model) AS p ON p.gpu_model = r.gpu_model""",
    """CREATE VIEW IF NOT EXISTS v_cost_by_team AS
SELECT team, sum(allocated_gpu_hours) AS gpu_hours, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(window_cost_usd) AS cost_usd, sum(list_cost_usd) AS list_cost_usd, sum(idle_cost_usd) AS \
idle_cost_usd
FROM v_cost_daily GROUP BY team""",
    """CREATE VIEW IF NOT EXISTS v_cost_by_project AS
SELECT team, project, sum(allocated_gpu_hours) AS gpu_hours, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(window_cost_usd) AS cost_usd, sum(list_cost_usd) AS list_cost_usd, sum(idle_cost_usd) AS \
idle_cost_usd
FROM v_cost_daily GROUP BY team, project""",
    """CREATE VIEW IF NOT EXISTS v_idle_cost AS
SELECT day, team, project, namespace, sum(idle_gpu_hours) AS idle_gpu_hours, sum(idle_cost_usd) AS idle_cost_usd
FROM v_cost_daily GROUP BY day, team, project, namespace""",
    """CREATE VIEW IF NOT EXISTS v_shared_gpu_cost AS
WITH w AS (SELECT * FROM pod_windows FINAL),
g AS (
    SELECT gpu_uuid, window_start, count() AS pods_on_gpu, sum(busy_s) AS gpu_busy_s,
           max(allocated_s) AS gpu_window_s, max(share_fraction < 1) AS any_shared
    FROM w GROUP BY gpu_uuid, window_start
)
SELECT w.namespace AS namespace, w.team AS team, w.project AS project, w.pod AS pod, w.pod_uid AS pod_uid,
       sum(w.allocated_s * w.share_fraction) / 3600 AS requested_gpu_hours,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600 AS \
usage_gpu_hours,
       sum(w.allocated_s * w.share_fraction) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS \
request_based_cost_usd,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600
           * any(coalesce(p.usd_per_gpu_hour, 0)) AS usage_based_cost_usd
FROM w
INNER JOIN g ON g.gpu_uuid = w.gpu_uuid AND g.window_start = w.window_start
LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices GROUP \
BY gpu_model) AS p ON p.gpu_model = w.gpu_model
WHERE g.pods_on_gpu > 1 OR g.any_shared
GROUP BY namespace, team, project, pod, pod_uid""",
    """CREATE VIEW IF NOT EXISTS v_cost_per_unit AS
WITH c AS (
    SELECT pod_uid, any(namespace) AS namespace, any(pod) AS pod, any(team) AS team, any(project) AS project,
           sum(allocated_s) / 3600 AS gpu_hours, sum(cost_usd) AS cost_usd,
           sum(allocated_s) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
           sum(steps) AS window_steps, sum(tokens) AS window_tokens
    FROM (SELECT * FROM pod_windows FINAL) AS w
    LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices \
GROUP BY gpu_model) AS p ON p.gpu_model = w.gpu_model
    GROUP BY pod_uid
),
u AS (
    SELECT pod_uid, max(steps_total) - min(steps_total) AS steps, max(tokens_total) - min(tokens_total) AS \
tokens,
           max(samples_total) - min(samples_total) AS samples
    FROM workload_progress FINAL GROUP BY pod_uid
)
SELECT c.namespace AS namespace, c.pod AS pod, c.pod_uid AS pod_uid, c.team AS team, c.project AS project,
       c.gpu_hours AS gpu_hours, greatest(c.cost_usd, c.list_cost_usd) AS cost_usd,
       coalesce(nullIf(u.steps, 0), nullIf(c.window_steps, 0)) AS steps,
       coalesce(nullIf(u.tokens, 0), nullIf(c.window_tokens, 0)) AS tokens,
       greatest(c.cost_usd, c.list_cost_usd) / steps AS cost_per_step_usd,
       greatest(c.cost_usd, c.list_cost_usd) / tokens * 1000 AS cost_per_1k_tokens_usd
FROM c LEFT JOIN u ON u.pod_uid = c.pod_uid
WHERE steps > 0 OR tokens > 0""",
    """CREATE VIEW IF NOT EXISTS v_pods AS
SELECT * FROM pod_states FINAL
WHERE uid NOT IN (SELECT key FROM state_tombstones WHERE topic = 'k8s.pods.v1')""",
    """CREATE VIEW IF NOT EXISTS v_alerts AS
SELECT id, any(a.type) AS alert_type, argMax(a.severity, a.at) AS current_severity,
       argMax(a.state, a.at) AS current_state, any(a.started_at) AS first_at,
       maxIf(a.at, a.state = 'resolved') AS resolved_at, max(a.at) AS last_at,
       any(a.subject_kind) AS kind, any(a.subject_namespace) AS namespace,
       any(a.subject_name) AS name, any(a.subject_node) AS node,
       any(a.subject_gpu_uuid) AS gpu_uuid, argMax(a.summary, a.at) AS last_summary,
       argMax(a.details_json, a.at) AS last_details_json
FROM alerts AS a FINAL GROUP BY id""",
)
"""Migration 3: prices and cost views."""

