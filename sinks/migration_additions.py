"""Migrations 8-12 and 16 of the sink's schema as committed SQL: the fragmentation tables and columns (8),
the allocator columns (9), the engine's path for GPU samples (10, 11: :mod:`sinks.sample_json`),
the batch journal's group (12), the GPUs' tenancy per day and the shared-GPU cost view over it (16).

Why literal text: a migration runs on stores created long after it was written, and must do there
exactly what it did on the first one; the engine path's structure in particular follows the column
spec (:mod:`sinks.tables`), which grows. tests/sinks/test_migrations_frozen.py pins every applied
migration's text: never edit one, add a migration. ``{state_ttl_days}`` is the configured TTL
(:func:`sinks.migrations.render`).
"""

from __future__ import annotations

M8_FRAGMENTATION: tuple[str, ...] = (
    """ALTER TABLE cluster_capacity
ADD COLUMN IF NOT EXISTS mig_gpus Nullable(UInt32),
ADD COLUMN IF NOT EXISTS mig_free_compute_slices Nullable(UInt32),
ADD COLUMN IF NOT EXISTS mig_free_memory_slices Nullable(UInt32),
ADD COLUMN IF NOT EXISTS mig_free_instances_by_profile Map(LowCardinality(String), UInt32),
ADD COLUMN IF NOT EXISTS mig_relayout_capacity_by_profile Map(LowCardinality(String), UInt32),
ADD COLUMN IF NOT EXISTS mig_pending_by_profile Map(LowCardinality(String), UInt32),
ADD COLUMN IF NOT EXISTS shared_gpus Nullable(UInt32),
ADD COLUMN IF NOT EXISTS shared_vram_free_bytes Nullable(UInt64),
ADD COLUMN IF NOT EXISTS shared_vram_largest_free_bytes Nullable(UInt64),
ADD COLUMN IF NOT EXISTS shared_vram_stranded_bytes Nullable(UInt64),
ADD COLUMN IF NOT EXISTS shared_vram_pending_bytes Nullable(UInt64)""",
    """CREATE TABLE IF NOT EXISTS mig_gpu_windows (
    `cluster` LowCardinality(String) DEFAULT 'default',
    window_id String,
    window_start DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    window_end DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    node LowCardinality(String),
    gpu_index UInt16,
    gpu_uuid String,
    profile_table LowCardinality(String),
    instance_profiles Array(LowCardinality(String)),
    instance_starts Array(UInt8),
    instance_used Array(UInt8),
    instance_idle_s Array(Nullable(Float64)),
    free_compute_slices UInt8,
    free_memory_slices UInt8,
    largest_creatable_profile Nullable(String),
    largest_after_relayout Nullable(String),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (cluster, window_start, window_id, gpu_uuid)
TTL toDateTime(window_start) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
    """CREATE TABLE IF NOT EXISTS shared_gpu_windows (
    `cluster` LowCardinality(String) DEFAULT 'default',
    window_id String,
    window_start DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    window_end DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    node LowCardinality(String),
    gpu_index UInt16,
    gpu_uuid String,
    mem_total_bytes UInt64,
    mem_used_bytes Nullable(UInt64),
    free_bytes UInt64,
    pod_namespaces Array(LowCardinality(String)),
    pod_names Array(String),
    pod_mem_bytes Array(Nullable(UInt64)),
    pod_peak_bytes Array(Nullable(UInt64)),
    kafka_partition UInt16 CODEC(T64, ZSTD(1)),
    kafka_offset UInt64 CODEC(Delta, ZSTD(1))
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (cluster, window_start, window_id, gpu_uuid)
TTL toDateTime(window_start) + INTERVAL {state_ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000""",
)
"""Migration 8: fragmentation: MIG and shared-VRAM capacity figures, mig_gpu_windows, shared_gpu_windows."""


M9_ALLOCATOR: tuple[str, ...] = (
    """ALTER TABLE pod_windows ADD COLUMN IF NOT EXISTS alloc_reserved_bytes Nullable(UInt64), ADD COLUMN IF NOT \
EXISTS alloc_allocated_bytes Nullable(UInt64), ADD COLUMN IF NOT EXISTS max_reserved_unused_bytes \
Nullable(UInt64), ADD COLUMN IF NOT EXISTS alloc_retries Nullable(UInt64), ADD COLUMN IF NOT EXISTS \
alloc_ooms Nullable(UInt64)""",
    """ALTER TABLE pod_lifecycle ADD COLUMN IF NOT EXISTS max_reserved_unused_bytes Nullable(UInt64), ADD COLUMN IF \
NOT EXISTS alloc_retries Nullable(UInt64), ADD COLUMN IF NOT EXISTS alloc_ooms Nullable(UInt64)""",
)
"""Migration 9: allocator figures (reserved but unused, retries, OOMs) in pod windows and lifecycle."""


M10_SAMPLE_JSON: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS gpu_samples_json (p UInt16, o UInt64, t Int64, s Tuple(cluster Nullable(String), \
node String, agent_boot_id String, seq UInt64, sample_interval_s Float64, driver_version Nullable(String), \
cuda_driver_version Nullable(String), gpus Array(Tuple(uuid String, index Int64, model String, \
mig_parent_uuid Nullable(String), mig_profile Nullable(String), gpu_util_pct Nullable(Float64), mem_util_pct \
Nullable(Float64), mem_used_bytes Nullable(UInt64), mem_total_bytes Nullable(UInt64), power_w \
Nullable(Float64), temperature_c Nullable(Float64), sm_clock_mhz Nullable(UInt64), mem_clock_mhz \
Nullable(UInt64), pcie_tx_bytes_per_s Nullable(Float64), pcie_rx_bytes_per_s Nullable(Float64), \
nvlink_tx_bytes_per_s Nullable(Float64), nvlink_rx_bytes_per_s Nullable(Float64), health Nullable(String), \
health_reason Nullable(String), assigned_to Array(Tuple(namespace String, pod String, pod_uid \
Nullable(String))), processes Array(Tuple(pid UInt32, process_name Nullable(String), container_id \
Nullable(String), container_name Nullable(String), pod_uid Nullable(String), pod_namespace Nullable(String), \
pod_name Nullable(String), mem_used_bytes Nullable(UInt64), sm_util_pct Nullable(Float64))), shared \
Nullable(Bool))))) ENGINE = Null""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_samples_json_to_samples TO gpu_samples (cluster, ts, node, \
gpu_uuid, gpu_index, gpu_model, mig_parent_uuid, mig_profile, agent_boot_id, seq, sample_interval_s, \
driver_version, cuda_driver_version, gpu_util_pct, mem_util_pct, mem_used_bytes, mem_total_bytes, power_w, \
temperature_c, sm_clock_mhz, mem_clock_mhz, pcie_tx_bytes_per_s, pcie_rx_bytes_per_s, nvlink_tx_bytes_per_s, \
nvlink_rx_bytes_per_s, health, health_reason, xids, critical_xid, pod_uids, pod_namespaces, pod_names, \
process_count, shared, kafka_partition, kafka_offset) AS
SELECT ifNull(s.cluster, 'default') AS cluster,
       fromUnixTimestamp64Milli(t, 'UTC') AS ts,
       s.node AS node,
       g.uuid AS gpu_uuid,
       toUInt16(g.index) AS gpu_index,
       g.model AS gpu_model,
       ifNull(g.mig_parent_uuid, '') AS mig_parent_uuid,
       ifNull(g.mig_profile, '') AS mig_profile,
       s.agent_boot_id AS agent_boot_id,
       s.seq AS seq,
       toFloat32(s.sample_interval_s) AS sample_interval_s,
       ifNull(s.driver_version, '') AS driver_version,
       ifNull(s.cuda_driver_version, '') AS cuda_driver_version,
       toFloat32(g.gpu_util_pct) AS gpu_util_pct,
       toFloat32(g.mem_util_pct) AS mem_util_pct,
       g.mem_used_bytes AS mem_used_bytes,
       g.mem_total_bytes AS mem_total_bytes,
       toFloat32(g.power_w) AS power_w,
       toFloat32(g.temperature_c) AS temperature_c,
       toUInt32(g.sm_clock_mhz) AS sm_clock_mhz,
       toUInt32(g.mem_clock_mhz) AS mem_clock_mhz,
       toFloat32(g.pcie_tx_bytes_per_s) AS pcie_tx_bytes_per_s,
       toFloat32(g.pcie_rx_bytes_per_s) AS pcie_rx_bytes_per_s,
       toFloat32(g.nvlink_tx_bytes_per_s) AS nvlink_tx_bytes_per_s,
       toFloat32(g.nvlink_rx_bytes_per_s) AS nvlink_rx_bytes_per_s,
       ifNull(g.health, 'ok') AS health,
       ifNull(g.health_reason, '') AS health_reason,
       CAST([], 'Array(UInt32)') AS xids,
       false AS critical_xid,
       arrayMap(r -> ifNull(r.pod_uid, ''), g.assigned_to) AS pod_uids,
       arrayMap(r -> r.namespace, g.assigned_to) AS pod_namespaces,
       arrayMap(r -> r.pod, g.assigned_to) AS pod_names,
       toUInt16(length(g.processes)) AS process_count,
       ifNull(g.shared, false) AS shared,
       p AS kafka_partition,
       o AS kafka_offset
FROM gpu_samples_json ARRAY JOIN s.gpus AS g""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_samples_json_to_processes TO gpu_processes (cluster, ts, node, \
gpu_uuid, pid, process_name, container_id, container_name, pod_uid, pod_namespace, pod_name, mem_used_bytes, \
sm_util_pct, kafka_partition, kafka_offset) AS
SELECT ifNull(s.cluster, 'default') AS cluster,
       fromUnixTimestamp64Milli(t, 'UTC') AS ts,
       s.node AS node,
       g.uuid AS gpu_uuid,
       q.pid AS pid,
       ifNull(q.process_name, '') AS process_name,
       ifNull(q.container_id, '') AS container_id,
       ifNull(q.container_name, '') AS container_name,
       ifNull(q.pod_uid, '') AS pod_uid,
       ifNull(q.pod_namespace, '') AS pod_namespace,
       ifNull(q.pod_name, '') AS pod_name,
       q.mem_used_bytes AS mem_used_bytes,
       toFloat32(q.sm_util_pct) AS sm_util_pct,
       p AS kafka_partition,
       o AS kafka_offset
FROM gpu_samples_json ARRAY JOIN s.gpus AS g ARRAY JOIN g.processes AS q""",
)
"""Migration 10: gpu_samples_json: GPU samples unpacked into rows by the engine."""


M11_SAMPLE_JSON_UNCHECKED: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS gpu_samples_json (p UInt16, o UInt64, t Int64, s Tuple(cluster Nullable(String), \
node String, agent_boot_id String, seq UInt64, sample_interval_s Float64, driver_version Nullable(String), \
cuda_driver_version Nullable(String), gpus Array(Tuple(uuid String, index Int64, model String, \
mig_parent_uuid Nullable(String), mig_profile Nullable(String), gpu_util_pct Nullable(Float64), mem_util_pct \
Nullable(Float64), mem_used_bytes Nullable(UInt64), mem_total_bytes Nullable(UInt64), power_w \
Nullable(Float64), temperature_c Nullable(Float64), sm_clock_mhz Nullable(UInt64), mem_clock_mhz \
Nullable(UInt64), pcie_tx_bytes_per_s Nullable(Float64), pcie_rx_bytes_per_s Nullable(Float64), \
nvlink_tx_bytes_per_s Nullable(Float64), nvlink_rx_bytes_per_s Nullable(Float64), health Nullable(String), \
health_reason Nullable(String), assigned_to Array(Tuple(namespace String, pod String, pod_uid \
Nullable(String))), processes Array(Tuple(pid UInt32, process_name Nullable(String), container_id \
Nullable(String), container_name Nullable(String), pod_uid Nullable(String), pod_namespace Nullable(String), \
pod_name Nullable(String), mem_used_bytes Nullable(UInt64), sm_util_pct Nullable(Float64))), shared \
Nullable(Bool))))) ENGINE = Null""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_samples_json_to_samples TO gpu_samples (cluster, ts, node, \
gpu_uuid, gpu_index, gpu_model, mig_parent_uuid, mig_profile, agent_boot_id, seq, sample_interval_s, \
driver_version, cuda_driver_version, gpu_util_pct, mem_util_pct, mem_used_bytes, mem_total_bytes, power_w, \
temperature_c, sm_clock_mhz, mem_clock_mhz, pcie_tx_bytes_per_s, pcie_rx_bytes_per_s, nvlink_tx_bytes_per_s, \
nvlink_rx_bytes_per_s, health, health_reason, xids, critical_xid, pod_uids, pod_namespaces, pod_names, \
process_count, shared, kafka_partition, kafka_offset) AS
SELECT ifNull(s.cluster, 'default') AS cluster,
       fromUnixTimestamp64Milli(t, 'UTC') AS ts,
       s.node AS node,
       g.uuid AS gpu_uuid,
       toUInt16(g.index) AS gpu_index,
       g.model AS gpu_model,
       ifNull(g.mig_parent_uuid, '') AS mig_parent_uuid,
       ifNull(g.mig_profile, '') AS mig_profile,
       s.agent_boot_id AS agent_boot_id,
       s.seq AS seq,
       toFloat32(s.sample_interval_s) AS sample_interval_s,
       ifNull(s.driver_version, '') AS driver_version,
       ifNull(s.cuda_driver_version, '') AS cuda_driver_version,
       toFloat32(g.gpu_util_pct) AS gpu_util_pct,
       toFloat32(g.mem_util_pct) AS mem_util_pct,
       g.mem_used_bytes AS mem_used_bytes,
       g.mem_total_bytes AS mem_total_bytes,
       toFloat32(g.power_w) AS power_w,
       toFloat32(g.temperature_c) AS temperature_c,
       toUInt32(g.sm_clock_mhz) AS sm_clock_mhz,
       toUInt32(g.mem_clock_mhz) AS mem_clock_mhz,
       toFloat32(g.pcie_tx_bytes_per_s) AS pcie_tx_bytes_per_s,
       toFloat32(g.pcie_rx_bytes_per_s) AS pcie_rx_bytes_per_s,
       toFloat32(g.nvlink_tx_bytes_per_s) AS nvlink_tx_bytes_per_s,
       toFloat32(g.nvlink_rx_bytes_per_s) AS nvlink_rx_bytes_per_s,
       ifNull(g.health, 'ok') AS health,
       ifNull(g.health_reason, '') AS health_reason,
       CAST([], 'Array(UInt32)') AS xids,
       false AS critical_xid,
       arrayMap(r -> ifNull(r.pod_uid, ''), g.assigned_to) AS pod_uids,
       arrayMap(r -> r.namespace, g.assigned_to) AS pod_namespaces,
       arrayMap(r -> r.pod, g.assigned_to) AS pod_names,
       toUInt16(length(g.processes)) AS process_count,
       ifNull(g.shared, false) AS shared,
       p AS kafka_partition,
       o AS kafka_offset
FROM gpu_samples_json ARRAY JOIN s.gpus AS g""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_samples_json_to_processes TO gpu_processes (cluster, ts, node, \
gpu_uuid, pid, process_name, container_id, container_name, pod_uid, pod_namespace, pod_name, mem_used_bytes, \
sm_util_pct, kafka_partition, kafka_offset) AS
SELECT ifNull(s.cluster, 'default') AS cluster,
       fromUnixTimestamp64Milli(t, 'UTC') AS ts,
       s.node AS node,
       g.uuid AS gpu_uuid,
       q.pid AS pid,
       ifNull(q.process_name, '') AS process_name,
       ifNull(q.container_id, '') AS container_id,
       ifNull(q.container_name, '') AS container_name,
       ifNull(q.pod_uid, '') AS pod_uid,
       ifNull(q.pod_namespace, '') AS pod_namespace,
       ifNull(q.pod_name, '') AS pod_name,
       q.mem_used_bytes AS mem_used_bytes,
       toFloat32(q.sm_util_pct) AS sm_util_pct,
       p AS kafka_partition,
       o AS kafka_offset
FROM gpu_samples_json ARRAY JOIN s.gpus AS g ARRAY JOIN g.processes AS q""",
    """DROP VIEW IF EXISTS gpu_samples_json_check""",
    """DROP VIEW IF EXISTS gpu_samples_json_samples""",
    """DROP VIEW IF EXISTS gpu_samples_json_processes""",
    """DROP TABLE IF EXISTS gpu_samples_json_checked""",
)
"""Migration 11: gpu_samples_json: no check view, the schemas bound what the columns cannot hold."""


M12_BATCH_GROUP: tuple[str, ...] = (
    """ALTER TABLE sink_batches ADD COLUMN IF NOT EXISTS batch_group String DEFAULT ''""",
)
"""Migration 12: sink_batches: the group a journalled range was stored in."""



M16_SHARED_GPU_COST: tuple[str, ...] = (
    """CREATE OR REPLACE VIEW v_shared_gpu_cost AS
WITH t AS (
    SELECT cluster, day, gpu_uuid, namespace, pod_uid, min(first_start) AS first_start,
           max(last_start) AS last_start, min(share_min) AS share_min
    FROM gpu_tenancy_daily GROUP BY cluster, day, gpu_uuid, namespace, pod_uid
),
c AS (
    SELECT a.cluster AS cluster, a.day AS day, a.gpu_uuid AS gpu_uuid, a.namespace AS namespace,
           a.pod_uid AS pod_uid
    FROM t AS a INNER JOIN t AS b ON b.cluster = a.cluster AND b.day = a.day AND b.gpu_uuid = a.gpu_uuid
    WHERE a.share_min < 1 OR ((b.namespace != a.namespace OR b.pod_uid != a.pod_uid)
                              AND b.first_start <= a.last_start AND a.first_start <= b.last_start)
),
n AS (
    SELECT cluster, gpu_uuid, toUInt32(row_number() OVER (ORDER BY cluster, gpu_uuid)) AS gpu_no
    FROM (SELECT DISTINCT cluster, gpu_uuid FROM c)
),
w AS (
    SELECT cluster, namespace, team, project, pod, pod_uid, gpu_uuid, gpu_model, window_start, allocated_s,
           busy_s, share_fraction
    FROM pod_windows FINAL
    WHERE (cluster, namespace, pod_uid, gpu_uuid) IN (SELECT cluster, namespace, pod_uid, gpu_uuid FROM c)
      AND (cluster, namespace, pod_uid, gpu_uuid, toDate(window_start)) IN (
          SELECT cluster, namespace, pod_uid, gpu_uuid, day FROM c)
),
x AS (SELECT w.*, n.gpu_no AS gpu_no FROM w INNER JOIN n ON n.cluster = w.cluster AND n.gpu_uuid = w.gpu_uuid),
g AS (
    SELECT gpu_no, window_start, count() AS pods_on_gpu, sum(busy_s) AS gpu_busy_s,
           max(allocated_s) AS gpu_window_s
    FROM x GROUP BY gpu_no, window_start
    HAVING pods_on_gpu > 1 OR max(share_fraction < 1)
)
SELECT x.cluster AS cluster, x.namespace AS namespace, x.team AS team, x.project AS project, x.pod AS pod,
       x.pod_uid AS pod_uid,
       sum(x.allocated_s * x.share_fraction) / 3600 AS requested_gpu_hours,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, x.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600 AS \
usage_gpu_hours,
       sum(x.allocated_s * x.share_fraction) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS \
request_based_cost_usd,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, x.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600
           * any(coalesce(p.usd_per_gpu_hour, 0)) AS usage_based_cost_usd
FROM x
INNER JOIN g ON g.gpu_no = x.gpu_no AND g.window_start = x.window_start
LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices GROUP \
BY gpu_model) AS p ON p.gpu_model = x.gpu_model
GROUP BY cluster, namespace, team, project, pod, pod_uid""",
)
"""Migration 16's view: ``v_shared_gpu_cost`` over ``gpu_tenancy_daily`` (:data:`sinks.rollups.GPU_TENANCY_DAILY`:
each pod's first and last window start and least share per GPU and day).

The view's answer is migration 7's: per pod, its windows in a GPU-window that had more than one pod
or a share under 1, the GPU's window split by busy share. Migration 7 grouped every GPU-window of the
history to find them; this view reads only the windows that can be such: a pod's windows on a GPU
and day where its share fell under 1 or its first-to-last span met another pod's on that GPU (two
pods in one GPU-window both span it; a pod has one window per GPU and start, its ``window_id`` being
their hash). The candidate GPUs are numbered so that the per-GPU-window figures are grouped and
joined on two fixed-width keys. Minima and maxima are the same however often a window is inserted,
so a retried or replayed batch changes nothing; the back-fill reads every stored version of a
window, as the materialized view sees every insert."""
