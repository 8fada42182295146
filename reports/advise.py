"""The reclaimable-capacity advisor: how many GPUs the fleet could free, which pods, why, and the money.

Everything comes from the history the pipeline stored, over a period counted back from the latest
data in the store, each figure from what answers it with the fewest rows and equal to what the raw
windows give (docs/advise.md, "Where the figures come from"; tests/advise/test_advise_rollups.py):
per pod and GPU the held seconds, cost and peaks from ``pod_daily`` (whole days) and ``pod_hourly``
(the hours before the period's first whole day), per pod, time bucket and GPU the held, allocated
and busy seconds from ``pod_hourly``; the figures over a pod's active windows (windows in which any
of its GPUs was busy: evidence, SM percentile, VRAM) from ``pod_active_daily`` and
``pod_active_hourly`` alike, percentiles within a bin of the exact ones; capacity and its cost from
``cluster_capacity`` and ``gpu_daily``; waits from ``pod_lifecycle``; pools from ``node_states``. The categories
(docs/advise.md has the method, by hand):

- **reclaim**: runs of wholly idle time buckets of a pod at least ``idle_stretch_s`` long; the pod's
  GPU-hours in them are reclaimable (idle class: no process, or VRAM held without compute).
- **scale to zero**: nodes sampled for at least ``min_evidence_s`` on which no GPU was ever allocated.
- **right-size**: pods with ``min_evidence_s`` of active windows whose demand fits a smaller unit:
  fewer whole GPUs (GPUs of the pod that never computed nor held VRAM), or for a one-GPU pod a MIG
  profile of the same model (per-model MIG table) or a time-sliced share. Only "fewer GPUs" frees
  GPU-hours by itself; a fractional unit frees them when packed, so its saving is counted in pack.
- **pack**: per time bucket and node pool, first-fit decreasing of each remaining pod's demand onto
  GPUs (whole-GPU demands and gang members take whole GPUs); the GPUs the bins needed against the GPUs
  the pods held, after reclaim and right-size.
- **queue**: pending time of pods whose request fitted in the free GPUs of the schedulable nodes but
  not on any one node (fragmentation); reported as delay, not as reclaimable capacity.

No GPU-hour is counted twice: reclaim takes a pod's idle buckets out of the later categories,
right-size takes the freed whole GPUs out of pack, scale-to-zero counts unallocated GPU-hours only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from common.settings import AdviseThresholds
from reports.packing import EPS, GIB, PodEvidence, iso_utc, pack_pods, reclaimable_by_pod, right_size
from reports.reader import IN_CLUSTER, START, Row, Rows, SqlReader, data_period, query_rows, sql_time, utc_time
from sinks import rollups
from sinks.rollups import POD_ACTIVE_DAILY, POD_DAILY, POD_HOURLY, PRICE

MONTH_H = 30 * 24
"""A month in hours, for the monthly figures."""

POOL_LABELS = ("pool", "karpenter.sh/nodepool", "cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup",
               "kubernetes.azure.com/agentpool", "agentpool")
"""Node labels that name a node pool, first found wins; without one a node's pool is its GPU model."""


def _label(value: str) -> str:
    return value or "(none)"


def _params(start: datetime, team: str | None, alias: str = "",
            time_column: str = "window_start") -> tuple[str, dict[str, str]]:
    """The condition on rows of the cluster, from ``start`` on (on ``time_column``; empty: the rows
    come from a subquery that starts there) and of ``team``, and its parameters."""
    where = f"{alias}{IN_CLUSTER}"
    if time_column:
        where += f" AND {alias}{time_column} >= {START}"
    params = {"start": sql_time(start)}
    if team is not None:
        where += f" AND if({alias}team = '', '(none)', {alias}team) = {{team:String}}"
        params["team"] = team
    return where, params


def _nodes(reader: SqlReader) -> dict[str, Row]:
    rows = query_rows(reader, f"""
SELECT node, argMax(labels, ts) AS labels, argMax(gpu_memory_bytes, ts) AS gpu_memory_bytes,
       argMax(gpu_product, ts) AS gpu_product
FROM node_states WHERE {IN_CLUSTER} GROUP BY node""")
    return {r["node"]: r for r in rows}


def _pool(node: Row | None, model: str) -> str:
    labels = (node or {}).get("labels") or {}
    for key in POOL_LABELS:
        if labels.get(key):
            return f"{labels[key]} ({model})"
    return model or "(unknown model)"


