"""Rollups whose rows add up a raw table per period, so that a question over a long history reads one
row per group and period instead of every sample or window.

A :class:`Rollup` is declared once: its table (:mod:`sinks.tables`: the columns, and how each
measure's rows merge, by its ``SimpleAggregateFunction`` or ``AggregateFunction`` type), the raw
table it reads, its keys and its measures as aggregates over raw rows. Its migration (the table,
a back-fill from the rows already stored, then the materialized view) and the expressions readers
merge rows with (:meth:`Rollup.merged`) are built from that declaration.

- :data:`GPU_HOURLY`, :data:`GPU_DAILY`: GPU samples per GPU and hour and per day (``gpu_samples``):
  sample counts, seconds sampled, unallocated and allocated but idle (utilisation under
  :data:`IDLE_UTIL_PCT` %), the GPU's memory, first and last sample. The report's nodes to scale
  down, the advisor's capacity cost and scale to zero, the GPUs' memory and index beside pod windows
  and the notes on unpriced models read them (:func:`gpu_rows_since`: whole days from the daily one,
  the hours before a start's first whole day from the hourly one). The daily one is back-filled from
  the hourly one, which outlives the raw samples.
- :data:`TEAM_HOURLY`, :data:`TEAM_DAILY`: pod windows per namespace, team, project, GPU model and
  idle class (``no_process``, ``vram_held``, else ``partly_idle``: the window had compute), per hour
  and per day (``pod_windows``): windows, distinct pods (all, and those with idle or gap seconds),
  allocated, busy, idle and gap seconds, utilisation, peak VRAM, energy, cost and its idle part,
  first and last window. The report's fleet summary, top teams and projects, idle by team and class,
  cost by team and utilisation by team read them (over ``gpulens report --since``'s period: whole days
  from the daily one, the hours before the first from the hourly one).
- :data:`POD_HOURLY`, :data:`POD_DAILY`: pod windows per pod and GPU (with the pod's namespace, name,
  team and project, its node and the GPU model), per hour and per day (``pod_windows``): windows and
  busy windows, allocated, busy, idle, gap and held (allocated x share) GPU-seconds, utilisation,
  peak VRAM and SM utilisation, energy, cost and its idle part, the steps and tokens the windows
  carried, the largest share, the allocator's peak reserved-but-unused bytes, retries, OOMs and last
  reserved and allocated bytes, the first and last window and the end of the last busy one (NULL:
  never busy). The report's top pods, pods and cost per unit of work (``v_cost_per_unit``) read the
  daily one; the advisor reads the hourly one from its start on (:meth:`Rollup.rows_since`).
- :data:`PROGRESS_DAILY`: workload progress per pod and day (``workload_progress``): the least and the
  greatest of each total it reported (steps, tokens, samples), so a pod's progress over any days is
  the greatest less the least (``v_cost_per_unit``, :func:`cost_per_unit`). Without an hourly twin,
  it and :data:`SHARED_GPU_DAILY` take a period's part first day from the raw rows.
- :data:`POD_ACTIVE_HOURLY`: a pod's active windows per GPU, team and hour (the advisor's evidence and
  percentiles); :data:`SHARED_GPU_DAILY`: a pod's windows on shared GPUs per day (``v_shared_gpu_cost``).
  Both read the stamps the node stage gives each window (:attr:`Rollup.stamped`).
- :data:`GPU_TENANCY_DAILY` declares migration 16's table, which migration 17 drops.

An optional figure (a Nullable raw column) stays NULL in a rollup where every raw row had none, as
in the raw answer: its measure is a ``Nullable`` sum or max, or ``...OrNull``.

Exactly once, like their raw tables: the views run on the blocks the sink inserts (a block the
engine drops as a retry is dropped in the views too), and the sink never inserts a window or a
sample again at a new offset (:mod:`sinks.batches`). Every measure is a sum, count, max, min, a
distinct count's or a last value's state or the value of a key, so the rollups' answers equal the
raw tables' under ``FINAL`` (sums to float rounding); ``gpu_hourly.interval_s`` is any sample interval
of the hour. ``progress_daily`` holds least and greatest values only, which a record stored twice
leaves as they are.
Their TTL is the rollups' (730 days by default), so they answer beyond the raw tables' TTLs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sinks.tables import (
    GPU_DAILY_TABLE,
    GPU_HOURLY_TABLE,
    GPU_TENANCY_DAILY_TABLE,
    POD_ACTIVE_DAILY_TABLE,
    POD_ACTIVE_HOURLY_TABLE,
    POD_DAILY_TABLE,
    POD_HOURLY_TABLE,
    PROGRESS_DAILY_TABLE,
    SHARED_GPU_DAILY_TABLE,
    TEAM_DAILY_TABLE,
    TEAM_HOURLY_TABLE,
    Table,
)

PRICE = ("(SELECT gpu_model, argMax(usd_per_gpu_hour, updated_at) AS usd_per_gpu_hour FROM gpu_prices "
         "GROUP BY gpu_model)")
"""Each GPU model's latest list price (``gpu_prices``), to join on ``gpu_model``."""

