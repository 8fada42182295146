"""The HTML report as a browser shows it: headless Chromium renders it, its DOM holds every chart
with its data marks, and the screenshot is not blank — each chart's card shows the chart's colours.

Chromium is required (``scripts/test.sh`` installs Debian's ``chromium`` package when missing):
without it this test fails with the command to install it, it is never skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from reports.html.charts import GANTT_COLORS
from reports.html.format import IDLE_CLASS_COLORS, PALETTE, STATE_COLORS
from tests.report.conftest import StoredReport
from tests.report.dom import parse

SCENARIO = Path(__file__).parent / "scenarios" / "report-fleet.yaml"
SECTIONS = ["summary", "utilisation", "fleet-states", "idle", "pending", "pending-reasons", "stranded", "cost",
            "vram", "reclaimable", "firing", "lifecycle", "more"]
CARD_BG = (255, 255, 255)
PAGE_BG = (246, 248, 250)
PENDING_PURPLE = "#b07aa1"
CARD_PADDING_X = 150
"""A pixel column inside the cards' left padding at 1280 px: main is 1040 px wide plus 20 px padding."""

# colours each chart must show in its card, and how many of them at least; a colour counts when it covers
# MIN_PIXELS pixels or more (a legend swatch alone covers about 130). Greys are left out: text uses them too.
MIN_PIXELS = 300
CHART_COLOURS: dict[str, tuple[list[str], int]] = {
    "utilisation": (list(PALETTE[:4]), 4),
    "fleet-states": ([STATE_COLORS["busy"], STATE_COLORS["idle allocated"]], 2),
    "idle": (list(IDLE_CLASS_COLORS.values()), 2),
    "pending": ([PENDING_PURPLE], 1),
    "pending-reasons": ([PENDING_PURPLE], 1),
    "stranded": (["#e15759", PENDING_PURPLE, "#76b7b2"], 2),
    "cost": (["#4e79a7", "#f28e2b"], 2),
    "vram": (["#4e79a7"], 1),
    "firing": (["#e15759"], 1),
    "lifecycle": (list(GANTT_COLORS.values()), 2),
}


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("headless Chromium is needed to check the HTML report: install Debian's package "
                "(`apt-get install -y chromium`; scripts/test.sh does it when run as root)")


