"""The sink's tables, one column spec each: every column's name, ClickHouse type, codec and the field
of the message model it is read from.

Why one spec: a column is one fact, and several pieces of the sink follow it. The columnar GPU
sample builder (:func:`sinks.rows.sample_columns`: :data:`GPU_GAUGES`), the engine's path for GPU
samples (:mod:`sinks.sample_json`: its JSON structure and its views' expressions) and the DDL of new
migrations (:meth:`Table.add_columns`, :meth:`Table.create`) derive from it;
tests/sinks/test_table_spec.py compares a migrated store with it table by table, column by column
(position, type, codec, default) and every row builder's columns with it. Applied migrations do not
derive from it: they are committed SQL (:mod:`sinks.migration_core` and its siblings), so a store
migrated long ago and a new one are the same.

Columns are listed in the table's order (a migration adds a column where the spec lists it: ``AFTER``
the column before it). Codecs, written as in DDL, are chosen per series (:mod:`sinks.migrations`).
A column's ``source`` is a path in the message the row comes from: ``a.b`` a nested field, ``a[].b``
the field of each item of a list (one row per item, or an array column), ``sum(a)`` the sum of a
map's values, ``(record partition)`` where Kafka delivered it; None: the message's field of the same
name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """A column's ClickHouse type and codec (``""``: the default compression)."""

    type: str
    codec: str = ""


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    source: str | None = None
    """The message field it is read from (see the module's docstring); None: the same-named field."""
    default: str = ""
    """The ``DEFAULT`` expression, for rows from before the column (``''`` none)."""

    @property
    def type(self) -> str:
        return self.kind.type

    @property
    def nullable(self) -> bool:
        return self.kind.type.startswith("Nullable(")

    def ddl(self) -> str:
        """The column's definition as in ``CREATE TABLE`` or ``ADD COLUMN``."""
        default = f" DEFAULT {self.default}" if self.default else ""
        codec = f" CODEC({self.kind.codec})" if self.kind.codec else ""
        return f"`{self.name}` {self.kind.type}{default}{codec}"


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"{self.name}: a column is listed twice")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def column(self, name: str) -> Column:
        return self.columns[self.names.index(name)]

    def create(self, engine: str) -> str:
        """``CREATE TABLE IF NOT EXISTS`` with every column; ``engine``: from ``ENGINE =`` on."""
        columns = ",\n    ".join(column.ddl() for column in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} (\n    {columns}\n) {engine}"

    def add_columns(self, *names: str) -> str:
        """``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` for ``names``, each where the spec lists it."""
        clauses = []
        for name in names:
            position = self.names.index(name)
            where = f" AFTER `{self.names[position - 1]}`" if position else " FIRST"
            clauses.append(f"ADD COLUMN IF NOT EXISTS {self.column(name).ddl()}{where}")
        return f"ALTER TABLE {self.name} " + ", ".join(clauses)