IDLE_UTIL_PCT = 5
"""An allocated GPU whose utilisation is under this (%) in a sample is idle in that sample."""

_BACKFILL_SETTINGS = "\nSETTINGS max_bytes_before_external_sort = 1000000000"
"""A stamped back-fill sorts every stored window by its pod's or GPU's window: on disk past 1 GB."""

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
    condition: str = ""
    """The raw rows it adds up (``""``: every row)."""
    stamped: str = ""
    """For measures that read the windows' stamps (``pod_busy_s``, ``gpu_pods``, ...): the raw columns
    the back-fill and a part hour read, the stamps among them computed over the windows of the same
    start, as the node stage stamps them (windows stored without stamps have NULL there)."""
    finer: Rollup | None = None
    """For a daily rollup: the hourly one of the same keys and measures, which :meth:`rows_since`
    reads the start's part day from."""
    backfilled_from_finer: bool = False
    """Its back-fill merges :attr:`finer`'s rows per day (they outlive the raw rows' TTL), not the raw
    rows."""

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

    def merged_state(self, column: str) -> str:
        """The expression that merges ``column``'s rows into one row of a coarser rollup (its
        aggregate, or ``...MergeState`` of a state)."""
        merged = self.merged(column)
        return merged.replace("Merge(", "MergeState(", 1) if "Merge(" in merged else merged

    def aggregate(self, source: str) -> str:
        """``SELECT`` of the rollup's rows from ``source`` (the raw table, ``FINAL`` or not)."""
        derived = dict(self.derived)
        period = PERIODS[self.period].format(time=self.time)
        keys = ", ".join(["cluster", f"{period} AS {self.period}",
                          *(f"{derived[k]} AS {k}" if k in derived else k for k in self.keys)])
        measures = ", ".join(f"{expression} AS {name}" for name, expression in self.measures.items())
        return (f"SELECT {keys}, {measures}\nFROM {source}{f' WHERE {self.condition}' if self.condition else ''}\n"
                f"GROUP BY {', '.join(('cluster', self.period, *self.keys))}")

    def stored(self, where: str = "") -> str:
        """The raw rows as stored (``FINAL``), those matching ``where`` (``""``: all): the table, or
        for a :attr:`stamped` rollup a subquery that computes the stamps."""
        if not self.stamped:
            return f"(SELECT * FROM {self.source} FINAL WHERE {where})" if where else f"{self.source} FINAL"
        return f"(SELECT {self.stamped} FROM {self.source} FINAL{f' WHERE {where}' if where else ''})"

    def rows_since(self, start_param: str | None = None) -> str:
        """A subquery of the rollup's columns but its period whose rows, merged per measure
        (:meth:`merged`), give each group's figures over its raw rows at or after the query
        parameter ``start_param`` (a ``String`` time; None: every row).

        A start inside an hour takes that hour's part from the raw table under ``FINAL`` (its rows
        whose :attr:`time` is at or after the start); an hourly rollup gives the rest; a daily one
        with a :attr:`finer` hourly rollup gives the whole days, the hourly one the hours before the
        first. A daily one without takes the start's part day from the raw table. Past the raw
        table's TTL that part is empty, so such a figure may miss at most the start's hour (its day
        without a :attr:`finer` rollup)."""
        columns = ", ".join(name for name in self.table.names if name != self.period)
        if start_param is None:
            return f"(SELECT {columns} FROM {self.table.name})"
        start = f"toDateTime64({{{start_param}:String}}, 3, 'UTC')"

        def raw_until(end: str) -> str:
            raw = self.aggregate(self.stored(f"{self.time} >= {start} AND {self.time} < {end}"))
            return f"UNION ALL SELECT {columns} FROM ({raw}))"

        hour = (f"if(toStartOfHour({start}) = {start}, toStartOfHour({start}), "
                f"toStartOfHour({start}) + INTERVAL 1 HOUR)")
        if self.period == "hour":
            return f"(SELECT {columns} FROM {self.table.name} WHERE hour >= {hour}\n{raw_until(hour)}"
        day = f"if(toStartOfDay({start}) = {start}, toStartOfDay({start}), toStartOfDay({start}) + INTERVAL 1 DAY)"
        days = f"(SELECT {columns} FROM {self.table.name} WHERE day >= toDate({day})\n"
        if self.finer is None:
            return f"{days}{raw_until(day)}"
        return (f"{days}UNION ALL SELECT {columns} FROM {self.finer.table.name} WHERE hour >= {hour} AND hour < {day}\n"
                f"{raw_until(hour)}")

    def backfill(self) -> str:
        """The ``SELECT`` of the rollup's rows from those already stored: the raw rows, or the
        :attr:`finer` rollup's rows merged per day."""
        if self.finer is None or not self.backfilled_from_finer:
            return f"{self.aggregate(self.stored())}{_BACKFILL_SETTINGS if self.stamped else ''}"
        keys = ", ".join(("cluster", f"toDate(hour) AS {self.period}", *self.keys))
        measures = ", ".join(f"{self.finer.merged_state(name)} AS {name}" for name in self.measures)
        return (f"SELECT {keys}, {measures}\nFROM {self.finer.table.name}\n"
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
            f"INSERT INTO {name} ({', '.join(self.table.names)})\n{self.backfill()}",
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {name}_mv TO {name} AS\n{self.aggregate(self.source)}",
        )