def _evidence(reader: SqlReader, start: datetime, team: str | None, cfg: AdviseThresholds,
              nodes: dict[str, Row]) -> dict[str, PodEvidence]:
    """Each pod's evidence over the period: one row per (pod, GPU) folded into its :class:`PodEvidence`."""
    rows = _pod_gpu_rows(reader, start, team, cfg)
    owners = _owners(reader)
    pods: dict[str, PodEvidence] = {}
    for r in rows:
        ev = pods.get(r["pod_uid"])
        if ev is None:
            ev = pods[r["pod_uid"]] = _new_evidence(r, nodes.get(r["node"]), owners.get(r["pod_uid"], {}))
        _add_gpu(ev, r)
    for ev in pods.values():
        _order_by_gpu(ev)
    return pods


def _pod_gpu_rows(reader: SqlReader, start: datetime, team: str | None, cfg: AdviseThresholds) -> Rows:
    """One row per (pod, GPU) of the period, by pod uid and GPU: the pod's labels, its GPU's memory and
    index, held seconds, cost, price and last busy window from ``pod_hourly`` (:func:`_pod_gpu_totals`),
    and the figures over the pod's active windows from ``pod_active_hourly`` (:func:`_active_figures`)."""
    active = {(r["pod_uid"], r["gpu_uuid"]): r for r in _active_figures(reader, start, team, cfg)}
    return [r | active.get((r["pod_uid"], r["gpu_uuid"]), _NO_ACTIVE_WINDOW)
            for r in _pod_gpu_totals(reader, start, team)]


_NO_ACTIVE_WINDOW: Row = {"active_windows": 0, "active_s": 0.0, "pct_sm": None, "sm_windows": 0, "peak_sm": None,
                          "peak_mem": 0, "pct_mem": 0}
"""The active-window figures of a (pod, GPU) none of whose pod's windows had busy time."""


def _pod_gpu_totals(reader: SqlReader, start: datetime, team: str | None) -> Rows:
    """Per (pod, GPU), from the pod rollups (their rows since ``start``): what needs no window of
    another GPU of the pod. The price is ``v_advise_windows``'s: the model's list price, else what the
    windows were costed at per held GPU-hour."""
    merged = {name: POD_DAILY.merged(name) for name in (
        "windows", "busy_windows", "held_gpu_s", "cost_total_usd", "share_max", "last_busy_end")}
    where, params = _params(start, team, "w.", time_column="")
    return query_rows(reader, f"""
WITH g AS (SELECT gpu_uuid, max(mem_total_bytes) AS gpu_mem_bytes, argMax(gpu_index, last_ts) AS gpu_index
           FROM {rollups.gpu_rows_since()} WHERE {IN_CLUSTER} GROUP BY gpu_uuid)
SELECT w.pod_uid AS pod_uid, w.gpu_uuid AS gpu_uuid, any(w.namespace) AS namespace, any(w.pod) AS pod,
       any(w.team) AS team, any(w.project) AS project, any(w.node) AS node, any(w.gpu_model) AS gpu_model,
       {merged["share_max"]} AS share, max(g.gpu_mem_bytes) AS gpu_mem_bytes,
       maxIf(toNullable(g.gpu_index), g.gpu_uuid != '') AS gpu_index,
       {merged["held_gpu_s"]} AS held_s, {merged["cost_total_usd"]} AS cost_usd,
       any(coalesce(p.usd_per_gpu_hour, w.cost_total_usd / nullIf(w.held_gpu_s / 3600, 0))) AS usd_per_gpu_hour,
       {merged["last_busy_end"]} AS last_busy, {merged["busy_windows"]} AS busy_windows,
       {merged["windows"]} AS windows
FROM {POD_DAILY.rows_since("start")} AS w
LEFT JOIN g ON g.gpu_uuid = w.gpu_uuid
LEFT JOIN {PRICE} AS p ON p.gpu_model = w.gpu_model
WHERE {where}
GROUP BY pod_uid, gpu_uuid
ORDER BY pod_uid, gpu_uuid""", params)


