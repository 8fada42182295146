"""``pod_active_hourly`` (a pod's active windows per GPU and hour: windows in which any GPU of the pod
was busy) gives what the raw windows give, on windows that need another GPU's to tell: a pod on three
GPUs, one computing at times, one never (its windows active through the first), one now and then; a
one-GPU pod with windows without an SM or VRAM reading; a pod never busy (no active window). SM peaks
are fractional and VRAM peaks off the bins' bounds, so percentiles fall inside bins.

- per pod, GPU and hour, and per pod and GPU over everything and from a start inside an hour: the
  count and seconds of active windows, the count with an SM reading and both peaks equal those of the
  raw windows whose (pod, start) had a busy window, as SQL over ``pod_windows FINAL`` finds them
  (no stamp read);
- every percentile (:func:`sinks.rollups.percentile`) is never below ``quantileExact``'s over those
  raw windows and less than a bin above it;
- windows stored without stamps (a stream job that does not stamp them): the view counts a window as
  its own GPU's busy time says; the migration's back-fill computes the stamps and gives the raw answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from schemas.outputs import PodWindow
from sinks import rollups
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from tests.sinks import factories as f

ROLLUP = rollups.POD_ACTIVE_HOURLY
SM_PAIRS, MEM_PAIRS = rollups.histogram_pairs('sm_bins'), rollups.histogram_pairs('mem_bins')
MINUTES = range(0, 150, 1)
LEVELS = (0.01, 0.5, 0.9, 0.95, 1.0)

RAW_ACTIVE = """(SELECT * FROM pod_windows FINAL WHERE (pod_uid, window_start) IN (
    SELECT pod_uid, window_start FROM pod_windows FINAL WHERE busy_s > 0))"""
"""The raw windows of (pod, start)s in which any GPU of the pod was busy."""


def _windows(cluster: str = "default") -> Iterator[PodWindow]:
    for w in _cluster_windows():
        yield w.model_copy(update={"cluster": cluster})


def _cluster_windows() -> Iterator[PodWindow]:
    for m in MINUTES:
        first = 0.0 if m % 3 == 0 else 30.0 + m % 20
        yield f.window("wide", 0, m, busy_s=first, mem=int((3.3 + (m % 11) * 0.71) * f.GIB)).model_copy(
            update={"max_sm_util_pct": 12.5 + (m * 7.31) % 80 if first else 0.0})
        yield f.window("wide", 1, m, busy_s=0.0, mem=5 * f.GIB + m * 1_000_003)
        yield f.window("wide", 2, m, busy_s=10.0 if m % 5 == 0 else 0.0, mem=0).model_copy(
            update={"max_sm_util_pct": 3.75 if m % 5 == 0 else None})
        solo = 20.0 if m % 4 else 0.0
        yield f.window("solo", 0, m, busy_s=solo, node="gpu-b", mem=None if m % 6 == 0 else 7 * f.GIB + m).model_copy(
            update={"max_sm_util_pct": None if m % 7 == 0 else 40.0 + (m % 9) / 3})
        yield f.window("never", 1, m, busy_s=0.0, node="gpu-b")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseStore]:
    opened = open_store(f"chdb://{tmp_path_factory.mktemp('pod-active') / 'ch'}")
    migrate(opened, TtlDays(raw=36500, state=36500, rollup=36500))
    f.store_rows(opened, f.stamped(_windows()))
    try:
        yield opened
    finally:
        opened.close()


def _figures(store: ClickHouseStore, keys: tuple[str, ...], source: str, params: dict[str, Any] | None = None,
             cluster: str = "default") -> dict[tuple[str, ...], dict[str, Any]]:
    names = ("active_windows", "active_gpu_s", "sm_windows", "active_peak_sm_pct", "active_peak_mem_bytes")
    measures = ", ".join(f"{ROLLUP.merged(n)} AS {n}" for n in names)
    rows = store.query(f"SELECT {', '.join(keys)}, {measures} FROM {source} WHERE cluster = {{cluster:String}} "
                       f"GROUP BY {', '.join(keys)}", (params or {}) | {"cluster": cluster}).dicts()
    return {tuple(str(r[k]) for k in keys): r for r in rows}


def _raw(store: ClickHouseStore, keys: tuple[str, ...], where: str = "true", params: dict[str, Any] | None = None,
         cluster: str = "default") -> dict[tuple[str, ...], dict[str, Any]]:
    columns = ", ".join("toStartOfHour(window_start) AS hour" if k == "hour" else k for k in keys)
    rows = store.query(f"""
SELECT {columns}, count() AS active_windows, sum(allocated_s) AS active_gpu_s,
       count(max_sm_util_pct) AS sm_windows, max(max_sm_util_pct) AS active_peak_sm_pct,
       max(coalesce(max_mem_used_bytes, 0)) AS active_peak_mem_bytes