TS = Kind("DateTime64(3, 'UTC')", "DoubleDelta, ZSTD(1)")
"""Regularly spaced times."""
TS_PLAIN = Kind("DateTime64(3, 'UTC')", "Delta, ZSTD(1)")
TS_NULL = Kind("Nullable(DateTime64(3, 'UTC'))", "ZSTD(1)")
DATETIME = Kind("DateTime64(3, 'UTC')")
LC = Kind("LowCardinality(String)")
LC_ARRAY = Kind("Array(LowCardinality(String))")
STRING = Kind("String")
STRINGS = Kind("Array(String)")
TEXT = Kind("String", "ZSTD(1)")
TEXTS = Kind("Array(String)", "ZSTD(1)")
LONG_TEXT = Kind("String", "ZSTD(3)")
BOOL = Kind("Bool")
UINT32 = Kind("UInt32")
NULL_UINT32 = Kind("Nullable(UInt32)")
NULL_UINT64 = Kind("Nullable(UInt64)")
FLOAT64 = Kind("Float64")
NULL_FLOAT64 = Kind("Nullable(Float64)")
SECONDS = Kind("Float32", "ZSTD(1)")
NULL_SECONDS = Kind("Nullable(Float32)", "ZSTD(1)")
INDEX = Kind("UInt16", "T64, ZSTD(1)")
"""Small integers (GPU index, process count, Kafka partition)."""
SEQUENCE = Kind("UInt64", "Delta, ZSTD(1)")
"""Increasing integers (sequence numbers, Kafka offsets)."""
GAUGE = Kind("Nullable(Float32)", "Gorilla, ZSTD(1)")
BYTES_GAUGE = Kind("Nullable(UInt64)", "T64, ZSTD(1)")
CLOCK = Kind("Nullable(UInt32)", "T64, ZSTD(1)")
RATE = Kind("Nullable(Float32)", "ZSTD(1)")
"""Transfer rates: proportional to load, they compress better with ZSTD alone than with Gorilla."""
COUNTS = Kind("Map(LowCardinality(String), UInt32)")
LABELS = Kind("Map(LowCardinality(String), String)")
SUM = Kind("SimpleAggregateFunction(sum, Float64)")
COUNT = Kind("SimpleAggregateFunction(sum, UInt64)")
PEAK_BYTES = Kind("SimpleAggregateFunction(max, Nullable(UInt64))")
HISTOGRAM = Kind("SimpleAggregateFunction(sumMap, Tuple(Array(UInt16), Array(UInt64)))")
"""Counts per bin (``sumMap``: bins sorted, counts added up)."""
FIRST = Kind("SimpleAggregateFunction(min, DateTime64(3, 'UTC'))")
LAST = Kind("SimpleAggregateFunction(max, DateTime64(3, 'UTC'))")

KAFKA = (Column("kafka_partition", INDEX, "(record partition)"), Column("kafka_offset", SEQUENCE, "(record offset)"))
"""Where a row came from: columns of every table the sink writes from a topic."""

GPU_SAMPLES = Table("gpu_samples", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("ts", TS, "ts"),
    Column("node", LC, "node"),
    Column("gpu_uuid", LC, "gpus[].uuid"),
    Column("gpu_index", INDEX, "gpus[].index"),
    Column("gpu_model", LC, "gpus[].model"),
    Column("mig_parent_uuid", LC, "gpus[].mig_parent_uuid"),
    Column("mig_profile", LC, "gpus[].mig_profile"),
    Column("agent_boot_id", LC, "agent_boot_id"),
    Column("seq", SEQUENCE, "seq"),
    Column("sample_interval_s", SECONDS, "sample_interval_s"),
    Column("driver_version", LC, "driver_version"),
    Column("cuda_driver_version", LC, "cuda_driver_version"),
    Column("gpu_util_pct", GAUGE, "gpus[].gpu_util_pct"),
    Column("mem_util_pct", GAUGE, "gpus[].mem_util_pct"),
    Column("mem_used_bytes", BYTES_GAUGE, "gpus[].mem_used_bytes"),
    Column("mem_total_bytes", BYTES_GAUGE, "gpus[].mem_total_bytes"),
    Column("power_w", GAUGE, "gpus[].power_w"),
    Column("temperature_c", GAUGE, "gpus[].temperature_c"),
    Column("sm_clock_mhz", CLOCK, "gpus[].sm_clock_mhz"),
    Column("mem_clock_mhz", CLOCK, "gpus[].mem_clock_mhz"),
    Column("pcie_tx_bytes_per_s", RATE, "gpus[].pcie_tx_bytes_per_s"),
    Column("pcie_rx_bytes_per_s", RATE, "gpus[].pcie_rx_bytes_per_s"),
    Column("nvlink_tx_bytes_per_s", RATE, "gpus[].nvlink_tx_bytes_per_s"),
    Column("nvlink_rx_bytes_per_s", RATE, "gpus[].nvlink_rx_bytes_per_s"),
    Column("health", LC, "gpus[].health"),
    Column("health_reason", LC, "gpus[].health_reason"),
    Column("xids", Kind("Array(UInt32)", "ZSTD(1)"), "gpus[].xids[].xid"),
    Column("critical_xid", BOOL, "gpus[].xids[].critical"),
    Column("pod_uids", TEXTS, "gpus[].assigned_to[].pod_uid"),
    Column("pod_namespaces", LC_ARRAY, "gpus[].assigned_to[].namespace"),
    Column("pod_names", TEXTS, "gpus[].assigned_to[].pod"),
    Column("process_count", INDEX, "gpus[].processes"),
    Column("shared", BOOL, "gpus[].shared"),
    *KAFKA,
))