def _active_figures(reader: SqlReader, start: datetime, team: str | None, cfg: AdviseThresholds) -> Rows:
    """Per (pod, GPU) with an active window since ``start`` (a window in which any GPU of the pod had
    busy time, as the node stage stamps it), from the rollups of active windows: their count
    and allocated seconds, the percentile and peak of their SM peaks, the peak and percentile of their
    VRAM peaks. A percentile is that of ``quantileExact`` within a bin
    (:data:`~sinks.rollups.SM_BIN_PCT`, :data:`~sinks.rollups.VRAM_BIN_BYTES`) above it."""
    level = cfg.percentile / 100
    where, params = _params(start, team, time_column="")
    m = {name: POD_ACTIVE_DAILY.merged(name) for name in (
        "active_windows", "active_gpu_s", "sm_windows", "active_peak_sm_pct", "active_peak_mem_bytes")}
    return query_rows(reader, f"""
SELECT pod_uid, gpu_uuid, active_windows, active_s, sm_windows, peak_sm, peak_mem,
       {rollups.percentile("sm_pairs", "sm_windows", "peak_sm", rollups.SM_BIN_PCT, level)} AS pct_sm,
       {rollups.percentile("mem_pairs", "active_windows", "peak_mem", rollups.VRAM_BIN_BYTES, level)} AS pct_mem
FROM (
    SELECT pod_uid, gpu_uuid, {m["active_windows"]} AS active_windows, {m["active_gpu_s"]} AS active_s,
           {m["sm_windows"]} AS sm_windows, {m["active_peak_sm_pct"]} AS peak_sm,
           {m["active_peak_mem_bytes"]} AS peak_mem,
           {rollups.histogram_pairs("sm_bins")} AS sm_pairs, {rollups.histogram_pairs("mem_bins")} AS mem_pairs
    FROM {POD_ACTIVE_DAILY.rows_since("start")}
    WHERE {where}
    GROUP BY pod_uid, gpu_uuid)""", params)


def _owners(reader: SqlReader) -> dict[str, Row]:
    """Pod uid -> its latest owner kinds, owner names and gang."""
    return {r["uid"]: r for r in query_rows(reader, f"""
SELECT uid, argMax(owner_kinds, ts) AS kinds, argMax(owner_names, ts) AS names, argMax(gang_id, ts) AS gang
FROM pod_states WHERE {IN_CLUSTER} GROUP BY uid""")}


def _new_evidence(r: Row, node: Row | None, meta: Row) -> PodEvidence:
    """A pod's evidence from its first (pod, GPU) row, before any GPU is added."""
    kinds, names = meta.get("kinds") or [], meta.get("names") or []
    mem = r["gpu_mem_bytes"] or (node or {}).get("gpu_memory_bytes")
    return PodEvidence(
        pod_uid=r["pod_uid"], namespace=r["namespace"], pod=r["pod"], team=_label(r["team"]),
        project=_label(r["project"]), node=r["node"], pool=_pool(node, r["gpu_model"]),
        gpu_model=r["gpu_model"], owner=f"{kinds[0]}/{names[0]}" if kinds and names else "",
        gang=meta.get("gang") or "", gpus=0, share=float(r["share"] or 1.0),
        gpu_memory_bytes=float(mem) if mem else None, usd_per_gpu_hour=float(r["usd_per_gpu_hour"] or 0.0))


def _add_gpu(ev: PodEvidence, r: Row) -> None:
    """One GPU of the pod (one row of :func:`_pod_gpu_rows`) into its evidence."""
    ev.gpus += 1
    ev.gpu_uuids.append(r["gpu_uuid"])
    ev.gpu_indexes.append(None if r["gpu_index"] is None else int(r["gpu_index"]))
    ev.active_s = max(ev.active_s, float(r["active_s"] or 0.0))
    ev.active_windows = max(ev.active_windows, int(r["active_windows"]))
    ev.sm_pct.append(None if not r["sm_windows"] else float(r["pct_sm"]))
    if r["peak_sm"] is not None:
        ev.peak_sm_pct = max(ev.peak_sm_pct or 0.0, float(r["peak_sm"]))
    ev.peak_mem_bytes.append(int(r["peak_mem"] or 0))
    ev.pct_mem_bytes = max(ev.pct_mem_bytes, float(r["pct_mem"] or 0.0))
    if r["busy_windows"]:
        last = iso_utc(utc_time(r["last_busy"]))
        ev.last_busy = max(ev.last_busy or last, last)


