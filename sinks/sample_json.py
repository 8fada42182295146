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
  (a check view cost about a tenth of the sink's time, migration 11 dropped it);
- every object of a record is read as a named tuple, which refuses a duplicate key (a top-level
  row would keep the first of two where validation keeps the last); a line the engine cannot read
  fails the insert while the block is parsed, before either view writes a row, and the caller
  writes the batch through the row path, whose verdict stands.

The views' expressions mirror ``sample_columns`` column by column (defaults of omitted fields
included); tests store the same records both ways and compare every column.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.messages import DEFAULT_CLUSTER
from sinks.clickhouse import datetime_ticks
from sinks.rows import GPU_GAUGES

TABLE = "gpu_samples_json"

_FLOATS = ("gpu_util_pct", "mem_util_pct", "power_w", "temperature_c", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
           "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")
_UINT64S = ("mem_used_bytes", "mem_total_bytes")
_UINT32S = ("sm_clock_mhz", "mem_clock_mhz")
_PROCESS_STRINGS = ("process_name", "container_id", "container_name", "pod_uid", "pod_namespace", "pod_name")


def _gpu_structure() -> str:
    gauges = ", ".join(
        f"{name} Nullable({'Float64' if name in _FLOATS else 'UInt64'})" for name in GPU_GAUGES)
    process = ", ".join(["pid UInt32", *(f"{name} Nullable(String)" for name in _PROCESS_STRINGS),
                         "mem_used_bytes Nullable(UInt64)", "sm_util_pct Nullable(Float64)"])
    return (f"Tuple(uuid String, index Int64, model String, mig_parent_uuid Nullable(String), "
            f"mig_profile Nullable(String), {gauges}, health Nullable(String), health_reason Nullable(String), "
            f"assigned_to Array(Tuple(namespace String, pod String, pod_uid Nullable(String))), "
            f"processes Array(Tuple({process})), shared Nullable(Bool))")


STRUCTURE = (
    "p UInt16, o UInt64, t Int64, "
    "s Tuple(cluster Nullable(String), node String, agent_boot_id String, seq UInt64, sample_interval_s Float64, "
    f"driver_version Nullable(String), cuda_driver_version Nullable(String), gpus Array({_gpu_structure()}))"
)
"""What one line of ``gpu_samples_json`` holds: the record's partition, offset, time in ms and the sample."""


def _gauge(name: str) -> str:
    if name in _FLOATS:
        return f"toFloat32(g.{name})"
    if name in _UINT32S:
        return f"toUInt32(g.{name})"
    return f"g.{name}"


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
    **{name: _gauge(name) for name in GPU_GAUGES},
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


def _view(name: str, target: str, columns: Mapping[str, str], joins: str) -> str:
    exprs = ",\n       ".join(f"{expr} AS {column}" for column, expr in columns.items())
    return (f"CREATE MATERIALIZED VIEW IF NOT EXISTS {name} TO {target} ({', '.join(columns)}) AS\n"
            f"SELECT {exprs}\nFROM {TABLE} {joins}")


def ddl() -> list[str]:
    """The Null table and the two views that unpack its lines (migration 10 on a new store)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {TABLE} ({STRUCTURE}) ENGINE = Null",
        _view(f"{TABLE}_to_samples", "gpu_samples", SAMPLE_COLUMNS, "ARRAY JOIN s.gpus AS g"),
        _view(f"{TABLE}_to_processes", "gpu_processes", PROCESS_COLUMNS,
              "ARRAY JOIN s.gpus AS g ARRAY JOIN g.processes AS q"),
    ]


def ddl_without_the_check() -> list[str]:
    """Migration 11: the lines go straight to the views that unpack them; the check view that passed
    them on and its table are dropped, now that the schemas bound what a column cannot hold.

    The new views are created before the old path is dropped, so a sink that inserts during the
    migration loses no line: a block may be unpacked by both paths for that moment, and its second
    copy of each row is one row under ``FINAL`` and after merges (one row per fact).
    """
    return [
        *ddl(),
        f"DROP VIEW IF EXISTS {TABLE}_check",
        f"DROP VIEW IF EXISTS {TABLE}_samples",
        f"DROP VIEW IF EXISTS {TABLE}_processes",
        f"DROP TABLE IF EXISTS {TABLE}_checked",
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
