"""``gpu_hourly``: the GPU samples added up per GPU and hour, so that a figure over the whole
history of every GPU reads one row per GPU-hour instead of 360 samples (10 s sampling).

What it holds, per cluster, hour, node and GPU (its index, model and MIG parent in the key too):
how many samples there were and how many found the GPU allocated, the seconds they covered in all,
unallocated, and allocated but idle (utilisation under :data:`IDLE_UTIL_PCT` %), the GPU's memory,
and its first and last sample time. The report's "nodes to scale down", the advisor's capacity cost
and "scale to zero", the GPUs' memory and index beside pod windows and the notes on unpriced models
read it (:func:`rows_since`).

How it stays exact: a materialized view over ``gpu_samples`` (the engine runs it on every block the
sink inserts; a block the engine drops as a retry is dropped in the view too), and the sink never
inserts a sample again at a new offset (:mod:`sinks.batches`). Every figure is a sum, count, max,
min or the value of a key, so the rollup's answers equal those of ``gpu_samples FINAL`` exactly;
``interval_s`` is any sample interval of the hour's (a GPU samples at one interval). Its TTL is the rollups'
(730 days by default), so it answers beyond the raw samples' TTL.

One declaration: :data:`sinks.tables.GPU_HOURLY` gives the columns and how rows merge (each measure's
``SimpleAggregateFunction``); :data:`MEASURES` how each is computed from samples. The view, the
back-fill of migration 13 and the raw part of :func:`rows_since` are built from both.
"""

from __future__ import annotations

import re

from sinks.tables import GPU_HOURLY

IDLE_UTIL_PCT = 5
"""An allocated GPU whose utilisation is under this (%) in a sample is idle in that sample."""

KEYS: tuple[str, ...] = ("cluster", "hour", "node", "gpu_uuid", "gpu_index", "gpu_model", "mig_parent_uuid")
"""The rollup's sorting key: one row per combination once merged."""

MEASURES: dict[str, str] = {
    "samples": "count()",
    "allocated_samples": "countIf(NOT empty(pod_uids))",
    "sampled_s": "sum(sample_interval_s)",
    "unallocated_s": "sumIf(sample_interval_s, empty(pod_uids))",
    "allocated_idle_s":
        f"sumIf(sample_interval_s, NOT empty(pod_uids) AND coalesce(gpu_util_pct, 0) < {IDLE_UTIL_PCT})",
    "mem_total_bytes": "max(mem_total_bytes)",
    "interval_s": "any(sample_interval_s)",
    "first_ts": "min(ts)",
    "last_ts": "max(ts)",
}
"""Each measure column of :data:`~sinks.tables.GPU_HOURLY` as an aggregate over ``gpu_samples`` rows."""

_KEY_SQL = {"hour": "toStartOfHour(ts)"}


def merge_function(column: str) -> str:
    """How rows of ``column`` combine: the function of its ``SimpleAggregateFunction`` type."""
    found = re.match(r"SimpleAggregateFunction\((\w+),", GPU_HOURLY.column(column).type)
    if found is None:
        raise ValueError(f"gpu_hourly.{column} is not a measure")
    return found.group(1)


def _aggregate(source: str, where: str = "") -> str:
    keys = ", ".join(f"{_KEY_SQL[k]} AS {k}" if k in _KEY_SQL else k for k in KEYS)
    measures = ", ".join(f"{expression} AS {name}" for name, expression in MEASURES.items())
    return f"SELECT {keys}, {measures}\nFROM {source}{f' WHERE {where}' if where else ''}\nGROUP BY {', '.join(KEYS)}"


def migration() -> tuple[str, ...]:
    """Migration 13: the table, its back-fill from the samples already stored, then the view.

    Idempotent as a whole, as every migration is: a rerun after a crash deletes a partial back-fill
    and fills again (the sink consumes nothing before its migrations are done, so no view insert is
    lost); the view is created last, so nothing is counted both by it and by the back-fill."""
    assert tuple(GPU_HOURLY.names) == (*KEYS, *MEASURES), "gpu_hourly: the spec's columns are KEYS then MEASURES"
    return (
        GPU_HOURLY.create("ENGINE = AggregatingMergeTree\nPARTITION BY toYYYYMM(hour)\n"
                          f"ORDER BY ({', '.join(KEYS)})\nTTL hour + INTERVAL {{rollup_ttl_days}} DAY\n"
                          "SETTINGS non_replicated_deduplication_window = 10000"),
        "DELETE FROM gpu_hourly WHERE true",
        f"INSERT INTO gpu_hourly ({', '.join(GPU_HOURLY.names)})\n{_aggregate('gpu_samples FINAL')}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_hourly_mv TO gpu_hourly AS\n{_aggregate('gpu_samples')}",
    )


def rows_since(start_param: str | None = None) -> str:
    """A subquery of ``gpu_hourly``'s columns (:data:`KEYS` but ``hour``, and :data:`MEASURES`) whose
    rows, merged with :func:`merge_function` per measure, give every GPU's figures over its samples
    at or after the query parameter ``start_param`` (a ``String`` time; None: every sample).

    A start inside an hour takes that hour's part from ``gpu_samples FINAL`` (its samples from the
    start on) and the rollup from the next full hour; past the raw samples' TTL the part hour is
    empty, so such a figure may miss at most the start's hour."""
    columns = ", ".join(name for name in GPU_HOURLY.names if name != "hour")
    if start_param is None:
        return f"(SELECT {columns} FROM gpu_hourly)"
    start = f"toDateTime64({{{start_param}:String}}, 3, 'UTC')"
    boundary = f"if(toStartOfHour({start}) = {start}, toStartOfHour({start}), toStartOfHour({start}) + INTERVAL 1 HOUR)"
    raw = _aggregate("gpu_samples FINAL", f"ts >= {start} AND ts < {boundary}")
    return (f"(SELECT {columns} FROM gpu_hourly WHERE hour >= {boundary}\n"
            f"UNION ALL SELECT {columns} FROM ({raw}))")