_GPU_KEYS = ("node", "gpu_uuid", "gpu_index", "gpu_model", "mig_parent_uuid")
_GPU_MEASURES = {
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
GPU_HOURLY = Rollup(GPU_HOURLY_TABLE, "gpu_samples", "ts", "hour", _GPU_KEYS, _GPU_MEASURES)
GPU_DAILY = Rollup(GPU_DAILY_TABLE, "gpu_samples", "ts", "day", _GPU_KEYS, _GPU_MEASURES, finer=GPU_HOURLY,
                   backfilled_from_finer=True)

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
                    (("idle_class", IDLE_CLASS),), finer=TEAM_HOURLY)


_POD_KEYS = ("pod_uid", "gpu_uuid", "namespace", "pod", "team", "project", "node", "gpu_model")
_POD_MEASURES = {
    "windows": "count()",
    "busy_windows": "countIf(busy_s > 0)",
    "allocated_gpu_s": "sum(allocated_s)",
    "busy_gpu_s": "sum(busy_s)",
    "idle_gpu_s": "sum(idle_s)",
    "gap_gpu_s": "sum(gap_s)",
    "held_gpu_s": "sum(allocated_s * share_fraction)",
    "util_pct_x_gpu_s": _TEAM_MEASURES["util_pct_x_gpu_s"],
    "util_gpu_s": _TEAM_MEASURES["util_gpu_s"],
    "mem_gpu_s": "sumIf(allocated_s, max_mem_used_bytes IS NOT NULL)",
    "peak_mem_bytes": "max(max_mem_used_bytes)",
    "peak_sm_pct": "max(max_sm_util_pct)",
    "energy_total_j": _TEAM_MEASURES["energy_total_j"],
    "cost_total_usd": _TEAM_MEASURES["cost_total_usd"],
    "idle_cost_usd": _TEAM_MEASURES["idle_cost_usd"],
    "window_steps": "sum(steps)",
    "window_tokens": "sum(tokens)",
    "share_max": "max(share_fraction)",
    "peak_reserved_unused_bytes": "max(max_reserved_unused_bytes)",
    "alloc_retries_total": "sum(alloc_retries)",
    "alloc_ooms_total": "sum(alloc_ooms)",
    "last_reserved_bytes": "argMaxState(alloc_reserved_bytes, window_start)",
    "last_allocated_bytes": "argMaxState(alloc_allocated_bytes, window_start)",
    "first_start": "min(window_start)",
    "last_end": "max(window_end)",
    "last_busy_end": "maxIfOrNull(window_end, busy_s > 0)",
}
POD_HOURLY = Rollup(POD_HOURLY_TABLE, "pod_windows", "window_start", "hour", _POD_KEYS, _POD_MEASURES)
POD_DAILY = Rollup(POD_DAILY_TABLE, "pod_windows", "window_start", "day", _POD_KEYS, _POD_MEASURES, finer=POD_HOURLY)
PROGRESS_DAILY = Rollup(PROGRESS_DAILY_TABLE, "workload_progress", "ts", "day", ("pod_uid",), {
    f"{total}_{bound}": f"{bound}({total}_total)"
    for total in ("steps", "tokens", "samples") for bound in ("min", "max")})


