"""MIG and shared-GPU VRAM fragmentation over time, for the HTML report's chart (``reports.timeseries``'
conventions: one query, buckets that follow the span of the data, plain rows).

Per bucket, the peaks over its capacity windows: MIG free compute and memory slices, empty MIG
instances and the MIG devices pending pods ask for; on shared GPUs, free VRAM, the largest free
piece (its minimum), stranded VRAM and the VRAM pending pods declare (GiB). No rows on a fleet
without MIG or shared GPUs (migration 8's columns are NULL there).
"""

from __future__ import annotations

from reports.reader import IN_CLUSTER, WHOLE_HISTORY, Period, Rows, SqlReader, query_rows, round_floats

_GIB = "pow(2, 30)"


def fragmentation_over_time(reader: SqlReader, bucket_s: int, period: Period = WHOLE_HISTORY) -> Rows:
    return round_floats(query_rows(reader, f"""
SELECT toStartOfInterval(window_start, toIntervalSecond({{bucket_s:UInt32}})) AS bucket,
       max(mig_gpus) AS max_mig_gpus,
       max(mig_free_compute_slices) AS max_mig_free_compute_slices,
       max(mig_free_memory_slices) AS max_mig_free_memory_slices,
       if(max(mig_gpus) IS NULL, NULL, max(arraySum(mapValues(mig_free_instances_by_profile))))
           AS max_mig_empty_instances,
       if(max(mig_gpus) IS NULL, NULL, max(arraySum(mapValues(mig_pending_by_profile))))
           AS max_mig_pending_devices,
       max(shared_gpus) AS max_shared_gpus,
       max(shared_vram_free_bytes) / {_GIB} AS max_shared_vram_free_gib,
       min(shared_vram_largest_free_bytes) / {_GIB} AS min_shared_vram_largest_free_gib,
       max(shared_vram_stranded_bytes) / {_GIB} AS max_shared_vram_stranded_gib,
       max(shared_vram_pending_bytes) / {_GIB} AS max_shared_vram_pending_gib
FROM cluster_capacity FINAL
WHERE {IN_CLUSTER}{period.at_or_after("window_start")} AND (mig_gpus IS NOT NULL OR shared_gpus IS NOT NULL)
GROUP BY bucket
ORDER BY bucket""", {"bucket_s": int(bucket_s), **period.parameters}))
