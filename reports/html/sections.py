"""The sections of the HTML report, one function each: data in, HTML out. A new section goes here
and into ``page.SECTION_LINKS`` and :func:`reports.html.page.render_html`."""

from __future__ import annotations

from typing import Any

from reports.advise import pack_text
from reports.html.charts import (
    GANTT_COLORS,
    GanttRow,
    Series,
    column_chart,
    gantt_chart,
    hbar_chart,
    line_chart,
    stacked_time_columns,
)
from reports.html.format import (
    DASH,
    IDLE_CLASS_COLORS,
    IDLE_CLASS_LABELS,
    MAX_TEAM_SERIES,
    OTHER_COLOR,
    PENDING_BUCKETS,
    STATE_COLORS,
    as_number,
    esc,
    fmt_duration,
    fmt_gib,
    fmt_hours,
    fmt_number,
    fmt_pct,
    fmt_share,
    fmt_ts,
    fmt_usd,
    parse_ts,
)
from reports.html.pieces import (
    Card,
    Column,
    ReportData,
    cell_text,
    kpi_cards,
    legend,
    no_data,
    section,
    table,
    wrapped_cell,
)

# --------------------------------------------------------------------------- sections


def summary_section(data: ReportData) -> str:
    rows = data.get("summary") or []
    s = rows[0] if rows else {}
    if not s or not (as_number(s.get("windows")) or as_number(s.get("gpu_hours_capacity"))):
        return section("summary", "Fleet summary", "Totals over the whole period in the store.",
                       no_data("the store has no pod windows or capacity windows yet — run the sink "
                               "(`gpulens sink`) or `gpulens demo` first."))
    lede = (f"Data from {fmt_ts(s.get('first_window'))} to {fmt_ts(s.get('last_window'))} UTC. GPU-hours come "
            f"from the per-pod windows; capacity, unallocated and stranded GPUs from the cluster capacity windows. "
            f"Money is USD as priced by the stream jobs.")
    return section("summary", "Fleet summary", lede, kpi_cards(_summary_cards(s, data)))


def _summary_cards(s: dict[str, Any], data: ReportData) -> list[Card]:
    """The fleet summary's figures, from its one row (``s``) and the cost and alert tables."""
    capacity = as_number(s.get("gpu_hours_capacity")) or 0.0
    allocated = as_number(s.get("gpu_hours_allocated")) or 0.0
    idle = as_number(s.get("gpu_hours_idle")) or 0.0
    idle_cost = sum(as_number(r.get("idle_window_cost_usd")) or 0.0 for r in data.get("cost_by_team") or [])
    alerts = data.get("alerts_by_type") or []

    def share(part: float, whole: float) -> str:
        return f"{part / whole * 100:.1f} % of {'capacity' if whole == capacity else 'allocated'}" if whole else ""

    return [
        ("GPU capacity", f"{fmt_hours(capacity)} GPU-h", "GPU-hours the fleet offered"),
        ("Allocated", f"{fmt_hours(allocated)} GPU-h", share(allocated, capacity)),
        ("Busy", f"{fmt_hours(s.get('gpu_hours_busy'))} GPU-h",
         share(as_number(s.get("gpu_hours_busy")) or 0.0, allocated)),
        ("Idle while allocated", f"{fmt_hours(idle)} GPU-h", share(idle, allocated)),
        ("Unallocated", f"{fmt_hours(s.get('gpu_hours_unallocated'))} GPU-h",
         share(as_number(s.get("gpu_hours_unallocated")) or 0.0, capacity)),
        ("Cost", fmt_usd(s.get("window_cost_usd")), f"of which idle {fmt_usd(idle_cost)}"),
        ("Peak stranded GPUs", fmt_number(s.get("max_stranded_gpus")), "free but unusable (fragmented)"),
        ("Peak pending demand", f"{fmt_number(s.get('max_pending_gpu_demand'))} GPUs", "requested by waiting pods"),
        ("GPU pods", fmt_number(max(as_number(s.get("pods_ended")) or 0, as_number(s.get("pods")) or 0)),
         f"{fmt_number(s.get('pods'))} held GPUs in this period"),
        ("Alerts fired", fmt_number(sum(as_number(r.get("alerts")) or 0 for r in alerts)),
         f"{fmt_number(sum(as_number(r.get('still_firing')) or 0 for r in alerts))} still firing"),
    ]


