"""The advisor gives the same answer from the rollups and raw windows it reads now as from the raw
windows alone: on a small multi-day history store (the history benchmark's bulk fill,
benchmarks/history/fill.py), every figure and every recommendation of :func:`reports.advise.advise`
equals that of its **raw twin**, the advisor whose evidence queries read ``v_advise_windows`` (the
pod's windows joined with ``pod_active``), ``pod_windows`` and ``pod_lifecycle`` x
``cluster_capacity`` directly, as they are written below.

- per (pod, GPU): labels, share, GPU memory and index, held seconds, cost, price, last busy window
  and busy windows (``pod_hourly`` now), active windows and seconds, the SM percentile and peak and
  the VRAM peak over the pod's active windows (``pod_active_hourly`` now), exactly; the SM and VRAM
  percentiles never below the exact ones and less than a bin above them;
- per (pod, time bucket, GPU): held, allocated and busy seconds and peak VRAM, from ``pod_hourly``
  (whole-hour buckets) and from the raw windows (other buckets);
- the period's end and the nodes pods held, and the queue's fragmented waits (their rows here; the
  hour join itself against every pending pod paired with every capacity window on the scenarios
  that have such waits: tests/advise/test_advise_queue_join.py);
- from a start on the hour and inside an hour, per team, at other percentiles and buckets.

The store has multi-GPU pods with one GPU idle while another computes (their windows are active
through the other GPU), pods busy in every window, at times and never.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from datetime import datetime, timedelta
from typing import Any

import pytest

from benchmarks.history.fill import FillOutcome, FillSpec, fill
from common.settings import AdviseThresholds
from reports import advise as advisor
from reports.reader import IN_CLUSTER, ClusterScope, Rows, SqlReader, query_rows, scoped
from sinks import rollups
from sinks.clickhouse import open_store

SPEC = FillSpec(gpus=32, days=3, day_s=3600, template_nodes=4, gpus_per_node=4, variants=2)
"""Three played hours ("days" in miniature) of 36 GPUs: 108 pods, 1-, 2- and 4-GPU ones."""

SHORT = {"min_evidence_s": 300.0, "idle_stretch_s": 600.0}
"""Thresholds a history of hours gives recommendations at."""


# --------------------------------------------------------------------------- the raw twin


def raw_period(reader: SqlReader, since_s: float) -> tuple[datetime, datetime] | None:
    rows = query_rows(reader, f"""
SELECT maxOrNull(e) AS data_end FROM (
    SELECT max(window_end) AS e FROM pod_windows WHERE {IN_CLUSTER}
    UNION ALL SELECT max(window_end) AS e FROM cluster_capacity WHERE {IN_CLUSTER}
) WHERE e > toDateTime64(0, 3, 'UTC')""")
    end = rows[0]["data_end"] if rows else None
    if not end:
        return None
    data_end = advisor.utc_time(end)
    return data_end - timedelta(seconds=since_s), data_end


def raw_pod_gpu_rows(reader: SqlReader, start: datetime, team: str | None, cfg: AdviseThresholds) -> Rows:
    level = cfg.percentile / 100
    where, params = advisor._params(start, team, "w.")
    return query_rows(reader, f"""
WITH g AS (SELECT gpu_uuid, max(mem_total_bytes) AS gpu_mem_bytes, argMax(gpu_index, last_ts) AS gpu_index
           FROM {rollups.gpu_rows_since()} WHERE {IN_CLUSTER} GROUP BY gpu_uuid)
SELECT w.pod_uid AS pod_uid, w.gpu_uuid AS gpu_uuid, any(w.namespace) AS namespace, any(w.pod) AS pod,
       any(w.team) AS team, any(w.project) AS project, any(w.node) AS node, any(w.gpu_model) AS gpu_model,
       max(w.share_fraction) AS share, max(g.gpu_mem_bytes) AS gpu_mem_bytes,
       maxIf(toNullable(g.gpu_index), g.gpu_uuid != '') AS gpu_index,
       sum(w.held_gpu_s) AS held_s, sum(w.cost_usd) AS cost_usd, any(w.usd_per_gpu_hour) AS usd_per_gpu_hour,
       countIf(w.pod_active) AS active_windows, sumIf(w.allocated_s, w.pod_active) AS active_s,
       quantileExactIf({level!r})(w.max_sm_util_pct, w.pod_active AND w.max_sm_util_pct IS NOT NULL) AS pct_sm,
       countIf(w.pod_active AND w.max_sm_util_pct IS NOT NULL) AS sm_windows,
       maxIf(w.max_sm_util_pct, w.pod_active) AS peak_sm,
       maxIf(coalesce(w.max_mem_used_bytes, 0), w.pod_active) AS peak_mem,
       quantileExactIf({level!r})(coalesce(w.max_mem_used_bytes, 0), w.pod_active) AS pct_mem,
       maxIf(w.window_end, w.busy_s > 0) AS last_busy, countIf(w.busy_s > 0) AS busy_windows
