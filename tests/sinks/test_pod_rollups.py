"""The pod rollups (``pod_hourly``, ``pod_daily``: per pod and GPU) and ``progress_daily`` (per pod)
give the raw tables' figures, measure by measure, on windows that exercise every measure: across an
hour and a day boundary, on two GPUs, shared (a fraction of a GPU), busy and never busy, with and
without steps, tokens and allocator figures, and without any optional figure at all:

- per pod, GPU and period, and per pod over the whole history: every measure equals its aggregate
  over ``pod_windows FINAL`` (sums to float rounding; counts, peaks, times, last values exactly), and
  an optional figure no window had is NULL in the rollup as in the raw answer (a never-busy pod has no
  ``last_busy_end``);
- per group of each rollup from a start (:meth:`sinks.rollups.Rollup.rows_since`) inside an hour or
  at midnight, as from the raw windows or progress at or after it;
- ``progress_daily``'s least and greatest totals per pod equal those of ``workload_progress FINAL``;
- every rollup keeps the rollups' TTL (``GPULENS_ROLLUP_TTL_DAYS``), so it answers beyond the raw TTLs.

tests/sinks/test_rollups_history.py compares them on a filled history store, with the report's
sections that read them and a window batch stored again.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from schemas.outputs import PodWindow
from sinks import rollups
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.ddl import TtlDays
from sinks.migrations import TTL_TABLES, migrate
from tests.sinks import factories as f

MIDNIGHT = datetime(2026, 3, 2, tzinfo=UTC)
"""The windows run from 22:30 the day before to 01:30: two days, four hours."""

Figures = dict[tuple[str, ...], dict[str, Any]]


def raw_expression(expression: str) -> str:
    """A measure's aggregate as a value (``argMaxState(x, t)`` -> ``argMax(x, t)``)."""
    return expression.replace("State(", "(")


def rollup_figures(store: ClickHouseStore, rollup: rollups.Rollup, keys: tuple[str, ...], source: str = "",
                   params: dict[str, Any] | None = None) -> Figures:
    """Every measure of ``rollup`` per ``keys``, merged from ``source`` (its table by default)."""
    measures = ", ".join(f"{rollup.merged(name)} AS {name}" for name in rollup.measures)
    group = ", ".join(keys)
    rows = store.query(f"SELECT {group}, {measures} FROM {source or rollup.table.name} GROUP BY {group}",
                       params).dicts()
    return {tuple(str(r[k]) for k in keys): r for r in rows}


def raw_figures(store: ClickHouseStore, rollup: rollups.Rollup, keys: tuple[str, ...], where: str = "",
                params: dict[str, Any] | None = None) -> Figures:
    """Every measure of ``rollup`` per ``keys`` over its raw table under ``FINAL`` (the rollup's
    period among them: the period of each row's time), its rows that match ``where`` and its
    condition, with their stamps computed from the stored windows (:meth:`sinks.rollups.Rollup.stored`)."""
    period = rollups.PERIODS[rollup.period].format(time=rollup.time)
    measures = ", ".join(f"{raw_expression(e)} AS {n}" for n, e in rollup.measures.items())
    group = ", ".join(keys)
    derived = {rollup.period: period, **dict(rollup.derived)}
    columns = ", ".join(f"{derived[key]} AS {key}" if key in derived else key for key in keys)
    rows = store.query(f"SELECT {columns}, {measures} FROM {rollup.stored(where)} "
                       f"{f'WHERE {rollup.condition}' if rollup.condition else ''} GROUP BY {group}", params).dicts()
    return {tuple(str(r[k]) for k in keys): r for r in rows}


def assert_figures_equal(raw: Figures, rolled: Figures, what: str) -> None:
    assert raw, f"{what}: the store answers"
    assert set(rolled) == set(raw), what
    for key, row in raw.items():
        for name, value in row.items():
            got = rolled[key][name]
            if isinstance(value, float):
                assert got == pytest.approx(value, rel=1e-9, abs=1e-9), (what, key, name)
            else:
                assert got == value, (what, key, name)


def _at(window: PodWindow, start: datetime, **update: Any) -> PodWindow:
    return window.model_copy(update={"window_id": f"{window.pod_uid}/{window.gpu_uuid}/{start.isoformat()}",
                                     "window_start": start, "window_end": start + timedelta(minutes=1), **update})


def _without_optional_figures(model: BaseModel) -> Any:
    return model.model_copy(update={name: None for name, field in type(model).model_fields.items()
                                    if not field.is_required() and field.default is None})


def _windows() -> Iterator[PodWindow]:
    first = MIDNIGHT - timedelta(minutes=90)
    for minute in range(0, 180, 7):
        start = first + timedelta(minutes=minute)
        busy = 0.0 if minute % 3 == 0 else 45.0
        # a training pod on two GPUs, one of them shared: steps on one GPU, allocator figures on some windows
        yield _at(f.window("train", 0, 0, busy_s=busy, steps=120.0 + minute), start,
                  tokens=None if minute % 2 else 1000.0 * minute, alloc_reserved_bytes=minute * f.GIB,
                  alloc_allocated_bytes=None if minute % 5 == 0 else minute * f.GIB // 2,
                  max_reserved_unused_bytes=minute * f.GIB // 4, alloc_retries=minute % 4,
                  alloc_ooms=None if minute % 2 else 0)
        yield _at(f.window("train", 1, 0, busy_s=60.0 - busy, mem=None if minute % 4 == 0 else 8 * f.GIB), start,
                  share_fraction=0.5, cost_usd=1.25 / 60, avg_sm_util_pct=None if minute % 3 == 1 else 40.0)
        # a notebook that never computes, with no team
        yield _at(f.window("notebook", 2, 0, busy_s=0.0, team=None, project=None, node="gpu-b"), start)
        # a pod that reports nothing optional (MIG-like: no utilisation, memory, energy or progress)
        yield _at(_without_optional_figures(f.window("bare", 3, 0, busy_s=0.0, node="gpu-b")), start)



