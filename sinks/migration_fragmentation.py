"""Migration 8: the MIG and shared-GPU VRAM fragmentation figures of the capacity windows.

``cluster_capacity`` gains the fleet's MIG and shared-VRAM figures (NULL / empty on a fleet
without MIG or shared GPUs, and on every row from before this migration). ``mig_gpu_windows``
holds one row per MIG GPU per capacity window: its layout (instances as parallel arrays, in slice
order), free compute and memory slices, and the largest profile that can still be created with
and without a re-layout. ``shared_gpu_windows`` holds one row per shared GPU per window: its
memory, free VRAM and tenants (parallel arrays) with their memory now and their peak there.
docs/sql.md shows the queries. Every statement is idempotent (``IF NOT EXISTS``).
"""

from __future__ import annotations

from sinks.ddl import KAFKA_COLS, LC, TS, TtlDays, dedup_settings

_COUNTS = "Map(LowCardinality(String), UInt32)"

CAPACITY_MIG_COLUMNS: tuple[tuple[str, str], ...] = (
    ("mig_gpus", "Nullable(UInt32)"),
    ("mig_free_compute_slices", "Nullable(UInt32)"),
    ("mig_free_memory_slices", "Nullable(UInt32)"),
    ("mig_free_instances_by_profile", _COUNTS),
    ("mig_relayout_capacity_by_profile", _COUNTS),
    ("mig_pending_by_profile", _COUNTS),
    ("shared_gpus", "Nullable(UInt32)"),
    ("shared_vram_free_bytes", "Nullable(UInt64)"),
    ("shared_vram_largest_free_bytes", "Nullable(UInt64)"),
    ("shared_vram_stranded_bytes", "Nullable(UInt64)"),
    ("shared_vram_pending_bytes", "Nullable(UInt64)"),
)


def m8_fragmentation(ttl: TtlDays) -> list[str]:
    alter = ",\n".join(f"ADD COLUMN IF NOT EXISTS {name} {kind}" for name, kind in CAPACITY_MIG_COLUMNS)
    return [
        f"ALTER TABLE cluster_capacity\n{alter}",
        f"""CREATE TABLE IF NOT EXISTS mig_gpu_windows (
    `cluster` {LC} DEFAULT 'default',
    window_id String,
    window_start {TS},
    window_end {TS},
    node {LC},
    gpu_index UInt16,
    gpu_uuid String,
    profile_table {LC},
    instance_profiles Array({LC}),
    instance_starts Array(UInt8),
    instance_used Array(UInt8),
    instance_idle_s Array(Nullable(Float64)),
    free_compute_slices UInt8,
    free_memory_slices UInt8,
    largest_creatable_profile Nullable(String),
    largest_after_relayout Nullable(String),
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (cluster, window_start, window_id, gpu_uuid)
TTL toDateTime(window_start) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
        f"""CREATE TABLE IF NOT EXISTS shared_gpu_windows (
    `cluster` {LC} DEFAULT 'default',
    window_id String,
    window_start {TS},
    window_end {TS},
    node {LC},
    gpu_index UInt16,
    gpu_uuid String,
    mem_total_bytes UInt64,
    mem_used_bytes Nullable(UInt64),
    free_bytes UInt64,
    pod_namespaces Array({LC}),
    pod_names Array(String),
    pod_mem_bytes Array(Nullable(UInt64)),
    pod_peak_bytes Array(Nullable(UInt64)),
    {KAFKA_COLS}
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (cluster, window_start, window_id, gpu_uuid)
TTL toDateTime(window_start) + INTERVAL {ttl.state} DAY
{dedup_settings()}""",
    ]