def _bucket_label(bucket_s: int) -> str:
    return fmt_duration(bucket_s).replace("m", " min").replace("h 00 min", " h") if bucket_s < 86400 else \
        fmt_duration(bucket_s)


def utilisation_section(data: ReportData, colors: dict[str, str], bucket_s: int) -> str:
    rows = data.get("utilisation_by_team") or []
    title = "GPU utilisation by team over time"
    lede = (f"Average SM utilisation of the GPUs each team held, weighted by allocated time, per "
            f"{_bucket_label(bucket_s)} bucket. A gap in the line is missing data, not idle time.")
    if not rows:
        return section("utilisation", title, lede, no_data("no pod windows in the store."))
    totals: dict[str, float] = {}
    for row in rows:
        team = str(row["team_label"])
        totals[team] = totals.get(team, 0.0) + (as_number(row.get("gpus_allocated")) or 0.0)
    ranked = sorted(totals, key=lambda t: (-totals[t], t))
    shown = ranked if len(ranked) <= MAX_TEAM_SERIES + 1 else ranked[:MAX_TEAM_SERIES]
    other = "other teams"
    buckets = sorted({parse_ts(r["bucket"]) or 0.0 for r in rows})
    acc: dict[tuple[str, float], list[float]] = {}
    for row in rows:
        team = str(row["team_label"])
        name = team if team in shown else other
        at = parse_ts(row["bucket"]) or 0.0
        weight = as_number(row.get("gpus_allocated")) or 0.0
        util = as_number(row.get("avg_sm_util_pct"))
        slot = acc.setdefault((name, at), [0.0, 0.0, 0.0])
        slot[2] += weight
        if util is not None:
            slot[0] += util * weight
            slot[1] += weight
    names = shown + ([other] if any(t not in shown for t in ranked) else [])
    half = bucket_s / 2
    series = []
    for name in names:
        points: list[tuple[float, float | None]] = []
        for at in buckets:
            found = acc.get((name, at))
            points.append((at + half, found[0] / found[1] if found and found[1] > 0 else None))
        series.append(Series(name, colors.get(name, OTHER_COLOR), points, unit=" %"))
    chart = line_chart("utilisation", title, series, "SM utilisation (%)",
                       (buckets[0], buckets[-1] + bucket_s), y_max=100.0)
    columns: list[Column] = [("bucket", "bucket start (UTC)", fmt_ts), ("team_label", "team", cell_text),
                             ("covered_s", "covers", fmt_duration),
                             ("gpus_allocated", "GPUs allocated (avg)", fmt_hours),
                             ("gpus_busy", "GPUs busy (avg)", fmt_hours), ("gpus_idle", "GPUs idle (avg)", fmt_hours),
                             ("avg_sm_util_pct", "SM utilisation", fmt_pct), ("cost_usd", "cost", fmt_usd)]
    body = (legend((s.name, s.color) for s in series) + chart
            + table(columns, rows, "Utilisation per team and bucket"))
    return section("utilisation", title, lede, body)


