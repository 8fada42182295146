"""GPU samples turned into rows by the engine: the sink's fast path for ``gpu.samples.v1``.

Why: building a batch's ``gpu_samples`` and ``gpu_processes`` rows in Python (one value per GPU
and column) and serialising them for the driver took about as much of the interpreter as
validating the records, and the interpreter is what a sink's wall clock waits on. Here the sink
validates each record as before, then hands the record's own bytes, wrapped with its source
position, to ``gpu_samples_json`` (a ``Null`` table, migration 10), whose two views unpack them
into the same rows :func:`sinks.rows.sample_columns` builds. The engine parses and pivots without the interpreter's
lock, while the sink validates the next batch.

The same rows, or none:

- only **canonical** records take this path (:func:`schemas.codec.decode_plain_canonical`: strict
  validation passed, so every value already has its JSON type and a JSON reader reads what the
  validation read; the sink validates them sparsely, :func:`schemas.codec.decode_canonical_sparse`,
  as the engine fills in the defaults itself); the sample's time comes from the validated record
  (``t``, in the column's milliseconds, floored as the driver does), not from the engine's reading
  of the text;
- records with XID events (their ``gpu_xids`` rows) take the row path;
- a value a column cannot hold (an index beyond ``UInt16``, a float beyond ``Float32``) never gets
  here: the schema bounds it (``schemas.messages.Uint16``, ``Float32``, ...), so validation refuses
  the record, as the driver's serialisation would; the views convert without a check of their own
  (a check view cost about a tenth of the sink's time);
- every object of a record is read as a named tuple, which refuses a duplicate key (a top-level
  row would keep the first of two where validation keeps the last); a line the engine cannot read
  fails the insert while the block is parsed, before either view writes a row, and the caller
  writes the batch through the row path, whose verdict stands.

The views' expressions mirror ``sample_columns`` column by column (defaults of omitted fields
included); the gauges' types and expressions follow the column spec (:data:`sinks.tables.GPU_GAUGES`).
Tests store the same records both ways and compare every column, and compare the migrated store's
table and views with :func:`ddl`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.messages import DEFAULT_CLUSTER
from sinks.clickhouse import datetime_ticks
from sinks.tables import GPU_GAUGES, GPU_PROCESSES, Column

TABLE = "gpu_samples_json"

_PROCESS_STRINGS = tuple(column.name for column in GPU_PROCESSES.columns
                         if column.source == f"gpus[].processes[].{column.name}"
                         and column.type in ("String", "LowCardinality(String)"))
"""The processes' names (NULL in the record: ``''`` in their LowCardinality or String column)."""


def _inner(column: Column) -> str:
    return column.type.removeprefix("Nullable(").removesuffix(")") if column.nullable else column.type


def _read_as(column: Column) -> str:
    """The type a gauge is read as from the record's JSON: wide, then converted to the column's by the view."""
    inner = _inner(column)
    return "Float64" if inner.startswith("Float") else "UInt64" if inner.startswith("UInt") else "Int64"


def _gpu_structure() -> str:
    gauges = ", ".join(f"{column.name} Nullable({_read_as(column)})" for column in GPU_GAUGES)
    process = ", ".join(["pid UInt32", *(f"{name} Nullable(String)" for name in _PROCESS_STRINGS),
                         "mem_used_bytes Nullable(UInt64)", "sm_util_pct Nullable(Float64)"])
    return (f"Tuple(uuid String, index Int64, model String, mig_parent_uuid Nullable(String), "
            f"mig_profile Nullable(String), {gauges}, health Nullable(String), health_reason Nullable(String), "
            f"assigned_to Array(Tuple(namespace String, pod String, pod_uid Nullable(String))), "
            f"processes Array(Tuple({process})), shared Nullable(Bool))")


SAMPLE_STRUCTURE = (
    "Tuple(cluster Nullable(String), node String, agent_boot_id String, seq UInt64, sample_interval_s Float64, "
    f"driver_version Nullable(String), cuda_driver_version Nullable(String), gpus Array({_gpu_structure()}))"
)
"""The type of a line's ``s``: the sample as the engine reads it, gauges from the column spec."""

STRUCTURE = f"p UInt16, o UInt64, t Int64, s {SAMPLE_STRUCTURE}"
"""What one line of ``gpu_samples_json`` holds: the record's partition, offset, time in ms and the sample."""


def _gauge(column: Column) -> str:
    inner = _inner(column)
    return f"g.{column.name}" if inner == _read_as(column) else f"to{inner}(g.{column.name})"


_CLUSTER = f"ifNull(s.cluster, '{DEFAULT_CLUSTER}')"
_TS = "fromUnixTimestamp64Milli(t, 'UTC')"