def _run(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    command = [_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(command)} failed: {result.stderr[-2000:]}"
    return result


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def _near(pixel: object, b: tuple[int, int, int], tolerance: int = 12) -> bool:
    assert isinstance(pixel, tuple), pixel
    return all(abs(int(x) - y) <= tolerance for x, y in zip(pixel[:3], b, strict=True))


def _cards(image: Image.Image, x: int) -> list[tuple[int, int]]:
    """Vertical extents of the white cards, read down one pixel column inside the cards' left padding."""
    pixels = image.load()
    assert pixels is not None
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for y in range(image.height):
        white = _near(pixels[x, y], CARD_BG, 2)
        if white and start is None:
            start = y
        elif not white and start is not None:
            if y - start > 40:
                runs.append((start, y))
            start = None
    return runs


def _colour_counts(image: Image.Image, box: tuple[int, int, int, int], colours: list[str]) -> dict[str, int]:
    region = image.crop(box).convert("RGB")
    counts = dict.fromkeys(colours, 0)
    for count, pixel in region.getcolors(maxcolors=1 << 20) or []:
        for colour in colours:
            if _near(pixel, _rgb(colour)):
                counts[colour] += count
    return counts


def test_chromium_renders_every_chart(stored_report: Callable[[Path], StoredReport], tmp_path: Path) -> None:
    report = stored_report(SCENARIO)
    url = report.html_path.resolve().as_uri()

    # the DOM as Chromium built it: every section, every chart with its titled data marks
    dom = parse(_run(["--dump-dom", url], tmp_path / "profile").stdout)
    assert dom.title == "gpulens fleet report"
    assert dom.sections == SECTIONS
    assert sorted(dom.charts) == sorted(CHART_COLOURS)
    minimum_marks = {"utilisation": 4 + 4 * 90, "fleet-states": 2 * 90, "idle": 3, "pending": 3,
                     "pending-reasons": 1, "stranded": 4 + 4 * 90, "cost": 6, "vram": 2 * 11, "firing": 1,
                     "lifecycle": 12 + 3}
    for name, count in minimum_marks.items():
        chart = dom.charts[name]
        assert len(chart.marks) >= count, (name, len(chart.marks))
        assert chart.title, name
    assert {m.series for m in dom.charts["utilisation"].marks} == {"nlp", "speech", "vision", "research"}
    assert not dom.no_data.get("utilisation") and not dom.no_data.get("cost")

    # the first screen, at the documented size: header, summary and the first charts, in colour
    first = tmp_path / "first.png"
    _run([f"--screenshot={first}", "--window-size=1280,2400", url], tmp_path / "profile")
    with Image.open(first) as image:
        assert image.size == (1280, 2400)
        rgb = image.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 200, "the first screen is (nearly) blank"
        # the fleet-states columns fill large areas, the utilisation lines thin ones
        top = _colour_counts(rgb, (0, 0, 1280, 2400), [STATE_COLORS["busy"], STATE_COLORS["idle allocated"]])
        assert all(n > 5000 for n in top.values()), top
        lines = _colour_counts(rgb, (0, 0, 1280, 2400), list(PALETTE[:4]))
        assert all(n > 1000 for n in lines.values()), lines

    # the whole page: find each card and check its chart shows its colours
    full = tmp_path / "full.png"
    _run([f"--screenshot={full}", "--window-size=1280,12000", url], tmp_path / "profile")
    with Image.open(full) as image:
        rgb = image.convert("RGB")
        cards = _cards(rgb, CARD_PADDING_X)
        assert len(cards) == len(SECTIONS), f"expected {len(SECTIONS)} cards, found {cards}"
        below = rgb.getpixel((CARD_PADDING_X, cards[-1][1] + 30))
        assert _near(below, PAGE_BG, 3), "the page did not fit the screenshot"
        for section, (top_y, bottom_y) in zip(SECTIONS, cards, strict=True):
            if section not in CHART_COLOURS:
                continue
            wanted, needed = CHART_COLOURS[section]
            counts = _colour_counts(rgb, (CARD_PADDING_X, top_y, 1280 - CARD_PADDING_X, bottom_y), wanted)
            shown = [c for c, n in counts.items() if n >= MIN_PIXELS]
            assert len(shown) >= needed, f"{section}: chart colours {counts}"


def test_team_filter_hides_the_other_teams_without_scripts(stored_report: Callable[[Path], StoredReport],
                                                            tmp_path: Path) -> None:
    """``report.html#team-N`` (the header's team links): the utilisation chart keeps one team's line."""
    report = stored_report(SCENARIO)
    url = report.html_path.resolve().as_uri()
    markup = report.html_path.read_text(encoding="utf-8")
    links = dict(re.findall(r'<a href="#(team-\d+)">([^<]+)</a>', markup))
    assert set(links.values()) == {"nlp", "speech", "vision", "research"}, links
    anchor = next(a for a, team in links.items() if team == "nlp")

    shot = tmp_path / "filtered.png"
    _run([f"--screenshot={shot}", "--window-size=1280,12000", f"{url}#{anchor}"], tmp_path / "profile")
    with Image.open(shot) as image:
        rgb = image.convert("RGB")
        cards = dict(zip(SECTIONS, _cards(rgb, CARD_PADDING_X), strict=False))
        top_y, bottom_y = cards["utilisation"]
        counts = _colour_counts(rgb, (CARD_PADDING_X, top_y, 1280 - CARD_PADDING_X, bottom_y), list(PALETTE[:4]))
        assert len([c for c, n in counts.items() if n >= MIN_PIXELS]) == 1, counts