def _order_by_gpu(ev: PodEvidence) -> None:
    """The per-GPU lists by GPU index (the order nvidia-smi shows), then UUID."""
    order = sorted(range(ev.gpus), key=lambda k: (ev.gpu_indexes[k] is None, ev.gpu_indexes[k] or 0,
                                                  ev.gpu_uuids[k]))
    ev.gpu_uuids = [ev.gpu_uuids[k] for k in order]
    ev.gpu_indexes = [ev.gpu_indexes[k] for k in order]
    ev.sm_pct = [ev.sm_pct[k] for k in order]
    ev.peak_mem_bytes = [ev.peak_mem_bytes[k] for k in order]


def advise(reader: SqlReader, cfg: AdviseThresholds, team: str | None = None) -> dict[str, Any]:
    """The advisor's findings as plain, JSON-friendly data (see the module docstring and docs/advise.md)."""
    period = data_period(reader, cfg.since_s)
    if period is None:
        return {"period": None, "headline": None, "headline_text": headline_text(None), "thresholds": cfg.model_dump(),
                "reclaim": [], "scale_to_zero": [], "right_size": [], "pack": [], "queue": [], "totals": {}}
    start, end = period
    nodes = _nodes(reader)
    pods = _evidence(reader, start, team, cfg, nodes)
    per_pod = _buckets(reader, start, team, cfg)
    reclaim_rows, reclaimed = reclaimable_by_pod(pods, per_pod, cfg)
    sized = {uid: rs for uid, ev in pods.items() if (rs := right_size(ev, cfg)) is not None}
    right_rows, pack_rows, pod_hours = pack_pods(pods, per_pod, reclaimed, sized, cfg)
    capacity = _capacity(reader, start)
    scale_rows = [] if team is not None else _scale_to_zero(reader, start, cfg, nodes)
    queue_rows = _queue(reader, start, team)

    # hours the data covers (capacity windows); the whole period only when there are none
    span_h = (capacity["span_s"] or (end - start).total_seconds()) / 3600
    cats = _categories(reclaim_rows, right_rows, pack_rows, scale_rows)
    reclaimable_h = sum(h for h, _ in cats.values())
    reclaimable_usd = sum(c for _, c in cats.values())
    held_h = pod_hours["held_gpu_hours"]
    headline = _headline(reclaimable_h, reclaimable_usd, reclaimable_h - cats["scale_to_zero"][0], held_h,
                         held_h if team is not None else capacity["capacity_gpu_hours"], span_h)
    totals = {
        "span_hours": span_h,
        "capacity_gpu_hours": capacity["capacity_gpu_hours"], "allocated_gpu_hours": capacity["allocated_gpu_hours"],
        "unallocated_gpu_hours": capacity["unallocated_gpu_hours"], "capacity_cost_usd": capacity["cost_usd"],
        "held_gpu_hours": held_h, "held_cost_usd": pod_hours["held_cost_usd"],
        **{f"{name}_gpu_hours": h for name, (h, _) in cats.items()},
        **{f"{name}_cost_usd": c for name, (_, c) in cats.items()},
        "reclaimable_gpu_hours": reclaimable_h, "reclaimable_cost_usd": reclaimable_usd,
        "kept_gpu_hours": capacity["capacity_gpu_hours"] - reclaimable_h,
        **_queue_totals(queue_rows),
    }
    return _rounded({
        "period": {"start": iso_utc(start), "end": iso_utc(end), "team": team},
        "headline": headline, "headline_text": _too_short(pods, reclaimable_h, cfg) or headline_text(headline, team),
        "thresholds": cfg.model_dump(),
        "reclaim": reclaim_rows, "scale_to_zero": scale_rows, "right_size": right_rows, "pack": pack_rows,
        "queue": queue_rows, "totals": totals,
    })