GPU_PROCESSES = Table("gpu_processes", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("ts", TS, "ts"),
    Column("node", LC, "node"),
    Column("gpu_uuid", LC, "gpus[].uuid"),
    Column("pid", Kind("UInt32", "T64, ZSTD(1)"), "gpus[].processes[].pid"),
    Column("process_name", LC, "gpus[].processes[].process_name"),
    Column("container_id", TEXT, "gpus[].processes[].container_id"),
    Column("container_name", LC, "gpus[].processes[].container_name"),
    Column("pod_uid", TEXT, "gpus[].processes[].pod_uid"),
    Column("pod_namespace", LC, "gpus[].processes[].pod_namespace"),
    Column("pod_name", TEXT, "gpus[].processes[].pod_name"),
    Column("mem_used_bytes", BYTES_GAUGE, "gpus[].processes[].mem_used_bytes"),
    Column("sm_util_pct", GAUGE, "gpus[].processes[].sm_util_pct"),
    *KAFKA,
))

GPU_XIDS = Table("gpu_xids", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("at", TS_PLAIN, "gpus[].xids[].at"),
    Column("ts", TS_PLAIN, "ts"),
    Column("node", LC, "node"),
    Column("gpu_uuid", LC, "gpus[].uuid"),
    Column("gpu_model", LC, "gpus[].model"),
    Column("xid", UINT32, "gpus[].xids[].xid"),
    Column("critical", BOOL, "gpus[].xids[].critical"),
    Column("message", TEXT, "gpus[].xids[].message"),
    *KAFKA,
))

POD_STATES = Table("pod_states", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("uid", STRING),
    Column("namespace", LC),
    Column("name", STRING),
    Column("ts", TS_PLAIN),
    Column("node", LC),
    Column("phase", LC),
    Column("team", LC),
    Column("project", LC),
    Column("gang_id", STRING),
    Column("gpu_requests", COUNTS),
    Column("gpus_requested", UINT32, "sum(gpu_requests)"),
    Column("owner_kinds", LC_ARRAY, "owners[].kind"),
    Column("owner_names", STRINGS, "owners[].name"),
    Column("labels", LABELS),
    Column("images", STRINGS, "containers[].image"),
    Column("container_ids", STRINGS, "containers[].container_id"),
    Column("restarts", UINT32),
    Column("last_termination_reason", LC),
    Column("last_exit_code", Kind("Nullable(Int32)")),
    Column("status_reason", LC),
    Column("priority_class", LC),
    Column("conditions_json", TEXT, "conditions (JSON)"),
    Column("deleted", BOOL),
    Column("created_at", DATETIME),
    Column("scheduled_at", TS_NULL),
    Column("started_at", TS_NULL),
    Column("finished_at", TS_NULL),
    Column("deleted_at", TS_NULL),
    *KAFKA,
))

NODE_STATES = Table("node_states", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("node", STRING),
    Column("ts", TS_PLAIN),
    Column("uid", STRING),
    Column("gpu_capacity", COUNTS),
    Column("gpu_allocatable", COUNTS),
    Column("gpus_capacity", UINT32, "sum(gpu_capacity)"),
    Column("gpus_allocatable", UINT32, "sum(gpu_allocatable)"),
    Column("gpu_product", LC),
    Column("gpu_memory_bytes", NULL_UINT64),
    Column("driver_version", LC),
    Column("cuda_driver_version", LC),
    Column("mig_strategy", LC),
    Column("ready", BOOL),
    Column("unschedulable", BOOL),
    Column("taints", STRINGS, "taints[] (key=value:effect)"),
    Column("labels", LABELS),
    Column("deleted", BOOL),
    *KAFKA,
))

STATE_TOMBSTONES = Table("state_tombstones", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("topic", LC, "suffix"),
    Column("key", STRING, "key"),
    Column("at", TS_PLAIN, "at"),
    *KAFKA,
))