def cost_per_unit(pods: str = POD_DAILY_TABLE.name, progress: str = PROGRESS_DAILY_TABLE.name) -> str:
    """Cost per step and per 1k tokens per pod (per cluster): its windows' GPU-hours, cost and steps from
    ``pods`` (``pod_daily`` or its :meth:`Rollup.rows_since`), its progress (the greatest minus the least
    total it reported) from ``progress`` (``progress_daily`` or its rows since a time)."""
    return f"""WITH c AS (
    SELECT cluster, pod_uid, any(namespace) AS namespace, any(pod) AS pod, any(team) AS team,
           any(project) AS project,
           sum(allocated_gpu_s) / 3600 AS gpu_hours, sum(cost_total_usd) AS cost_usd,
           sum(allocated_gpu_s) / 3600 * any(coalesce(p.usd_per_gpu_hour, 0)) AS list_cost_usd,
           sum(window_steps) AS window_steps, sum(window_tokens) AS window_tokens
    FROM {pods} AS w
    LEFT JOIN {PRICE} AS p ON p.gpu_model = w.gpu_model
    GROUP BY cluster, pod_uid
),
u AS (
    SELECT cluster, pod_uid, max(steps_max) - min(steps_min) AS steps, max(tokens_max) - min(tokens_min) AS tokens,
           max(samples_max) - min(samples_min) AS samples
    FROM {progress} GROUP BY cluster, pod_uid
)
SELECT c.cluster AS cluster, c.namespace AS namespace, c.pod AS pod, c.pod_uid AS pod_uid, c.team AS team,
       c.project AS project,
       c.gpu_hours AS gpu_hours, greatest(c.cost_usd, c.list_cost_usd) AS cost_usd,
       coalesce(nullIf(u.steps, 0), nullIf(c.window_steps, 0)) AS steps,
       coalesce(nullIf(u.tokens, 0), nullIf(c.window_tokens, 0)) AS tokens,
       greatest(c.cost_usd, c.list_cost_usd) / steps AS cost_per_step_usd,
       greatest(c.cost_usd, c.list_cost_usd) / tokens * 1000 AS cost_per_1k_tokens_usd
FROM c LEFT JOIN u ON u.cluster = c.cluster AND u.pod_uid = c.pod_uid
WHERE steps > 0 OR tokens > 0"""


COST_PER_UNIT_VIEW = f"CREATE OR REPLACE VIEW v_cost_per_unit AS\n{cost_per_unit()}"
"""Each pod's cost per unit of work over all its history (:func:`cost_per_unit`)."""