def fleet_states_section(data: ReportData, bucket_s: int) -> str:
    rows = data.get("capacity_over_time") or []
    title = "Fleet GPUs by state over time"
    lede = (f"Time-averaged GPUs per {_bucket_label(bucket_s)} bucket: busy, allocated but idle "
            f"(below the idle threshold), and not allocated to any pod. A bucket the data covers only in part "
            f"(see 'covers') is averaged over that part.")
    if not rows:
        return section("fleet-states", title, lede, no_data("no cluster capacity windows in the store."))
    buckets = [parse_ts(r["bucket"]) or 0.0 for r in rows]
    busy = [as_number(r.get("gpus_busy")) or 0.0 for r in rows]
    idle = [as_number(r.get("gpus_idle_allocated")) or 0.0 for r in rows]
    free = [as_number(r.get("gpus_free")) or 0.0 for r in rows]
    layers = [("busy", STATE_COLORS["busy"], busy), ("idle allocated", STATE_COLORS["idle allocated"], idle),
              ("unallocated", STATE_COLORS["unallocated"], free)]
    chart = stacked_time_columns("fleet-states", title, buckets, bucket_s, layers, "GPUs", " GPUs")
    columns: list[Column] = [("bucket", "bucket start (UTC)", fmt_ts), ("covered_s", "covers", fmt_duration),
                             ("gpus_total", "GPUs total", fmt_hours),
                             ("gpus_allocated", "allocated", fmt_hours), ("gpus_busy", "busy", fmt_hours),
                             ("gpus_idle_allocated", "idle allocated", fmt_hours),
                             ("gpus_free", "unallocated", fmt_hours)]
    body = legend((n, c) for n, c, _ in layers) + chart + table(columns, rows, "GPUs by state per bucket")
    return section("fleet-states", title, lede, body)


def idle_section(data: ReportData) -> str:
    rows = data.get("idle_by_team_and_class") or []
    title = "Idle GPU-hours by team and idle class"
    lede = ("GPU-hours allocated to pods while their GPUs sat below the idle threshold, split by why: no process "
            "on the GPU, memory held without compute, or windows that were only partly idle. Gaps in the data "
            "are counted separately and never as idle.")
    idle_rows = [r for r in rows if (as_number(r.get("idle_gpu_hours")) or 0.0) > 0]
    if not idle_rows:
        body = no_data("no allocated GPU sat idle in this period.")
        if rows:
            body += table(_idle_columns(), rows, "Idle and gap GPU-hours per team and class")
        return section("idle", title, lede, body)
    totals: dict[str, float] = {}
    values: dict[tuple[str, str], float] = {}
    for row in idle_rows:
        team, cls = str(row["team"]), str(row["idle_class"])
        hours = as_number(row.get("idle_gpu_hours")) or 0.0
        totals[team] = totals.get(team, 0.0) + hours
        key = (team, IDLE_CLASS_LABELS.get(cls, cls))
        values[key] = values.get(key, 0.0) + hours
    teams = sorted(totals, key=lambda t: (-totals[t], t))
    classes = sorted({str(r["idle_class"]) for r in idle_rows},
                     key=lambda c: (list(IDLE_CLASS_COLORS).index(c) if c in IDLE_CLASS_COLORS else 99, c))
    segments = [(IDLE_CLASS_LABELS.get(c, c), IDLE_CLASS_COLORS.get(c, OTHER_COLOR)) for c in classes]
    chart = hbar_chart("idle", title, teams, segments, values, "idle GPU-hours", " GPU-h")
    return section("idle", title, lede,
                   legend(segments) + chart + table(_idle_columns(), rows, "Idle and gap GPU-hours per team and class"))


def _idle_columns() -> list[Column]:
    return [("team", "team", cell_text), ("idle_class", "idle class", cell_text),
            ("idle_gpu_hours", "idle GPU-h", fmt_hours), ("gap_gpu_hours", "gap GPU-h (no data)", fmt_hours),
            ("pods", "pods", fmt_number), ("idle_cost_usd", "idle cost", fmt_usd)]