K8S_EVENTS = Table("k8s_events", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("uid", STRING),
    Column("ts", TS_PLAIN),
    Column("category", LC),
    Column("reason", LC),
    Column("message", LONG_TEXT),
    Column("type", LC),
    Column("count", UINT32),
    Column("involved_kind", LC),
    Column("involved_uid", STRING),
    Column("involved_namespace", LC),
    Column("involved_name", STRING),
    Column("source", LC),
    *KAFKA,
))

WORKLOAD_PROGRESS = Table("workload_progress", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("pod_uid", STRING),
    Column("namespace", LC),
    Column("pod", STRING),
    Column("ts", TS),
    Column("steps_total", Kind("Nullable(Float64)", "Delta, ZSTD(1)")),
    Column("tokens_total", Kind("Nullable(Float64)", "Delta, ZSTD(1)")),
    Column("samples_total", Kind("Nullable(Float64)", "Delta, ZSTD(1)")),
    *KAFKA,
))

POD_WINDOWS = Table("pod_windows", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("window_id", STRING),
    Column("pod_uid", STRING),
    Column("namespace", LC),
    Column("pod", STRING),
    Column("node", LC),
    Column("gpu_uuid", LC),
    Column("gpu_model", LC),
    Column("window_start", TS),
    Column("window_end", TS),
    Column("team", LC),
    Column("project", LC),
    Column("allocated_s", SECONDS),
    Column("busy_s", SECONDS),
    Column("idle_s", SECONDS),
    Column("gap_s", SECONDS),
    Column("samples", Kind("UInt32", "T64, ZSTD(1)")),
    Column("avg_sm_util_pct", GAUGE),
    Column("max_sm_util_pct", GAUGE),
    Column("avg_mem_used_bytes", Kind("Nullable(Float64)", "Gorilla, ZSTD(1)")),
    Column("max_mem_used_bytes", BYTES_GAUGE),
    Column("energy_j", Kind("Nullable(Float64)", "Gorilla, ZSTD(1)")),
    Column("share_fraction", Kind("Float32")),
    Column("share_estimated", BOOL),
    Column("cost_usd", Kind("Float64", "Gorilla, ZSTD(1)")),
    Column("steps", NULL_FLOAT64),
    Column("tokens", NULL_FLOAT64),
    *KAFKA,
    Column("alloc_reserved_bytes", NULL_UINT64),
    Column("alloc_allocated_bytes", NULL_UINT64),
    Column("max_reserved_unused_bytes", NULL_UINT64),
    Column("alloc_retries", NULL_UINT64),
    Column("alloc_ooms", NULL_UINT64),
    Column("pod_busy_s", NULL_SECONDS),
    Column("gpu_pods", Kind("Nullable(UInt16)", "ZSTD(1)")),
    Column("gpu_busy_s", NULL_SECONDS),
    Column("gpu_allocated_s", NULL_SECONDS),
))

CLUSTER_CAPACITY = Table("cluster_capacity", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("window_id", STRING),
    Column("window_start", TS),
    Column("window_end", TS),
    Column("gpus_total", UINT32),
    Column("gpus_allocated", UINT32),
    Column("gpus_busy", UINT32),
    Column("gpus_idle_allocated", UINT32),
    Column("gpus_free", UINT32),
    Column("free_gpus_by_node", COUNTS),
    Column("largest_free_block", UINT32),
    Column("stranded_gpus", UINT32),
    Column("pending_pods", UINT32),
    Column("pending_gpu_demand", UINT32),
    Column("gpu_s_total", NULL_FLOAT64),
    Column("gpu_s_allocated", NULL_FLOAT64),
    Column("gpu_s_busy", NULL_FLOAT64),
    Column("gpu_s_idle_allocated", NULL_FLOAT64),
    Column("gpu_s_free", NULL_FLOAT64),
    Column("stranded_gpus_max", NULL_UINT32),
    *KAFKA,
    Column("mig_gpus", NULL_UINT32),
    Column("mig_free_compute_slices", NULL_UINT32),
    Column("mig_free_memory_slices", NULL_UINT32),
    Column("mig_free_instances_by_profile", COUNTS),
    Column("mig_relayout_capacity_by_profile", COUNTS),
    Column("mig_pending_by_profile", COUNTS),
    Column("shared_gpus", NULL_UINT32),
    Column("shared_vram_free_bytes", NULL_UINT64),
    Column("shared_vram_largest_free_bytes", NULL_UINT64),
    Column("shared_vram_stranded_bytes", NULL_UINT64),
    Column("shared_vram_pending_bytes", NULL_UINT64),
))

