"""The canned analyses of ``gpulens report``, as functions returning plain data.

Each analysis is one SQL query over the sink's tables (the same SQL on chDB and on a server) and
returns ``list[dict]`` with JSON-friendly values, so the CLI prints them, ``--json`` emits them and
an HTML report can reuse them unchanged. :func:`run_report` runs them all.

Every analysis sees one cluster (``cluster = {cluster:String}`` in each query), read through
:mod:`reports.reader`: :func:`~reports.reader.scoped` picks the cluster and refuses to mix them.

Conventions: rows come from the deduplicated view of each table (``FINAL``); an empty team or
project is shown as ``(none)``; hours are GPU-hours; money is USD. ``window_cost_usd`` is the cost
the stream jobs attached to each window; ``list_cost_usd`` re-prices GPU-hours with the sink's
price table (``gpu_prices``), so a price change is visible without replaying.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from reports.reader import (
    IN_CLUSTER,
    START,
    WHOLE_HISTORY,
    Period,
    Rows,
    SqlReader,
    data_period,
    query_rows,
    round_floats,
    scoped,
)
from reports.reader import ClusterError as ClusterError  # raised by run_report; callers catch it from here
from sinks import rollups
from sinks.rollups import GPU_DAILY, POD_DAILY, PRICE, PROGRESS_DAILY, SHARED_GPU_DAILY, TEAM_DAILY

if TYPE_CHECKING:  # settings (pydantic) only where the advisor runs: `gpulens report --help` stays fast
    from common.settings import AdviseThresholds

NONE = "'(none)'"


_WINDOW_S = "(dateDiff('millisecond', window_start, window_end) / 1000)"
"""Window length in seconds: capacity counts are states, integrals (gpu_s_*) are preferred when sent."""


LIFECYCLE_END = "coalesce(finished_at, created_at + toIntervalMillisecond(toInt64((pending_s + running_s) * 1000)))"
"""When a lifecycle record's pod ended (a record without a finish time: its creation plus the time it
pended and ran); a period holds the records of the pods that ended after its start."""


def _label(column: str) -> str:
    return f"if({column} = '', {NONE}, {column})"


def summary(reader: SqlReader, period: Period = WHOLE_HISTORY) -> Rows:
    """Fleet totals: allocated, busy, idle GPU-hours and cost from windows (their daily rollup);
    capacity from capacity windows."""
    windows = query_rows(reader, f"""
