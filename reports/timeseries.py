"""Time series and per-pod rows the HTML report plots, beside the canned analyses.

``reports.analyses`` answers the report's questions as totals (per team, per class, per hour);
charts over time need finer, evenly spaced buckets whose size follows the span of the data (a
30-minute replay and a month of production data should both give a readable line). Each function
here is one SQL query over the sink's tables, the same on chDB and on a server, through the same
:class:`~reports.reader.SqlReader` protocol, and returns plain JSON-friendly rows.

Conventions follow ``reports.analyses``: deduplicated reads (``FINAL``), ``(none)`` for an empty
team, UTC ISO timestamps, the rows of a :class:`~reports.reader.Period` (the whole history by
default). GPU counts are time-averaged over the part of the bucket the data covers (GPU-seconds /
covered seconds, with ``covered_s`` in each row): a bucket the data only partly covers (the first and
last of a series, a replay shorter than a bucket) shows the fleet as it was in that time, not diluted
over time nobody measured.
"""

from __future__ import annotations

from datetime import datetime

from reports.analyses import LIFECYCLE_END
from reports.reader import IN_CLUSTER, WHOLE_HISTORY, Period, Rows, SqlReader, query_rows, round_floats
from sinks.rollups import GPU_DAILY, POD_DAILY, TEAM_DAILY, TEAM_HOURLY

NICE_BUCKETS_S: tuple[int, ...] = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
                                   2 * 86400, 7 * 86400)
"""Bucket sizes a chart may use; the smallest that keeps the series within ``max_points``."""

_WINDOW_MS = "dateDiff('millisecond', window_start, window_end)"


def _covered(first: str = "window_start", last: str = "window_end") -> str:
    """Seconds of a bucket its windows cover: from the first window's start to the last one's end, at
    least one millisecond (windows are aligned to the window size, which divides every bucket size)."""
    return f"greatest(dateDiff('millisecond', min({first}), max({last})), 1) / 1000"