def pending_section(data: ReportData) -> str:
    rows = data.get("pending_distribution") or []
    title = "Pending time distribution"
    lede = ("How long GPU pods waited between creation and being scheduled, from their lifecycle records "
            "(one per pod).")
    if not rows:
        return section("pending", title, lede, no_data("no pod lifecycle records in the store."))
    by_bucket = {str(r["bucket"]): r for r in rows}
    names = list(PENDING_BUCKETS) + sorted(b for b in by_bucket if b not in PENDING_BUCKETS)
    counts = [as_number(by_bucket.get(b, {}).get("pods")) or 0.0 for b in names]
    chart = column_chart("pending", title, names, counts, "#b07aa1", "time pending before scheduling",
                         "pods", "pods")
    columns: list[Column] = [("bucket", "waited", cell_text), ("pods", "pods", fmt_number),
                             ("gpus", "GPUs", fmt_number),
                             ("pending_hours", "pending hours", fmt_hours),
                             ("max_pending_s", "longest wait", fmt_duration)]
    ordered = [by_bucket[b] for b in names if b in by_bucket]
    return section("pending", title, lede, chart + table(columns, ordered, "Pods per pending-time bucket"))


def pending_reasons_section(data: ReportData) -> str:
    rows = data.get("pending_reasons") or []
    title = "Why pods waited"
    lede = ("Pending hours by the scheduler's reason recorded on each pod's lifecycle, with the number of "
            "scheduling-failure events seen for the same message.")
    columns: list[Column] = [("reason", "reason", cell_text), ("pods", "pods", fmt_number),
                             ("pending_hours", "pending hours", fmt_hours),
                             ("scheduler_events", "scheduler events", fmt_number)]
    with_hours = [r for r in rows if (as_number(r.get("pending_hours")) or 0.0) > 0]
    if not with_hours:
        body = no_data("no pod waited for a recorded reason.")
        if rows:
            body += table(columns, rows, "Pending reasons")
        return section("pending-reasons", title, lede, body)
    reasons = [str(r["reason"]) for r in with_hours]
    values = {(str(r["reason"]), "pending hours"): as_number(r.get("pending_hours")) or 0.0 for r in with_hours}
    chart = hbar_chart("pending-reasons", title, reasons, [("pending hours", "#b07aa1")], values,
                       "pending hours (pod-hours)", " h", label_width=390)
    return section("pending-reasons", title, lede, chart + table(columns, rows, "Pending reasons"))


def stranded_section(data: ReportData, bucket_s: int) -> str:
    rows = data.get("capacity_over_time") or []
    title = "Stranded GPUs over time"
    lede = (f"Per {_bucket_label(bucket_s)} bucket: GPUs that were free but could not serve any pending pod "
            f"because they were spread over nodes (peak in the bucket), beside all free GPUs and the GPUs "
            f"pending pods asked for.")
    if not rows:
        return section("stranded", title, lede, no_data("no cluster capacity windows in the store."))
    buckets = [parse_ts(r["bucket"]) or 0.0 for r in rows]
    half = bucket_s / 2

    def points(key: str) -> list[tuple[float, float | None]]:
        return [(at + half, as_number(r.get(key))) for at, r in zip(buckets, rows, strict=True)]

    series = [Series("stranded GPUs (peak)", "#e15759", points("max_stranded_gpus"), unit=" GPUs"),
              Series("free GPUs (avg)", "#8c959f", points("gpus_free"), unit=" GPUs"),
              Series("pending GPU demand (peak)", "#b07aa1", points("max_pending_gpu_demand"), dashed=True,
                     unit=" GPUs"),
              Series("largest free block (min)", "#76b7b2", points("min_largest_free_block"), dashed=True,
                     unit=" GPUs")]
    chart = line_chart("stranded", title, series, "GPUs", (buckets[0], buckets[-1] + bucket_s), integer=True)
    columns: list[Column] = [("bucket", "bucket start (UTC)", fmt_ts), ("covered_s", "covers", fmt_duration),
                             ("max_stranded_gpus", "stranded GPUs (peak)", fmt_number),
                             ("avg_stranded_gpus", "stranded GPUs (avg)", fmt_hours),
                             ("gpus_free", "free GPUs (avg)", fmt_hours),
                             ("min_largest_free_block", "largest free block", fmt_number),
                             ("max_pending_gpu_demand", "pending GPU demand", fmt_number),
                             ("max_pending_pods", "pending pods", fmt_number)]
    hourly: list[Column] = [("hour", "hour (UTC)", fmt_ts), ("avg_gpus_free", "free GPUs (avg)", fmt_hours),
                            ("max_stranded_gpus", "stranded GPUs (peak)", fmt_number),
                            ("stranded_gpu_hours", "stranded GPU-h", fmt_hours),
                            ("max_pending_gpu_demand", "pending GPU demand", fmt_number)]
    body = (legend(((s.name, s.color) for s in series), dashed=[s.name for s in series if s.dashed]) + chart
            + table(columns, rows, "Stranded and free GPUs per bucket")
            + table(hourly, data.get("fragmentation_over_time") or [], "Fragmentation per hour"))
    return section("stranded", title, lede, body)