FROM v_advise_windows AS w LEFT JOIN g ON g.gpu_uuid = w.gpu_uuid
WHERE {where}
GROUP BY pod_uid, gpu_uuid
ORDER BY pod_uid, gpu_uuid""", params)


def raw_buckets(reader: SqlReader, start: datetime, team: str | None,
                cfg: AdviseThresholds) -> dict[str, dict[int, dict[str, float]]]:
    where, params = advisor._params(start, team)
    rows = query_rows(reader, f"""
SELECT pod_uid, toUnixTimestamp(toStartOfInterval(window_start, toIntervalSecond({{bucket_s:UInt32}}))) AS bucket,
       gpu_uuid, sum(held_gpu_s) AS held_s, sum(allocated_s) AS allocated_s, sum(busy_s) AS busy_s,
       max(coalesce(max_mem_used_bytes, 0)) AS peak_mem
FROM v_advise_windows
WHERE {where}
GROUP BY pod_uid, bucket, gpu_uuid
ORDER BY pod_uid, bucket, gpu_uuid""", params | {"bucket_s": int(cfg.bucket_s)})
    per_pod: dict[str, dict[int, dict[str, float]]] = {}
    for r in rows:
        b = per_pod.setdefault(r["pod_uid"], {}).setdefault(
            int(r["bucket"]), {"held_s": 0.0, "present_s": 0.0, "busy_s": 0.0, "peak_mem": 0.0})
        b["held_s"] += float(r["held_s"])
        b["present_s"] = max(b["present_s"], float(r["allocated_s"]))
        b["busy_s"] += float(r["busy_s"])
        b["peak_mem"] = max(b["peak_mem"], float(r["peak_mem"]))
    return per_pod


def raw_held_nodes(reader: SqlReader, start: datetime) -> set[str]:
    return {r["node"] for r in query_rows(reader, f"""
SELECT DISTINCT node FROM pod_windows
WHERE {IN_CLUSTER} AND window_start >= toDateTime64({{start:String}}, 3, 'UTC')""",
                                          {"start": advisor.sql_time(start)})}


def raw_queue_rows(reader: SqlReader, start: datetime, team: str | None) -> Rows:
    """The queue's rows as the SQL gives them: every pending pod against every capacity window."""
    team_filter = "AND if(l.team = '', '(none)', l.team) = {team:String}" if team is not None else ""
    return query_rows(reader, f"""
WITH
l AS (SELECT *, addMilliseconds(created_at, toInt64(floor(pending_s * 1000))) AS wait_end
      FROM pod_lifecycle FINAL WHERE {IN_CLUSTER} AND gpus > 0 AND pending_s > 0),
c AS (SELECT window_start, window_end, arraySum(mapValues(free_gpus_by_node)) AS free, largest_free_block
      FROM cluster_capacity FINAL WHERE {IN_CLUSTER} AND window_start >= toDateTime64({{start:String}}, 3, 'UTC'))
SELECT l.pod_uid AS pod_uid, any(l.namespace) AS namespace, any(l.name) AS pod, any(l.team) AS team,
       any(l.gpus) AS gpus, any(l.created_at) AS created_at, any(l.scheduled_at) AS scheduled_at,
       any(l.pending_s) AS pending_s,
       sumIf(dateDiff('millisecond', greatest(c.window_start, l.created_at),
                      least(c.window_end, l.wait_end)) / 1000,
             c.free >= l.gpus AND c.largest_free_block < l.gpus) AS fragmented_pending_s,
       minIf(greatest(c.window_start, l.created_at), c.free >= l.gpus AND c.largest_free_block < l.gpus)
           AS first_fragmented_at,
       argMinIf(c.free, c.window_start, c.free >= l.gpus AND c.largest_free_block < l.gpus) AS free_gpus,
       argMinIf(c.largest_free_block, c.window_start, c.free >= l.gpus AND c.largest_free_block < l.gpus)
           AS largest_free_block
FROM l CROSS JOIN c
WHERE c.window_end > l.created_at AND c.window_start < l.wait_end
      {team_filter}
GROUP BY pod_uid
HAVING fragmented_pending_s > 0
ORDER BY fragmented_pending_s DESC, namespace, pod""", {"start": advisor.sql_time(start),
                                                        **({"team": team} if team is not None else {})})


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> FillOutcome:
    return fill(SPEC, tmp_path_factory.mktemp("advise-rollups"))