MIG_GPU_WINDOWS = Table("mig_gpu_windows", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("window_id", STRING),
    Column("window_start", TS),
    Column("window_end", TS),
    Column("node", LC, "mig_layouts[].node"),
    Column("gpu_index", Kind("UInt16"), "mig_layouts[].gpu_index"),
    Column("gpu_uuid", STRING, "mig_layouts[].gpu_uuid"),
    Column("profile_table", LC, "mig_layouts[].profile_table"),
    Column("instance_profiles", LC_ARRAY, "mig_layouts[].instances[].profile"),
    Column("instance_starts", Kind("Array(UInt8)"), "mig_layouts[].instances[].start"),
    Column("instance_used", Kind("Array(UInt8)"), "mig_layouts[].instances[].used"),
    Column("instance_idle_s", Kind("Array(Nullable(Float64))"), "mig_layouts[].instances[].idle_s"),
    Column("free_compute_slices", Kind("UInt8"), "mig_layouts[].free_compute_slices"),
    Column("free_memory_slices", Kind("UInt8"), "mig_layouts[].free_memory_slices"),
    Column("largest_creatable_profile", Kind("Nullable(String)"), "mig_layouts[].largest_creatable_profile"),
    Column("largest_after_relayout", Kind("Nullable(String)"), "mig_layouts[].largest_after_relayout"),
    *KAFKA,
))

SHARED_GPU_WINDOWS = Table("shared_gpu_windows", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("window_id", STRING),
    Column("window_start", TS),
    Column("window_end", TS),
    Column("node", LC, "shared_gpu_layouts[].node"),
    Column("gpu_index", Kind("UInt16"), "shared_gpu_layouts[].gpu_index"),
    Column("gpu_uuid", STRING, "shared_gpu_layouts[].gpu_uuid"),
    Column("mem_total_bytes", Kind("UInt64"), "shared_gpu_layouts[].mem_total_bytes"),
    Column("mem_used_bytes", NULL_UINT64, "shared_gpu_layouts[].mem_used_bytes"),
    Column("free_bytes", Kind("UInt64"), "shared_gpu_layouts[].free_bytes"),
    Column("pod_namespaces", LC_ARRAY, "shared_gpu_layouts[].pods[].namespace"),
    Column("pod_names", STRINGS, "shared_gpu_layouts[].pods[].name"),
    Column("pod_mem_bytes", Kind("Array(Nullable(UInt64))"), "shared_gpu_layouts[].pods[].mem_bytes"),
    Column("pod_peak_bytes", Kind("Array(Nullable(UInt64))"), "shared_gpu_layouts[].pods[].peak_bytes"),
    *KAFKA,
))

POD_LIFECYCLE = Table("pod_lifecycle", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("pod_uid", STRING),
    Column("namespace", LC),
    Column("name", STRING),
    Column("team", LC),
    Column("project", LC),
    Column("node", LC),
    Column("gpus", UINT32),
    Column("gpu_model", LC),
    Column("created_at", DATETIME),
    Column("scheduled_at", TS_NULL),
    Column("started_at", TS_NULL),
    Column("finished_at", TS_NULL),
    Column("pending_reasons", STRINGS),
    Column("pending_s", FLOAT64),
    Column("running_s", FLOAT64),
    Column("gpu_hours", FLOAT64),
    Column("idle_gpu_hours", FLOAT64),
    Column("peak_mem_bytes", NULL_UINT64),
    Column("avg_sm_util_pct", Kind("Nullable(Float32)")),
    Column("cost_usd", FLOAT64),
    Column("end_reason", LC),
    Column("steps", NULL_FLOAT64),
    Column("cost_per_step_usd", NULL_FLOAT64),
    *KAFKA,
    Column("max_reserved_unused_bytes", NULL_UINT64),
    Column("alloc_retries", NULL_UINT64),
    Column("alloc_ooms", NULL_UINT64),
))

