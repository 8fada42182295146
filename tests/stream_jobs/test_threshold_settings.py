"""A threshold set in the environment reaches the rule that reads it: ``GPULENS_THRESHOLDS__*`` ->
``load_settings`` -> ``EngineConfig.from_settings`` -> the node stage's ``vram_pressure``."""

from __future__ import annotations

import pytest

from common.settings import WorkerSettings, load_settings
from schemas.outputs import Alert
from stream_jobs.config import EngineConfig
from stream_jobs.node_stage import NodeStage
from stream_jobs.timeutil import epoch
from tests.stream_jobs.helpers import T0, node, pod, reading, sample

BASE = epoch(T0)


def _vram_alerts() -> list[tuple[str, float, float]]:
    """A pod's GPU at 90 % of its memory for 2 minutes through a stage configured from the environment."""
    stage = NodeStage("n1", EngineConfig.from_settings(load_settings(WorkerSettings)))
    for message in [node(), pod("a"), *[sample(t, [reading(0, 50.0, ["a"], mem_gib=72.0)]) for t in range(0, 130, 10)]]:
        stage.submit(message)
    return [(m.state, epoch(m.at) - BASE, m.details["threshold_pct"]) for m in stage.advance(BASE + 130)
            if isinstance(m, Alert) and m.type == "vram_pressure"]


def test_the_default_threshold_keeps_90_percent_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULENS_THRESHOLDS", raising=False)
    assert _vram_alerts() == []


@pytest.mark.parametrize("variable, value", [
    ("GPULENS_THRESHOLDS__VRAM_PRESSURE_PCT", "85"),
    ("GPULENS_THRESHOLDS", '{"vram_pressure_pct": 85, "vram_pressure_after_s": 30}'),
])
def test_an_overridden_threshold_fires_the_alert(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    after = 30.0 if variable == "GPULENS_THRESHOLDS" else 60.0
    assert _vram_alerts() == [("firing", after, 85.0)]
