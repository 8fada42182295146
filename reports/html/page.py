"""``gpulens report --html FILE``: one self-contained HTML page with the fleet's figures as charts.

Team leads and finance open the report in a browser, mail it, or archive it; it must therefore
need nothing else — no JavaScript, no CDN, no web fonts. The charts are inline SVG generated here
from the same plain rows as ``gpulens report`` (``reports.analyses``) plus the time series of
``reports.timeseries``, every chart has axis labels with units, a legend and the table of its
figures underneath, and an empty section says so instead of drawing an empty frame.

:func:`render_html` is pure (data in, HTML out) and deterministic — the same rows give the same
bytes, so reports can be diffed and tested. Every string that comes from the cluster (pod, team,
namespace names, scheduler messages) is escaped. :func:`collect_report_data` runs the queries;
:func:`write_html_report` does both and writes the file.

Data marks in the SVG carry ``class="mark"`` and ``data-series``/``data-label``/``data-value``
attributes and a ``<title>`` tooltip, so a browser test (and a curious reader) can find them.
"""

from __future__ import annotations

from pathlib import Path

from common.settings import AdviseThresholds
from reports import timeseries
from reports.advise import advice_rows, advise
from reports.analyses import ANALYSES, advisor_thresholds, run_report
from reports.fragmentation_series import fragmentation_over_time
from reports.html.allocator import allocator_section
from reports.html.format import FONT, WIDTH, as_number, esc, fmt_ts
from reports.html.fragmentation import fragmentation_section
from reports.html.pieces import ReportData, team_colors, team_filter, team_links
from reports.html.sections import (
    advice_section,
    cost_section,
    firing_section,
    fleet_states_section,
    idle_section,
    lifecycle_section,
    more_section,
    pending_reasons_section,
    pending_section,
    stranded_section,
    summary_section,
    utilisation_section,
    vram_section,
)
from reports.notes import price_gaps, unknown_money_in_advice, unknown_money_in_report
from reports.reader import WHOLE_HISTORY, Period, SqlReader, scoped
from schemas.messages import DEFAULT_CLUSTER

CSS = """
:root{--ink:#1f2328;--muted:#57606a;--line:#d8dee4;--bg:#f6f8fa;--card:#fff;--accent:#4e79a7}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 FONT}
header.top{background:#1f2d3d;color:#fff;padding:28px 40px 24px}
header.top h1{margin:0 0 4px;font-size:26px;font-weight:650;letter-spacing:.2px}
header.top p{margin:0;color:#c9d1d9}
nav{display:flex;flex-wrap:wrap;gap:6px 16px;margin-top:14px}
nav a{color:#9ecbff;text-decoration:none;font-size:13px}
.teams{margin-top:10px;font-size:12.5px;color:#c9d1d9;display:flex;flex-wrap:wrap;gap:6px;align-items:center}
.teams a{color:#9ecbff;text-decoration:none;border:1px solid #3d5166;border-radius:10px;padding:1px 9px}
.team-anchor{position:fixed;top:0}
main{max-width:1040px;margin:0 auto;padding:24px 20px 48px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:20px 24px;margin:0 0 20px;
box-shadow:0 1px 2px rgba(31,35,40,.04)}
h2{margin:0 0 4px;font-size:18px;font-weight:650}
h3{margin:18px 0 6px;font-size:15px}
.lede{margin:0 0 12px;color:var(--muted);max-width:880px}
.kpis{display:grid;grid-template-columns:repeat(5,1fr);gap:12px}
.kpi{border:1px solid var(--line);border-radius:8px;padding:10px 12px;background:#fbfcfd}
.kpi-label{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.4px}
.kpi-value{font-size:20px;font-weight:650;margin:2px 0;font-variant-numeric:tabular-nums}
.kpi-note{font-size:12px;color:var(--muted)}
svg.chart{display:block;width:100%;height:auto;max-width:WIDTHpx;font-family:FONT}
svg .grid{stroke:#eaeef2;stroke-width:1}
svg .axis{stroke:#8c959f;stroke-width:1}
svg .tick{fill:#57606a;font-size:11px}
svg .axis-label{fill:#1f2328;font-size:12px;font-weight:600}
svg .category{fill:#1f2328;font-size:12px}
svg .value{fill:#57606a;font-size:11px}
svg .mark:hover{opacity:.75}
.legend{list-style:none;display:flex;flex-wrap:wrap;gap:4px 18px;margin:0 0 6px;padding:0;font-size:13px}
.legend li{display:flex;align-items:center;gap:6px}
.swatch{display:inline-block;width:14px;height:10px;border-radius:2px}
.swatch.dashed{height:3px;width:18px}
.no-data{margin:8px 0;padding:14px 16px;border:1px dashed #afb8c1;border-radius:8px;background:#f6f8fa;
color:var(--muted);font-style:italic}
.table{margin-top:12px}
.caption,details.table summary{font-size:12px;color:var(--muted);font-weight:600;margin-bottom:4px;cursor:default}
details.table summary{cursor:pointer}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:12.5px;font-variant-numeric:tabular-nums}
th,td{padding:5px 8px;border-bottom:1px solid #eaeef2;text-align:left;white-space:nowrap}
th{background:#f6f8fa;font-weight:600;color:#424a53}
td.num,th.num{text-align:right}
td.wrap{white-space:normal;min-width:180px}
tbody tr:nth-child(even){background:#fbfcfd}
footer{color:var(--muted);font-size:12px;text-align:center;padding:8px 0 24px}
""".replace("FONT", FONT).replace("WIDTH", str(WIDTH))

