"""``render_html`` alone: every section and chart, escaping, empty data, determinism, self-containment."""

from __future__ import annotations

import copy
import re

import pytest

from reports.html.page import render_html
from reports.html.sections import fits_in
from tests.report.dom import parse
from tests.report.sample import EVIL_POD, EVIL_REASON, EVIL_TEAM, sample_data

SECTIONS = ["summary", "utilisation", "fleet-states", "idle", "pending", "pending-reasons", "stranded", "cost",
            "vram", "reclaimable", "firing", "lifecycle", "more"]
CHARTS = ["utilisation", "fleet-states", "idle", "pending", "pending-reasons", "stranded", "cost", "vram", "firing",
          "lifecycle"]


def test_every_section_has_a_titled_chart_with_data_marks_legend_and_table() -> None:
    page = parse(render_html(sample_data()))
    assert page.title == "gpulens fleet report"
    assert page.sections == SECTIONS
    assert sorted(page.charts) == sorted(CHARTS)
    for name in CHARTS:
        assert page.charts[name].title, name
        assert page.charts[name].marks, name
        assert page.tables.get(name), f"no table under {name}"
    assert not page.no_data.get("utilisation")
    # axis labels and units
    for label in ("SM utilisation (%)", "time (UTC)", "idle GPU-hours", "cost (USD)", "pods", "GPUs",
                  "pending hours (pod-hours)", "time pending before scheduling"):
        assert label in page.text, label


def test_charts_show_the_figures_of_the_data() -> None:
    page = parse(render_html(sample_data()))
    # utilisation: one line per team + points; the missing reading breaks the line, it is not a zero
    lines = [m for m in page.charts["utilisation"].marks if m.tag == "path"]
    assert sorted(m.series for m in lines) == sorted(["nlp", EVIL_TEAM])
    assert page.series_values("utilisation", "nlp") == [90.0, 89.0, 88.0, 87.0]
    evil_points = [m.value for m in page.charts["utilisation"].marks if m.tag == "circle" and m.series == EVIL_TEAM]
    assert evil_points == [40.0, 40.0, 40.0] and 0.0 not in evil_points
    # idle GPU-hours by class, cost split busy/idle per team
    assert page.by_label("idle") == {EVIL_TEAM: pytest.approx(0.25)}
    assert page.by_label("cost") == {"nlp": pytest.approx(3.2), EVIL_TEAM: pytest.approx(1.6)}
    assert page.series_values("cost", "idle") == [pytest.approx(0.6)]
    # pending histogram: the five buckets, bars only where pods waited
    assert page.by_label("pending") == {"< 1m": 2.0, "5-15m": 1.0}
    assert max(page.series_values("stranded", "stranded GPUs (peak)")) == 6
    # gantt: longest wait first, a pending then a running span
    spans = page.charts["lifecycle"].marks
    assert [(m.label, m.series, m.value) for m in spans[:2]] == [
        ("ml/big-train (8 GPUs)", "pending", 600.0), ("ml/big-train (8 GPUs)", "running", 480.0)]
    # fleet states: stacked layers per bucket
    assert page.series_values("fleet-states", "idle allocated") == [1.0, 1.0, 1.0, 5.0]
    # VRAM: the peak and the memory it never used add up to the GPU's memory, in GiB
    assert page.series_values("vram", "peak VRAM") == [70.0, 6.0]
    assert page.series_values("vram", "never used") == [10.0, 74.0]
    vram_rows = page.records("vram")
    assert [row["fits in"] for row in vram_rows] == ["whole GPU", "MIG 1g.10gb"]
    assert vram_rows[0]["peak VRAM"] == "70.0 GiB"
    # alerts still firing, with their age at the end of the data
    assert page.by_label("firing") == {"idle_gpu": 1.0}
    (firing,) = page.records("firing")
    assert (firing["type"], firing["age"], firing["subject"]) == ("idle_gpu", "10m", f"pod ml/{EVIL_POD}")
    # header figures
    assert page.kpis["GPU capacity"] == "5.33 GPU-h"
    assert page.kpis["Idle while allocated"] == "0.25 GPU-h"
    assert page.kpis["Cost"] == "$4.80"
    assert page.kpis["Peak stranded GPUs"] == "6"
    assert page.kpis["Alerts fired"] == "2"


@pytest.mark.parametrize(("peak_gib", "gpu_gib", "model", "expected"), [
    (6.0, 80.0, "NVIDIA H100 80GB HBM3", "MIG 1g.10gb"),
    (8.4, 80.0, "NVIDIA H100 80GB HBM3", "MIG 2g.20gb"),  # 8.4 GiB + 20 % headroom > 10 GiB
    (30.0, 80.0, "NVIDIA A100-SXM4-80GB", "MIG 3g.40gb"),
    (4.0, 40.0, "NVIDIA A100-SXM4-40GB", "MIG 1g.5gb"),
    (5.0, 24.0, "NVIDIA L4", "1/4 of a shared GPU"),
    (70.0, 80.0, "NVIDIA H100 80GB HBM3", "whole GPU"),
])
def test_fits_in_names_the_smallest_slice_with_headroom(peak_gib: float, gpu_gib: float, model: str,
                                                       expected: str) -> None:
    assert fits_in(peak_gib * 2**30, gpu_gib * 2**30, model) == expected