def _buckets(reader: SqlReader, start: datetime, team: str | None,
             cfg: AdviseThresholds) -> dict[str, dict[int, dict[str, float]]]:
    """Pod uid -> time bucket (unix seconds) -> its GPUs' held, present and busy seconds and peak VRAM
    (:data:`_BUCKET_FIGURES`).

    Buckets of whole hours (the default) add up ``pod_hourly``'s rows since ``start`` (an hour's rows
    fall in the bucket of their first window); other buckets add up the raw windows."""
    if cfg.bucket_s % 3600 == 0:
        where, params = _params(start, team, time_column="")
        source, bucket_time = POD_HOURLY.rows_since("start"), "first_start"
        figures = ", ".join(f"{POD_HOURLY.merged(name)} AS {name}" for name in (
            "held_gpu_s", "allocated_gpu_s", "busy_gpu_s"))
        peak = f"coalesce({POD_HOURLY.merged('peak_mem_bytes')}, 0)"
    else:
        where, params = _params(start, team)
        source, bucket_time = "pod_windows FINAL", "window_start"
        figures = ("sum(allocated_s * share_fraction) AS held_gpu_s, sum(allocated_s) AS allocated_gpu_s, "
                   "sum(busy_s) AS busy_gpu_s")
        peak = "max(coalesce(max_mem_used_bytes, 0))"
    buckets = query_rows(reader, f"""
SELECT pod_uid, bucket, sum(held_gpu_s) AS held_s, max(allocated_gpu_s) AS present_s, sum(busy_gpu_s) AS busy_s,
       max(peak_mem) AS peak_mem
FROM (
    SELECT pod_uid, toUnixTimestamp(toStartOfInterval({bucket_time}, toIntervalSecond({{bucket_s:UInt32}})))
               AS bucket, gpu_uuid, {figures}, {peak} AS peak_mem
    FROM {source}
    WHERE {where}
    GROUP BY pod_uid, bucket, gpu_uuid)
GROUP BY pod_uid, bucket
ORDER BY pod_uid, bucket""", params | {"bucket_s": int(cfg.bucket_s)})
    per_pod: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for r in buckets:
        per_pod[r["pod_uid"]][int(r["bucket"])] = {name: float(r[name]) for name in _BUCKET_FIGURES}
    return per_pod


_BUCKET_FIGURES = ("held_s", "present_s", "busy_s", "peak_mem")
"""A pod's figures per time bucket: held GPU-seconds (allocated x share) and busy seconds of its GPUs
added up, the most seconds any of its GPUs was allocated (present), the peak VRAM of any."""


def _categories(reclaim_rows: Rows, right_rows: Rows, pack_rows: Rows,
                scale_rows: Rows) -> dict[str, tuple[float, float]]:
    """Category -> (GPU-hours, USD) it frees, in the order the totals list them."""
    return {
        "reclaim": (sum(r["gpu_hours"] for r in reclaim_rows), sum(r["cost_usd"] for r in reclaim_rows)),
        "right_size": (sum(r["freed_gpu_hours"] for r in right_rows), sum(r["freed_cost_usd"] for r in right_rows)),
        "pack": (sum(r["freed_gpu_hours"] for r in pack_rows), sum(r["freed_cost_usd"] for r in pack_rows)),
        "scale_to_zero": (sum(r["gpu_hours"] for r in scale_rows), sum(r["cost_usd"] for r in scale_rows)),
    }


def _queue_totals(queue_rows: Rows) -> dict[str, float]:
    return {"queue_fragmented_pending_hours": sum(r["fragmented_pending_s"] for r in queue_rows) / 3600,
            "queue_delayed_gpu_hours": sum(r["delayed_gpu_hours"] for r in queue_rows)}


def _headline(reclaimable_h: float, reclaimable_usd: float, from_pods_h: float, held_h: float,
              scope_h: float, span_h: float) -> dict[str, float]:
    """The headline in GPUs (GPU-hours over the ``span_h`` the data covers): what is reclaimable, of
    the ``scope_h`` GPU-hours in scope (the fleet's capacity, or a team's held GPU-hours), and what
    the pods held against what would have served them (``from_pods_h``: all but scale-to-zero)."""
    scope_gpus = scope_h / span_h
    gpus = reclaimable_h / span_h
    return {
        "gpus": gpus, "percent": 100 * gpus / scope_gpus if scope_gpus > EPS else 0.0,
        "usd_per_month": reclaimable_usd * MONTH_H / span_h,
        "held_gpus": held_h / span_h, "would_serve_gpus": (held_h - from_pods_h) / span_h,
        "pack_freed_gpus": from_pods_h / span_h,
        "pack_percent": 100 * from_pods_h / held_h if held_h > EPS else 0.0,
    }


def _too_short(pods: Mapping[str, PodEvidence], reclaimable_h: float, cfg: AdviseThresholds) -> str | None:
    """Why a zero headline means nothing yet: no pod has the evidence the advisor asks (a short demo)."""
    longest_s = max((ev.active_s for ev in pods.values()), default=0.0)
    if reclaimable_h > EPS or longest_s + EPS >= cfg.min_evidence_s:
        return None
    return (f"not enough history yet: the longest pod history is {longest_s / 60:.0f} min, the advisor needs "
            f"{cfg.min_evidence_s / 60:.0f} min of evidence (--min-evidence) before it names reclaimable GPUs")