SECTION_LINKS = (("summary", "Summary"), ("utilisation", "Utilisation"), ("fleet-states", "GPU states"),
                 ("idle", "Idle GPU-hours"), ("pending", "Pending time"), ("pending-reasons", "Pending reasons"),
                 ("stranded", "Stranded GPUs"), ("cost", "Cost"), ("vram", "VRAM"),
                 ("allocator", "Allocator"), ("reclaimable", "Reclaimable"),
                 ("firing", "Firing alerts"),
                 ("lifecycle", "Lifecycle"), ("more", "More"))


def render_html(data: ReportData, title: str = "gpulens fleet report") -> str:
    """The whole report page for ``data`` (as :func:`collect_report_data` returns it); pure and deterministic."""
    bucket_s = int(as_number(data.get("bucket_s")) or 60)
    colors = team_colors(data)
    summary = (data.get("summary") or [{}])[0]
    period = (f"{fmt_ts(summary.get('first_window'))} to {fmt_ts(summary.get('last_window'))} UTC"
              if summary.get("first_window") else "no data yet")
    nav = "".join(f'<a href="#{anchor}">{esc(label)}</a>' for anchor, label in SECTION_LINKS)
    teams = sorted(colors)
    anchors, filter_css = team_filter(teams)
    sections = [
        summary_section(data),
        utilisation_section(data, colors, bucket_s),
        fleet_states_section(data, bucket_s),
        idle_section(data),
        pending_section(data),
        pending_reasons_section(data),
        stranded_section(data, bucket_s),
        fragmentation_section(data, bucket_s),
        cost_section(data),
        vram_section(data),
        allocator_section(data),
        advice_section(data),
        firing_section(data),
        lifecycle_section(data),
        more_section(data),
    ]
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}{filter_css}</style></head><body>{anchors}"
        f'<header class="top"><h1>{esc(title)}</h1><p>{esc(period)} · GPU-hours, idle time, waiting, '
        f"fragmentation and cost of the GPU fleet</p><nav>{nav}</nav>{team_links(teams)}</header>"
        f'<main>{"".join(sections)}</main>'
        f"<footer>Generated by gpulens from ClickHouse (pod windows, cluster capacity, pod lifecycle, alerts). "
        f"Self-contained: no scripts, no external resources.</footer>"
        "</body></html>\n"
    )


# --------------------------------------------------------------------------- data and file


def collect_report_data(reader: SqlReader, advise_thresholds: AdviseThresholds | None = None,
                        cluster: str | None = None, period: Period = WHOLE_HISTORY) -> ReportData:
    """Every canned analysis plus the time series the charts need, as plain rows, of one cluster
    (``reports.reader.scoped``: the named one, else the store's only one) over ``period``; ``advice``
    is the reclaimable-capacity advisor's whole answer (``reports.advise``), run once for its section
    (over ``period`` unless that is the whole history: then over the thresholds' period)."""
    reader = scoped(reader, cluster)
    data: ReportData = dict(run_report(reader, [n for n in ANALYSES if n != "reclaimable_capacity"], period=period))
    data["cluster"] = reader.cluster
    data["advice"] = advise(reader, advisor_thresholds(advise_thresholds, period))
    gaps = price_gaps(reader, period)
    unknown_money_in_advice(data["advice"], gaps)
    data["reclaimable_capacity"] = advice_rows(data["advice"])
    bucket_s = timeseries.choose_bucket_s(reader, period=period)
    data["bucket_s"] = bucket_s
    data["utilisation_by_team"] = timeseries.utilisation_by_team(reader, bucket_s, period)
    data["capacity_over_time"] = timeseries.capacity_over_time(reader, bucket_s, period)
    data["fragmentation_series"] = fragmentation_over_time(reader, bucket_s, period)
    data["longest_waiting_pods"] = timeseries.longest_waiting_pods(reader, period=period)
    data["pod_vram_peaks"] = timeseries.pod_vram_peaks(reader, period=period)
    data["allocator_by_pod"] = timeseries.allocator_by_pod(reader, period=period)
    data["firing_alerts"] = timeseries.firing_alerts(reader)
    unknown_money_in_report(data, gaps)
    return data


def write_html_report(reader: SqlReader, path: Path | str, advise_thresholds: AdviseThresholds | None = None,
                      cluster: str | None = None, period: Period = WHOLE_HISTORY) -> Path:
    """Query, render and write the report of one cluster over ``period`` (see :func:`collect_report_data`);
    returns the file's path."""
    target = Path(path)
    data = collect_report_data(reader, advise_thresholds, cluster, period)
    page = render_html(data) if data["cluster"] == DEFAULT_CLUSTER else render_html(
        data, f"gpulens fleet report: cluster {data['cluster']}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return target
