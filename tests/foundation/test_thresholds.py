"""Alert thresholds are one typed settings model (``common.settings.Thresholds``): both environment
forms reach it, and a bad name or value fails at load with the variable and what it accepts."""

from __future__ import annotations

import pytest

from common.settings import SECONDS, ConfigError, Thresholds, WorkerSettings, load_settings


def test_the_nested_and_the_json_forms_reach_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_THRESHOLDS__VRAM_PRESSURE_PCT", "90")
    assert load_settings(WorkerSettings).thresholds == Thresholds(vram_pressure_pct=90.0)
    monkeypatch.delenv("GPULENS_THRESHOLDS__VRAM_PRESSURE_PCT")
    monkeypatch.setenv("GPULENS_THRESHOLDS", '{"idle_util_pct": 3, "idle_after_s": 1800}')
    assert load_settings(WorkerSettings).thresholds == Thresholds(idle_util_pct=3.0, idle_after=1800.0)
    monkeypatch.setenv("GPULENS_THRESHOLDS__GANG_AFTER", "60")  # the two forms merge
    assert load_settings(WorkerSettings).thresholds == Thresholds(idle_util_pct=3.0, idle_after=1800.0,
                                                                  gang_after=60.0)


@pytest.mark.parametrize("variable, value", [
    ("GPULENS_THRESHOLDS__IDLE_AFTR", "60"),
    ("GPULENS_THRESHOLDS", '{"idle_aftr": 60}'),
])
def test_an_unknown_threshold_fails_at_load_naming_it_and_the_known_ones(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=r"GPULENS_THRESHOLDS__IDLE_AFTR: unknown threshold; known: idle_util_pct, "
                                          r"idle_after, "):
        load_settings(WorkerSettings)


def test_a_duration_given_in_both_spellings_fails_rather_than_one_winning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_THRESHOLDS__IDLE_AFTER", "1800")
    monkeypatch.setenv("GPULENS_THRESHOLDS__IDLE_AFTER_S", "1700")
    with pytest.raises(ConfigError, match=r"GPULENS_THRESHOLDS__IDLE_AFTER_S: given twice: as idle_after and as "
                                          r"idle_after_s"):
        load_settings(WorkerSettings)


@pytest.mark.parametrize("variable, value", [
    ("GPULENS_THRESHOLDS__VRAM_PRESSURE_PCT", "900"),
    ("GPULENS_THRESHOLDS", '{"vram_pressure_pct": 900}'),
])
def test_a_threshold_out_of_its_bounds_fails_at_load_with_the_range(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=r"GPULENS_THRESHOLDS__VRAM_PRESSURE_PCT: expected a number from 0 to 100 "
                                          r"\(%\) \(got '?900'?\)"):
        load_settings(WorkerSettings)


def test_a_negative_duration_and_a_non_finite_value_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_THRESHOLDS__IDLE_AFTER_S", "-1")
    with pytest.raises(ConfigError, match=r"GPULENS_THRESHOLDS__IDLE_AFTER: expected a number >= 0 \(s\)"):
        load_settings(WorkerSettings)
    monkeypatch.setenv("GPULENS_THRESHOLDS__IDLE_AFTER_S", "inf")
    with pytest.raises(ConfigError, match=r"GPULENS_THRESHOLDS__IDLE_AFTER: Input should be a finite number"):
        load_settings(WorkerSettings)


def test_every_threshold_declares_its_bounds_and_durations_take_the_s_form() -> None:
    for name in Thresholds.names():
        bounds = Thresholds.bounds(name)
        assert getattr(Thresholds(), name) in bounds and bounds.low == 0.0, name
        assert Thresholds.model_fields[name].description, f"{name} has no description"
    assert Thresholds.bounds("vram_pressure_pct").high == 100.0
    assert Thresholds.durations() == tuple(n for n in Thresholds.names() if Thresholds.bounds(n) is SECONDS)
    assert Thresholds.name_of("idle_after_s") == "idle_after" and Thresholds.name_of("idle_util_pct_s") is None
