"""The demo fleet gives the advisor something in every category, so the demo's closing headline
("N GPUs (P %) reclaimable, $X/month") is never zero: idle notebooks (reclaim), a job holding half a
node and computing on one GPU (right-size), a cordoned node nobody uses (scale to zero), an 8-GPU job
kept waiting by fragmentation (queue). Stored through the sink's write path, read back by the advisor
with the demo's thresholds."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gpulens.demo import DEMO_ADVISE
from reports.advise import advise, headline_text
from simulation.demo_fleet import demo_scenario
from sinks.clickhouse import open_store
from tests.report.loader import store_scenarios


def test_demo_fleet_has_reclaimable_capacity_in_every_category(tmp_path: Path) -> None:
    path = tmp_path / "demo.yaml"
    path.write_bytes(orjson.dumps(demo_scenario(nodes=8, duration_m=20)))
    url = f"chdb://{tmp_path / 'clickhouse'}"
    store_scenarios([path], url)
    store = open_store(url, read_only=True)
    try:
        advice = advise(store, DEMO_ADVISE)
    finally:
        store.close()
    pods = {(row["namespace"], row["pod"]) for row in advice["reclaim"]}
    assert any(name.startswith("notebook") for _, name in pods), advice["reclaim"]
    sized = {row["pod"]: row for row in advice["right_size"]}
    assert sized["train-half"]["recommendation"] == "1 GPU instead of 4"
    # 3 spare GPUs from 09:00 to 09:20 = 1 GPU-h
    assert sized["train-half"]["freed_gpu_hours"] == pytest.approx(1.0)
    assert [row["node"] for row in advice["scale_to_zero"]] == ["gpu-04"]
    assert advice["scale_to_zero"][0]["gpu_hours"] == pytest.approx(8 * 20 / 60)
    assert "train-big-batch" in {row["pod"] for row in advice["queue"]}
    headline = advice["headline"]
    assert headline["gpus"] > 0 and headline["usd_per_month"] > 0
    assert headline_text(headline).endswith("/month") and " GPUs (" in headline_text(headline)