def cost_section(data: ReportData) -> str:
    rows = data.get("cost_by_team") or []
    title = "Cost per team"
    lede = ("What each team's GPU windows cost (USD, priced by the stream jobs), split into the part spent "
            "while the GPUs were busy and the part spent while they sat idle. The table adds projects and "
            "a re-pricing at the sink's current list prices.")
    columns: list[Column] = [("team", "team", cell_text), ("project", "project", cell_text),
                             ("gpu_hours", "GPU-h", fmt_hours), ("idle_gpu_hours", "idle GPU-h", fmt_hours),
                             ("window_cost_usd", "cost", fmt_usd), ("idle_window_cost_usd", "idle cost", fmt_usd),
                             ("list_cost_usd", "cost at list price", fmt_usd)]
    if not rows:
        return section("cost", title, lede, no_data("no pod windows in the store."))
    busy: dict[str, float] = {}
    idle: dict[str, float] = {}
    for row in rows:
        team = str(row["team"])
        cost = as_number(row.get("window_cost_usd")) or 0.0
        idle_cost = as_number(row.get("idle_window_cost_usd")) or 0.0
        busy[team] = busy.get(team, 0.0) + max(cost - idle_cost, 0.0)
        idle[team] = idle.get(team, 0.0) + idle_cost
    teams = sorted(busy, key=lambda t: (-(busy[t] + idle[t]), t))
    if sum(busy.values()) + sum(idle.values()) <= 0:
        body = no_data("the windows carry no cost (no price is configured for these GPU models).")
        return section("cost", title, lede, body + table(columns, rows, "Cost per team and project"))
    values = {(t, "busy"): busy[t] for t in teams} | {(t, "idle"): idle[t] for t in teams}
    segments = [("busy", "#4e79a7"), ("idle", "#f28e2b")]
    chart = hbar_chart("cost", title, teams, segments, values, "cost (USD)", "", value_format=fmt_usd)
    swatches = legend([("cost while busy", "#4e79a7"), ("cost while idle", "#f28e2b")])
    return section("cost", title, lede, swatches + chart
                   + table(columns, rows, "Cost per team and project"))


_LIFECYCLE_COLUMNS: list[Column] = [
    ("pod_label", "pod", cell_text), ("team", "team", cell_text), ("gpus", "GPUs", fmt_number),
    ("node", "node", cell_text), ("created_at", "created (UTC)", fmt_ts), ("scheduled_at", "scheduled (UTC)", fmt_ts),
    ("finished_at", "finished (UTC)", fmt_ts), ("pending_s", "waited", fmt_duration),
    ("running_s", "ran", fmt_duration), ("end_reason", "end", cell_text),
    ("pending_reasons", "pending reasons", wrapped_cell), ("gpu_hours", "GPU-h", fmt_hours),
    ("cost_usd", "cost", fmt_usd)]


