"""The daily rollups (``gpu_daily`` with its hourly twin ``gpu_hourly``, ``pod_daily``,
``pod_active_daily`` and ``team_daily`` with theirs, ``shared_gpu_daily`` without one) give the raw
rows' figures per day, and their rows since a start (:meth:`sinks.rollups.Rollup.rows_since`: the
start's part hour from the raw rows, the rest of its day from the hourly rollup, whole days from the
daily one; without an hourly twin the start's part day from the raw rows) equal the raw rows since
that start, for starts inside an hour, on the hour, at midnight and before the first row, on samples
and windows that cross a midnight. The back-fill of ``gpu_daily`` and ``pod_active_daily``
(migration 18) merges the hourly rollup, so days whose raw rows the TTL already dropped keep their
figures."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sinks import migrations, rollups
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from tests.sinks import factories as f
from tests.sinks.test_pod_rollups import assert_figures_equal, raw_figures, rollup_figures

TTL = TtlDays(raw=36500, state=36500, rollup=36500)
INTERVAL_S = 600.0
SAMPLES = 181
"""Every 10 minutes for 30 hours from :data:`factories.T0`: a midnight falls inside."""
KEYS = ("cluster", *rollups.GPU_DAILY.keys)
MEASURES = {name: expression for name, expression in rollups.GPU_DAILY.measures.items() if name != "interval_s"}


def _samples() -> list[Any]:
    return [f.sample(node, seq, interval_s=INTERVAL_S, busy_until=(seq // 7) % 9, util=float(seq % 11))
            for node in ("n1", "n2") for seq in range(SAMPLES)]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ClickHouseStore]:
    opened = open_store(f"chdb://{tmp_path / 'ch'}")
    try:
        yield opened
    finally:
        opened.close()


Figures = dict[tuple[str, ...], dict[str, Any]]


def _raw(store: ClickHouseStore, period: str = "", where: str = "", params: dict[str, Any] | None = None) -> Figures:
    keys = [f"{period} AS period", *KEYS] if period else list(KEYS)
    names = ["period", *KEYS] if period else list(KEYS)
    measures = ", ".join(f"{e} AS {n}" for n, e in MEASURES.items())
    rows = store.query(f"SELECT {', '.join(keys)}, {measures} FROM gpu_samples FINAL {where} "
                       f"GROUP BY {', '.join(names)}", params).dicts()
    return {tuple(str(r[k]) for k in names): r for r in rows}


def _rolled(store: ClickHouseStore, source: str, period: str = "", params: dict[str, Any] | None = None) -> Figures:
    names = [*(["period"] if period else []), *KEYS]
    keys = [*([f"{period} AS period"] if period else []), *KEYS]
    measures = ", ".join(f"{rollups.GPU_DAILY.merged(n)} AS {n}" for n in MEASURES)
    rows = store.query(f"SELECT {', '.join(keys)}, {measures} FROM {source} GROUP BY {', '.join(names)}",
                       params).dicts()
    return {tuple(str(r[k]) for k in names): r for r in rows}


def _assert_equal(raw: Figures, rolled: Figures, what: str) -> None:
    assert raw and set(raw) == set(rolled), what
    for key, row in raw.items():
        for name in MEASURES:
            if name.endswith("_s"):
                assert rolled[key][name] == pytest.approx(row[name], rel=1e-9, abs=1e-9), (what, key, name)
            else:
                assert rolled[key][name] == row[name], (what, key, name)


def _midnight_inside() -> datetime:
    """The first midnight after the first sample with at least two hours of samples before it."""
    midnight = (f.T0 + timedelta(hours=2)).replace(hour=0) + timedelta(days=1)
    return midnight.astimezone(UTC)


def test_the_daily_rollup_and_the_rows_since_any_start_equal_the_raw_samples(store: ClickHouseStore) -> None:
    migrate(store, TTL)
    f.store_rows(store, _samples())
    by_day = _raw(store, "toDate(ts)")
    _assert_equal(by_day, _rolled(store, "gpu_daily", "day"), "per GPU and day")
    assert len({key[0] for key in by_day}) >= 2, "the samples cross a midnight"

    midnight = _midnight_inside()
    starts = {
        "the part hour, the rest of the day from the hourly rollup, whole days": midnight - timedelta(minutes=115),
        "on the hour, a day's last hour": midnight - timedelta(hours=1),
        "at midnight: whole days only": midnight,
        "before the first sample": f.T0 - timedelta(days=2, minutes=17),
        "in the last day's part hour": midnight + timedelta(hours=3, minutes=25),
    }
    for what, start in starts.items():
        params = {"start": start.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]}
        raw = _raw(store, where="WHERE ts >= toDateTime64({start:String}, 3, 'UTC')", params=params)
        _assert_equal(raw, _rolled(store, rollups.gpu_rows_since("start"), params=params), what)


@pytest.fixture
def store_before_daily(store: ClickHouseStore, monkeypatch: pytest.MonkeyPatch) -> ClickHouseStore:
    """A store migrated up to migration 17: before the daily rollups migration 18 adds."""
    with monkeypatch.context() as before:
        before.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:17])
        migrate(store, TTL)
    return store


def test_the_back_fill_keeps_the_days_whose_raw_samples_are_gone(store_before_daily: ClickHouseStore) -> None:
    store = store_before_daily
    f.store_rows(store, _samples())
    by_day = _raw(store, "toDate(ts)")
    store.command("TRUNCATE TABLE gpu_samples")  # as the raw TTL drops them; gpu_hourly keeps its rows

    assert migrate(store, TTL) == [18]
    _assert_equal(by_day, _rolled(store, "gpu_daily", "day"), "back-filled from gpu_hourly")
    f.store_rows(store, [f.sample("n3", seq, interval_s=INTERVAL_S) for seq in range(3)])
    fed = store.query("SELECT sum(samples) FROM gpu_daily WHERE node = 'n3'").rows[0][0]
    assert int(fed) == 3 * 8, "the view feeds it after the back-fill"


MIDNIGHT = datetime(2026, 3, 2, tzinfo=UTC)
POD_DAILY_ROLLUPS = tuple(r for r in rollups.ROLLUPS if r.source == "pod_windows" and r.period == "day")
"""Every daily rollup of the windows: with an hourly twin (``pod_daily``, ``pod_active_daily``,
``team_daily``) or without (``shared_gpu_daily``: the part day from the raw rows)."""


def _at(window: Any, start: datetime) -> Any:
    return window.model_copy(update={"window_id": f"{window.pod_uid}/{window.gpu_uuid}/{start.isoformat()}",
                                     "window_start": start, "window_end": start + timedelta(minutes=1)})


def _windows() -> list[Any]:
    """From 21:30 to 02:25 every 5 minutes: a pod on two GPUs busy on one at times (its other GPU's
    windows are active through it), a one-GPU pod busy now and then, a pod never busy."""
    windows = []
    for k in range(60):
        start = MIDNIGHT - timedelta(minutes=150) + timedelta(minutes=5 * k)
        busy = 0.0 if k % 3 == 0 else 20.0 + k % 17
        windows += [
            _at(f.window("wide", 0, 0, busy_s=busy, mem=(3 + k % 5) * f.GIB).model_copy(
                update={"max_sm_util_pct": 10.0 + (k * 7) % 80 if busy else 0.0}), start),
            _at(f.window("wide", 1, 0, busy_s=0.0, mem=2 * f.GIB + k).model_copy(update={"share_fraction": 0.5}),
                start),
            _at(f.window("solo", 0, 0, busy_s=30.0 if k % 4 else 0.0, node="gpu-b"), start),
            _at(f.window("never", 1, 0, busy_s=0.0, node="gpu-b"), start),
        ]
    return f.stamped(windows)


def _since(start: datetime) -> dict[str, str]:
    return {"start": start.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]}


def test_the_pod_daily_rollups_and_their_rows_since_any_start_equal_the_raw_windows(store: ClickHouseStore) -> None:
    migrate(store, TTL)
    f.store_rows(store, _windows())
    starts = (MIDNIGHT - timedelta(minutes=97, seconds=30), MIDNIGHT - timedelta(hours=2), MIDNIGHT,
              MIDNIGHT + timedelta(minutes=61), MIDNIGHT - timedelta(days=3))
    for rollup in POD_DAILY_ROLLUPS:
        per_day = ("cluster", "day", *rollup.keys)
        raw = raw_figures(store, rollup, per_day)
        assert len({key[1] for key in raw}) == 2, "two days"
        assert_figures_equal(raw, rollup_figures(store, rollup, per_day), f"{rollup.table.name} per day")
        keys = ("cluster", *rollup.keys)
        for start in starts:
            raw = raw_figures(store, rollup, keys, "window_start >= toDateTime64({start:String}, 3, 'UTC')",
                              _since(start))
            assert_figures_equal(raw, rollup_figures(store, rollup, keys, rollup.rows_since("start"), _since(start)),
                                 f"{rollup.table.name} since {start}")


def test_the_active_windows_back_fill_keeps_the_days_whose_windows_are_gone(
        store_before_daily: ClickHouseStore) -> None:
    store = store_before_daily
    f.store_rows(store, _windows())
    per_day = ("cluster", "day", *rollups.POD_ACTIVE_DAILY.keys)
    raw = raw_figures(store, rollups.POD_ACTIVE_DAILY, per_day)
    store.command("TRUNCATE TABLE pod_windows")  # as the state TTL drops them; pod_active_hourly keeps its rows

    assert migrate(store, TTL) == [18]
    assert_figures_equal(raw, rollup_figures(store, rollups.POD_ACTIVE_DAILY, per_day), "back-filled")
