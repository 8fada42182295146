"""``v_shared_gpu_cost`` and the report's ``shared_gpu_cost`` section (they read ``shared_gpu_daily``,
fed by the windows' stamps of their GPU's other pods) give what the same SQL over every GPU-window
of ``pod_windows FINAL`` gives (migration 7's view, kept below as the raw twin), on a history store
filled by the history benchmark's bulk path (its time-sliced GPUs, stamped by the node stage) plus
windows written through the sink's writer, stamped as a node stage closes them, for the cases the
rollup must not miss nor invent:

- two pods on one GPU in the same windows, their windows written in separate batches, the pods
  meeting only after midnight while one of them ran alone on the GPU the day before;
- a pod that hands its GPU to the next inside one window (two pods in that window: shared, as
  migration 7 counts it), and two that follow each other in adjacent windows (not shared);
- a pod whose share fell under 1 in a window without another pod's window (a co-tenant the stage
  did not know);
- the sink storing those batches again (its retry: the same offsets; a worker's replay: new offsets)
  changes neither the view, the section nor ``shared_gpu_daily``;
- the same windows without stamps (a stream job that does not stamp them) count as shared by their
  share alone until the migration's back-fill, which computes the stamps and gives the raw answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from benchmarks.history.fill import FillOutcome, FillSpec, fill, sink_settings
from common.metrics import MetricsRegistry
from reports.analyses import run_report
from reports.reader import round_floats, scoped
from schemas.codec import encode
from schemas.outputs import PodWindow
from schemas.topics import POD_WINDOWS
from simulation.store import PREFIX
from sinks import rollups
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.ddl import TtlDays
from sinks.service import load_prices
from tests.sinks import factories as f

SPEC = FillSpec(gpus=32, days=3, day_s=3600, template_nodes=4, gpus_per_node=4, variants=2)
H100 = "NVIDIA H100 80GB HBM3"

RAW_VIEW = """
WITH w AS (SELECT * FROM pod_windows FINAL),
g AS (
    SELECT cluster, gpu_uuid, window_start, count() AS pods_on_gpu, sum(busy_s) AS gpu_busy_s,
           max(allocated_s) AS gpu_window_s, max(share_fraction < 1) AS any_shared
    FROM w GROUP BY cluster, gpu_uuid, window_start
)
SELECT w.cluster AS cluster, w.namespace AS namespace, w.team AS team, w.project AS project, w.pod AS pod,
       w.pod_uid AS pod_uid,
       sum(w.allocated_s * w.share_fraction) / 3600 AS requested_gpu_hours,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600 AS usage_gpu_hours,
       sum(w.allocated_s * w.share_fraction) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS request_based_cost_usd,
       sum(g.gpu_window_s * if(g.gpu_busy_s > 0, w.busy_s / g.gpu_busy_s, 1 / g.pods_on_gpu)) / 3600
           * any(coalesce(p.usd_per_gpu_hour, 0)) AS usage_based_cost_usd
FROM w
INNER JOIN g ON g.cluster = w.cluster AND g.gpu_uuid = w.gpu_uuid AND g.window_start = w.window_start
LEFT JOIN (SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices
           GROUP BY gpu_model) AS p ON p.gpu_model = w.gpu_model
WHERE g.pods_on_gpu > 1 OR g.any_shared
GROUP BY cluster, namespace, team, project, pod, pod_uid"""
"""Migration 7's ``v_shared_gpu_cost``: every GPU-window of the history grouped."""

RAW_SECTION = f"""
SELECT namespace, pod, if(team = '', '(none)', team) AS team, requested_gpu_hours, usage_gpu_hours,
       request_based_cost_usd, usage_based_cost_usd
FROM ({RAW_VIEW})
WHERE cluster = 'default'
ORDER BY usage_based_cost_usd DESC, namespace, pod
LIMIT 50"""

VIEW_COLUMNS = ("cluster, namespace, team, project, pod, pod_uid, requested_gpu_hours, usage_gpu_hours, "
                "request_based_cost_usd, usage_based_cost_usd")