GPU_TENANCY_DAILY = Rollup(GPU_TENANCY_DAILY_TABLE, "pod_windows", "window_start", "day",
                           ("gpu_uuid", "namespace", "pod_uid"),
                           {"first_start": "min(window_start)", "last_start": "max(window_start)",
                            "share_min": "min(share_fraction)"})

ACTIVE = "coalesce(pod_busy_s, busy_s) > 0"
"""A pod's active window: any GPU of the pod had busy time in it (a window stored without the stamp:
its own GPU had)."""

SM_BIN_PCT = 1
"""Width of a bin of :data:`POD_ACTIVE_HOURLY`'s SM histogram (percentage points)."""
VRAM_BIN_BYTES = 16 * 2**20
"""Width of a bin of :data:`POD_ACTIVE_HOURLY`'s VRAM histogram."""


def _bin(value: str, width: int) -> str:
    """The histogram entry of one value: bin ``ceil(value / width)``, holding ``(bin - 1, bin] x width``."""
    return f"([toUInt16(ceil({value} / {width}))], [toUInt64(1)])"


_POD_ACTIVE_KEYS = ("pod_uid", "gpu_uuid", "team")
_POD_ACTIVE_MEASURES = {
    "active_windows": "count()",
    "active_gpu_s": "sum(allocated_s)",
    "sm_windows": "count(max_sm_util_pct)",
    "active_peak_sm_pct": "max(max_sm_util_pct)",
    "active_peak_mem_bytes": "max(coalesce(max_mem_used_bytes, 0))",
    "sm_bins": f"sumMapIf({_bin('max_sm_util_pct', SM_BIN_PCT)}, max_sm_util_pct IS NOT NULL)",
    "mem_bins": f"sumMap({_bin('coalesce(max_mem_used_bytes, 0)', VRAM_BIN_BYTES)})",
}
_POD_ACTIVE_STAMPED = ("cluster, window_start, pod_uid, gpu_uuid, team, allocated_s, busy_s, max_sm_util_pct, "
                       "max_mem_used_bytes, "
                       "max(busy_s) OVER (PARTITION BY cluster, pod_uid, window_start) AS pod_busy_s")
POD_ACTIVE_HOURLY = Rollup(POD_ACTIVE_HOURLY_TABLE, "pod_windows", "window_start", "hour", _POD_ACTIVE_KEYS,
                           _POD_ACTIVE_MEASURES, condition=ACTIVE, stamped=_POD_ACTIVE_STAMPED)
POD_ACTIVE_DAILY = Rollup(POD_ACTIVE_DAILY_TABLE, "pod_windows", "window_start", "day", _POD_ACTIVE_KEYS,
                          _POD_ACTIVE_MEASURES, condition=ACTIVE, stamped=_POD_ACTIVE_STAMPED,
                          finer=POD_ACTIVE_HOURLY, backfilled_from_finer=True)
"""Each pod's active windows per GPU and hour and per day: what the advisor's right-sizing reads, a
percentile of the SM or VRAM peaks within a bin of the exact one (:func:`percentile`)."""

SHARED = "coalesce(gpu_pods, 1) > 1 OR share_fraction < 1"
"""A window on a shared GPU: another pod held the GPU in the same window, or the pod's share was
under 1 (a window stored without the stamps: by its share alone)."""

SHARED_GPU_DAILY = Rollup(
    SHARED_GPU_DAILY_TABLE, "pod_windows", "window_start", "day",
    ("namespace", "team", "project", "pod", "pod_uid", "gpu_model"),
    {
        "windows": "count()",
        "requested_gpu_s": "sum(allocated_s * share_fraction)",
        "usage_gpu_s": "sum(coalesce(gpu_allocated_s, allocated_s) * if(coalesce(gpu_busy_s, busy_s) > 0, "
                       "busy_s / coalesce(gpu_busy_s, busy_s), 1 / coalesce(gpu_pods, 1)))",
    },
    condition=SHARED,
    stamped="cluster, window_start, namespace, team, project, pod, pod_uid, gpu_model, allocated_s, busy_s, "
            "share_fraction, toUInt16(count() OVER gpu_window) AS gpu_pods, sum(busy_s) OVER gpu_window AS gpu_busy_s, "
            "max(allocated_s) OVER gpu_window AS gpu_allocated_s".replace(
                "gpu_window", "(PARTITION BY cluster, gpu_uuid, window_start)"),
)
"""Each pod's windows on a shared GPU per day: the GPU-seconds it requested (allocated x share) and
those it used, the GPU's window split by the pods' busy seconds (evenly when none was busy)."""