ALERTS = Table("alerts", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("id", STRING),
    Column("type", LC),
    Column("severity", LC),
    Column("state", LC),
    Column("at", TS_PLAIN),
    Column("started_at", DATETIME),
    Column("subject_kind", LC, "subject.kind"),
    Column("subject_namespace", LC, "subject.namespace"),
    Column("subject_name", STRING, "subject.name"),
    Column("subject_node", LC, "subject.node"),
    Column("subject_gpu_uuid", LC, "subject.gpu_uuid"),
    Column("summary", LONG_TEXT),
    Column("details_json", LONG_TEXT, "details (JSON)"),
    *KAFKA,
))

ROLLUP_HOURLY = Table("rollup_hourly", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("hour", Kind("DateTime('UTC')")),
    Column("namespace", LC),
    Column("team", LC),
    Column("project", LC),
    Column("node", LC),
    Column("gpu_model", LC),
    Column("allocated_gpu_hours", SUM),
    Column("busy_gpu_hours", SUM),
    Column("idle_gpu_hours", SUM),
    Column("gap_gpu_hours", SUM),
    Column("util_pct_x_hours", SUM),
    Column("util_hours", SUM),
    Column("peak_mem_bytes", Kind("SimpleAggregateFunction(max, UInt64)")),
    Column("energy_kwh", SUM),
    Column("cost_usd", SUM),
    Column("windows", Kind("SimpleAggregateFunction(sum, UInt64)")),
))

ROLLUP_DAILY = Table("rollup_daily", (
    Column("cluster", LC, "cluster", default="'default'"),
    Column("day", Kind("Date")),
    Column("namespace", LC),
    Column("team", LC),
    Column("project", LC),
    Column("node", LC),
    Column("gpu_model", LC),
    Column("allocated_gpu_hours", SUM),
    Column("busy_gpu_hours", SUM),
    Column("idle_gpu_hours", SUM),
    Column("gap_gpu_hours", SUM),
    Column("util_pct_x_hours", SUM),
    Column("util_hours", SUM),
    Column("peak_mem_bytes", Kind("SimpleAggregateFunction(max, UInt64)")),
    Column("energy_kwh", SUM),
    Column("cost_usd", SUM),
    Column("windows", Kind("SimpleAggregateFunction(sum, UInt64)")),
))

def _gpu_rollup(name: str, period: Column) -> Table:
    """GPU samples per GPU, per hour or per day (:mod:`sinks.rollups`: what each measure is, and why)."""
    return Table(name, (
        Column("cluster", LC),
        period,
        Column("node", LC),
        Column("gpu_uuid", LC),
        Column("gpu_index", Kind("UInt16")),
        Column("gpu_model", LC),
        Column("mig_parent_uuid", LC),
        Column("samples", COUNT),
        Column("allocated_samples", COUNT),
        Column("sampled_s", SUM),
        Column("unallocated_s", SUM),
        Column("allocated_idle_s", SUM),
        Column("mem_total_bytes", PEAK_BYTES),
        Column("interval_s", Kind("SimpleAggregateFunction(any, Float32)")),
        Column("first_ts", FIRST),
        Column("last_ts", LAST),
    ))


GPU_HOURLY_TABLE = _gpu_rollup("gpu_hourly", Column("hour", Kind("DateTime('UTC')")))
GPU_DAILY_TABLE = _gpu_rollup("gpu_daily", Column("day", Kind("Date")))


def _team_rollup(name: str, period: Column) -> Table:
    """Pod windows per namespace, team, project, GPU model and idle class, per hour or per day."""
    sums = ("allocated_gpu_s", "busy_gpu_s", "idle_gpu_s", "gap_gpu_s", "util_pct_x_gpu_s", "util_gpu_s",
            "energy_total_j", "cost_total_usd")
    return Table(name, (
        Column("cluster", LC),
        period,
        *(Column(key, LC) for key in ("namespace", "team", "project", "gpu_model", "idle_class")),
        Column("windows", COUNT),
        Column("pods", Kind("AggregateFunction(uniqExact, String)")),
        Column("idle_pods", Kind("AggregateFunction(uniqExactIf, String, UInt8)")),
        *(Column(measure, SUM) for measure in sums[:6]),
        Column("peak_mem_bytes", PEAK_BYTES),
        *(Column(measure, SUM) for measure in sums[6:]),
        Column("idle_cost_usd", Kind("SimpleAggregateFunction(sum, Nullable(Float64))")),
        Column("first_start", FIRST),
        Column("last_end", LAST),
    ))