def _window(pod: str, gpu: int, start: datetime, allocated_s: float = 60.0, busy_s: float = 30.0,
            share: float = 1.0) -> PodWindow:
    gpu_uuid = f"GPU-h4x-{gpu}"
    return PodWindow(
        window_id=f"{pod}/{gpu_uuid}/{start.isoformat()}", pod_uid=f"uid-{pod}", namespace="tenancy", pod=pod,
        node="gpu-h4x", gpu_uuid=gpu_uuid, gpu_model=H100, window_start=start,
        window_end=start + timedelta(minutes=1), team="search", project="ranking", allocated_s=allocated_s,
        busy_s=busy_s, idle_s=allocated_s - busy_s, samples=6, avg_sm_util_pct=50.0, share_fraction=share,
        cost_usd=0.04)


def _batches(midnight: datetime, stamps: bool = True) -> list[list[PodWindow]]:
    """The windows of the cases above, as the sink's batches (each its own insert block), stamped
    over all of them (without ``stamps``: of cluster ``unstamped``)."""
    def at(minute: int) -> datetime:
        return midnight + timedelta(minutes=minute)

    alone_then_shared = [_window("a", 0, at(m), busy_s=40.0) for m in range(-5, 5)]
    joins_after_midnight = [_window("b", 0, at(m), busy_s=20.0) for m in range(2, 7)]
    hands_over = [_window("c", 1, at(m)) for m in range(0, 3)] + [_window("c", 1, at(3), allocated_s=20.0, busy_s=10.0)]
    takes_over = [_window("d", 1, at(3), allocated_s=40.0, busy_s=40.0)] + [_window("d", 1, at(m)) for m in (4, 5)]
    adjacent = [_window("e", 2, at(m)) for m in range(0, 3)] + [_window("f", 2, at(m)) for m in range(3, 6)]
    share_alone = [_window("g", 3, at(m), share=0.5 if m == 2 else 1.0) for m in range(0, 5)]
    batches = [alone_then_shared + hands_over, joins_after_midnight + takes_over, adjacent + share_alone]
    if not stamps:
        return [[w.model_copy(update={"cluster": "unstamped", "window_id": f"unstamped/{w.window_id}"}) for w in batch]
                for batch in batches]
    by_id = {w.window_id: w for w in f.stamped(w for batch in batches for w in batch)}
    return [[by_id[w.window_id] for w in batch] for batch in batches]


def _write(store: ClickHouseStore, path: Path, batches: list[list[PodWindow]], first_offset: int) -> None:
    settings = sink_settings(SPEC, path)
    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays.from_settings(settings),
                         max_future_skew_s=settings.max_future_skew_s)
    topic = POD_WINDOWS.name(PREFIX)
    offset = first_offset
    for windows in batches:
        records = [ConsumedRecord(topic, 0, offset + i, w.pod_uid.encode(), encode(w)) for i, w in enumerate(windows)]
        writer.write(Batch(topic, 0, records, records[0].offset, records[-1].offset))
        offset += len(records)


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FillOutcome, ClickHouseStore, datetime]]:
    outcome = fill(SPEC, tmp_path_factory.mktemp("shared-gpu-cost"))
    midnight = SPEC.start + timedelta(seconds=SPEC.days * SPEC.day_s)
    with closing(open_store(f"chdb://{outcome.path}")) as store:
        load_prices(store, {H100: 3.0})
        _write(store, outcome.path, _batches(midnight), 5 * 10**12)
        yield outcome, store, midnight


def _view(store: ClickHouseStore, source: str) -> dict[str, dict[str, Any]]:
    rows = store.query(f"SELECT {VIEW_COLUMNS} FROM {source} ORDER BY cluster, pod_uid").dicts()
    return {f"{r['cluster']}/{r['pod_uid']}": r for r in rows}


def _assert_view_is_the_raw_twin(store: ClickHouseStore) -> dict[str, dict[str, Any]]:
    raw, view = _view(store, f"({RAW_VIEW})"), _view(store, "v_shared_gpu_cost")
    assert raw and list(view) == list(raw)
    for key, row in raw.items():
        for name, value in row.items():
            if isinstance(value, float):
                assert view[key][name] == pytest.approx(value, rel=1e-12, abs=1e-12), (key, name)
            else:
                assert view[key][name] == value, (key, name)
    return view


