"""The HTML report's per-pod lists that rank pods on ``pod_daily`` and read raw windows only for the
pods listed (``reports.timeseries.pod_vram_peaks``, ``allocator_by_pod``) give exactly the rows of the
same analyses over every raw window (the raw twins below), at every list length:

- on a two-day store of hand-made windows: a pod name reused by a second pod (two uids, one row),
  windows without a VRAM reading (left out of the GPU-hours and the percentile), a pod without any,
  windows of a third of a minute, a pod without a team, GPUs whose memory only the node states know
  (and one nobody knows), and ties in GPU-hours and in allocator figures that the names order;
- on the ``allocator-fragmentation`` scenario replayed and stored through the sink (the pipeline's own
  VRAM readings and allocator statistics).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reports import timeseries
from reports.reader import IN_CLUSTER, Rows, SqlReader, query_rows, round_floats, scoped
from schemas.outputs import PodWindow
from sinks import rollups
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from tests.conftest import REPO_ROOT
from tests.report.conftest import StoredReport
from tests.sinks import factories as f

START = datetime(2026, 3, 1, 22, 0, tzinfo=UTC)
"""The windows run from 22:00 to 02:00 the next day: two days in the rollups."""

LIMITS = (1, 2, 3, 4, 5, 40)


def raw_pod_vram_peaks(reader: SqlReader, limit: int = 40) -> Rows:
    """``pod_vram_peaks`` as one query over every raw window."""
    return round_floats(query_rows(reader, f"""
WITH g AS (SELECT gpu_uuid, max(mem_total_bytes) AS gpu_mem_bytes FROM {rollups.gpu_rows_since()} WHERE {IN_CLUSTER}
           GROUP BY gpu_uuid),
     n AS (SELECT node, argMax(gpu_memory_bytes, ts) AS node_gpu_mem_bytes FROM node_states WHERE {IN_CLUSTER}
           GROUP BY node)
SELECT w.namespace AS namespace, w.pod AS pod, if(w.team = '', '(none)', w.team) AS team,
       any(w.gpu_model) AS gpu_model, uniqExact(w.gpu_uuid) AS gpus, sum(w.allocated_s) / 3600 AS gpu_hours,
       max(w.max_mem_used_bytes) AS peak_mem_bytes, quantile(0.95)(w.max_mem_used_bytes) AS p95_mem_bytes,
       max(coalesce(g.gpu_mem_bytes, n.node_gpu_mem_bytes)) AS gpu_mem_bytes,
       peak_mem_bytes / nullIf(gpu_mem_bytes, 0) AS peak_share
FROM pod_windows AS w FINAL
LEFT JOIN g ON g.gpu_uuid = w.gpu_uuid
LEFT JOIN n ON n.node = w.node
WHERE w.max_mem_used_bytes IS NOT NULL AND w.{IN_CLUSTER}
GROUP BY namespace, pod, team
ORDER BY gpu_hours DESC, namespace, pod
LIMIT {int(limit)}"""))


def raw_allocator_by_pod(reader: SqlReader, limit: int = 40) -> Rows:
    """``allocator_by_pod`` as one query over every raw window."""
    return round_floats(query_rows(reader, f"""
SELECT namespace, pod, if(team = '', '(none)', team) AS team, node, gpu_uuid,
       max(max_reserved_unused_bytes) AS max_reserved_unused_bytes,
       argMax(alloc_reserved_bytes, window_start) AS reserved_bytes,
       argMax(alloc_allocated_bytes, window_start) AS allocated_bytes,
       sum(alloc_retries) AS alloc_retries, sum(alloc_ooms) AS alloc_ooms,
       max(max_mem_used_bytes) AS peak_mem_bytes
