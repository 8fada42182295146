"""Rollups whose rows add up a raw table per period, so that a question over a long history reads one
row per group and period instead of every sample or window.

A :class:`Rollup` is declared once: its table (:mod:`sinks.tables`: the columns, and how each
measure's rows merge, by its ``SimpleAggregateFunction`` or ``AggregateFunction`` type), the raw
table it reads, its keys and its measures as aggregates over raw rows. Its migration (the table,
a back-fill from the rows already stored, then the materialized view) and the expressions readers
merge rows with (:meth:`Rollup.merged`) are built from that declaration.

- :data:`GPU_HOURLY`: GPU samples per GPU and hour (``gpu_samples``): sample counts, seconds sampled,
  unallocated and allocated but idle (utilisation under :data:`IDLE_UTIL_PCT` %), the GPU's memory,
  first and last sample. The report's nodes to scale down, the advisor's capacity cost and scale to
  zero, the GPUs' memory and index beside pod windows and the notes on unpriced models read it.
- :data:`TEAM_HOURLY`, :data:`TEAM_DAILY`: pod windows per namespace, team, project, GPU model and
  idle class (``no_process``, ``vram_held``, else ``partly_idle``: the window had compute), per hour
  and per day (``pod_windows``): windows, distinct pods (all, and those with idle or gap seconds),
  allocated, busy, idle and gap seconds, utilisation, peak VRAM, energy, cost and its idle part,
  first and last window. The report's fleet summary, top teams and projects, idle by team and class,
  cost by team and utilisation by team read them.

Exactly once, like their raw tables: the views run on the blocks the sink inserts (a block the
engine drops as a retry is dropped in the views too), and the sink never inserts a window or a
sample again at a new offset (:mod:`sinks.batches`). Every measure is a sum, count, max, min, a
distinct count's state or the value of a key, so the rollups' answers equal the raw tables' under
``FINAL`` (sums to float rounding); ``gpu_hourly.interval_s`` is any sample interval of the hour.
Their TTL is the rollups' (730 days by default), so they answer beyond the raw tables' TTLs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sinks.tables import GPU_HOURLY_TABLE, TEAM_DAILY_TABLE, TEAM_HOURLY_TABLE, Table

IDLE_UTIL_PCT = 5
"""An allocated GPU whose utilisation is under this (%) in a sample is idle in that sample."""

PERIODS = {"hour": "toStartOfHour({time})", "day": "toDate({time})"}


@dataclass(frozen=True)
class Rollup:
    table: Table
    """Its columns: ``cluster``, the period, :attr:`keys`, then :attr:`measures`, in this order."""
    source: str
    """The raw table its view reads."""
    time: str
    """The raw table's time column the period is taken from."""
    period: str
    """``hour`` or ``day``: the period's column and how it is taken from :attr:`time`."""
    keys: tuple[str, ...]
    """Grouping columns after the cluster and the period: raw columns, or named in :attr:`derived`."""
    measures: dict[str, str]
    """Each measure column as an aggregate over raw rows (``...State`` for a distinct count). A
    measure is named unlike every raw column another aggregate reads: in the view's ``SELECT`` the
    name would mean the aggregate."""
    derived: tuple[tuple[str, str], ...] = ()
    """(key, expression over raw rows) for keys that are not raw columns."""

    def __post_init__(self) -> None:
        if self.table.names != ("cluster", self.period, *self.keys, *self.measures):
            raise ValueError(f"{self.table.name}: the spec's columns are cluster, the period, the keys, the measures")

    def merged(self, column: str) -> str:
        """The expression that merges ``column``'s rows (``sum(x)``, ``uniqExactMerge(x)``, ...)."""
        kind = self.table.column(column).type
        simple = re.match(r"SimpleAggregateFunction\((\w+),", kind)
        if simple:
            return f"{simple.group(1)}({column})"
        state = re.match(r"AggregateFunction\((\w+),", kind)
        if state:
            return f"{state.group(1)}Merge({column})"
        raise ValueError(f"{self.table.name}.{column} is not a measure")

    def aggregate(self, source: str, where: str = "") -> str:
        """``SELECT`` of the rollup's rows from ``source`` (the raw table, ``FINAL`` or not)."""
        derived = dict(self.derived)
        period = PERIODS[self.period].format(time=self.time)
        keys = ", ".join(["cluster", f"{period} AS {self.period}",
                          *(f"{derived[k]} AS {k}" if k in derived else k for k in self.keys)])
        measures = ", ".join(f"{expression} AS {name}" for name, expression in self.measures.items())
        return (f"SELECT {keys}, {measures}\nFROM {source}{f' WHERE {where}' if where else ''}\n"
                f"GROUP BY {', '.join(('cluster', self.period, *self.keys))}")

    def migration(self) -> tuple[str, ...]:
        """The table, its back-fill from the raw rows already stored, then the view.

        Idempotent as a whole, as every migration is: a rerun after a crash deletes a partial
        back-fill and fills again (the sink consumes nothing before its migrations are done, so no
        view insert is lost); the view is created last, so nothing is counted both by it and by
        the back-fill."""
        name = self.table.name
        order = ", ".join(("cluster", self.period, *self.keys))
        return (
            self.table.create(f"ENGINE = AggregatingMergeTree\nPARTITION BY toYYYYMM({self.period})\n"
                              f"ORDER BY ({order})\nTTL {self.period} + INTERVAL {{rollup_ttl_days}} DAY\n"
                              "SETTINGS non_replicated_deduplication_window = 10000"),
            f"DELETE FROM {name} WHERE true",
            f"INSERT INTO {name} ({', '.join(self.table.names)})\n{self.aggregate(f'{self.source} FINAL')}",
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {name}_mv TO {name} AS\n{self.aggregate(self.source)}",
        )