FROM {RAW_ACTIVE} WHERE {where} AND cluster = {{cluster:String}}
GROUP BY {', '.join(keys)}""", (params or {}) | {"cluster": cluster}).dicts()
    return {tuple(str(r[k]) for k in keys): r for r in rows}


def _assert_equal(raw: dict[tuple[str, ...], dict[str, Any]], rolled: dict[tuple[str, ...], dict[str, Any]],
                  what: str) -> None:
    assert raw and set(rolled) == set(raw), (what, sorted(set(rolled) ^ set(raw)))
    for key, row in raw.items():
        for name, value in row.items():
            expected = pytest.approx(value, rel=1e-9) if isinstance(value, float) else value
            assert rolled[key][name] == expected, (what, key, name)


def test_active_windows_per_hour_and_over_everything_equal_the_raw_ones(store: ClickHouseStore) -> None:
    for keys in (("pod_uid", "gpu_uuid", "hour"), ("pod_uid", "gpu_uuid")):
        raw = _raw(store, keys)
        _assert_equal(raw, _figures(store, keys, ROLLUP.table.name), f"per {keys}")
    everything = _raw(store, ("pod_uid", "gpu_uuid"))
    # active through GPU 0 (100 windows) or GPU 2 (10 more: minutes divisible by 15)
    assert everything["wide", "GPU-gpu-a-1"]["active_windows"] == 110, "the idle GPU's windows, active through others"
    assert ("never", "GPU-gpu-b-1") not in everything
    assert everything["solo", "GPU-gpu-b-0"]["sm_windows"] < everything["solo", "GPU-gpu-b-0"]["active_windows"]


def test_from_a_start_inside_an_hour(store: ClickHouseStore) -> None:
    for minute in (37.5, 60, 121):
        params = {"start": (f.T0 + timedelta(minutes=minute)).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]}
        raw = _raw(store, ("pod_uid", "gpu_uuid"), "window_start >= toDateTime64({start:String}, 3, 'UTC')", params)
        _assert_equal(raw, _figures(store, ("pod_uid", "gpu_uuid"), ROLLUP.rows_since("start"), params),
                      f"since minute {minute}")


def test_percentiles_lie_within_a_bin_above_the_exact_ones(store: ClickHouseStore) -> None:
    inside = 0
    for level in LEVELS:
        rows = store.query(f"""
WITH r AS (
    SELECT pod_uid, gpu_uuid, {ROLLUP.merged('sm_windows')} AS sm_windows,
           {ROLLUP.merged('active_windows')} AS active_windows,
           {ROLLUP.merged('active_peak_sm_pct')} AS peak_sm, {ROLLUP.merged('active_peak_mem_bytes')} AS peak_mem,
           {rollups.percentile(SM_PAIRS, 'sm_windows', 'peak_sm', rollups.SM_BIN_PCT, level)} AS sm,
           {rollups.percentile(MEM_PAIRS, 'active_windows', 'peak_mem', rollups.VRAM_BIN_BYTES, level)} AS mem
    FROM {ROLLUP.table.name} WHERE cluster = 'default' GROUP BY pod_uid, gpu_uuid),
x AS (
    SELECT pod_uid, gpu_uuid, quantileExactIf({level!r})(max_sm_util_pct, max_sm_util_pct IS NOT NULL) AS sm,
           count(max_sm_util_pct) AS sm_windows,
           quantileExact({level!r})(coalesce(max_mem_used_bytes, 0)) AS mem
    FROM {RAW_ACTIVE} WHERE cluster = 'default' GROUP BY pod_uid, gpu_uuid)
SELECT r.pod_uid AS pod, r.gpu_uuid AS gpu, r.sm AS sm, x.sm AS exact_sm, x.sm_windows AS sm_windows, r.mem AS mem,
       x.mem AS exact_mem
FROM r INNER JOIN x ON x.pod_uid = r.pod_uid AND x.gpu_uuid = r.gpu_uuid""").dicts()
        assert len(rows) == 4, rows
        for r in rows:
            assert r["exact_mem"] <= r["mem"] < r["exact_mem"] + rollups.VRAM_BIN_BYTES, (level, r)
            if r["sm_windows"]:
                assert r["exact_sm"] <= r["sm"] < r["exact_sm"] + rollups.SM_BIN_PCT, (level, r)
            else:
                assert r["sm"] is None, (level, r)
            inside += (r["mem"] != r["exact_mem"]) + (r["sm"] != r["exact_sm"])
    assert inside > 10, "percentiles inside their bins, not only on their bounds"


def test_windows_without_stamps_count_their_own_gpu_until_the_back_fill_stamps_them(
        store: ClickHouseStore) -> None:
    f.store_rows(store, _windows("unstamped"))
    keys, hourly = ("pod_uid", "gpu_uuid"), ("pod_uid", "gpu_uuid", "hour")
    raw, viewed = _raw(store, keys, cluster="unstamped"), _figures(store, keys, ROLLUP.table.name, cluster="unstamped")
    assert ("wide", "GPU-gpu-a-1") not in viewed, "busy nowhere on its own GPU"
    assert viewed["wide", "GPU-gpu-a-0"]["active_windows"] == 100, "its own busy windows, none through GPU 2"
    assert viewed["solo", "GPU-gpu-b-0"] == raw["solo", "GPU-gpu-b-0"], "a one-GPU pod needs no stamp"
    stamped_before = _figures(store, hourly, ROLLUP.table.name)
    _, delete, backfill, _ = ROLLUP.migration()
    store.command(delete)
    store.command(backfill)
    _assert_equal(raw, _figures(store, keys, ROLLUP.table.name, cluster="unstamped"), "back-filled")
    _assert_equal(_raw(store, hourly, cluster="unstamped"),
                  _figures(store, hourly, ROLLUP.table.name, cluster="unstamped"), "back-filled per hour")
    assert _figures(store, hourly, ROLLUP.table.name) == stamped_before, "the stamped windows back-fill as they were"