def lifecycle_section(data: ReportData) -> str:
    rows = data.get("longest_waiting_pods") or []
    title = "Lifecycle of the longest-waiting pods"
    lede = ("Each row is one GPU pod, longest wait first: red while it waited to be scheduled, blue while it "
            "held its GPUs (to its end, or to the end of the data if it still runs).")
    if not rows:
        return section("lifecycle", title, lede, no_data("no pod lifecycle records in the store."))
    summary = (data.get("summary") or [{}])[0]
    instants = [parse_ts(r.get(k)) for r in rows for k in ("created_at", "scheduled_at", "started_at", "finished_at")]
    data_end = parse_ts(summary.get("last_window")) or max((t for t in instants if t is not None), default=0.0)
    gantt_rows = [g for g in (_gantt_row(row, data_end) for row in rows) if g is not None]
    starts = [s for r in gantt_rows for s, _, _ in r.spans] + [data_end]
    ends = [e for r in gantt_rows for _, e, _ in r.spans] + [data_end]
    chart = gantt_chart("lifecycle", title, gantt_rows, (min(starts), max(ends)))
    rows = [r | {"pod_label": f"{r.get('namespace')}/{r.get('name')}"} for r in rows]
    swatches = legend([("pending (waiting to be scheduled)", GANTT_COLORS["pending"]),
                       ("running (holding GPUs)", GANTT_COLORS["running"])])
    return section("lifecycle", title, lede, swatches + chart + table(_LIFECYCLE_COLUMNS, rows, "Longest-waiting pods"))


def _gantt_row(row: dict[str, Any], data_end: float) -> GanttRow | None:
    """One pod's bar: pending from creation to scheduling, running from start to its end (or the
    data's, while it runs); None for a pod without a creation time."""
    created = parse_ts(row.get("created_at"))
    scheduled = parse_ts(row.get("scheduled_at"))
    started = parse_ts(row.get("started_at")) or scheduled
    finished = parse_ts(row.get("finished_at"))
    if created is None:
        return None
    end = finished if finished is not None else max(data_end, created)
    spans: list[tuple[float, float, str]] = []
    pending_end = scheduled if scheduled is not None else (started if started is not None else end)
    if pending_end > created:
        spans.append((created, pending_end, "pending"))
    if started is not None and end > started:
        spans.append((started, end, "running"))
    gpus = as_number(row.get("gpus"))
    label = f"{row.get('namespace')}/{row.get('name')} ({fmt_number(gpus)} GPU{'s' if gpus != 1 else ''})"
    note = f"waited {fmt_duration(row.get('pending_s'))}" if (as_number(row.get("pending_s")) or 0) > 0 else \
        str(row.get("end_reason") or "")
    return GanttRow(label, spans, note, finished is None)


MIG_CAPABLE = ("A100", "H100", "H200", "H20", "B200", "GB200", "A30")
"""GPU models whose memory can be split into MIG slices (a name containing one of these)."""
SLICES = ((1 / 8, "1g"), (1 / 4, "2g"), (1 / 2, "3g"))
HEADROOM = 1.2


def fits_in(peak_bytes: float | None, gpu_bytes: float | None, model: str) -> str:
    """The smallest slice of the GPU that holds the pod's peak VRAM with 20 % headroom: a MIG profile
    (named like NVIDIA's, 1g = an eighth of the memory) on MIG-capable models, a share otherwise."""
    if peak_bytes is None or not gpu_bytes:
        return DASH
    mig = any(name in model for name in MIG_CAPABLE)
    for fraction, compute in SLICES:
        if peak_bytes * HEADROOM <= gpu_bytes * fraction:
            size_gb = round(gpu_bytes * fraction / 2**30)
            return f"MIG {compute}.{size_gb}gb" if mig else f"1/{round(1 / fraction)} of a shared GPU"
    return "whole GPU"


