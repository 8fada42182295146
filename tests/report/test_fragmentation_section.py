"""The HTML report's "MIG and VRAM fragmentation over time" section on the goldens, stored through
the sink and reported by the CLI; a fleet without MIG or shared GPUs gets no such section.

Hand-derived (one-minute buckets, one capacity window each, peaks at the windows' last instants):
mig-fragmentation has 3 free compute slices and one pending 3g.40gb device until the re-layout at
8m, then none; vram-fragmentation strands 40 GiB (four GPUs with 10 GiB free, a 20 GiB need) until
big is scheduled at 10m, then nothing is pending and nothing stranded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import REPO_ROOT, SHARED_SCENARIOS
from tests.report.conftest import StoredReport
from tests.report.dom import parse

GOLDENS = REPO_ROOT / "simulation" / "scenarios"


def test_mig_slices_over_time(stored_report: Callable[[Path], StoredReport]) -> None:
    page = parse(stored_report(GOLDENS / "mig-fragmentation.yaml").html_path.read_text(encoding="utf-8"))
    assert "mig-vram" in page.sections and "vram-fragmentation" not in page.charts
    assert page.series_values("mig-fragmentation", "free compute slices (peak)") == [3.0] * 8 + [0.0] * 4
    assert page.series_values("mig-fragmentation", "free memory slices (peak)") == [4.0] * 8 + [0.0] * 4
    assert page.series_values("mig-fragmentation", "pending MIG devices (peak)") == [1.0] * 8 + [0.0] * 4


def test_shared_vram_over_time(stored_report: Callable[[Path], StoredReport]) -> None:
    page = parse(stored_report(GOLDENS / "vram-fragmentation.yaml").html_path.read_text(encoding="utf-8"))
    assert "mig-vram" in page.sections and "mig-fragmentation" not in page.charts
    assert page.series_values("vram-fragmentation", "stranded VRAM (peak)") == [40.0] * 10 + [0.0] * 2
    assert page.series_values("vram-fragmentation", "pending VRAM need (peak)") == [20.0] * 10 + [0.0] * 2
    assert page.series_values("vram-fragmentation", "largest free on one GPU (min)")[:10] == [10.0] * 10


def test_no_section_without_mig_or_shared_gpus(stored_report: Callable[[Path], StoredReport]) -> None:
    page = parse(stored_report(SHARED_SCENARIOS / "idle-notebook.yaml").html_path.read_text(encoding="utf-8"))
    assert "mig-vram" not in page.sections