GPU_HOURLY = Rollup(
    GPU_HOURLY_TABLE, "gpu_samples", "ts", "hour", ("node", "gpu_uuid", "gpu_index", "gpu_model", "mig_parent_uuid"),
    {
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
    },
)

IDLE_CLASS = ("multiIf(busy_s = 0 AND coalesce(max_mem_used_bytes, 0) = 0, 'no_process', busy_s = 0, 'vram_held', "
              "'partly_idle')")
"""A window's idle class: no process held the GPU, a process held VRAM but computed nothing, or it
computed (its idle seconds, if any, are partly idle)."""

_TEAM_KEYS = ("namespace", "team", "project", "gpu_model", "idle_class")
_TEAM_MEASURES = {
    "windows": "count()",
    "pods": "uniqExactState(pod_uid)",
    "idle_pods": "uniqExactIfState(pod_uid, idle_s > 0 OR gap_s > 0)",
    "allocated_gpu_s": "sum(allocated_s)",
    "busy_gpu_s": "sum(busy_s)",
    "idle_gpu_s": "sum(idle_s)",
    "gap_gpu_s": "sum(gap_s)",
    "util_pct_x_gpu_s": "sumIf(coalesce(avg_sm_util_pct, 0) * allocated_s, avg_sm_util_pct IS NOT NULL)",
    "util_gpu_s": "sumIf(allocated_s, avg_sm_util_pct IS NOT NULL)",
    "peak_mem_bytes": "max(max_mem_used_bytes)",
    "energy_total_j": "sum(coalesce(energy_j, 0))",
    "cost_total_usd": "sum(cost_usd)",
    "idle_cost_usd": "sum(cost_usd * idle_s / nullIf(allocated_s, 0))",
    "first_start": "min(window_start)",
    "last_end": "max(window_end)",
}
TEAM_HOURLY = Rollup(TEAM_HOURLY_TABLE, "pod_windows", "window_start", "hour", _TEAM_KEYS, _TEAM_MEASURES,
                     (("idle_class", IDLE_CLASS),))
TEAM_DAILY = Rollup(TEAM_DAILY_TABLE, "pod_windows", "window_start", "day", _TEAM_KEYS, _TEAM_MEASURES,
                    (("idle_class", IDLE_CLASS),))


ROLLUPS = (GPU_HOURLY, TEAM_HOURLY, TEAM_DAILY)
SOURCES = frozenset(rollup.source for rollup in ROLLUPS) | {"pod_windows"}
"""Raw tables whose inserts feed rollups (``pod_windows`` also feeds ``rollup_hourly`` and
``rollup_daily``, migration 2): a row inserted there is counted in a rollup even if deleted later."""


def gpu_rows_since(start_param: str | None = None) -> str:
    """A subquery of ``gpu_hourly``'s columns but ``hour`` whose rows, merged per measure
    (:meth:`Rollup.merged`), give every GPU's figures over its samples at or after the query
    parameter ``start_param`` (a ``String`` time; None: every sample).

    A start inside an hour takes that hour's part from ``gpu_samples FINAL`` (its samples from the
    start on) and the rollup from the next full hour; past the raw samples' TTL the part hour is
    empty, so such a figure may miss at most the start's hour."""
    columns = ", ".join(name for name in GPU_HOURLY.table.names if name != "hour")
    if start_param is None:
        return f"(SELECT {columns} FROM gpu_hourly)"
    start = f"toDateTime64({{{start_param}:String}}, 3, 'UTC')"
    boundary = f"if(toStartOfHour({start}) = {start}, toStartOfHour({start}), toStartOfHour({start}) + INTERVAL 1 HOUR)"
    raw = GPU_HOURLY.aggregate("gpu_samples FINAL", f"ts >= {start} AND ts < {boundary}")
    return (f"(SELECT {columns} FROM gpu_hourly WHERE hour >= {boundary}\n"
            f"UNION ALL SELECT {columns} FROM ({raw}))")