SELECT sum(windows) AS windows, uniqExactMerge(pods) AS pods,
       sum(allocated_gpu_s) / 3600 AS gpu_hours_allocated, sum(busy_gpu_s) / 3600 AS gpu_hours_busy,
       sum(idle_gpu_s) / 3600 AS gpu_hours_idle, sum(gap_gpu_s) / 3600 AS gpu_hours_gap,
       sum(cost_total_usd) AS window_cost_usd,
       sum(r.allocated_gpu_s / 3600 * coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
       minOrNull(first_start) AS first_window, maxOrNull(last_end) AS last_window
FROM {period.rows(TEAM_DAILY)} AS r LEFT JOIN {PRICE} AS p ON p.gpu_model = r.gpu_model
WHERE {IN_CLUSTER}""", period.parameters)
    capacity = query_rows(reader, f"""
SELECT sum(coalesce(gpu_s_total, gpus_total * {_WINDOW_S})) / 3600 AS gpu_hours_capacity,
       sum(coalesce(gpu_s_allocated, gpus_allocated * {_WINDOW_S})) / 3600 AS gpu_hours_allocated_capacity,
       sum(coalesce(gpu_s_idle_allocated, gpus_idle_allocated * {_WINDOW_S})) / 3600 AS gpu_hours_idle_allocated,
       sum(coalesce(gpu_s_free, gpus_free * {_WINDOW_S})) / 3600 AS gpu_hours_unallocated,
       max(coalesce(stranded_gpus_max, stranded_gpus)) AS max_stranded_gpus,
       max(pending_gpu_demand) AS max_pending_gpu_demand
FROM cluster_capacity FINAL WHERE {IN_CLUSTER}{period.at_or_after("window_start")}""", period.parameters)
    lifecycle = query_rows(reader, f"""
SELECT count() AS pods_ended, sum(gpu_hours) AS lifecycle_gpu_hours, sum(idle_gpu_hours) AS lifecycle_idle_gpu_hours,
       sum(cost_usd) AS lifecycle_cost_usd
FROM pod_lifecycle FINAL WHERE {IN_CLUSTER}{period.after(LIFECYCLE_END)}""", period.parameters)
    return round_floats([windows[0] | capacity[0] | lifecycle[0]])


_TOP_MEASURES = """sum(allocated_gpu_s) / 3600 AS gpu_hours, sum(busy_gpu_s) / 3600 AS busy_gpu_hours,
       sum(idle_gpu_s) / 3600 AS idle_gpu_hours,
       sum(util_pct_x_gpu_s) / nullIf(sum(util_gpu_s), 0) AS avg_sm_util_pct,
       max(peak_mem_bytes) AS peak_mem_bytes, sum(energy_total_j) / 3600000 AS energy_kwh,
       sum(cost_total_usd) AS cost_usd"""
"""The top consumers' figures, from the windows' daily rollups: per team or project ``team_daily``,
per pod ``pod_daily`` (the same measure columns, :mod:`sinks.rollups`)."""


def top_consumers(reader: SqlReader, by: str, limit: int = 20, period: Period = WHOLE_HISTORY) -> Rows:
    """GPU-hours, utilisation and cost per team, project or pod, biggest first (from the windows'
    daily rollups); equal figures as shown (rounded) by name, whatever order their sums were added in."""
    keys = {
        "team": f"{_label('team')} AS team",
        "project": f"{_label('team')} AS team, {_label('project')} AS project",
        "pod": f"namespace, pod, {_label('team')} AS team, {_label('project')} AS project",
    }[by]
    group = {"team": "team", "project": "team, project", "pod": "namespace, pod, team, project"}[by]
    source = period.rows(POD_DAILY if by == "pod" else TEAM_DAILY)
    return round_floats(query_rows(reader, f"""
SELECT {keys},
       {_TOP_MEASURES}
FROM {source}
WHERE {IN_CLUSTER}
GROUP BY {group}
ORDER BY round(gpu_hours, 6) DESC, {group}
LIMIT {int(limit)}""", period.parameters))


def idle_by_team_and_class(reader: SqlReader, period: Period = WHOLE_HISTORY) -> Rows:
    """Idle GPU-hours by team and why: no process at all, VRAM held but no compute, or partly idle
    windows (:data:`sinks.rollups.IDLE_CLASS`), from the windows' daily rollup.

    Gaps in the data are reported separately (missing data is never idle).
    """
    return round_floats(query_rows(reader, f"""
SELECT {_label('team')} AS team, idle_class,
       sum(idle_gpu_s) / 3600 AS idle_gpu_hours, sum(gap_gpu_s) / 3600 AS gap_gpu_hours,
       uniqExactIfMerge(idle_pods) AS pods, sum(idle_cost_usd) AS idle_cost_usd
FROM {period.rows(TEAM_DAILY)}
WHERE {IN_CLUSTER}
GROUP BY team, idle_class
HAVING idle_gpu_hours > 0 OR gap_gpu_hours > 0
ORDER BY idle_gpu_hours DESC, team, idle_class""", period.parameters))


def pending_distribution(reader: SqlReader, period: Period = WHOLE_HISTORY) -> Rows:
    """How long GPU pods waited to be scheduled, in buckets, from the lifecycle records."""
    return round_floats(query_rows(reader, f"""
SELECT multiIf(pending_s < 60, '< 1m', pending_s < 300, '1-5m', pending_s < 900, '5-15m',
               pending_s < 3600, '15-60m', '>= 1h') AS bucket,
       min(pending_s) AS bucket_floor_s, count() AS pods, sum(gpus) AS gpus,
       sum(pending_s) / 3600 AS pending_hours, max(pending_s) AS max_pending_s
FROM pod_lifecycle FINAL
WHERE {IN_CLUSTER}{period.after(LIFECYCLE_END)}
GROUP BY bucket
ORDER BY bucket_floor_s""", period.parameters))


def pending_reasons(reader: SqlReader, limit: int = 20, period: Period = WHOLE_HISTORY) -> Rows:
    """Why pods waited: the reasons on lifecycle records, with the scheduler's failure events."""
    return round_floats(query_rows(reader, f"""
SELECT reason, sum(pods) AS pods, sum(pending_hours) AS pending_hours, sum(events) AS scheduler_events
FROM (
    SELECT arrayJoin(if(empty(pending_reasons), ['(none recorded)'], pending_reasons)) AS reason,
           count() AS pods, sum(pending_s) / 3600 AS pending_hours, 0 AS events
    FROM pod_lifecycle FINAL WHERE pending_s > 0 AND {IN_CLUSTER}{period.after(LIFECYCLE_END)} GROUP BY reason
    UNION ALL
    SELECT message AS reason, 0 AS pods, 0 AS pending_hours, sum(count) AS events
    FROM k8s_events FINAL
    WHERE category = 'scheduling_failed' AND {IN_CLUSTER}{period.at_or_after("ts")} GROUP BY reason
)
GROUP BY reason
ORDER BY pending_hours DESC, scheduler_events DESC, reason
LIMIT {int(limit)}""", period.parameters))


def fragmentation_over_time(reader: SqlReader, period: Period = WHOLE_HISTORY) -> Rows:
    """Per hour: free GPUs, the largest free block, stranded GPUs and pending GPU demand."""
    return round_floats(query_rows(reader, f"""
SELECT toStartOfHour(window_start) AS hour, count() AS windows,
       avg(gpus_total) AS avg_gpus_total, avg(gpus_free) AS avg_gpus_free,
       min(largest_free_block) AS min_largest_free_block,
       max(coalesce(stranded_gpus_max, stranded_gpus)) AS max_stranded_gpus,
       sum(stranded_gpus * dateDiff('millisecond', window_start, window_end)) / 3600000 AS stranded_gpu_hours,
       max(pending_gpu_demand) AS max_pending_gpu_demand, max(pending_pods) AS max_pending_pods
FROM cluster_capacity FINAL
WHERE {IN_CLUSTER}{period.at_or_after("window_start")}
GROUP BY hour
ORDER BY hour""", period.parameters))


def nodes_to_scale_down(reader: SqlReader, limit: int = 20, period: Period = WHOLE_HISTORY) -> Rows:
    """Nodes whose GPUs sat unallocated, with the cost burned (unallocated GPU-hours x list price)."""
    return round_floats(query_rows(reader, f"""
WITH s AS (
    SELECT node, any(gpu_model) AS gpu_model, uniqExact(gpu_uuid) AS gpus,
           sum(sampled_s) / 3600 AS observed_gpu_hours, sum(unallocated_s) / 3600 AS unallocated_gpu_hours,
           sum(allocated_idle_s) / 3600 AS allocated_idle_gpu_hours,
           min(first_ts) AS first_seen, max(last_ts) AS last_seen
    FROM {period.rows(GPU_DAILY)} WHERE {IN_CLUSTER} GROUP BY node
),
a AS (
    SELECT subject_node AS node, countIf(state = 'firing') AS idle_node_alerts
    FROM alerts FINAL WHERE type = 'idle_node' AND {IN_CLUSTER}{period.at_or_after("at")} GROUP BY node
)
SELECT s.node AS node, s.gpu_model AS gpu_model, s.gpus AS gpus, s.observed_gpu_hours AS observed_gpu_hours,
       s.unallocated_gpu_hours AS unallocated_gpu_hours,
       s.unallocated_gpu_hours / nullIf(s.observed_gpu_hours, 0) AS unallocated_share,
       s.allocated_idle_gpu_hours AS allocated_idle_gpu_hours,
       s.unallocated_gpu_hours * coalesce(p.usd_per_gpu_hour, 0) AS cost_burned_usd,
       coalesce(a.idle_node_alerts, 0) AS idle_node_alerts, s.first_seen AS first_seen, s.last_seen AS last_seen
FROM s
LEFT JOIN {PRICE} AS p ON p.gpu_model = s.gpu_model
LEFT JOIN a ON a.node = s.node
WHERE s.unallocated_gpu_hours > 0
ORDER BY unallocated_share DESC, cost_burned_usd DESC, node
LIMIT {int(limit)}""", period.parameters))


def cost_by_team(reader: SqlReader, period: Period = WHOLE_HISTORY) -> Rows:
    """Cost per team and project: window cost, list-price cost, and the idle part of it (from the
    windows' daily rollup)."""
    return round_floats(query_rows(reader, f"""
SELECT {_label('r.team')} AS team, {_label('r.project')} AS project,
       sum(allocated_gpu_s) / 3600 AS gpu_hours, sum(idle_gpu_s) / 3600 AS idle_gpu_hours,
       sum(cost_total_usd) AS window_cost_usd,
       sum(allocated_gpu_s / 3600 * coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
       sum(idle_gpu_s / 3600 * coalesce(p.usd_per_gpu_hour, 0)) AS idle_list_cost_usd,
       sum(idle_cost_usd) AS idle_window_cost_usd
FROM {period.rows(TEAM_DAILY)} AS r
LEFT JOIN {PRICE} AS p ON p.gpu_model = r.gpu_model
WHERE {IN_CLUSTER}
GROUP BY team, project
ORDER BY window_cost_usd DESC, list_cost_usd DESC, team, project""", period.parameters))


def cost_per_unit_of_work(reader: SqlReader, limit: int = 50, period: Period = WHOLE_HISTORY) -> Rows:
    """Cost per training step and per 1k tokens for pods that report progress (``v_cost_per_unit``'s
    query over the period: the windows' daily rollup and the pods' progress totals), costliest first
    (equal costs as shown by name)."""
    return round_floats(query_rows(reader, f"""
SELECT namespace, pod, {_label('team')} AS team, {_label('project')} AS project, gpu_hours, cost_usd,
       steps, tokens, cost_per_step_usd, cost_per_1k_tokens_usd
FROM ({rollups.cost_per_unit(period.rows(POD_DAILY), period.rows(PROGRESS_DAILY))})
WHERE {IN_CLUSTER}
ORDER BY round(cost_usd, 9) DESC, namespace, pod
LIMIT {int(limit)}""", period.parameters), 9)


def shared_gpu_cost(reader: SqlReader, limit: int = 50, period: Period = WHOLE_HISTORY) -> Rows:
    """Pods on shared GPUs: request-based versus usage-based cost (``v_shared_gpu_cost``'s query over
    the period)."""
    return round_floats(query_rows(reader, f"""
SELECT namespace, pod, {_label('team')} AS team, requested_gpu_hours, usage_gpu_hours,
       request_based_cost_usd, usage_based_cost_usd
FROM ({rollups.shared_gpu_cost(period.rows(SHARED_GPU_DAILY))})
WHERE {IN_CLUSTER}
ORDER BY usage_based_cost_usd DESC, namespace, pod
LIMIT {int(limit)}""", period.parameters))


def pods(reader: SqlReader, period: Period = WHOLE_HISTORY) -> Rows:
    """Per pod: GPU-hours, idle GPU-hours, utilisation and cost from its windows (their daily rollup),
    and how it ended."""
    return round_floats(query_rows(reader, f"""
WITH w AS (
    SELECT pod_uid, any(namespace) AS namespace, any(pod) AS pod, any(team) AS team, any(project) AS project,
           any(node) AS node, uniqExact(gpu_uuid) AS gpus,
           sum(allocated_gpu_s) / 3600 AS gpu_hours, sum(idle_gpu_s) / 3600 AS idle_gpu_hours,
           sum(util_pct_x_gpu_s) / nullIf(sum(util_gpu_s), 0) AS avg_sm_util_pct,
           max(peak_mem_bytes) AS peak_mem_bytes, sum(cost_total_usd) AS cost_usd
    FROM {period.rows(POD_DAILY)} WHERE {IN_CLUSTER} GROUP BY pod_uid
),
l AS (SELECT pod_uid, end_reason, pending_s, running_s FROM pod_lifecycle FINAL
      WHERE {IN_CLUSTER}{period.after(LIFECYCLE_END)})
SELECT w.namespace AS namespace, w.pod AS name, {_label('w.team')} AS team, {_label('w.project')} AS project,
       w.node AS node, w.gpus AS gpus, w.gpu_hours AS gpu_hours, w.idle_gpu_hours AS idle_gpu_hours,
       w.avg_sm_util_pct AS avg_sm_util_pct, w.peak_mem_bytes AS peak_mem_bytes, w.cost_usd AS cost_usd,
       l.end_reason AS end_reason, l.pending_s AS pending_s, l.running_s AS running_s
FROM w LEFT JOIN l ON l.pod_uid = w.pod_uid
ORDER BY namespace, name""", period.parameters))


def lifecycle_timeline(reader: SqlReader, limit: int = 200, period: Period = WHOLE_HISTORY) -> Rows:
    """GPU pods from creation to end: when they were scheduled, started, finished, and what they cost."""
    return round_floats(query_rows(reader, f"""
SELECT namespace, name, {_label('team')} AS team, {_label('project')} AS project, node, gpus, gpu_model,
       created_at, scheduled_at, started_at, finished_at, pending_s, running_s, end_reason,
       pending_reasons, gpu_hours, idle_gpu_hours, avg_sm_util_pct, peak_mem_bytes, cost_usd, steps,
       cost_per_step_usd
FROM pod_lifecycle FINAL
WHERE {IN_CLUSTER}{period.after(LIFECYCLE_END)}
ORDER BY created_at, namespace, name
LIMIT {int(limit)}""", period.parameters))


def alerts_by_type(reader: SqlReader, period: Period = WHOLE_HISTORY) -> Rows:
    """Alert counts per type: how many fired, are still firing, and their mean duration (of a period:
    the alerts firing at some time in it)."""
    return round_floats(query_rows(reader, f"""
SELECT alert_type AS type, count() AS alerts, countIf(current_state = 'firing') AS still_firing,
       avgIf(dateDiff('second', first_at, resolved_at), current_state = 'resolved') AS avg_duration_s
FROM v_alerts
WHERE {IN_CLUSTER}{"" if period.start is None else f" AND (current_state = 'firing' OR last_at >= {START})"}
GROUP BY type
ORDER BY alerts DESC, type""", period.parameters))


def advisor_thresholds(thresholds: AdviseThresholds | None, period: Period) -> AdviseThresholds:
    """The advisor's thresholds (its defaults when None) over ``period``; over the whole history: over
    the thresholds' own period (7 days by default)."""
    from common.settings import AdviseThresholds

    thresholds = thresholds or AdviseThresholds()
    return thresholds if period.seconds is None else thresholds.model_copy(update={"since_s": period.seconds})


def reclaimable_capacity(reader: SqlReader, thresholds: AdviseThresholds | None = None,
                         period: Period = WHOLE_HISTORY) -> Rows:
    """The reclaimable-capacity advisor (``gpulens advise``, docs/advise.md) as one table: the headline,
    then each recommendation with its GPU-hours and money (:func:`advisor_thresholds`)."""
    from reports.advise import advice_rows, advise

    return advice_rows(advise(reader, advisor_thresholds(thresholds, period)))


class Analysis(Protocol):
    """A report section: the reader and the period to plain rows."""

    def __call__(self, reader: SqlReader, *, period: Period = WHOLE_HISTORY) -> Rows: ...


ANALYSES: dict[str, Analysis] = {
    "summary": summary,
    "top_teams": lambda r, *, period=WHOLE_HISTORY: top_consumers(r, "team", period=period),
    "top_projects": lambda r, *, period=WHOLE_HISTORY: top_consumers(r, "project", period=period),
    "top_pods": lambda r, *, period=WHOLE_HISTORY: top_consumers(r, "pod", period=period),
    "idle_by_team_and_class": idle_by_team_and_class,
    "pending_distribution": pending_distribution,
    "pending_reasons": pending_reasons,
    "fragmentation_over_time": fragmentation_over_time,
    "nodes_to_scale_down": nodes_to_scale_down,
    "cost_by_team": cost_by_team,
    "cost_per_unit_of_work": cost_per_unit_of_work,
    "shared_gpu_cost": shared_gpu_cost,
    "alerts_by_type": alerts_by_type,
    "pods": pods,
    "lifecycle_timeline": lifecycle_timeline,
    "reclaimable_capacity": lambda r, *, period=WHOLE_HISTORY: reclaimable_capacity(r, None, period),
}
"""Report sections in display order; each maps a reader and the period to plain rows (the advisor's
section takes its period from its thresholds: :func:`run_report`)."""

LISTS = frozenset({"top_pods", "cost_per_unit_of_work", "shared_gpu_cost", "pods", "lifecycle_timeline",
                   "reclaimable_capacity"})
"""Sections whose rows are pods: what they cost grows with the pods of the history they list (the
others are fleet-, team- or node-level aggregates; docs/performance.md measures both)."""

TITLES: dict[str, str] = {
    "summary": "Fleet summary",
    "top_teams": "Top GPU consumers by team",
    "top_projects": "Top GPU consumers by project",
    "top_pods": "Top GPU consumers by pod",
    "idle_by_team_and_class": "Idle GPU-hours by team and idle class",
    "pending_distribution": "Pending time distribution",
    "pending_reasons": "Pending reasons",
    "fragmentation_over_time": "Fragmentation and stranded GPUs over time",
    "nodes_to_scale_down": "Nodes to scale down (cost burned)",
    "cost_by_team": "Cost per team and project",
    "cost_per_unit_of_work": "Cost per unit of work",
    "shared_gpu_cost": "Usage-based cost on shared GPUs",
    "alerts_by_type": "Alerts by type",
    "pods": "Pods",
    "lifecycle_timeline": "GPU pod lifecycle timeline",
    "reclaimable_capacity": "Reclaimable capacity (gpulens advise)",
}


def report_period(reader: SqlReader, since_s: float | None) -> Period:
    """The last ``since_s`` seconds of data (:func:`~reports.reader.data_period`; None, or a store
    without data: the whole history)."""
    bounds = None if since_s is None else data_period(reader, since_s)
    return WHOLE_HISTORY if bounds is None else Period(*bounds)


def run_report(reader: SqlReader, sections: list[str] | None = None,
               advise_thresholds: AdviseThresholds | None = None, cluster: str | None = None,
               period: Period = WHOLE_HISTORY) -> dict[str, Rows]:
    """Every analysis (or the named ones), in display order, of ``cluster`` (see :func:`scoped`) over
    ``period`` (:func:`report_period`); the advisor's section with ``advise_thresholds`` (its defaults
    when None), over ``period`` unless that is the whole history (then over the thresholds' period)."""
    names = sections or list(ANALYSES)
    unknown = [n for n in names if n not in ANALYSES]
    if unknown:
        raise KeyError(f"unknown report section(s) {', '.join(unknown)}; known: {', '.join(ANALYSES)}")
    reader = scoped(reader, cluster)
    return {name: reclaimable_capacity(reader, advise_thresholds, period) if name == "reclaimable_capacity"
            else ANALYSES[name](reader, period=period) for name in names}