SAMPLE_COLUMNS: Mapping[str, str] = {
    "cluster": _CLUSTER,
    "ts": _TS,
    "node": "s.node",
    "gpu_uuid": "g.uuid",
    "gpu_index": "toUInt16(g.index)",
    "gpu_model": "g.model",
    "mig_parent_uuid": "ifNull(g.mig_parent_uuid, '')",
    "mig_profile": "ifNull(g.mig_profile, '')",
    "agent_boot_id": "s.agent_boot_id",
    "seq": "s.seq",
    "sample_interval_s": "toFloat32(s.sample_interval_s)",
    "driver_version": "ifNull(s.driver_version, '')",
    "cuda_driver_version": "ifNull(s.cuda_driver_version, '')",
    **{column.name: _gauge(column) for column in GPU_GAUGES},
    "health": "ifNull(g.health, 'ok')",
    "health_reason": "ifNull(g.health_reason, '')",
    "xids": "CAST([], 'Array(UInt32)')",
    "critical_xid": "false",
    "pod_uids": "arrayMap(r -> ifNull(r.pod_uid, ''), g.assigned_to)",
    "pod_namespaces": "arrayMap(r -> r.namespace, g.assigned_to)",
    "pod_names": "arrayMap(r -> r.pod, g.assigned_to)",
    "process_count": "toUInt16(length(g.processes))",
    "shared": "ifNull(g.shared, false)",
    "kafka_partition": "p",
    "kafka_offset": "o",
}
"""``gpu_samples`` columns from one GPU ``g`` of sample ``s`` (as :func:`sinks.rows.sample_columns`)."""

PROCESS_COLUMNS: Mapping[str, str] = {
    "cluster": _CLUSTER,
    "ts": _TS,
    "node": "s.node",
    "gpu_uuid": "g.uuid",
    "pid": "q.pid",
    **{name: f"ifNull(q.{name}, '')" for name in _PROCESS_STRINGS},
    "mem_used_bytes": "q.mem_used_bytes",
    "sm_util_pct": "toFloat32(q.sm_util_pct)",
    "kafka_partition": "p",
    "kafka_offset": "o",
}
"""``gpu_processes`` columns from one process ``q`` of GPU ``g`` of sample ``s``."""


def _select(columns: Mapping[str, str], joins: str) -> str:
    exprs = ",\n       ".join(f"{expr} AS {column}" for column, expr in columns.items())
    return f"SELECT {exprs}\nFROM {TABLE} {joins}"


_VIEWS: tuple[tuple[str, str, Mapping[str, str], str], ...] = (
    (f"{TABLE}_to_samples", "gpu_samples", SAMPLE_COLUMNS, "ARRAY JOIN s.gpus AS g"),
    (f"{TABLE}_to_processes", "gpu_processes", PROCESS_COLUMNS, "ARRAY JOIN s.gpus AS g ARRAY JOIN g.processes AS q"),
)
"""Each view: its name, the table it writes, its columns' expressions, how it unpacks a line."""


def ddl() -> list[str]:
    """The Null table and the two views that unpack its lines, as the column spec has them."""
    return [
        f"CREATE TABLE IF NOT EXISTS {TABLE} ({STRUCTURE}) ENGINE = Null",
        *(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {name} TO {target} ({', '.join(columns)}) AS\n"
          f"{_select(columns, joins)}" for name, target, columns, joins in _VIEWS),
    ]


def ddl_update() -> list[str]:
    """A new migration's statements that bring the engine path to the column spec (after the
    ``ADD COLUMN`` of the tables it writes): the lines' structure, then each view's query, changed
    in place so that a sink inserting meanwhile loses no line (a line without a new field reads
    NULL there)."""
    return [
        f"ALTER TABLE {TABLE} MODIFY COLUMN s {SAMPLE_STRUCTURE}",
        *(f"ALTER TABLE {name} MODIFY QUERY {_select(columns, joins)}" for name, _, columns, joins in _VIEWS),
    ]


def ts_millis(ts: Any) -> int:
    """A sample's time in the ``ts`` column's milliseconds, floored (the driver's conversion)."""
    return datetime_ticks(ts, 1000)


def engine_line(raw: bytes, sample: Mapping[str, Any], partition: int, offset: int) -> bytes | None:
    """The record's line for ``gpu_samples_json``, or None when it takes the row path (XID events);
    ``sample`` is the validated record, sparse or not."""
    if b'"xids"' in raw and any(gpu.get("xids") for gpu in sample.get("gpus", ())):  # the bytes first: most have none
        return None
    return b'{"p":%d,"o":%d,"t":%d,"s":%b}' % (partition, offset, ts_millis(sample["ts"]), raw)


def row_counts(sample: Mapping[str, Any]) -> tuple[int, int]:
    """The ``gpu_samples`` and ``gpu_processes`` rows the views make of one sample (sparse or not)."""
    gpus = sample.get("gpus", ())
    return len(gpus), sum(len(gpu.get("processes", ())) for gpu in gpus)