@pytest.fixture(scope="module")
def reader(filled: FillOutcome) -> Iterator[ClusterScope]:
    with closing(open_store(f"chdb://{filled.path}", read_only=True)) as store:
        yield scoped(store)


ADVICE_BINS = {"percentile_sm_pct": rollups.SM_BIN_PCT, "percentile_vram_bytes": rollups.VRAM_BIN_BYTES}
"""The advice's percentiles: from a histogram, never below the exact one and less than a bin above it."""


def _same(new: Any, raw: Any, where: str = "") -> None:
    """``new`` equals ``raw``: numbers to float rounding (sums in another order), percentiles within
    their bin (:data:`ADVICE_BINS`), the rest exactly."""
    if isinstance(raw, dict):
        assert isinstance(new, dict) and set(new) == set(raw), (where, sorted(set(new) ^ set(raw)))
        for key in raw:
            _same(new[key], raw[key], f"{where}.{key}")
    elif isinstance(raw, list):
        assert isinstance(new, list) and len(new) == len(raw), (where, new, raw)
        for i, (a, b) in enumerate(zip(new, raw, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif where.rsplit(".", 1)[-1] in ADVICE_BINS and raw is not None:
        assert raw <= new < raw + ADVICE_BINS[where.rsplit(".", 1)[-1]], (where, new, raw)
    elif isinstance(raw, float) and not isinstance(new, bool):
        assert new == pytest.approx(raw, rel=1e-9, abs=1e-6), where
    else:
        assert new == raw, where


def _raw_advice(reader: SqlReader, cfg: AdviseThresholds, team: str | None,
                monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    with monkeypatch.context() as patch:
        patch.setattr(advisor, "data_period", raw_period)
        patch.setattr(advisor, "_pod_gpu_rows", raw_pod_gpu_rows)
        patch.setattr(advisor, "_buckets", raw_buckets)
        patch.setattr(advisor, "_held_nodes", raw_held_nodes)
        patch.setattr(advisor, "query_rows", _queue_twin(advisor.query_rows))
        return advisor.advise(reader, cfg, team)


def _queue_twin(query: Any) -> Any:
    """``query_rows`` that answers the queue's query with the raw twin's (every pod x every window)."""
    def answer(reader: SqlReader, sql: str, params: dict[str, Any] | None = None) -> Rows:
        if "FROM l INNER JOIN c ON c.hour = l.hour" in sql:
            start = datetime.fromisoformat(f"{params['start']}+00:00") if params else None
            assert start is not None
            return raw_queue_rows(reader, start, params.get("team") if params else None)
        return query(reader, sql, params)  # type: ignore[no-any-return]
    return answer


def _start(reader: SqlReader, since_s: float) -> datetime:
    period = advisor.data_period(reader, since_s)
    assert period is not None
    return period[0]


# --------------------------------------------------------------------------- the tests


def test_the_store_has_pods_active_through_another_gpu(reader: ClusterScope) -> None:
    pods = query_rows(reader, """
SELECT pod_uid, uniqExact(gpu_uuid) AS gpus, countIf(busy_s > 0) AS busy, count() AS windows,
       countIf(through_another) AS through_another
FROM (SELECT pod_uid, gpu_uuid, busy_s,
             busy_s = 0 AND max(busy_s) OVER (PARTITION BY pod_uid, window_start) > 0 AS through_another
      FROM pod_windows FINAL)
GROUP BY pod_uid""")
    assert any(p["gpus"] > 1 and p["through_another"] > 0 for p in pods), "a GPU idle while the pod computes"
    assert any(p["gpus"] > 1 and p["busy"] == p["windows"] for p in pods), "a multi-GPU pod busy throughout"
    assert any(p["busy"] == 0 for p in pods), "a pod never busy"
    assert any(p["gpus"] > 1 and 0 < p["busy"] < p["windows"] for p in pods), "a multi-GPU pod busy at times"


BINS = {"pct_sm": rollups.SM_BIN_PCT, "pct_mem": rollups.VRAM_BIN_BYTES}
"""A percentile from the rollup's histogram is never below the exact one and less than a bin above it."""


@pytest.mark.parametrize("since_h", [1.7, 2.0, 24 * 7.0], ids=["inside-an-hour", "on-the-hour", "everything"])
@pytest.mark.parametrize("team", [None, "nlp"])
def test_pod_gpu_rows_equal_the_raw_windows(reader: ClusterScope, since_h: float, team: str | None) -> None:
    for percentile in (95.0, 50.0, 100.0, 1.0):
        cfg = AdviseThresholds(since_s=since_h * 3600, percentile=percentile, **SHORT)
        start = _start(reader, cfg.since_s)
        assert since_h > 3 or start != start.replace(minute=0, second=0, microsecond=0) or since_h == 2.0
        raw = {(r["pod_uid"], r["gpu_uuid"]): r for r in raw_pod_gpu_rows(reader, start, team, cfg)}
        assert any(r["active_windows"] for r in raw.values())
        assert team or any(not r["active_windows"] for r in raw.values())
        rows = advisor._pod_gpu_rows(reader, start, team, cfg)
        assert [(r["pod_uid"], r["gpu_uuid"]) for r in rows] == list(raw), "the same (pod, GPU)s, in order"
        for r in rows:
            key = (r["pod_uid"], r["gpu_uuid"])
            # the last busy window of a GPU never busy is read nowhere (the SQL's is 1970, the rollup's null)
            same = [k for k in raw[key] if k not in BINS and (k != "last_busy" or raw[key]["busy_windows"])]
            _same({k: r[k] for k in same}, {k: raw[key][k] for k in same}, f"{key} p{percentile:g}")
            for k, width in BINS.items():
                exact = raw[key][k] if raw[key]["sm_windows" if k == "pct_sm" else "active_windows"] else None
                if exact is None:
                    assert r[k] in (None, 0), (key, k)
                    continue
                assert exact <= r[k] < exact + width, (key, k, percentile, r[k], exact)


@pytest.mark.parametrize("bucket_s", [3600.0, 7200.0, 1800.0, 300.0])
def test_buckets_equal_the_raw_windows(reader: ClusterScope, bucket_s: float) -> None:
    for since_h in (1.7, 24 * 7.0):
        cfg = AdviseThresholds(since_s=since_h * 3600, bucket_s=bucket_s, **SHORT)
        start = _start(reader, cfg.since_s)
        for team in (None, "nlp"):
            raw = raw_buckets(reader, start, team, cfg)
            assert raw
            _same(dict(advisor._buckets(reader, start, team, cfg)), raw, f"bucket {bucket_s:g} since {since_h}")


def test_period_and_held_nodes_equal_the_raw_windows(reader: ClusterScope) -> None:
    for since_h in (1.7, 2.0, 24 * 7.0):
        assert advisor.data_period(reader, since_h * 3600) == raw_period(reader, since_h * 3600)
        start = _start(reader, since_h * 3600)
        assert advisor._held_nodes(reader, start) == raw_held_nodes(reader, start)


@pytest.mark.parametrize("case", [
    {"since_s": 1.7 * 3600},
    {"since_s": 2 * 3600.0, "bucket_s": 1800.0},
    {"since_s": 7 * 86400.0, "percentile": 50.0},
    {"since_s": 7 * 86400.0, "bucket_s": 7200.0, "team": "serve"},
    {"since_s": 2.5 * 3600, "team": "vision"},
], ids=["inside-an-hour", "half-hour-buckets", "p50", "team-2h-buckets", "team-inside-an-hour"])
def test_the_advice_equals_its_raw_twin(reader: ClusterScope, case: dict[str, Any],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    team = case.get("team")
    cfg = AdviseThresholds(**{**SHORT, **{k: v for k, v in case.items() if k != "team"}})
    advice = advisor.advise(reader, cfg, team)
    raw = _raw_advice(reader, cfg, team, monkeypatch)
    _same(advice, raw, "advice")
    assert advice["pack"] and (advice["right_size"] or advice["reclaim"]), "recommendations to compare"
    assert advice["right_size"] != _raw_advice(reader, cfg.model_copy(update={"percentile": 5.0}), team,
                                               monkeypatch)["right_size"], "the percentile matters here"
