"""The sustained-condition rule engine of ``stream_jobs.rules``: the timing rule, unknown data,
restarts, sweeps, persistence, and that every declared rule names a real threshold and severity."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from stream_jobs import alerts, rules
from stream_jobs.alerts import AlertKind
from stream_jobs.config import Thresholds
from stream_jobs.rules import Resolution, RuleTable, SustainedRule


@dataclass(frozen=True)
class Hot:
    """A test context: one device's temperature (None: no reading)."""

    device: str
    temp_c: float | None


HOT: SustainedRule[Hot] = SustainedRule(
    kind=AlertKind("idle_gpu", "warning"),  # any declared type: the engine does not care which
    after=lambda th: th.idle_after,
    condition=lambda c: None if c.temp_c is None else c.temp_c > 80.0,
    subject=lambda c: alerts.subject("node", None, c.device, c.device),
    describe=lambda c, since, t: (f"{c.device} hot for {t - since:g}s", {"temp_c": c.temp_c}),
    resolution=lambda c, _alert, _t: Resolution("cooled", {"temp_c": c.temp_c}),
)
TH = Thresholds(idle_after=30.0)


def _run(temps: list[float | None], table: RuleTable | None = None) -> list[tuple[str, float, dict[str, object]]]:
    table = {} if table is None else table
    out: list[tuple[str, float, dict[str, object]]] = []
    for i, temp in enumerate(temps):
        for alert in rules.step(HOT, table, "d1", Hot("d1", temp), 10.0 * i, TH):
            out.append((alert.state, 10.0 * i, dict(alert.details)))
    return out


def test_fires_at_the_first_evaluation_with_the_duration_held_and_resolves_when_false() -> None:
    out = _run([90, 90, 90, 90, 90, 50])
    assert [(state, t) for state, t, _ in out] == [("firing", 30.0), ("resolved", 50.0)]
    assert out[1][2] == {"temp_c": 50, "resolved_reason": "cooled"}


def test_unknown_data_changes_nothing_and_a_false_condition_restarts_the_timer() -> None:
    assert [t for _, t, _ in _run([90, None, None, 90])] == [30.0]
    assert _run([90, 90, 50, 90, 90, 90]) == []


def test_the_alert_id_and_start_are_those_of_the_firing_evaluation() -> None:
    table: RuleTable = {}
    _run([90, 90, 90, 90], table)
    record = table["d1"].alert
    assert record is not None and record.started_at == 30.0
    assert record.id == alerts.alert_id("idle_gpu", alerts.subject("node", None, "d1", "d1"), 30.0)


def test_restart_keeps_an_open_alert_and_forgets_a_bare_timer() -> None:
    table: RuleTable = {}
    _run([90, 90, 90, 90], table)
    rules.step(HOT, table, "d2", Hot("d2", 90), 0.0, TH)
    rules.restart(table, ["d1", "d2"])
    assert set(table) == {"d1"} and table["d1"].since is None and table["d1"].alert is not None


def test_sweep_resolves_subjects_gone_in_key_order_with_the_stage_reason() -> None:
    table: RuleTable = {}
    for key in ("b", "a", "c"):
        for t in (0.0, 30.0):
            rules.step(HOT, table, key, Hot(key, 90), t, TH)
    out = rules.sweep(table, ["c"], 40.0, lambda key: f"{key} removed")
    assert [(a.subject.name, a.details["resolved_reason"]) for a in out] == [("a", "a removed"), ("b", "b removed")]
    assert set(table) == {"c"}


def test_a_table_survives_its_json_form() -> None:
    table: RuleTable = {}
    _run([90, 90, 90, 90], table)
    again = rules.table_from_dict(orjson.loads(orjson.dumps(rules.table_to_dict(table))))
    assert again == table
    assert _run([50], again) == [("resolved", 0.0, {"temp_c": 50, "resolved_reason": "cooled"})]


def test_an_open_alert_keeps_its_json_form() -> None:
    table: RuleTable = {}
    _run([90, 90, 90, 90], table)
    stored = orjson.dumps(rules.table_to_dict(table))
    assert orjson.loads(stored)["d1"]["alert"] == {
        "id": alerts.alert_id("idle_gpu", alerts.subject("node", None, "d1", "d1"), 30.0),
        "type": "idle_gpu", "severity": "warning",
        "subject": {"kind": "node", "namespace": None, "name": "d1", "node": "d1", "gpu_uuid": None},
        "started_at": 30.0, "summary": "d1 hot for 30s", "details": {"temp_c": 90},
    }
    assert orjson.dumps(rules.table_to_dict(rules.table_from_dict(orjson.loads(stored)))) == stored


def test_every_declared_rule_reads_a_threshold_in_seconds() -> None:
    th = Thresholds()
    durations = {getattr(th, name) for name in Thresholds.durations()}
    for rule in rules.CATALOGUE:
        if isinstance(rule, SustainedRule):
            assert rule.after(th) in durations, rule.alert_type
        else:
            assert isinstance(rule, rules.EventRule) and rule.quiet(th) in durations, rule.alert_type