def headline_text(headline: Mapping[str, float | None] | None, team: str | None = None) -> str:
    if headline is None:
        return "no data in the store: nothing to advise"
    scope = f" of team {team}'s GPUs" if team else ""
    usd = headline["usd_per_month"]
    money = "cost unknown (GPU models without a list price)" if usd is None else f"${usd:,.0f}/month"
    return f"{headline['gpus']:.1f} GPUs ({headline['percent']:.0f} %{scope}) reclaimable, {money}"


def pack_text(headline: dict[str, float]) -> str:
    return (f"you held {headline['held_gpus']:.1f} GPUs, {headline['would_serve_gpus']:.1f} would have served the "
            f"same work: {headline['pack_freed_gpus']:.1f} GPUs ({headline['pack_percent']:.0f} %) reclaimable "
            "from pods")


def _capacity(reader: SqlReader, start: datetime) -> dict[str, float]:
    cap = query_rows(reader, f"""
SELECT sum(coalesce(gpu_s_total, gpus_total * dateDiff('millisecond', window_start, window_end) / 1000)) / 3600
           AS capacity_gpu_hours,
       sum(coalesce(gpu_s_allocated, gpus_allocated * dateDiff('millisecond', window_start, window_end) / 1000))
           / 3600 AS allocated_gpu_hours,
       sum(coalesce(gpu_s_free, gpus_free * dateDiff('millisecond', window_start, window_end) / 1000)) / 3600
           AS unallocated_gpu_hours,
       sum(dateDiff('millisecond', window_start, window_end)) / 1000 AS span_s
FROM cluster_capacity FINAL
WHERE {IN_CLUSTER} AND window_start >= {START}""", {"start": sql_time(start)})[0]
    cost = query_rows(reader, f"""
SELECT sum(s.sampled_s / 3600 * coalesce(p.usd_per_gpu_hour, 0)) AS cost_usd
FROM {rollups.gpu_rows_since("start")} AS s
LEFT JOIN {PRICE} AS p ON p.gpu_model = s.gpu_model
WHERE s.{IN_CLUSTER} AND s.mig_parent_uuid = ''""",
                      {"start": sql_time(start)})[0]
    return {k: float(v or 0.0) for k, v in (cap | cost).items()}


def _scale_to_zero(reader: SqlReader, start: datetime, cfg: AdviseThresholds,
                   nodes: dict[str, Row]) -> Rows:
    rows = query_rows(reader, f"""
SELECT s.node AS node, any(s.gpu_model) AS gpu_model, uniqExactIf(s.gpu_uuid, s.mig_parent_uuid = '') AS gpus,
       sumIf(s.sampled_s, s.mig_parent_uuid = '') / 3600 AS gpu_hours,
       sum(s.allocated_samples) AS allocated_samples,
       dateDiff('millisecond', min(s.first_ts), max(s.last_ts)) / 1000 + any(s.interval_s) AS observed_s,
       min(s.first_ts) AS first_seen, max(s.last_ts) AS last_seen,
       any(coalesce(p.usd_per_gpu_hour, 0)) AS usd_per_gpu_hour
FROM {rollups.gpu_rows_since("start")} AS s
LEFT JOIN {PRICE} AS p ON p.gpu_model = s.gpu_model
WHERE s.{IN_CLUSTER}
GROUP BY node
HAVING allocated_samples = 0
ORDER BY gpu_hours DESC, node""", {"start": sql_time(start)})
    held = _held_nodes(reader, start)
    out = []
    for r in rows:
        if r["node"] in held or float(r["observed_s"]) + EPS < cfg.min_evidence_s:
            continue
        node = nodes.get(r["node"])
        labels = (node or {}).get("labels") or {}
        out.append({"node": r["node"], "pool": _pool(node, r["gpu_model"]), "gpu_model": r["gpu_model"],
                    "gpus": int(r["gpus"]), "first_seen": iso_utc(utc_time(r["first_seen"])),
                    "last_seen": iso_utc(utc_time(r["last_seen"])), "gpu_hours": float(r["gpu_hours"]),
                    "cost_usd": float(r["gpu_hours"]) * float(r["usd_per_gpu_hour"]),
                    "labels": {k: v for k, v in sorted(labels.items()) if k in POOL_LABELS}})
    return out


