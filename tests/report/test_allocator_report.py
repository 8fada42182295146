"""The HTML report's caching-allocator section on the ``allocator-fragmentation`` golden, replayed and
stored through the sink: it shows what ``gpulens replay`` reports for the same pods."""

from __future__ import annotations

from collections.abc import Callable

from tests.conftest import REPO_ROOT
from tests.report.conftest import StoredReport
from tests.report.dom import parse

SCENARIO = REPO_ROOT / "simulation" / "scenarios" / "allocator-fragmentation.yaml"


def test_the_allocator_section_agrees_with_the_replay_report(stored_report: Callable[..., StoredReport]) -> None:
    stored = stored_report(SCENARIO)
    page = parse(stored.html_path.read_text(encoding="utf-8"))
    rows = {r["pod"]: r for r in page.records("allocator")}
    replay = {f"{p['namespace']}/{p['name']}": p for p in stored.replay["pods"]}
    assert set(rows) == set(replay)
    for pod, row in rows.items():
        assert row["allocation retries"] == f"{replay[pod]['alloc_retries']:,}"
        assert row["OOMs"] == str(replay[pod]["alloc_ooms"])
        assert row["most reserved but unused"] == f"{replay[pod]['max_reserved_unused_bytes'] / 2**30:.1f} GiB"
    assert list(rows) == ["research/tight-fit", "research/train-frag", "research/cache-heavy"]  # retries first
    assert page.series_values("allocator", "reserved but unused") == [4.0, 48.0, 48.0]
    assert page.no_data.get("allocator") in (None, [])