def test_team_filter_links_rows_and_rules_without_scripts() -> None:
    markup = render_html(sample_data())
    assert "<script" not in markup.split("</style>", 1)[1].replace(EVIL_POD.replace("<", "&lt;"), "")
    links = re.findall(r'<a href="#(team-\d+)">([^<]+)</a>', markup)
    assert sorted(name for _, name in links) == sorted(["nlp", EVIL_TEAM.replace("&", "&amp;").replace('"', "&quot;")
                                                         .replace("<", "&lt;").replace(">", "&gt;")])
    for anchor, _ in links:
        assert f'<span class="team-anchor" id="{anchor}"></span>' in markup
        assert f"#{anchor}:target ~ main tr[data-team]:not(" in markup
    style = markup.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "<" not in style and '"ops"' not in style, "a team name must not escape the CSS string or <style>"
    page = parse(markup)
    cost_rows = page.tables["cost"][1:]
    assert cost_rows and all(row for row in cost_rows)
    assert markup.count('<tr data-team="nlp">') >= 3


def test_user_strings_are_escaped_everywhere() -> None:
    markup = render_html(sample_data())
    assert "<script" not in markup and "<img" not in markup and "<b>" not in markup
    assert "&lt;script&gt;alert(&quot;pod&quot;)&lt;/script&gt;" in markup
    assert 'ml&amp;&quot;ops&quot;&lt;b&gt;' in markup
    page = parse(markup)
    # the parsed text gives the names back exactly: escaped, not mangled
    assert EVIL_POD in page.text and EVIL_TEAM in page.text and EVIL_REASON in page.text
    assert EVIL_TEAM in {m.series for m in page.charts["utilisation"].marks}
    assert page.tags <= {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "p", "nav",
                         "a", "main", "section", "div", "ul", "li", "span", "svg", "line", "text", "path",
                         "circle", "rect", "table", "thead", "tbody", "tr", "th", "td", "details", "summary",
                         "footer"}


def test_empty_store_gives_a_clear_no_data_note_in_every_section() -> None:
    for data in ({}, {"summary": [{"windows": 0, "pods": 0, "gpu_hours_capacity": None}], "bucket_s": 60}):
        page = parse(render_html(data))
        assert page.sections == SECTIONS
        assert page.charts == {}
        for name in SECTIONS:
            assert page.no_data.get(name), f"{name} has no 'no data' note"
        assert "no data yet" in page.text


def test_sections_without_figures_say_so_instead_of_drawing_empty_frames() -> None:
    data = sample_data()
    for row in data["cost_by_team"]:
        row["window_cost_usd"] = row["idle_window_cost_usd"] = 0.0
    data["idle_by_team_and_class"] = []
    data["pending_reasons"] = []
    page = parse(render_html(data))
    assert "cost" not in page.charts and "no price is configured" in page.no_data["cost"][0]
    assert page.tables["cost"], "the cost table stays (GPU-hours, list price)"
    assert "idle" not in page.charts and page.no_data["idle"]
    assert "pending-reasons" not in page.charts and page.no_data["pending-reasons"]
    assert "utilisation" in page.charts


def test_output_is_deterministic_and_self_contained() -> None:
    data = sample_data()
    first = render_html(data)
    assert render_html(copy.deepcopy(data)) == first
    assert data == sample_data(), "render_html must not modify its input"
    assert "<script" not in first and "<link" not in first and "@import" not in first and "url(" not in first
    assert set(re.findall(r"https?://[^\"' )]+", first)) == {"http://www.w3.org/2000/svg"}  # the SVG namespace


def test_many_teams_fold_into_other_teams_with_weighted_utilisation() -> None:
    data = sample_data()
    data["utilisation_by_team"] = [
        {"bucket": "2026-01-05T09:00:00Z", "team_label": f"team-{i:02d}", "gpus_allocated": 1.0 + i,
         "gpus_busy": 1.0, "gpus_idle": 0.0, "avg_sm_util_pct": 10.0 * (i % 10), "cost_usd": 0.0}
        for i in range(12)]
    page = parse(render_html(data))
    lines = [m.series for m in page.charts["utilisation"].marks if m.tag == "path"]
    assert len(lines) == 9 and lines[-1] == "other teams"
    # the four smallest teams (00..03, weights 1..4, util 0,10,20,30) fold into one weighted mean
    assert page.series_values("utilisation", "other teams")[-1] == pytest.approx((0 + 20 + 60 + 120) / 10)