def _held_nodes(reader: SqlReader, start: datetime) -> set[str]:
    """Nodes on which a pod held a GPU in the period (a window of it since ``start``)."""
    return {r["node"] for r in query_rows(reader, f"""
SELECT DISTINCT node FROM {POD_DAILY.rows_since("start")} WHERE {IN_CLUSTER}""", {"start": sql_time(start)})}


def _queue(reader: SqlReader, start: datetime, team: str | None) -> Rows:
    """The pods whose wait overlapped capacity windows with enough free GPUs but too few on one node.

    A pod meets the capacity windows of the hours its wait touches (an equi-join on the hour; the hours
    begin a window's length before the pod was created, so a window that began earlier and overlaps is
    met too), not every window of the period: the pairs grow with the waits, not with the period
    squared."""
    team_filter = "AND if(l.team = '', '(none)', l.team) = {team:String}" if team is not None else ""
    rows = query_rows(reader, f"""
WITH
c AS (SELECT window_start, window_end, arraySum(mapValues(free_gpus_by_node)) AS free, largest_free_block,
             intDiv(toInt64(toUnixTimestamp(window_start)), 3600) AS hour
      FROM cluster_capacity FINAL WHERE {IN_CLUSTER} AND window_start >= {START}),
w AS (SELECT *, addMilliseconds(created_at, toInt64(floor(pending_s * 1000))) AS wait_end
      FROM pod_lifecycle FINAL WHERE {IN_CLUSTER} AND gpus > 0 AND pending_s > 0),
l AS (SELECT *, arrayJoin(range(
                    intDiv(toInt64(toUnixTimestamp(created_at)) - (SELECT intDiv(max(dateDiff('millisecond',
                        window_start, window_end)), 1000) + 1 FROM c), 3600),
                    intDiv(toInt64(toUnixTimestamp(wait_end)), 3600) + 1)) AS hour
      FROM w WHERE wait_end > {START})
SELECT l.pod_uid AS pod_uid, any(l.namespace) AS namespace, any(l.name) AS pod, any(l.team) AS team,
       any(l.gpus) AS gpus, any(l.created_at) AS created_at, any(l.scheduled_at) AS scheduled_at,
       any(l.pending_s) AS pending_s,
       sumIf(dateDiff('millisecond', greatest(c.window_start, l.created_at),
                      least(c.window_end, l.wait_end)) / 1000,
             c.free >= l.gpus AND c.largest_free_block < l.gpus) AS fragmented_pending_s,
       minIf(greatest(c.window_start, l.created_at), c.free >= l.gpus AND c.largest_free_block < l.gpus)
           AS first_fragmented_at,
       argMinIf(c.free, c.window_start, c.free >= l.gpus AND c.largest_free_block < l.gpus) AS free_gpus,
       argMinIf(c.largest_free_block, c.window_start, c.free >= l.gpus AND c.largest_free_block < l.gpus)
           AS largest_free_block
FROM l INNER JOIN c ON c.hour = l.hour
WHERE c.window_end > l.created_at AND c.window_start < l.wait_end
      {team_filter}
GROUP BY pod_uid
HAVING fragmented_pending_s > 0
ORDER BY fragmented_pending_s DESC, namespace, pod""", {"start": sql_time(start),
                                                        **({"team": team} if team is not None else {})})
    return [{
        "namespace": r["namespace"], "pod": r["pod"], "team": _label(r["team"]), "gpus": int(r["gpus"]),
        "created_at": iso_utc(utc_time(r["created_at"])),
        "scheduled_at": iso_utc(utc_time(r["scheduled_at"])) if r["scheduled_at"] else None,
        "pending_s": float(r["pending_s"]), "fragmented_pending_s": float(r["fragmented_pending_s"]),
        "delayed_gpu_hours": int(r["gpus"]) * float(r["fragmented_pending_s"]) / 3600,
        "defrag_would_place_at": iso_utc(utc_time(r["first_fragmented_at"])),
        "free_gpus": int(r["free_gpus"]), "largest_free_block": int(r["largest_free_block"]),
        "gpus_to_move": int(r["gpus"]) - int(r["largest_free_block"]),
    } for r in rows]


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def per_gpu_text(gpus: Rows) -> str:
    """A right-size row's per-GPU SM percentiles for people, by GPU index, runs of consecutive indexes
    with the same figure joined: ``GPU 0-1: 90 %, GPU 2-7: 0 %`` (``-``: no SM reading; a GPU no
    sample named an index is shown by its UUID)."""
    runs: list[tuple[str, int | None, int | None, str]] = []  # (label, first, last, figure)
    for g in gpus:
        index, pct = g["gpu_index"], g["percentile_sm_pct"]
        figure = "-" if pct is None else f"{pct:g} %"
        if index is not None and runs and runs[-1][2] is not None and runs[-1][2] + 1 == index \
                and runs[-1][3] == figure:
            runs[-1] = (runs[-1][0], runs[-1][1], index, figure)
        else:
            runs.append((g["gpu_uuid"] if index is None else "GPU", index, index, figure))
    return ", ".join(
        f"{label}: {figure}" if first is None
        else f"{label} {first}: {figure}" if first == last else f"{label} {first}-{last}: {figure}"
        for label, first, last, figure in runs)


