"""Migrations 1-3 of the sink's schema: the core tables, the rollups over pod windows, the cost views.

Why apart from :mod:`sinks.migrations`: these are the long DDL of the first schema; the runner and
the later, smaller migrations stay readable beside them. Never edit an applied migration: add one.
"""

from __future__ import annotations

from sinks.ddl import BYTES_GAUGE, GAUGE, KAFKA_COLS, LC, RATE, TS, TS_NULL, TS_PLAIN, TtlDays, dedup_settings


def m1_core(ttl: TtlDays) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS gpu_samples (
    ts {TS},
    node {LC},
    gpu_uuid {LC},
    gpu_index UInt16 CODEC(T64, ZSTD(1)),
    gpu_model {LC},
    mig_parent_uuid {LC},
    mig_profile {LC},
    agent_boot_id {LC},
    seq UInt64 CODEC(Delta, ZSTD(1)),
    sample_interval_s Float32 CODEC(ZSTD(1)),
    driver_version {LC},
    cuda_driver_version {LC},
    gpu_util_pct {GAUGE},
    mem_util_pct {GAUGE},
    mem_used_bytes {BYTES_GAUGE},
    mem_total_bytes {BYTES_GAUGE},
    power_w {GAUGE},
    temperature_c {GAUGE},
    sm_clock_mhz Nullable(UInt32) CODEC(T64, ZSTD(1)),
    mem_clock_mhz Nullable(UInt32) CODEC(T64, ZSTD(1)),
    pcie_tx_bytes_per_s {RATE},
    pcie_rx_bytes_per_s {RATE},
    nvlink_tx_bytes_per_s {RATE},
    nvlink_rx_bytes_per_s {RATE},
    health {LC},
    health_reason {LC},
    xids Array(UInt32) CODEC(ZSTD(1)),
    critical_xid Bool,
    pod_uids Array(String) CODEC(ZSTD(1)),
    pod_namespaces Array({LC}),
    pod_names Array(String) CODEC(ZSTD(1)),
    process_count UInt16 CODEC(T64, ZSTD(1)),
    shared Bool,
    {KAFKA_COLS}
) ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, gpu_uuid, ts)
TTL toDateTime(ts) + INTERVAL {ttl.raw} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS gpu_processes (
    ts {TS},
    node {LC},
    gpu_uuid {LC},
    pid UInt32 CODEC(T64, ZSTD(1)),
    process_name {LC},
    container_id String CODEC(ZSTD(1)),
    container_name {LC},
    pod_uid String CODEC(ZSTD(1)),
    pod_namespace {LC},
    pod_name String CODEC(ZSTD(1)),
    mem_used_bytes {BYTES_GAUGE},
    sm_util_pct {GAUGE},
    {KAFKA_COLS}
) ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, gpu_uuid, ts, pid)
TTL toDateTime(ts) + INTERVAL {ttl.raw} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS gpu_xids (
    at {TS_PLAIN},
    ts {TS_PLAIN},
    node {LC},
    gpu_uuid {LC},
    gpu_model {LC},
    xid UInt32,
    critical Bool,
    message String CODEC(ZSTD(1)),
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(at)
ORDER BY (node, gpu_uuid, at, xid)
TTL toDateTime(at) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS pod_states (
    uid String,
    namespace {LC},
    name String,
    ts {TS_PLAIN},
    node {LC},
    phase {LC},
    team {LC},
    project {LC},
    gang_id String,
    gpu_requests Map({LC}, UInt32),
    gpus_requested UInt32,
    owner_kinds Array({LC}),
    owner_names Array(String),
    labels Map({LC}, String),
    images Array(String),
    container_ids Array(String),
    restarts UInt32,
    last_termination_reason {LC},
    last_exit_code Nullable(Int32),
    status_reason {LC},
    priority_class {LC},
    conditions_json String CODEC(ZSTD(1)),
    deleted Bool,
    created_at DateTime64(3, 'UTC'),
    scheduled_at {TS_NULL},
    started_at {TS_NULL},
    finished_at {TS_NULL},
    deleted_at {TS_NULL},
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree(ts)
PARTITION BY toYYYYMM(created_at)
ORDER BY uid
TTL toDateTime(created_at) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS node_states (
    node String,
    ts {TS_PLAIN},
    uid String,
    gpu_capacity Map({LC}, UInt32),
    gpu_allocatable Map({LC}, UInt32),
    gpus_capacity UInt32,
    gpus_allocatable UInt32,
    gpu_product {LC},
    gpu_memory_bytes Nullable(UInt64),
    driver_version {LC},
    cuda_driver_version {LC},
    mig_strategy {LC},
    ready Bool,
    unschedulable Bool,
    taints Array(String),
    labels Map({LC}, String),
    deleted Bool,
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree(ts)
ORDER BY node
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS state_tombstones (
    topic {LC},
    key String,
    at {TS_PLAIN},
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree
ORDER BY (topic, key, kafka_partition, kafka_offset)
TTL toDateTime(at) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS k8s_events (
    uid String,
    ts {TS_PLAIN},
    category {LC},
    reason {LC},
    message String CODEC(ZSTD(3)),
    type {LC},
    count UInt32,
    involved_kind {LC},
    involved_uid String,
    involved_namespace {LC},
    involved_name String,
    source {LC},
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree(ts)
ORDER BY uid
TTL toDateTime(ts) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS workload_progress (
    pod_uid String,
    namespace {LC},
    pod String,
    ts {TS},
    steps_total Nullable(Float64) CODEC(Delta, ZSTD(1)),
    tokens_total Nullable(Float64) CODEC(Delta, ZSTD(1)),
    samples_total Nullable(Float64) CODEC(Delta, ZSTD(1)),
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (pod_uid, ts)
TTL toDateTime(ts) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS pod_windows (
    window_id String,
    pod_uid String,
    namespace {LC},
    pod String,
    node {LC},
    gpu_uuid {LC},
    gpu_model {LC},
    window_start {TS},
    window_end {TS},
    team {LC},
    project {LC},
    allocated_s Float32 CODEC(ZSTD(1)),
    busy_s Float32 CODEC(ZSTD(1)),
    idle_s Float32 CODEC(ZSTD(1)),
    gap_s Float32 CODEC(ZSTD(1)),
    samples UInt32 CODEC(T64, ZSTD(1)),
    avg_sm_util_pct {GAUGE},
    max_sm_util_pct {GAUGE},
    avg_mem_used_bytes Nullable(Float64) CODEC(Gorilla, ZSTD(1)),
    max_mem_used_bytes {BYTES_GAUGE},
    energy_j Nullable(Float64) CODEC(Gorilla, ZSTD(1)),
    share_fraction Float32,
    share_estimated Bool,
    cost_usd Float64 CODEC(Gorilla, ZSTD(1)),
    steps Nullable(Float64),
    tokens Nullable(Float64),
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(window_start)
ORDER BY (namespace, pod_uid, gpu_uuid, window_start, window_id)
TTL toDateTime(window_start) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS cluster_capacity (
    window_id String,
    window_start {TS},
    window_end {TS},
    gpus_total UInt32,
    gpus_allocated UInt32,
    gpus_busy UInt32,
    gpus_idle_allocated UInt32,
    gpus_free UInt32,
    free_gpus_by_node Map({LC}, UInt32),
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
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_start, window_id)
TTL toDateTime(window_start) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS pod_lifecycle (
    pod_uid String,
    namespace {LC},
    name String,
    team {LC},
    project {LC},
    node {LC},
    gpus UInt32,
    gpu_model {LC},
    created_at DateTime64(3, 'UTC'),
    scheduled_at {TS_NULL},
    started_at {TS_NULL},
    finished_at {TS_NULL},
    pending_reasons Array(String),
    pending_s Float64,
    running_s Float64,
    gpu_hours Float64,
    idle_gpu_hours Float64,
    peak_mem_bytes Nullable(UInt64),
    avg_sm_util_pct Nullable(Float32),
    cost_usd Float64,
    end_reason {LC},
    steps Nullable(Float64),
    cost_per_step_usd Nullable(Float64),
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(created_at)
ORDER BY (namespace, pod_uid)
TTL toDateTime(created_at) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS alerts (
    id String,
    type {LC},
    severity {LC},
    state {LC},
    at {TS_PLAIN},
    started_at DateTime64(3, 'UTC'),
    subject_kind {LC},
    subject_namespace {LC},
    subject_name String,
    subject_node {LC},
    subject_gpu_uuid {LC},
    summary String CODEC(ZSTD(3)),
    details_json String CODEC(ZSTD(3)),
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree(at)
PARTITION BY toYYYYMM(started_at)
ORDER BY (type, id, state)
TTL toDateTime(started_at) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS sink_batches (
    topic {LC},
    partition UInt16,
    first_offset UInt64,
    last_offset UInt64,
    planned_at {TS_PLAIN}
) ENGINE = MergeTree
ORDER BY (topic, partition, last_offset)
TTL toDateTime(planned_at) + INTERVAL 30 DAY
{dedup_settings()}""",
    ]


ROLLUP_COLUMNS = f"""    namespace {LC},
    team {LC},
    project {LC},
    node {LC},
    gpu_model {LC},
    allocated_gpu_hours SimpleAggregateFunction(sum, Float64),
    busy_gpu_hours SimpleAggregateFunction(sum, Float64),
    idle_gpu_hours SimpleAggregateFunction(sum, Float64),
    gap_gpu_hours SimpleAggregateFunction(sum, Float64),
    util_pct_x_hours SimpleAggregateFunction(sum, Float64),
    util_hours SimpleAggregateFunction(sum, Float64),
    peak_mem_bytes SimpleAggregateFunction(max, UInt64),
    energy_kwh SimpleAggregateFunction(sum, Float64),
    cost_usd SimpleAggregateFunction(sum, Float64),
    windows SimpleAggregateFunction(sum, UInt64)"""

ROLLUP_SELECT = """    namespace, team, project, node, gpu_model,
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
FROM pod_windows"""


def m2_rollups(ttl: TtlDays) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS rollup_hourly (
    hour DateTime('UTC'),
{ROLLUP_COLUMNS}
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, namespace, team, project, node, gpu_model)
TTL hour + INTERVAL {ttl.rollup} DAY
{dedup_settings()}""",
        f"""CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_hourly_mv TO rollup_hourly AS
SELECT toStartOfHour(window_start) AS hour,
{ROLLUP_SELECT}
GROUP BY hour, namespace, team, project, node, gpu_model""",
        f"""CREATE TABLE IF NOT EXISTS rollup_daily (
    day Date,
{ROLLUP_COLUMNS}
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (day, namespace, team, project, node, gpu_model)
TTL day + INTERVAL {ttl.rollup} DAY
{dedup_settings()}""",
        f"""CREATE MATERIALIZED VIEW IF NOT EXISTS rollup_daily_mv TO rollup_daily AS
SELECT toDate(window_start) AS day,
{ROLLUP_SELECT}
GROUP BY day, namespace, team, project, node, gpu_model""",
    ]


PRICE = (
    "(SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour "
    "FROM gpu_prices GROUP BY gpu_model)"
)


def m3_costs(ttl: TtlDays) -> list[str]:
    return [
        """CREATE TABLE IF NOT EXISTS gpu_prices (
    gpu_model String,
    usd_per_gpu_hour Float64,
    updated_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(updated_at)
ORDER BY gpu_model""",
        f"""CREATE VIEW IF NOT EXISTS v_cost_daily AS
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
LEFT JOIN {PRICE} AS p ON p.gpu_model = r.gpu_model""",
        """CREATE VIEW IF NOT EXISTS v_cost_by_team AS
SELECT team, sum(allocated_gpu_hours) AS gpu_hours, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(window_cost_usd) AS cost_usd, sum(list_cost_usd) AS list_cost_usd, sum(idle_cost_usd) AS idle_cost_usd
FROM v_cost_daily GROUP BY team""",
        """CREATE VIEW IF NOT EXISTS v_cost_by_project AS
SELECT team, project, sum(allocated_gpu_hours) AS gpu_hours, sum(idle_gpu_hours) AS idle_gpu_hours,
       sum(window_cost_usd) AS cost_usd, sum(list_cost_usd) AS list_cost_usd, sum(idle_cost_usd) AS idle_cost_usd
FROM v_cost_daily GROUP BY team, project""",
        """CREATE VIEW IF NOT EXISTS v_idle_cost AS
SELECT day, team, project, namespace, sum(idle_gpu_hours) AS idle_gpu_hours, sum(idle_cost_usd) AS idle_cost_usd
FROM v_cost_daily GROUP BY day, team, project, namespace""",
        f"""CREATE VIEW IF NOT EXISTS v_shared_gpu_cost AS
WITH w AS (SELECT * FROM pod_windows FINAL),
g AS (
    SELECT gpu_uuid, window_start, count() AS pods_on_gpu, sum(busy_s) AS gpu_busy_s,
           max(allocated_s) AS gpu_window_s, max(share_fraction < 1) AS any_shared
    FROM w GROUP BY gpu_uuid, window_start
)
SELECT w.namespace AS namespace, w.team AS team, w.project AS project, w.pod AS pod, w.pod_uid AS pod_uid,
       sum(w.allocated_s * w.share_fraction) / 3600 AS requested_gpu_hours,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600 AS usage_gpu_hours,
       sum(w.allocated_s * w.share_fraction) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS request_based_cost_usd,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600
           * any(coalesce(p.usd_per_gpu_hour, 0)) AS usage_based_cost_usd
FROM w
INNER JOIN g ON g.gpu_uuid = w.gpu_uuid AND g.window_start = w.window_start
LEFT JOIN {PRICE} AS p ON p.gpu_model = w.gpu_model
WHERE g.pods_on_gpu > 1 OR g.any_shared
GROUP BY namespace, team, project, pod, pod_uid""",
        f"""CREATE VIEW IF NOT EXISTS v_cost_per_unit AS
WITH c AS (
    SELECT pod_uid, any(namespace) AS namespace, any(pod) AS pod, any(team) AS team, any(project) AS project,
           sum(allocated_s) / 3600 AS gpu_hours, sum(cost_usd) AS cost_usd,
           sum(allocated_s) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
           sum(steps) AS window_steps, sum(tokens) AS window_tokens
    FROM (SELECT * FROM pod_windows FINAL) AS w
    LEFT JOIN {PRICE} AS p ON p.gpu_model = w.gpu_model
    GROUP BY pod_uid
),
u AS (
    SELECT pod_uid, max(steps_total) - min(steps_total) AS steps, max(tokens_total) - min(tokens_total) AS tokens,
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
    ]
