"""A small hand-made report data set (the shape ``collect_report_data`` returns) for the pure tests.

Names are deliberately hostile: the renderer must escape whatever the cluster calls things.
"""

from __future__ import annotations

from typing import Any

EVIL_POD = '<script>alert("pod")</script>'
EVIL_TEAM = 'ml&"ops"<b>'
EVIL_REASON = "0/2 nodes are available: <img src=x onerror=alert(1)> 2 Insufficient nvidia.com/gpu."

GIB = 2**30
BUCKETS = ["2026-01-05T09:00:00Z", "2026-01-05T09:05:00Z", "2026-01-05T09:10:00Z", "2026-01-05T09:15:00Z"]


def sample_data() -> dict[str, Any]:
    util = []
    for i, bucket in enumerate(BUCKETS):
        util.append({"bucket": bucket, "team_label": "nlp", "gpus_allocated": 4.0, "gpus_busy": 4.0, "gpus_idle": 0.0,
                     "avg_sm_util_pct": 90.0 - i, "cost_usd": 0.8})
        util.append({"bucket": bucket, "team_label": EVIL_TEAM, "gpus_allocated": 2.0, "gpus_busy": 2.0 - (i > 1),
                     "gpus_idle": float(i > 1), "avg_sm_util_pct": None if i == 2 else 40.0, "cost_usd": 0.4})
    capacity = [{"bucket": b, "windows": 5, "gpus_total": 16.0, "gpus_allocated": 6.0 + (i == 3) * 4,
                 "gpus_busy": 5.0, "gpus_idle_allocated": 1.0 + (i == 3) * 4, "gpus_free": 10.0 - (i == 3) * 4,
                 "max_stranded_gpus": 6 if i in (1, 2) else 0, "avg_stranded_gpus": 4.5 if i in (1, 2) else 0.0,
                 "min_largest_free_block": 5, "max_pending_gpu_demand": 8 if i in (1, 2) else 0,
                 "max_pending_pods": 1 if i in (1, 2) else 0} for i, b in enumerate(BUCKETS)]
    return {
        "bucket_s": 300,
        "summary": [{"windows": 40, "pods": 3, "gpu_hours_allocated": 2.0, "gpu_hours_busy": 1.75,
                     "gpu_hours_idle": 0.25, "gpu_hours_gap": 0.0, "window_cost_usd": 4.8, "list_cost_usd": 5.0,
                     "first_window": BUCKETS[0], "last_window": "2026-01-05T09:20:00Z",
                     "gpu_hours_capacity": 5.333333, "gpu_hours_allocated_capacity": 2.0,
                     "gpu_hours_idle_allocated": 0.25, "gpu_hours_unallocated": 3.333333, "max_stranded_gpus": 6,
                     "max_pending_gpu_demand": 8, "pods_ended": 3, "lifecycle_gpu_hours": 2.0,
                     "lifecycle_idle_gpu_hours": 0.25, "lifecycle_cost_usd": 4.8}],
        "top_teams": [{"team": "nlp", "gpu_hours": 1.333333, "cost_usd": 3.2},
                      {"team": EVIL_TEAM, "gpu_hours": 0.666667, "cost_usd": 1.6}],
        "top_pods": [{"namespace": "ml", "pod": EVIL_POD, "team": EVIL_TEAM, "project": "p", "gpu_hours": 0.666667,
                      "idle_gpu_hours": 0.25, "avg_sm_util_pct": 40.0, "peak_mem_bytes": 2**34, "energy_kwh": 0.1,
                      "cost_usd": 1.6}],
        "idle_by_team_and_class": [
            {"team": EVIL_TEAM, "idle_class": "vram_held", "idle_gpu_hours": 0.2, "gap_gpu_hours": 0.0, "pods": 1,
             "idle_cost_usd": 0.48},
            {"team": EVIL_TEAM, "idle_class": "no_process", "idle_gpu_hours": 0.05, "gap_gpu_hours": 0.0, "pods": 1,
             "idle_cost_usd": 0.12}],
        "pending_distribution": [
            {"bucket": "< 1m", "bucket_floor_s": 0.0, "pods": 2, "gpus": 6, "pending_hours": 0.0, "max_pending_s": 0.0},
            {"bucket": "5-15m", "bucket_floor_s": 600.0, "pods": 1, "gpus": 8, "pending_hours": 0.166667,
             "max_pending_s": 600.0}],
        "pending_reasons": [{"reason": EVIL_REASON, "pods": 1, "pending_hours": 0.166667, "scheduler_events": 4}],
        "fragmentation_over_time": [{"hour": "2026-01-05T09:00:00Z", "windows": 20, "avg_gpus_total": 16.0,
                                     "avg_gpus_free": 9.0, "min_largest_free_block": 5, "max_stranded_gpus": 6,
                                     "stranded_gpu_hours": 0.75, "max_pending_gpu_demand": 8,
                                     "max_pending_pods": 1}],
        "nodes_to_scale_down": [],
        "cost_by_team": [
            {"team": "nlp", "project": "chat", "gpu_hours": 1.333333, "idle_gpu_hours": 0.0, "window_cost_usd": 3.2,
             "list_cost_usd": 3.333333, "idle_list_cost_usd": 0.0, "idle_window_cost_usd": 0.0},
            {"team": EVIL_TEAM, "project": "p", "gpu_hours": 0.666667, "idle_gpu_hours": 0.25, "window_cost_usd": 1.6,
             "list_cost_usd": 1.666667, "idle_list_cost_usd": 0.625, "idle_window_cost_usd": 0.6}],
        "cost_per_unit_of_work": [],
        "alerts_by_type": [{"type": "idle_gpu", "alerts": 2, "still_firing": 1, "avg_duration_s": 600.0}],
        "lifecycle_timeline": [],
        "pod_vram_peaks": [
            {"namespace": "ml", "pod": "big-train", "team": "nlp", "gpu_model": "NVIDIA H100 80GB HBM3", "gpus": 8,
             "gpu_hours": 1.066667, "peak_mem_bytes": 70 * GIB, "p95_mem_bytes": 68 * GIB, "gpu_mem_bytes": 80 * GIB,
             "peak_share": 0.875},
            {"namespace": "ml", "pod": EVIL_POD, "team": EVIL_TEAM, "gpu_model": "NVIDIA H100 80GB HBM3", "gpus": 2,
             "gpu_hours": 0.6, "peak_mem_bytes": 6 * GIB, "p95_mem_bytes": 5 * GIB, "gpu_mem_bytes": 80 * GIB,
             "peak_share": 0.075}],
        "allocator_by_pod": [
            {"namespace": "ml", "pod": "big-train", "team": "nlp", "node": "gpu-b", "gpu_uuid": "GPU-b0",
             "max_reserved_unused_bytes": 48 * GIB, "reserved_bytes": 60 * GIB, "allocated_bytes": 12 * GIB,
             "alloc_retries": 19, "alloc_ooms": 1, "peak_mem_bytes": 60 * GIB}],
        "firing_alerts": [
            {"alert_type": "idle_gpu", "severity": "warning", "kind": "pod", "namespace": "ml", "name": EVIL_POD,
             "node": "gpu-a", "first_at": "2026-01-05T09:08:00Z", "age_s": 600, "summary": "idle for 10m"}],
        "utilisation_by_team": util,
        "capacity_over_time": capacity,
        "longest_waiting_pods": [
            {"namespace": "ml", "name": "big-train", "team": "nlp", "node": "gpu-b", "gpus": 8,
             "created_at": "2026-01-05T09:02:00Z", "scheduled_at": "2026-01-05T09:12:00Z",
             "started_at": "2026-01-05T09:12:00Z", "finished_at": None, "pending_s": 600.0, "running_s": 480.0,
             "end_reason": "Running", "pending_reasons": [EVIL_REASON], "gpu_hours": 1.066667,
             "idle_gpu_hours": 0.0, "cost_usd": 2.4},
            {"namespace": "ml", "name": EVIL_POD, "team": EVIL_TEAM, "node": "gpu-a", "gpus": 2,
             "created_at": "2026-01-05T09:00:00Z", "scheduled_at": "2026-01-05T09:00:00Z",
             "started_at": "2026-01-05T09:00:00Z", "finished_at": "2026-01-05T09:18:00Z", "pending_s": 0.0,
             "running_s": 1080.0, "end_reason": "Deleted", "pending_reasons": [], "gpu_hours": 0.6,
             "idle_gpu_hours": 0.25, "cost_usd": 1.6}],
    }