@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseStore]:
    path: Path = tmp_path_factory.mktemp("pod-rollups") / "ch"
    opened = open_store(f"chdb://{path}")
    try:
        migrate(opened, TtlDays(raw=36500, state=36500, rollup=36500))
        progress = [f.progress("train", minute, 10.0 * minute).model_copy(
            update={"ts": MIDNIGHT + timedelta(minutes=minute - 90)}) for minute in range(0, 180, 11)]
        progress.append(f.progress("bare", 0, 0.0).model_copy(
            update={"ts": MIDNIGHT, "steps_total": None, "tokens_total": None}))
        f.store_rows(opened, [*_windows(), *progress])
        yield opened
    finally:
        opened.close()


@pytest.mark.parametrize("rollup", [rollups.POD_HOURLY, rollups.POD_DAILY], ids=lambda r: r.table.name)
def test_every_pod_measure_equals_the_raw_windows_per_pod_gpu_and_period(store: ClickHouseStore,
                                                                         rollup: rollups.Rollup) -> None:
    keys = ("cluster", rollup.period, *rollup.keys)
    raw = raw_figures(store, rollup, keys)
    assert_figures_equal(raw, rollup_figures(store, rollup, keys), rollup.table.name)
    assert len({k[1] for k in raw}) == {"hour": 4, "day": 2}[rollup.period]


def test_every_pod_measure_over_the_whole_history_and_its_nulls(store: ClickHouseStore) -> None:
    for keys in (("cluster", "pod_uid", "gpu_uuid"), ("cluster", "pod_uid")):
        raw = raw_figures(store, rollups.POD_DAILY, keys)
        assert_figures_equal(raw, rollup_figures(store, rollups.POD_HOURLY, keys), f"hourly per {keys}")
        assert_figures_equal(raw, rollup_figures(store, rollups.POD_DAILY, keys), f"daily per {keys}")
    pods = rollup_figures(store, rollups.POD_DAILY, ("pod_uid",))
    bare, notebook, train = pods[("bare",)], pods[("notebook",)], pods[("train",)]
    optional = ("peak_mem_bytes", "peak_sm_pct", "window_steps", "window_tokens", "peak_reserved_unused_bytes",
                "alloc_retries_total", "alloc_ooms_total", "last_reserved_bytes", "last_allocated_bytes",
                "last_busy_end")
    assert {name: bare[name] for name in optional} == dict.fromkeys(optional)
    assert bare["util_gpu_s"] == 0.0 and bare["windows"] == 26 and bare["busy_windows"] == 0
    assert notebook["last_busy_end"] is None and notebook["busy_windows"] == 0
    assert train["held_gpu_s"] == pytest.approx(26 * 60 * 1.5) and train["share_max"] == 1.0
    assert train["last_busy_end"] is not None and train["last_busy_end"] <= train["last_end"]


SINCE_HERE = [r for r in rollups.ROLLUPS if r.source != "gpu_samples" and "pod_busy_s" not in r.stamped]
"""The rollups of these windows and progress, but the active ones: their stamp (``pod_busy_s``, the
pod's busy time on any GPU) is one these windows are stored without, so their views count a window
by its own GPU only (tests/advise/test_advise_rollups.py compares them on replayed windows)."""


@pytest.mark.parametrize("rollup", SINCE_HERE, ids=lambda r: r.table.name)
def test_rows_since_a_start_equal_the_raw_rows_from_it(store: ClickHouseStore, rollup: rollups.Rollup) -> None:
    """From a start inside an hour of the first day, at midnight and inside an hour of the second day:
    hourly rollups, daily ones with an hourly one (whole days, hours, the part hour) and daily ones
    without (whole days, the part day from the raw rows)."""
    keys = ("cluster", *rollup.keys)
    for start in (MIDNIGHT - timedelta(minutes=37, seconds=30), MIDNIGHT, MIDNIGHT + timedelta(minutes=61)):
        params = {"start": start.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]}
        raw = raw_figures(store, rollup, keys, f"{rollup.time} >= toDateTime64({{start:String}}, 3, 'UTC')", params)
        since = rollup.rows_since("start")
        assert_figures_equal(raw, rollup_figures(store, rollup, keys, since, params), f"since {start}")
    everything = rollup_figures(store, rollup, keys, rollup.rows_since(None))
    assert_figures_equal(raw_figures(store, rollup, keys), everything, "since the beginning")


def test_progress_per_pod_equals_the_raw_progress(store: ClickHouseStore) -> None:
    keys = ("cluster", "day", "pod_uid")
    assert_figures_equal(raw_figures(store, rollups.PROGRESS_DAILY, keys),
                         rollup_figures(store, rollups.PROGRESS_DAILY, keys), "progress per day")
    unit = store.query("SELECT pod_uid, steps, tokens FROM v_cost_per_unit").dicts()
    steps = 10.0 * max(range(0, 180, 11))
    assert unit == [{"pod_uid": "train", "steps": steps, "tokens": steps * 1000}]


def test_every_rollup_keeps_the_rollups_ttl(store: ClickHouseStore) -> None:
    engines = {str(r[0]): str(r[1]) for r in store.query(
        "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()").rows}
    for rollup in rollups.ROLLUPS:
        assert TTL_TABLES[rollup.table.name] == (rollup.period, "rollup"), rollup.table.name
        assert f"TTL {rollup.period} + toIntervalDay(36500)" in engines[rollup.table.name], rollup.table.name