def vram_section(data: ReportData) -> str:
    rows = data.get("pod_vram_peaks") or []
    title = "Peak VRAM per pod against GPU memory"
    lede = ("The most VRAM each pod used in any window (and in its 95th-percentile window) against the memory "
            "of the GPUs it held, biggest GPU-hours first: pods far below their GPU's memory could move to a "
            f"smaller MIG slice or share a GPU. 'fits in' keeps {round((HEADROOM - 1) * 100)} % headroom over "
            "the peak.")
    if not rows:
        return section("vram", title, lede, no_data("no pod windows with a VRAM reading in the store."))
    rows = [r | {"pod_label": f"{r.get('namespace')}/{r.get('pod')}",
                 "fits_in": fits_in(as_number(r.get("peak_mem_bytes")), as_number(r.get("gpu_mem_bytes")),
                                    str(r.get("gpu_model") or ""))} for r in rows]
    labels = [str(r["pod_label"]) for r in rows]
    values: dict[tuple[str, str], float] = {}
    for row in rows:
        peak = (as_number(row.get("peak_mem_bytes")) or 0.0) / 2**30
        total = (as_number(row.get("gpu_mem_bytes")) or 0.0) / 2**30
        values[(str(row["pod_label"]), "peak VRAM")] = peak
        values[(str(row["pod_label"]), "never used")] = max(total - peak, 0.0)
    segments = [("peak VRAM", "#4e79a7"), ("never used", "#d0d7de")]
    chart = hbar_chart("vram", title, labels, segments, values, "GiB per GPU", " GiB", value_format=fmt_number)
    columns: list[Column] = [("pod_label", "pod", cell_text), ("team", "team", cell_text),
                             ("gpu_model", "GPU", cell_text),
                             ("gpus", "GPUs", fmt_number), ("gpu_hours", "GPU-h", fmt_hours),
                             ("peak_mem_bytes", "peak VRAM", fmt_gib), ("p95_mem_bytes", "p95 window VRAM", fmt_gib),
                             ("gpu_mem_bytes", "GPU memory", fmt_gib), ("peak_share", "peak share", fmt_share),
                             ("fits_in", "fits in", cell_text)]
    swatches = legend([("peak VRAM", "#4e79a7"), ("GPU memory never used", "#d0d7de")])
    return section("vram", title, lede, swatches + chart + table(columns, rows, "Peak VRAM per pod"))


def advice_section(data: ReportData) -> str:
    advice = data.get("advice") or {}
    title = "Reclaimable capacity"
    headline = advice.get("headline")
    if not headline:
        return section("reclaimable", title, "What `gpulens advise` finds reclaimable.",
                       no_data("the store has no pod windows or capacity windows yet."))
    totals = advice.get("totals") or {}
    cards = [("Reclaimable", f"{headline['gpus']:.1f} GPUs", f"{headline['percent']:.0f} % of the fleet"),
             ("Per month", fmt_usd(headline["usd_per_month"]), f"{fmt_usd(totals.get('reclaimable_cost_usd'))} "
              f"in this period")]
    cards += [(label, f"{fmt_hours(totals.get(f'{key}_gpu_hours'))} GPU-h", fmt_usd(totals.get(f"{key}_cost_usd")))
              for key, label in (("reclaim", "Reclaim idle pods"), ("right_size", "Right-size"), ("pack", "Pack"),
                                 ("scale_to_zero", "Scale to zero"))]
    cards.append(("Lost to fragmentation", f"{fmt_hours(totals.get('queue_delayed_gpu_hours'))} GPU-h",
                  "pending demand delayed (not in the total)"))
    lede = (f"{advice.get('headline_text')}; {pack_text(headline)}. Over {advice['period']['start']} to "
            f"{advice['period']['end']} (counted back from the latest data). No GPU-hour is in two categories; "
            "the method and its limits are in docs/advise.md.")
    columns: list[Column] = [("category", "category", cell_text), ("subject", "pod / node / pool", cell_text),
                             ("team", "team", cell_text), ("detail", "why", wrapped_cell),
                             ("gpu_hours", "GPU-h", fmt_hours),
                             ("cost_usd", "money", fmt_usd)]
    rows = [r | {"team": r.get("team") or "-"} for r in data.get("reclaimable_capacity") or []]
    return section("reclaimable", title, lede, kpi_cards(cards)
                   + table(columns, rows, "Recommendations with the figures behind them"))