def shared_gpu_cost(shared: str = SHARED_GPU_DAILY_TABLE.name) -> str:
    """Per pod, its windows on shared GPUs: requested and used GPU-hours and their cost at the model's
    list price, from ``shared`` (``shared_gpu_daily`` or its :meth:`Rollup.rows_since`)."""
    return ("SELECT s.cluster AS cluster, s.namespace AS namespace, s.team AS team, s.project AS project, "
            f"""s.pod AS pod,
       s.pod_uid AS pod_uid,
       sum(s.requested_gpu_s) / 3600 AS requested_gpu_hours, sum(s.usage_gpu_s) / 3600 AS usage_gpu_hours,
       sum(s.requested_gpu_s * coalesce(p.usd_per_gpu_hour, 0)) / 3600 AS request_based_cost_usd,
       sum(s.usage_gpu_s * coalesce(p.usd_per_gpu_hour, 0)) / 3600 AS usage_based_cost_usd
FROM {shared} AS s
LEFT JOIN {PRICE} AS p ON p.gpu_model = s.gpu_model
GROUP BY cluster, namespace, team, project, pod, pod_uid""")


SHARED_GPU_COST_VIEW = f"CREATE OR REPLACE VIEW v_shared_gpu_cost AS\n{shared_gpu_cost()}"
"""Each pod's usage-based cost on shared GPUs over all its history (:func:`shared_gpu_cost`)."""


def histogram_pairs(column: str) -> str:
    """The aggregate expression of the rows' :data:`HISTOGRAM <sinks.tables.HISTOGRAM>` ``column``
    put together as one array of (bin, count) pairs sorted by bin, a bin repeated where several rows
    have it. :func:`percentile` needs no more than that: the cumulative counts cross a rank in the bin
    in which the merged histogram's cross it, and unlike ``sumMap`` no map is built per group."""
    return f"arraySort(arrayFlatten(groupArray(arrayZip(({column}).1, ({column}).2))))"


def percentile(pairs: str, count: str, peak: str, width: int, level: float) -> str:
    """The expression of the ``level`` percentile (0-1) of ``count`` values whose histogram is
    ``pairs`` (:func:`histogram_pairs`) and greatest value ``peak``, as ``quantileExact(level)``
    picks it (the value at index ``level x count`` of the sorted values, the last one at level 1):
    its bin's upper bound, or the peak where that is less. Never below the exact value, less than
    ``width`` above it; NULL when there is no value."""
    rank = f"if({level!r} < 1, toUInt64(floor({level!r} * {count})), {count} - 1)"
    bin_ = f"({pairs})[arrayFirstIndex(c -> c > {rank}, arrayCumSum(arrayMap(p -> p.2, {pairs})))].1"
    return f"if({count} = 0, NULL, least({bin_} * {width}, {peak}))"


ROLLUPS = (GPU_HOURLY, GPU_DAILY, TEAM_HOURLY, TEAM_DAILY, POD_HOURLY, POD_DAILY, PROGRESS_DAILY, POD_ACTIVE_HOURLY,
           POD_ACTIVE_DAILY, SHARED_GPU_DAILY)
SOURCES = frozenset(rollup.source for rollup in ROLLUPS) | {"pod_windows"}
"""Raw tables whose inserts feed rollups (``pod_windows`` also feeds ``rollup_hourly`` and
``rollup_daily``, migration 2): a row inserted there is counted in a rollup even if deleted later."""


def gpu_rows_since(start_param: str | None = None) -> str:
    """:meth:`Rollup.rows_since` of :data:`GPU_DAILY`: every GPU's figures over its samples at or
    after the query parameter ``start_param``."""
    return GPU_DAILY.rows_since(start_param)