TEAM_HOURLY_TABLE = _team_rollup("team_hourly", Column("hour", Kind("DateTime('UTC')")))
TEAM_DAILY_TABLE = _team_rollup("team_daily", Column("day", Kind("Date")))


def _pod_rollup(name: str, period: Column) -> Table:
    """Pod windows per pod and GPU (with the pod's names and labels, the node and the GPU model), per
    hour or per day."""
    sums = ("allocated_gpu_s", "busy_gpu_s", "idle_gpu_s", "gap_gpu_s", "held_gpu_s", "util_pct_x_gpu_s",
            "util_gpu_s", "mem_gpu_s")
    optional_sum = Kind("SimpleAggregateFunction(sum, Nullable(Float64))")
    optional_count = Kind("SimpleAggregateFunction(sum, Nullable(UInt64))")
    last_bytes = Kind("AggregateFunction(argMax, Nullable(UInt64), DateTime64(3, 'UTC'))")
    return Table(name, (
        Column("cluster", LC),
        period,
        Column("pod_uid", STRING),
        Column("gpu_uuid", LC),
        Column("namespace", LC),
        Column("pod", STRING),
        *(Column(key, LC) for key in ("team", "project", "node", "gpu_model")),
        Column("windows", COUNT),
        Column("busy_windows", COUNT),
        *(Column(measure, SUM) for measure in sums),
        Column("peak_mem_bytes", PEAK_BYTES),
        Column("peak_sm_pct", Kind("SimpleAggregateFunction(max, Nullable(Float32))")),
        Column("energy_total_j", SUM),
        Column("cost_total_usd", SUM),
        Column("idle_cost_usd", optional_sum),
        Column("window_steps", optional_sum),
        Column("window_tokens", optional_sum),
        Column("share_max", Kind("SimpleAggregateFunction(max, Float32)")),
        Column("peak_reserved_unused_bytes", PEAK_BYTES),
        Column("alloc_retries_total", optional_count),
        Column("alloc_ooms_total", optional_count),
        Column("last_reserved_bytes", last_bytes),
        Column("last_allocated_bytes", last_bytes),
        Column("first_start", FIRST),
        Column("last_end", LAST),
        Column("last_busy_end", Kind("SimpleAggregateFunction(max, Nullable(DateTime64(3, 'UTC')))")),
    ))


POD_HOURLY_TABLE = _pod_rollup("pod_hourly", Column("hour", Kind("DateTime('UTC')")))
POD_DAILY_TABLE = _pod_rollup("pod_daily", Column("day", Kind("Date")))

PROGRESS_DAILY_TABLE = Table("progress_daily", (
    Column("cluster", LC),
    Column("day", Kind("Date")),
    Column("pod_uid", STRING),
    *(Column(f"{total}_{bound}", Kind(f"SimpleAggregateFunction({bound}, Nullable(Float64))"))
      for total in ("steps", "tokens", "samples") for bound in ("min", "max")),
))
"""Workload progress per pod and day: the least and the greatest of each total it reported."""

GPU_TENANCY_DAILY_TABLE = Table("gpu_tenancy_daily", (
    Column("cluster", LC),
    Column("day", Kind("Date")),
    Column("gpu_uuid", LC),
    Column("namespace", LC),
    Column("pod_uid", STRING),
    Column("first_start", FIRST),
    Column("last_start", LAST),
    Column("share_min", Kind("SimpleAggregateFunction(min, Float32)")),
))
"""Each pod's windows per GPU and day: the first and the last window's start, the least share.
Migration 16's table (which GPU-windows its ``v_shared_gpu_cost`` read), dropped by migration 17:
its spec stays for migration 16's statements, and it is in no store's :data:`TABLES`."""