FROM (SELECT * FROM pod_windows FINAL WHERE max_reserved_unused_bytes IS NOT NULL AND {IN_CLUSTER})
GROUP BY namespace, pod, team, node, gpu_uuid
ORDER BY alloc_retries + alloc_ooms DESC, max_reserved_unused_bytes DESC, namespace, pod, gpu_uuid
LIMIT {int(limit)}"""))


TWINS: dict[str, tuple[Callable[[SqlReader, int], Rows], Callable[[SqlReader, int], Rows]]] = {
    "pod_vram_peaks": (timeseries.pod_vram_peaks, raw_pod_vram_peaks),
    "allocator_by_pod": (timeseries.allocator_by_pod, raw_allocator_by_pod),
}


def _items(rows: Rows) -> list[list[tuple[str, Any]]]:
    """The rows with their columns in order (the JSON report keeps the order)."""
    return [list(row.items()) for row in rows]


def _window(uid: str, gpu: int, minute: int, *, pod: str | None = None, namespace: str = "research",
            node: str = "gpu-a", mem: int | None = 20 * f.GIB, allocated_s: float = 60.0,
            team: str | None = "nlp", allocator: tuple[int, int, int] | None = None) -> PodWindow:
    """One minute window; ``allocator``: (reserved GiB, retries, OOMs), all figures together as the
    stream job sends them."""
    start = START + timedelta(minutes=minute)
    window = f.window(uid, gpu, 0, mem=mem, node=node, team=team)
    figures: dict[str, Any] = {}
    if allocator is not None:
        reserved, retries, ooms = allocator
        figures = {"alloc_reserved_bytes": reserved * f.GIB, "alloc_allocated_bytes": reserved * f.GIB // 2,
                   "max_reserved_unused_bytes": reserved * f.GIB // 2, "alloc_retries": retries,
                   "alloc_ooms": ooms}
    return window.model_copy(update={
        "window_id": f"{uid}/{window.gpu_uuid}/{start.isoformat()}", "window_start": start,
        "window_end": start + timedelta(minutes=1), "namespace": namespace, "pod": pod or f"pod-{uid}",
        "allocated_s": allocated_s, "busy_s": min(window.busy_s, allocated_s),
        "idle_s": allocated_s - min(window.busy_s, allocated_s), **figures})


def _windows() -> Iterator[PodWindow]:
    for minute in range(0, 240, 5):
        # a trainer on two GPUs, restarted at midnight as a new pod of the same name
        uid = "trainer-1" if minute < 120 else "trainer-2"
        yield _window(uid, 0, minute, pod="trainer", mem=(30 + minute % 17) * f.GIB,
                      allocator=(40 + minute % 7, minute % 3, 1 if minute == 200 else 0))
        yield _window(uid, 1, minute, pod="trainer", mem=None if minute % 15 == 0 else (10 + minute % 5) * f.GIB,
                      allocator=(12, 0, 0) if minute % 2 else None)
        # two pods alike in every figure but their names (ties in GPU-hours and allocator figures)
        for namespace in ("alpha", "research"):
            yield _window("twin", 2, minute, namespace=namespace, node="gpu-b", mem=(5 + minute % 3) * f.GIB,
                          allocator=(8, 1, 0) if minute >= 60 else None)
        # a third of a minute per window (GPU-hours that are not whole), a notebook without a team
        yield _window("notebook", 3, minute, node="gpu-b", mem=2 * f.GIB, allocated_s=20.0, team=None)
        # a pod with readings in some windows only, and one with none at all
        yield _window("sparse", 4, minute, mem=None if minute % 10 else 50 * f.GIB, allocated_s=60.0 / 7)
        yield _window("blind", 5, minute, mem=None)



@contextlib.contextmanager
def _opened(path: Path) -> Iterator[ClickHouseStore]:
    """One embedded engine per process: each test opens the store and closes it again."""
    store = open_store(f"chdb://{path}")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = tmp_path_factory.mktemp("html-rollups") / "ch"
    with _opened(path) as store:
        migrate(store, TtlDays(raw=36500, state=36500, rollup=36500))
        node = f.node_state("gpu-a").model_copy(update={"ts": START, "gpu_memory_bytes": 80 * f.GIB})
        f.store_rows(store, [*_windows(), node])
    return path


@pytest.mark.parametrize("name", TWINS)
def test_the_lists_equal_their_raw_twins_on_a_two_day_store(made: Path, name: str) -> None:
    with _opened(made) as store:
        reader = scoped(store)
        assert store.query("SELECT uniqExact(day) FROM pod_daily").rows[0][0] == 2
        listed, raw_twin = TWINS[name]
        for limit in LIMITS:
            assert _items(listed(reader, limit)) == _items(raw_twin(reader, limit)), (name, limit)


def test_the_two_day_store_exercises_ties_reused_names_and_missing_figures(made: Path) -> None:
    with _opened(made) as store:
        reader = scoped(store)
        peaks = timeseries.pod_vram_peaks(reader, 40)
        allocator = timeseries.allocator_by_pod(reader, 40)
    by_pod = {(r["namespace"], r["pod"]): r for r in peaks}
    assert ("research", "pod-blind") not in by_pod
    trainer = by_pod[("research", "trainer")]
    assert trainer["gpus"] == 2 and trainer["gpu_hours"] == pytest.approx((48 + 48 - 16) / 60)
    assert trainer["gpu_mem_bytes"] == 80 * f.GIB and trainer["p95_mem_bytes"] is not None
    twins = [r for r in peaks if r["pod"] == "pod-twin"]
    assert [r["namespace"] for r in twins] == ["alpha", "research"]
    assert twins[0]["gpu_hours"] == twins[1]["gpu_hours"] and twins[0]["gpu_mem_bytes"] is None
    assert by_pod[("research", "pod-notebook")]["team"] == "(none)"
    assert by_pod[("research", "pod-sparse")]["gpu_hours"] == pytest.approx(24 * 60 / 7 / 3600, abs=1e-6)

    assert [(r["namespace"], r["pod"], r["gpu_uuid"]) for r in allocator] == [
        ("research", "trainer", "GPU-gpu-a-0"), ("alpha", "pod-twin", "GPU-gpu-b-2"),
        ("research", "pod-twin", "GPU-gpu-b-2"), ("research", "trainer", "GPU-gpu-a-1")]
    assert allocator[1]["alloc_retries"] == allocator[2]["alloc_retries"] == 36
    assert allocator[0]["alloc_ooms"] == 1 and allocator[3]["alloc_retries"] == 0


ALLOCATOR_SCENARIO = REPO_ROOT / "simulation" / "scenarios" / "allocator-fragmentation.yaml"


@pytest.mark.parametrize("name", TWINS)
def test_the_lists_equal_their_raw_twins_on_a_replayed_scenario(stored_report: Callable[..., StoredReport],
                                                                name: str) -> None:
    stored = stored_report(ALLOCATOR_SCENARIO)
    with _opened(stored.html_path.parent.parent / "clickhouse") as store:
        reader = scoped(store)
        listed, raw_twin = TWINS[name]
        assert raw_twin(reader, 40), "the scenario has rows to list"
        for limit in LIMITS:
            assert _items(listed(reader, limit)) == _items(raw_twin(reader, limit)), (name, limit)