def _section(store: ClickHouseStore) -> list[dict[str, Any]]:
    return run_report(scoped(store), ["shared_gpu_cost"])["shared_gpu_cost"]


def test_the_view_and_the_section_equal_the_same_sql_over_every_gpu_window(
        filled: tuple[FillOutcome, ClickHouseStore, datetime]) -> None:
    _, store, midnight = filled
    assert store.query("SELECT countIf(share_fraction < 1) FROM pod_windows WHERE node != 'gpu-h4x'").rows[0][0] > 0, \
        "the filled fleet has shared GPUs"
    view = _assert_view_is_the_raw_twin(store)
    assert len(view) > 6, "the fleet's shared pods are listed beside the written cases"
    listed = {r["pod"] for r in view.values() if r["namespace"] == "tenancy"}
    assert listed == {"a", "b", "c", "d", "g"}, "e and f follow each other in adjacent windows: not shared"

    # a and b share GPU 0 after midnight only: 3 windows in which a was busy 40 s of 60, b 20 s
    a, b = view["default/uid-a"], view["default/uid-b"]
    assert a["requested_gpu_hours"] == pytest.approx(3 / 60) == b["requested_gpu_hours"]
    assert a["usage_gpu_hours"] == pytest.approx(3 / 60 * 2 / 3)
    assert b["usage_based_cost_usd"] == pytest.approx(3 / 60 / 3 * 3.0)
    # g's one window at half a share, alone: the whole window is its usage
    assert view["default/uid-g"]["requested_gpu_hours"] == pytest.approx(0.5 / 60)
    assert view["default/uid-g"]["usage_gpu_hours"] == pytest.approx(1 / 60)

    section = _section(store)
    assert section == round_floats(store.query(RAW_SECTION).dicts())
    days = {str(r[0]) for r in store.query(
        "SELECT DISTINCT day FROM shared_gpu_daily WHERE cluster = 'default' AND pod = 'a'").rows}
    assert days == {str(midnight.date())}, "a ran alone the day before"


def test_a_batch_stored_again_changes_nothing(filled: tuple[FillOutcome, ClickHouseStore, datetime]) -> None:
    outcome, store, midnight = filled
    shared = "SELECT cluster, day, pod_uid, sum(windows), round(sum(requested_gpu_s), 6), round(sum(usage_gpu_s), 6) " \
             "FROM shared_gpu_daily GROUP BY ALL ORDER BY ALL"
    before = (store.query("SELECT count() FROM pod_windows").rows, store.query(shared).rows,
              _view(store, "v_shared_gpu_cost"), _section(store))
    _write(store, outcome.path, _batches(midnight), 5 * 10**12)  # the sink's retry: the same offsets
    _write(store, outcome.path, _batches(midnight), 6 * 10**12)  # a worker's replay: new offsets
    after = (store.query("SELECT count() FROM pod_windows").rows, store.query(shared).rows,
             _view(store, "v_shared_gpu_cost"), _section(store))
    assert after == before
    _assert_view_is_the_raw_twin(store)


def test_windows_without_stamps_are_shared_by_their_share_until_the_back_fill(
        filled: tuple[FillOutcome, ClickHouseStore, datetime]) -> None:
    outcome, store, midnight = filled
    _write(store, outcome.path, _batches(midnight, stamps=False), 7 * 10**12)
    unstamped = {r["pod"] for r in _view(store, "v_shared_gpu_cost").values() if r["cluster"] == "unstamped"}
    assert unstamped == {"g"}, "no stamp tells another pod's window apart; g's share does"
    for statement in rollups.SHARED_GPU_DAILY.migration()[1:3]:
        store.command(statement)
    view = _assert_view_is_the_raw_twin(store)
    assert {r["pod"] for r in view.values() if r["cluster"] == "unstamped"} == {"a", "b", "c", "d", "g"}