def _epoch(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def data_span(reader: SqlReader, period: Period = WHOLE_HISTORY) -> Rows:
    """First and last instant covered by pod windows (their daily rollup's first and last window) and
    capacity windows (one row; None when empty)."""
    return query_rows(reader, f"""
SELECT minOrNull(start) AS first_at, maxOrNull(end) AS last_at
FROM (
    SELECT min(first_start) AS start, max(last_end) AS end FROM {period.rows(TEAM_DAILY)} WHERE {IN_CLUSTER}
    UNION ALL
    SELECT min(window_start) AS start, max(window_end) AS end FROM cluster_capacity
    WHERE {IN_CLUSTER}{period.at_or_after("window_start")}
)
WHERE start > toDateTime64(0, 3, 'UTC')""", period.parameters)


def bucket_for_span(span_s: float, max_points: int = 120) -> int:
    """The smallest nice bucket size (seconds) that cuts ``span_s`` into at most ``max_points`` buckets."""
    for bucket in NICE_BUCKETS_S:
        if span_s / bucket <= max_points:
            return bucket
    return NICE_BUCKETS_S[-1]


def choose_bucket_s(reader: SqlReader, max_points: int = 120, period: Period = WHOLE_HISTORY) -> int:
    span = data_span(reader, period)
    first, last = (_epoch(span[0]["first_at"]), _epoch(span[0]["last_at"])) if span else (None, None)
    if first is None or last is None:
        return NICE_BUCKETS_S[0]
    return bucket_for_span(last - first, max_points)


def utilisation_by_team(reader: SqlReader, bucket_s: int, period: Period = WHOLE_HISTORY) -> Rows:
    """Per time bucket and team: GPUs allocated, busy and idle (time-averaged), SM utilisation, cost.

    ``avg_sm_util_pct`` is weighted by allocated seconds and ignores windows without a reading, so a
    gap in the samples is not shown as 0 % utilisation. Buckets of whole days or hours read the
    windows' daily or hourly rollup (each row in the bucket of its first window: rows from a start
    inside an hour or a day hold no period), shorter ones the windows.
    """
    if bucket_s % 3600:
        source, time = f"pod_windows FINAL WHERE {IN_CLUSTER}{period.at_or_after('window_start')}", "window_start"
        sums = ("allocated_s", "busy_s", "idle_s", "cost_usd")
        util = ("sumIf(avg_sm_util_pct * allocated_s, avg_sm_util_pct IS NOT NULL)"
                "\n           / nullIf(sumIf(allocated_s, avg_sm_util_pct IS NOT NULL), 0)")
        first, last = "window_start", "window_end"
    else:
        rollup = TEAM_DAILY if bucket_s % 86400 == 0 else TEAM_HOURLY
        source, time = f"{period.rows(rollup)} WHERE {IN_CLUSTER}", "first_start"
        sums = ("allocated_gpu_s", "busy_gpu_s", "idle_gpu_s", "cost_total_usd")
        util = "sum(util_pct_x_gpu_s) / nullIf(sum(util_gpu_s), 0)"
        first, last = "first_start", "last_end"
    allocated, busy, idle, cost = sums
    return round_floats(query_rows(reader, f"""
WITH w AS (
    SELECT toStartOfInterval({time}, toIntervalSecond({{bucket_s:UInt32}})) AS bucket, *
    FROM {source}
),
covered AS (
    SELECT bucket, {_covered(first, last)} AS covered_s FROM w GROUP BY bucket
)
SELECT w.bucket AS bucket, if(team = '', '(none)', team) AS team_label, any(c.covered_s) AS covered_s,
       sum({allocated}) / any(c.covered_s) AS gpus_allocated,
       sum({busy}) / any(c.covered_s) AS gpus_busy,
       sum({idle}) / any(c.covered_s) AS gpus_idle,
       {util} AS avg_sm_util_pct,
       sum({cost}) AS cost_usd
FROM w INNER JOIN covered AS c ON c.bucket = w.bucket
GROUP BY bucket, team_label
ORDER BY bucket, team_label""", {"bucket_s": int(bucket_s), **period.parameters}))


def capacity_over_time(reader: SqlReader, bucket_s: int, period: Period = WHOLE_HISTORY) -> Rows:
    """Per time bucket: fleet GPUs by state (time-averaged), stranded GPUs (peak and average), pending demand.

    Stranded GPUs are free GPUs that no pending pod can use because they are spread over nodes
    (see the fragmentation alert); the peak uses the stream jobs' in-window maximum when sent.
    """
    return round_floats(query_rows(reader, f"""
WITH {_covered()} AS covered
SELECT toStartOfInterval(window_start, toIntervalSecond({{bucket_s:UInt32}})) AS bucket,
       count() AS windows, covered AS covered_s,
       sum(coalesce(gpu_s_total, gpus_total * {_WINDOW_MS} / 1000)) / covered AS gpus_total,
       sum(coalesce(gpu_s_allocated, gpus_allocated * {_WINDOW_MS} / 1000)) / covered AS gpus_allocated,
       sum(coalesce(gpu_s_busy, gpus_busy * {_WINDOW_MS} / 1000)) / covered AS gpus_busy,
       sum(coalesce(gpu_s_idle_allocated, gpus_idle_allocated * {_WINDOW_MS} / 1000)) / covered
           AS gpus_idle_allocated,
       sum(coalesce(gpu_s_free, gpus_free * {_WINDOW_MS} / 1000)) / covered AS gpus_free,
       max(coalesce(stranded_gpus_max, stranded_gpus)) AS max_stranded_gpus,
       sum(stranded_gpus * {_WINDOW_MS} / 1000) / covered AS avg_stranded_gpus,
       min(largest_free_block) AS min_largest_free_block,
       max(pending_gpu_demand) AS max_pending_gpu_demand,
       max(pending_pods) AS max_pending_pods
FROM cluster_capacity FINAL
WHERE {IN_CLUSTER}{period.at_or_after("window_start")}
GROUP BY bucket
ORDER BY bucket""", {"bucket_s": int(bucket_s), **period.parameters}))


def longest_waiting_pods(reader: SqlReader, limit: int = 15, period: Period = WHOLE_HISTORY) -> Rows:
    """The GPU pods that waited longest to be scheduled (then the earliest), with their whole lifecycle."""
    return round_floats(query_rows(reader, f"""
SELECT namespace, name, if(team = '', '(none)', team) AS team, node, gpus, created_at, scheduled_at,
       started_at, finished_at, pending_s, running_s, end_reason, pending_reasons, gpu_hours,
       idle_gpu_hours, cost_usd
FROM pod_lifecycle FINAL
WHERE {IN_CLUSTER}{period.after(LIFECYCLE_END)}
ORDER BY pending_s DESC, created_at, namespace, name
LIMIT {int(limit)}""", period.parameters))



def pod_vram_peaks(reader: SqlReader, limit: int = 40, period: Period = WHOLE_HISTORY) -> Rows:
    """Per pod: the VRAM it used at its peak and at its 95th percentile window, against the memory of
    the GPUs it held (NVML's total from the samples, else the node's advertised GPU memory: raw samples
    expire first), biggest GPU-hours first: who could move to a smaller MIG slice or share a GPU. Pods
    without a VRAM reading are left out (no made-up zero); GPU-hours count the windows with a reading.

    The pods, their GPU-hours, GPUs, peak and GPU memory come from ``pod_daily`` (``mem_gpu_s``: the
    allocated seconds of windows with a reading); only the percentile reads raw windows, those of the
    ``limit`` pods listed (the windows' sorting key starts with the namespace and the pod's uid), so the
    cost follows the answer's rows, not the history's length. The percentile covers the windows the raw
    TTL keeps (NULL once they have all expired)."""
    return round_floats(query_rows(reader, f"""
WITH g AS (SELECT gpu_uuid, max(mem_total_bytes) AS gpu_mem_bytes FROM {period.rows(GPU_DAILY)} WHERE {IN_CLUSTER}
           GROUP BY gpu_uuid),
     n AS (SELECT node, argMax(gpu_memory_bytes, ts) AS node_gpu_mem_bytes FROM node_states WHERE {IN_CLUSTER}
           GROUP BY node),
     top AS (
         SELECT d.namespace AS namespace, d.pod AS pod, if(d.team = '', '(none)', d.team) AS team,
                any(d.gpu_model) AS gpu_model, uniqExact(d.gpu_uuid) AS gpus,
                sum(d.mem_gpu_s) / 3600 AS gpu_hours, max(d.peak_mem_bytes) AS peak_mem_bytes,
                max(coalesce(g.gpu_mem_bytes, n.node_gpu_mem_bytes)) AS gpu_mem_bytes,
                groupUniqArray(d.pod_uid) AS pod_uids
         FROM {period.rows(POD_DAILY)} AS d
         LEFT JOIN g ON g.gpu_uuid = d.gpu_uuid
         LEFT JOIN n ON n.node = d.node
         WHERE d.peak_mem_bytes IS NOT NULL AND d.{IN_CLUSTER}
         GROUP BY namespace, pod, team
         ORDER BY round(gpu_hours, 9) DESC, namespace, pod
         LIMIT {int(limit)}),
     p AS (
         SELECT namespace, pod, if(team = '', '(none)', team) AS team,
                CAST(quantile(0.95)(max_mem_used_bytes) AS Nullable(Float64)) AS p95_mem_bytes
         FROM pod_windows FINAL
         WHERE (namespace, pod_uid) IN (SELECT namespace, arrayJoin(pod_uids) FROM top)
           AND max_mem_used_bytes IS NOT NULL AND {IN_CLUSTER}{period.at_or_after("window_start")}
         GROUP BY namespace, pod, team)
SELECT t.namespace AS namespace, t.pod AS pod, t.team AS team, t.gpu_model AS gpu_model, t.gpus AS gpus,
       t.gpu_hours AS gpu_hours, t.peak_mem_bytes AS peak_mem_bytes, p.p95_mem_bytes AS p95_mem_bytes,
       t.gpu_mem_bytes AS gpu_mem_bytes, t.peak_mem_bytes / nullIf(t.gpu_mem_bytes, 0) AS peak_share
FROM top AS t
LEFT JOIN p ON p.namespace = t.namespace AND p.pod = t.pod AND p.team = t.team
ORDER BY round(gpu_hours, 9) DESC, namespace, pod""", period.parameters))


def allocator_by_pod(reader: SqlReader, limit: int = 40, period: Period = WHOLE_HISTORY) -> Rows:
    """Per pod and GPU that reported its caching allocator's statistics: the most VRAM reserved but
    unused (reserved - allocated) in any window, the last reserved and allocated figures, and the
    allocation retries and OOMs over the period; retries and OOMs first (fragmentation that hurts),
    then the most unused. Pods without allocator statistics are left out (no made-up zero).

    ``pod_daily`` ranks the pods and GPUs (a window's allocator figures come together:
    ``stream_jobs.allocator``), then the figures are taken from the raw windows of the ``limit`` listed
    only (the windows' sorting key starts with the namespace, the pod's uid and the GPU): the peak VRAM
    over the windows with allocator statistics is not a rollup measure. The cost follows the answer's
    rows, not the history's length."""
    return round_floats(query_rows(reader, f"""
WITH top AS (
    SELECT namespace, pod, if(team = '', '(none)', team) AS team_label, node, gpu_uuid,
           max(peak_reserved_unused_bytes) AS unused, sum(alloc_retries_total) AS retries,
           sum(alloc_ooms_total) AS ooms, groupUniqArray(pod_uid) AS pod_uids
    FROM {period.rows(POD_DAILY)}
    WHERE peak_reserved_unused_bytes IS NOT NULL AND {IN_CLUSTER}
    GROUP BY namespace, pod, team_label, node, gpu_uuid
    ORDER BY retries + ooms DESC, unused DESC, namespace, pod, gpu_uuid
    LIMIT {int(limit)})
SELECT namespace, pod, if(team = '', '(none)', team) AS team, node, gpu_uuid,
       max(max_reserved_unused_bytes) AS max_reserved_unused_bytes,
       argMax(alloc_reserved_bytes, window_start) AS reserved_bytes,
       argMax(alloc_allocated_bytes, window_start) AS allocated_bytes,
       sum(alloc_retries) AS alloc_retries, sum(alloc_ooms) AS alloc_ooms,
       max(max_mem_used_bytes) AS peak_mem_bytes
FROM (SELECT * FROM pod_windows FINAL
      WHERE (namespace, pod_uid, gpu_uuid) IN (SELECT namespace, arrayJoin(pod_uids), gpu_uuid FROM top)
        AND max_reserved_unused_bytes IS NOT NULL AND {IN_CLUSTER}{period.at_or_after("window_start")})
GROUP BY namespace, pod, team, node, gpu_uuid
ORDER BY alloc_retries + alloc_ooms DESC, max_reserved_unused_bytes DESC, namespace, pod, gpu_uuid
LIMIT {int(limit)}""", period.parameters))


def firing_alerts(reader: SqlReader, limit: int = 200) -> Rows:
    """Alerts whose last transition is ``firing``, most severe and oldest first, with their age at the
    end of the data (the store's latest window, not the wall clock: a replayed or demo history is dated
    in the past or the future)."""
    return round_floats(query_rows(reader, f"""
WITH (SELECT max(last_end) FROM team_daily WHERE {IN_CLUSTER}) AS data_end
SELECT alert_type, current_severity AS severity, kind, namespace, name, node, first_at,
       dateDiff('second', first_at, greatest(data_end, last_at)) AS age_s, last_summary AS summary
FROM v_alerts
WHERE current_state = 'firing' AND {IN_CLUSTER}
ORDER BY multiIf(severity = 'critical', 0, severity = 'warning', 1, 2), first_at, alert_type, namespace, name
LIMIT {int(limit)}"""))