def advice_rows(advice: dict[str, Any]) -> Rows:
    """The advisor's findings as one table for the report: a total row with the headline, then one row per
    recommendation (queue rows carry delayed GPU-hours, which are not in the reclaimable total)."""
    if advice.get("headline") is None:
        return []
    totals = advice["totals"]
    rows: Rows = [{
        "category": "total", "subject": advice["period"]["team"] or "fleet", "team": advice["period"]["team"],
        "detail": f"{advice['headline_text']}; {pack_text(advice['headline'])}",
        "gpu_hours": totals["reclaimable_gpu_hours"], "cost_usd": totals["reclaimable_cost_usd"]}]
    for r in advice["reclaim"]:
        rows.append({"category": "reclaim", "subject": f"{r['namespace']}/{r['pod']}", "team": r["team"],
                     "detail": f"{r['idle_class']} on {r['gpus']} GPU(s) of {r['node']} since {r['idle_since']}, "
                               f"last busy {r['last_busy'] or 'never'}"
                               + (f", owner {r['owner']}" if r["owner"] else ""),
                     "gpu_hours": r["gpu_hours"], "cost_usd": r["cost_usd"]})
    for r in advice["scale_to_zero"]:
        rows.append({"category": "scale_to_zero", "subject": r["node"], "team": None,
                     "detail": f"{r['gpus']} x {r['gpu_model']} never allocated "
                               f"({r['first_seen']} .. {r['last_seen']}), pool {r['pool']}",
                     "gpu_hours": r["gpu_hours"], "cost_usd": r["cost_usd"]})
    for r in advice["right_size"]:
        peak_vram = max(g["peak_vram_bytes"] for g in r["peak_vram_bytes_per_gpu"])
        rows.append({"category": "right_size", "subject": f"{r['namespace']}/{r['pod']}", "team": r["team"],
                     "detail": f"{r['recommendation']} (p{r['percentile']:g} SM "
                               f"{per_gpu_text(r['percentile_sm_pct_per_gpu'])}; peak VRAM "
                               f"{peak_vram / GIB:.1f} GiB; {r['evidence_hours']:.1f} h of "
                               f"evidence, {r['confidence']} confidence; freed in {r['freed_in']})",
                     "gpu_hours": r["freed_gpu_hours"], "cost_usd": r["freed_cost_usd"]})
    for r in advice["pack"]:
        packed = f"; sharing GPUs: {', '.join(r['packed_pods'])}" if r["packed_pods"] else ""
        rows.append({"category": "pack", "subject": r["pool"], "team": None,
                     "detail": f"held {r['held_gpu_hours']:.2f} GPU-h, {r['needed_gpu_hours']:.2f} needed after "
                               f"right-size ({r['right_size_gpu_hours']:.2f} freed there){packed}",
                     "gpu_hours": r["freed_gpu_hours"], "cost_usd": r["freed_cost_usd"]})
    for r in advice["queue"]:
        rows.append({"category": "queue", "subject": f"{r['namespace']}/{r['pod']}", "team": r["team"],
                     "detail": f"{r['gpus']} GPUs pending {r['fragmented_pending_s'] / 60:.0f} min with "
                               f"{r['free_gpus']} free but at most {r['largest_free_block']} on one node; "
                               f"a defragmentation at {r['defrag_would_place_at']} moving {r['gpus_to_move']} "
                               "GPU(s) would have placed it (delayed GPU-hours, not reclaimable)",
                     "gpu_hours": r["delayed_gpu_hours"], "cost_usd": None})
    return rows