def firing_section(data: ReportData) -> str:
    rows = data.get("firing_alerts") or []
    title = "Alerts still firing"
    lede = ("Alerts whose last transition is 'firing', most severe and oldest first; the age is measured to the "
            "end of the data, not to the wall clock.")
    if not rows:
        return section("firing", title, lede, no_data("no alert is firing at the end of the data."))
    counts: dict[str, float] = {}
    for row in rows:
        counts[str(row["alert_type"])] = counts.get(str(row["alert_type"]), 0.0) + 1.0
    types = sorted(counts, key=lambda t: (-counts[t], t))
    chart = column_chart("firing", title, types, [counts[t] for t in types], "#e15759", "alert type", "alerts",
                         "firing")
    rows = [r | {"subject": f"{r.get('kind')} " + "/".join(str(p) for p in (r.get("namespace"), r.get("name")) if p)
                 if r.get("name") else f"{r.get('kind')} {r.get('node') or ''}".strip()} for r in rows]
    columns: list[Column] = [("severity", "severity", cell_text), ("alert_type", "type", cell_text),
                             ("subject", "subject", cell_text), ("first_at", "since (UTC)", fmt_ts),
                             ("age_s", "age", fmt_duration), ("summary", "summary", wrapped_cell)]
    return section("firing", title, lede, chart + table(columns, rows, "Alerts firing at the end of the data"))


def more_section(data: ReportData) -> str:
    parts = []
    tables: list[tuple[str, str, list[Column]]] = [
        ("top_pods", "Top GPU consumers by pod", [
            ("namespace", "namespace", cell_text), ("pod", "pod", cell_text), ("team", "team", cell_text),
            ("project", "project", cell_text), ("gpu_hours", "GPU-h", fmt_hours),
            ("idle_gpu_hours", "idle GPU-h", fmt_hours), ("avg_sm_util_pct", "SM utilisation", fmt_pct),
            ("peak_mem_bytes", "peak VRAM", fmt_gib), ("energy_kwh", "energy (kWh)", fmt_hours),
            ("cost_usd", "cost", fmt_usd)]),
        ("nodes_to_scale_down", "Nodes to scale down", [
            ("node", "node", cell_text), ("gpu_model", "GPU model", cell_text), ("gpus", "GPUs", fmt_number),
            ("unallocated_gpu_hours", "unallocated GPU-h", fmt_hours),
            ("unallocated_share", "unallocated share", fmt_share),
            ("cost_burned_usd", "cost burned", fmt_usd), ("idle_node_alerts", "idle-node alerts", fmt_number)]),
        ("alerts_by_type", "Alerts by type", [
            ("type", "type", cell_text), ("alerts", "alerts", fmt_number), ("still_firing", "still firing", fmt_number),
            ("avg_duration_s", "mean duration", fmt_duration)]),
        ("cost_per_unit_of_work", "Cost per unit of work", [
            ("namespace", "namespace", cell_text), ("pod", "pod", cell_text), ("team", "team", cell_text),
            ("cost_usd", "cost", fmt_usd), ("steps", "steps", fmt_number),
            ("cost_per_step_usd", "USD per step", lambda v: fmt_number(v, 6)),
            ("cost_per_1k_tokens_usd", "USD per 1k tokens", lambda v: fmt_number(v, 6))]),
    ]
    for key, caption, columns in tables:
        rows = data.get(key) or []
        parts.append(f'<h3>{esc(caption)}</h3>')
        parts.append(table(columns, rows, "") if rows else no_data(f"nothing to show for {caption.lower()}."))
    return section("more", "More analyses", "The other canned analyses of `gpulens report`, as tables.",
                   "".join(parts))