def _pod_active_rollup(name: str, period: Column) -> Table:
    """A pod's active windows (any GPU of the pod busy) per GPU, per hour or per day: their count and
    seconds, the peak and a histogram of their SM and VRAM peaks (:data:`sinks.rollups.POD_ACTIVE_HOURLY`)."""
    return Table(name, (
        Column("cluster", LC),
        period,
        Column("pod_uid", STRING),
        Column("gpu_uuid", LC),
        Column("team", LC),
        Column("active_windows", COUNT),
        Column("active_gpu_s", SUM),
        Column("sm_windows", COUNT),
        Column("active_peak_sm_pct", Kind("SimpleAggregateFunction(max, Nullable(Float32))")),
        Column("active_peak_mem_bytes", Kind("SimpleAggregateFunction(max, UInt64)")),
        Column("sm_bins", HISTOGRAM),
        Column("mem_bins", HISTOGRAM),
    ))


POD_ACTIVE_HOURLY_TABLE = _pod_active_rollup("pod_active_hourly", Column("hour", Kind("DateTime('UTC')")))
POD_ACTIVE_DAILY_TABLE = _pod_active_rollup("pod_active_daily", Column("day", Kind("Date")))

SHARED_GPU_DAILY_TABLE = Table("shared_gpu_daily", (
    Column("cluster", LC),
    Column("day", Kind("Date")),
    *(Column(key, LC) for key in ("namespace", "team", "project")),
    Column("pod", STRING),
    Column("pod_uid", STRING),
    Column("gpu_model", LC),
    Column("windows", COUNT),
    Column("requested_gpu_s", SUM),
    Column("usage_gpu_s", SUM),
))
"""A pod's windows on a shared GPU (another pod in the same GPU-window, or a share under 1) per day:
the GPU-seconds it requested and those its busy share used (``v_shared_gpu_cost``)."""

GPU_PRICES = Table("gpu_prices", (
    Column("gpu_model", STRING),
    Column("usd_per_gpu_hour", FLOAT64),
    Column("updated_at", DATETIME),
))

SINK_BATCHES = Table("sink_batches", (
    Column("topic", LC),
    Column("partition", Kind("UInt16")),
    Column("first_offset", Kind("UInt64")),
    Column("last_offset", Kind("UInt64")),
    Column("planned_at", TS_PLAIN),
    Column("batch_group", STRING, default="''"),
))

SCHEMA_MIGRATIONS = Table("schema_migrations", (
    Column("version", UINT32),
    Column("name", STRING),
    Column("applied_at", DATETIME),
))

SCHEMA_MIGRATION_CLAIMS = Table("schema_migration_claims", (
    Column("claimant", STRING),
    Column("claimed_at", DATETIME),
    Column("expires_at", DATETIME),
))
"""Starting sinks' claims to run the missing migrations, one at a time (:mod:`sinks.migration_lock`)."""

TABLES: dict[str, Table] = {table.name: table for table in (
    GPU_SAMPLES, GPU_PROCESSES, GPU_XIDS, POD_STATES, NODE_STATES, STATE_TOMBSTONES, K8S_EVENTS, WORKLOAD_PROGRESS,
    POD_WINDOWS, CLUSTER_CAPACITY, MIG_GPU_WINDOWS, SHARED_GPU_WINDOWS, POD_LIFECYCLE, ALERTS, ROLLUP_HOURLY,
    ROLLUP_DAILY, GPU_HOURLY_TABLE, GPU_DAILY_TABLE, TEAM_HOURLY_TABLE, TEAM_DAILY_TABLE, POD_HOURLY_TABLE,
    POD_DAILY_TABLE, PROGRESS_DAILY_TABLE, POD_ACTIVE_HOURLY_TABLE, POD_ACTIVE_DAILY_TABLE, SHARED_GPU_DAILY_TABLE,
    GPU_PRICES, SINK_BATCHES, SCHEMA_MIGRATIONS, SCHEMA_MIGRATION_CLAIMS,
)}
"""Every table of the store (not views, nor the engine path's ``gpu_samples_json``: :mod:`sinks.sample_json`)."""

GPU_GAUGES: tuple[Column, ...] = tuple(
    column for column in GPU_SAMPLES.columns if column.nullable and column.source == f"gpus[].{column.name}")
"""The GPU's gauges: the Nullable ``gpu_samples`` columns read from the same-named field of each GPU
(``schemas.messages.GpuReading``), NULL when the GPU did not report them."""
