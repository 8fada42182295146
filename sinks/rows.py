"""Topic messages -> ClickHouse rows, column-oriented, as plain deterministic Python.

The same Kafka records always give the same rows in the same order: that is what lets a batch
retried after a crash or an outage carry the same deduplication token and be dropped by the
engine. Values the source did not provide stay ``None`` (Nullable columns), never a made-up zero;
optional names become ``''`` in LowCardinality columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any

import orjson

from schemas.messages import DEFAULT_CLUSTER, GpuSample, K8sEvent, Message, NodeState, PodState, WorkloadProgress
from schemas.outputs import Alert, ClusterCapacity, PodLifecycle, PodWindow
from schemas.topics import (
    ALERTS,
    ALL_TOPICS,
    CLUSTER_CAPACITY,
    DEADLETTER,
    GPU_SAMPLES,
    K8S_EVENTS,
    K8S_NODES,
    K8S_PODS,
    K8S_WORKLOADS,
    POD_LIFECYCLE,
    POD_WINDOWS,
    WORKLOAD_ALLOCATOR,
    WORKLOAD_PROGRESS,
    TopicSpec,
)
from sinks import tables

SINK_TOPICS: tuple[TopicSpec, ...] = tuple(spec for spec in ALL_TOPICS
                                           if spec not in (DEADLETTER, K8S_WORKLOADS, WORKLOAD_ALLOCATOR))
"""The topics the sink stores: every topic except the dead-letter topic it writes to and, for now,
Kueue workload states (their demand reaches ClickHouse through ``cluster_capacity``)."""

TABLES_BY_TOPIC: dict[str, tuple[str, ...]] = {
    GPU_SAMPLES.suffix: ("gpu_samples", "gpu_processes", "gpu_xids"),
    K8S_PODS.suffix: ("pod_states", "state_tombstones"),
    K8S_NODES.suffix: ("node_states", "state_tombstones"),
    K8S_EVENTS.suffix: ("k8s_events",),
    WORKLOAD_PROGRESS.suffix: ("workload_progress",),
    POD_WINDOWS.suffix: ("pod_windows",),
    CLUSTER_CAPACITY.suffix: ("cluster_capacity", "mig_gpu_windows", "shared_gpu_windows"),
    POD_LIFECYCLE.suffix: ("pod_lifecycle",),
    ALERTS.suffix: ("alerts",),
}

Row = dict[str, Any]
Columns = dict[str, list[Any]]
"""Rows as columns: one list of values per column name."""
SampleItem = tuple[Row, int, int]
"""A GPU sample as plain data (:func:`schemas.codec.decode_plain`) with its partition and offset."""


@dataclass
class TableColumns:
    """Rows of one table held as columns (one list per column, in the builders' column order).

    Columnar builders (:func:`sample_columns`) hand over whole columns; row builders append one row
    dict at a time, whose keys must follow the table's column order.
    """

    names: tuple[str, ...] = ()
    data: list[list[Any]] = field(default_factory=list)

    def append(self, row: Row) -> None:
        if not self.names:
            self.names = tuple(row)
            self.data = [[] for _ in self.names]
        elif tuple(row) != self.names:
            raise ValueError(f"row columns {tuple(row)} differ from the table's {self.names}")
        for column, value in zip(self.data, row.values(), strict=True):
            column.append(value)

    @classmethod
    def of(cls, columns: dict[str, list[Any]]) -> TableColumns:
        return cls(tuple(columns), list(columns.values()))

    def extend(self, columns: dict[str, list[Any]]) -> None:
        """Add rows given as whole columns (the same names, in the same order)."""
        if not self.names:
            self.names = tuple(columns)
            self.data = [list(values) for values in columns.values()]
            return
        if tuple(columns) != self.names:
            raise ValueError(f"columns {tuple(columns)} differ from the table's {self.names}")
        for column, values in zip(self.data, columns.values(), strict=True):
            column.extend(values)

    @property
    def n_rows(self) -> int:
        return len(self.data[0]) if self.data else 0

    @property
    def columns(self) -> dict[str, list[Any]]:
        if not self.n_rows:
            return {}
        return dict(zip(self.names, self.data, strict=True))

    def column(self, name: str) -> list[Any]:
        return self.data[self.names.index(name)]

    def rows(self) -> Iterator[Row]:
        for values in zip(*self.data, strict=True):
            yield dict(zip(self.names, values, strict=True))

    def keep(self, indices: list[int]) -> None:
        """Keep only the rows at ``indices`` (in that order)."""
        self.data = [[column[i] for i in indices] for column in self.data]


def _s(value: str | None) -> str:
    return value or ""


def _repeat(values: Sequence[Any], counts: Sequence[int]) -> list[Any]:
    """Each value ``count`` times, in order (per-sample values onto per-GPU rows)."""
    return [value for value, count in zip(values, counts, strict=True) for _ in range(count)]


def _columns(getter: itemgetter[Any], dicts: Sequence[dict[str, Any]], width: int) -> list[list[Any]]:
    """The fields ``getter`` picks from every dict, as ``width`` columns."""
    if not dicts:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*map(getter, dicts), strict=True)]


_SAMPLE_FIELDS = ("ts", "node", "agent_boot_id", "seq", "sample_interval_s", "driver_version", "cuda_driver_version",
                  "cluster")
GPU_GAUGES: tuple[str, ...] = tuple(column.name for column in tables.GPU_GAUGES)
"""The GPU gauge columns of ``gpu_samples``, each the same-named field of a GPU (the column spec's)."""
_GPU_FIELDS = ("uuid", "index", "model", "mig_parent_uuid", "mig_profile", *GPU_GAUGES, "health", "health_reason",
               "xids", "assigned_to", "processes", "shared")
_PROCESS_FIELDS = tuple(column.source.removeprefix("gpus[].processes[].") for column in tables.GPU_PROCESSES.columns
                        if column.source and column.source.startswith("gpus[].processes[]."))
_sample_getter = itemgetter(*_SAMPLE_FIELDS)
_gpu_getter = itemgetter(*_GPU_FIELDS)
_process_getter = itemgetter(*_PROCESS_FIELDS)
_namespace, _pod = itemgetter("namespace"), itemgetter("pod")


def _or_empty(values: list[str | None]) -> list[str]:
    return [v or "" for v in values]


@dataclass
class _Gpus:
    """Every GPU of a batch of samples, one list per field (per-sample values repeated per GPU)."""

    sample: Columns
    """The sample's fields (:data:`_SAMPLE_FIELDS`), ``partition`` and ``offset``, one value per GPU."""
    gpu: Columns
    """The GPU's fields (:data:`_GPU_FIELDS`)."""

    @classmethod
    def of(cls, items: Sequence[SampleItem], gpus: list[Row]) -> _Gpus:
        counts = [len(sample["gpus"]) for sample, _, _ in items]
        sample = {name: _repeat(column, counts) for name, column in zip(
            _SAMPLE_FIELDS, _columns(_sample_getter, [item[0] for item in items], len(_SAMPLE_FIELDS)), strict=True)}
        sample["partition"] = _repeat([item[1] for item in items], counts)
        sample["offset"] = _repeat([item[2] for item in items], counts)
        gpu = dict(zip(_GPU_FIELDS, _columns(_gpu_getter, gpus, len(_GPU_FIELDS)), strict=True))
        return cls(sample, gpu)

    def picked(self, name: str, rows: list[int]) -> list[Any]:
        """A per-GPU column (``cluster``, ``uuid``, ...) at the GPUs ``rows`` (one value per row)."""
        column = self.sample[name] if name in self.sample else self.gpu[name]
        return [column[i] for i in rows]


def _sample_table(b: _Gpus) -> TableColumns:
    s, g = b.sample, b.gpu
    xids, assigned = g["xids"], g["assigned_to"]
    return TableColumns.of({
        "cluster": s["cluster"],
        "ts": s["ts"],
        "node": s["node"],
        "gpu_uuid": g["uuid"],
        "gpu_index": g["index"],
        "gpu_model": g["model"],
        "mig_parent_uuid": _or_empty(g["mig_parent_uuid"]),
        "mig_profile": _or_empty(g["mig_profile"]),
        "agent_boot_id": s["agent_boot_id"],
        "seq": s["seq"],
        "sample_interval_s": s["sample_interval_s"],
        "driver_version": _or_empty(s["driver_version"]),
        "cuda_driver_version": _or_empty(s["cuda_driver_version"]),
        **{name: g[name] for name in GPU_GAUGES},
        "health": g["health"],
        "health_reason": _or_empty(g["health_reason"]),
        "xids": [[x["xid"] for x in events] if events else [] for events in xids],
        "critical_xid": [any(x["critical"] for x in events) if events else False for events in xids],
        "pod_uids": [[p["pod_uid"] or "" for p in refs] if refs else [] for refs in assigned],
        "pod_namespaces": [list(map(_namespace, refs)) for refs in assigned],
        "pod_names": [list(map(_pod, refs)) for refs in assigned],
        "process_count": list(map(len, g["processes"])),
        "shared": g["shared"],
        "kafka_partition": s["partition"],
        "kafka_offset": s["offset"],
    })


def _process_table(b: _Gpus) -> TableColumns | None:
    processes = b.gpu["processes"]
    owners = [i for i, procs in enumerate(processes) if procs for _ in procs]
    if not owners:
        return None
    fields = dict(zip(_PROCESS_FIELDS, _columns(
        _process_getter, [p for procs in processes if procs for p in procs], len(_PROCESS_FIELDS)), strict=True))
    return TableColumns.of({
        "cluster": b.picked("cluster", owners),
        "ts": b.picked("ts", owners),
        "node": b.picked("node", owners),
        "gpu_uuid": b.picked("uuid", owners),
        "pid": fields["pid"],
        **{name: _or_empty(fields[name]) for name in ("process_name", "container_id", "container_name", "pod_uid",
                                                      "pod_namespace", "pod_name")},
        "mem_used_bytes": fields["mem_used_bytes"],
        "sm_util_pct": fields["sm_util_pct"],
        "kafka_partition": b.picked("partition", owners),
        "kafka_offset": b.picked("offset", owners),
    })


def _xid_table(b: _Gpus) -> TableColumns | None:
    events = [(x, i) for i, xs in enumerate(b.gpu["xids"]) if xs for x in xs]
    if not events:
        return None
    rows = [i for _, i in events]
    return TableColumns.of({
        "cluster": b.picked("cluster", rows),
        "at": [x["at"] for x, _ in events],
        "ts": b.picked("ts", rows),
        "node": b.picked("node", rows),
        "gpu_uuid": b.picked("uuid", rows),
        "gpu_model": b.picked("model", rows),
        "xid": [x["xid"] for x, _ in events],
        "critical": [x["critical"] for x, _ in events],
        "message": [x["message"] or "" for x, _ in events],
        "kafka_partition": b.picked("partition", rows),
        "kafka_offset": b.picked("offset", rows),
    })


def sample_columns(items: Sequence[SampleItem]) -> dict[str, TableColumns]:
    """The rows of many samples (plain data: :func:`schemas.codec.decode_plain`), built column by column.

    The hot path of the sink, one row per GPU and per process: every column is one pass over all
    GPUs of the batch (fields picked by ``itemgetter`` and transposed by ``zip``), not a dict per
    row; per-sample values are repeated once per GPU.
    """
    gpus = [gpu for sample, _, _ in items for gpu in sample["gpus"]]
    if not gpus:
        return {}
    batch = _Gpus.of(items, gpus)
    tables = {"gpu_samples": _sample_table(batch)}
    for name, table in (("gpu_processes", _process_table(batch)), ("gpu_xids", _xid_table(batch))):
        if table is not None:
            tables[name] = table
    return tables


def pod_rows(msg: PodState, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "pod_states", {
        "uid": msg.uid,
        "namespace": msg.namespace,
        "name": msg.name,
        "ts": msg.ts,
        "node": _s(msg.node),
        "phase": msg.phase,
        "team": _s(msg.team),
        "project": _s(msg.project),
        "gang_id": _s(msg.gang_id),
        "gpu_requests": dict(msg.gpu_requests),
        "gpus_requested": sum(msg.gpu_requests.values()),
        "owner_kinds": [o.kind for o in msg.owners],
        "owner_names": [o.name for o in msg.owners],
        "labels": dict(msg.labels),
        "images": [_s(c.image) for c in msg.containers],
        "container_ids": [_s(c.container_id) for c in msg.containers],
        "restarts": msg.restarts,
        "last_termination_reason": _s(msg.last_termination_reason),
        "last_exit_code": msg.last_exit_code,
        "status_reason": _s(msg.status_reason),
        "priority_class": _s(msg.priority_class),
        "conditions_json": orjson.dumps([c.model_dump(mode="json") for c in msg.conditions]).decode(),
        "deleted": msg.deleted,
        "created_at": msg.created_at,
        "scheduled_at": msg.scheduled_at,
        "started_at": msg.started_at,
        "finished_at": msg.finished_at,
        "deleted_at": msg.deleted_at,
        "kafka_partition": partition, "kafka_offset": offset,
    }


def node_rows(msg: NodeState, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "node_states", {
        "node": msg.node,
        "ts": msg.ts,
        "uid": _s(msg.uid),
        "gpu_capacity": dict(msg.gpu_capacity),
        "gpu_allocatable": dict(msg.gpu_allocatable),
        "gpus_capacity": sum(msg.gpu_capacity.values()),
        "gpus_allocatable": sum(msg.gpu_allocatable.values()),
        "gpu_product": _s(msg.gpu_product),
        "gpu_memory_bytes": msg.gpu_memory_bytes,
        "driver_version": _s(msg.driver_version),
        "cuda_driver_version": _s(msg.cuda_driver_version),
        "mig_strategy": _s(msg.mig_strategy),
        "ready": msg.ready,
        "unschedulable": msg.unschedulable,
        "taints": [f"{t.key}={t.value or ''}:{t.effect}" for t in msg.taints],
        "labels": dict(msg.labels),
        "deleted": msg.deleted,
        "kafka_partition": partition, "kafka_offset": offset,
    }


def event_rows(msg: K8sEvent, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "k8s_events", {
        "uid": msg.uid,
        "ts": msg.ts,
        "category": msg.category,
        "reason": msg.reason,
        "message": msg.message,
        "type": msg.type,
        "count": msg.count,
        "involved_kind": msg.involved_kind,
        "involved_uid": _s(msg.involved_uid),
        "involved_namespace": _s(msg.involved_namespace),
        "involved_name": msg.involved_name,
        "source": _s(msg.source),
        "kafka_partition": partition, "kafka_offset": offset,
    }


def progress_rows(msg: WorkloadProgress, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "workload_progress", {
        "pod_uid": msg.pod_uid,
        "namespace": msg.namespace,
        "pod": msg.pod,
        "ts": msg.ts,
        "steps_total": msg.steps_total,
        "tokens_total": msg.tokens_total,
        "samples_total": msg.samples_total,
        "kafka_partition": partition, "kafka_offset": offset,
    }


def window_rows(msg: PodWindow, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "pod_windows", {
        "window_id": msg.window_id,
        "pod_uid": msg.pod_uid,
        "namespace": msg.namespace,
        "pod": msg.pod,
        "node": msg.node,
        "gpu_uuid": msg.gpu_uuid,
        "gpu_model": msg.gpu_model,
        "window_start": msg.window_start,
        "window_end": msg.window_end,
        "team": _s(msg.team),
        "project": _s(msg.project),
        "allocated_s": msg.allocated_s,
        "busy_s": msg.busy_s,
        "idle_s": msg.idle_s,
        "gap_s": msg.gap_s,
        "samples": msg.samples,
        "avg_sm_util_pct": msg.avg_sm_util_pct,
        "max_sm_util_pct": msg.max_sm_util_pct,
        "avg_mem_used_bytes": msg.avg_mem_used_bytes,
        "max_mem_used_bytes": msg.max_mem_used_bytes,
        "energy_j": msg.energy_j,
        "share_fraction": msg.share_fraction,
        "share_estimated": msg.share_estimated,
        "cost_usd": msg.cost_usd,
        "steps": msg.steps,
        "tokens": msg.tokens,
        "alloc_reserved_bytes": msg.alloc_reserved_bytes,
        "alloc_allocated_bytes": msg.alloc_allocated_bytes,
        "max_reserved_unused_bytes": msg.max_reserved_unused_bytes,
        "alloc_retries": msg.alloc_retries,
        "alloc_ooms": msg.alloc_ooms,
        "pod_busy_s": msg.pod_busy_s,
        "gpu_pods": msg.gpu_pods,
        "gpu_busy_s": msg.gpu_busy_s,
        "gpu_allocated_s": msg.gpu_allocated_s,
        "kafka_partition": partition, "kafka_offset": offset,
    }


def capacity_rows(msg: ClusterCapacity, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "cluster_capacity", {
        "window_id": msg.window_id,
        "window_start": msg.window_start,
        "window_end": msg.window_end,
        "gpus_total": msg.gpus_total,
        "gpus_allocated": msg.gpus_allocated,
        "gpus_busy": msg.gpus_busy,
        "gpus_idle_allocated": msg.gpus_idle_allocated,
        "gpus_free": msg.gpus_free,
        "free_gpus_by_node": dict(msg.free_gpus_by_node),
        "largest_free_block": msg.largest_free_block,
        "stranded_gpus": msg.stranded_gpus,
        "pending_pods": msg.pending_pods,
        "pending_gpu_demand": msg.pending_gpu_demand,
        "gpu_s_total": msg.gpu_s_total,
        "gpu_s_allocated": msg.gpu_s_allocated,
        "gpu_s_busy": msg.gpu_s_busy,
        "gpu_s_idle_allocated": msg.gpu_s_idle_allocated,
        "gpu_s_free": msg.gpu_s_free,
        "stranded_gpus_max": msg.stranded_gpus_max,
        "mig_gpus": msg.mig_gpus,
        "mig_free_compute_slices": msg.mig_free_compute_slices,
        "mig_free_memory_slices": msg.mig_free_memory_slices,
        "mig_free_instances_by_profile": dict(msg.mig_free_instances_by_profile or {}),
        "mig_relayout_capacity_by_profile": dict(msg.mig_relayout_capacity_by_profile or {}),
        "mig_pending_by_profile": dict(msg.mig_pending_by_profile or {}),
        "shared_gpus": msg.shared_gpus,
        "shared_vram_free_bytes": msg.shared_vram_free_bytes,
        "shared_vram_largest_free_bytes": msg.shared_vram_largest_free_bytes,
        "shared_vram_stranded_bytes": msg.shared_vram_stranded_bytes,
        "shared_vram_pending_bytes": msg.shared_vram_pending_bytes,
        "kafka_partition": partition, "kafka_offset": offset,
    }
    for gpu in msg.mig_layouts or []:
        yield "mig_gpu_windows", {
            "window_id": msg.window_id, "window_start": msg.window_start, "window_end": msg.window_end,
            "node": gpu.node, "gpu_index": gpu.gpu_index, "gpu_uuid": gpu.gpu_uuid, "profile_table": gpu.profile_table,
            "instance_profiles": [i.profile for i in gpu.instances],
            "instance_starts": [i.start for i in gpu.instances],
            "instance_used": [int(i.used) for i in gpu.instances],
            "instance_idle_s": [i.idle_s for i in gpu.instances],
            "free_compute_slices": gpu.free_compute_slices, "free_memory_slices": gpu.free_memory_slices,
            "largest_creatable_profile": gpu.largest_creatable_profile,
            "largest_after_relayout": gpu.largest_after_relayout,
            "kafka_partition": partition, "kafka_offset": offset,
        }
    for shared in msg.shared_gpu_layouts or []:
        yield "shared_gpu_windows", {
            "window_id": msg.window_id, "window_start": msg.window_start, "window_end": msg.window_end,
            "node": shared.node, "gpu_index": shared.gpu_index, "gpu_uuid": shared.gpu_uuid,
            "mem_total_bytes": shared.mem_total_bytes, "mem_used_bytes": shared.mem_used_bytes,
            "free_bytes": shared.free_bytes,
            "pod_namespaces": [p.namespace for p in shared.pods], "pod_names": [p.name for p in shared.pods],
            "pod_mem_bytes": [p.mem_bytes for p in shared.pods], "pod_peak_bytes": [p.peak_bytes for p in shared.pods],
            "kafka_partition": partition, "kafka_offset": offset,
        }


def lifecycle_rows(msg: PodLifecycle, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "pod_lifecycle", {
        "pod_uid": msg.pod_uid,
        "namespace": msg.namespace,
        "name": msg.name,
        "team": _s(msg.team),
        "project": _s(msg.project),
        "node": _s(msg.node),
        "gpus": msg.gpus,
        "gpu_model": _s(msg.gpu_model),
        "created_at": msg.created_at,
        "scheduled_at": msg.scheduled_at,
        "started_at": msg.started_at,
        "finished_at": msg.finished_at,
        "pending_reasons": list(msg.pending_reasons),
        "pending_s": msg.pending_s,
        "running_s": msg.running_s,
        "gpu_hours": msg.gpu_hours,
        "idle_gpu_hours": msg.idle_gpu_hours,
        "peak_mem_bytes": msg.peak_mem_bytes,
        "avg_sm_util_pct": msg.avg_sm_util_pct,
        "cost_usd": msg.cost_usd,
        "end_reason": msg.end_reason,
        "steps": msg.steps,
        "cost_per_step_usd": msg.cost_per_step_usd,
        "max_reserved_unused_bytes": msg.max_reserved_unused_bytes,
        "alloc_retries": msg.alloc_retries,
        "alloc_ooms": msg.alloc_ooms,
        "kafka_partition": partition, "kafka_offset": offset,
    }


def alert_rows(msg: Alert, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "alerts", {
        "id": msg.id,
        "type": msg.type,
        "severity": msg.severity,
        "state": msg.state,
        "at": msg.at,
        "started_at": msg.started_at,
        "subject_kind": msg.subject.kind,
        "subject_namespace": _s(msg.subject.namespace),
        "subject_name": _s(msg.subject.name),
        "subject_node": _s(msg.subject.node),
        "subject_gpu_uuid": _s(msg.subject.gpu_uuid),
        "summary": msg.summary,
        "details_json": orjson.dumps(msg.details, default=str).decode(),
        "kafka_partition": partition, "kafka_offset": offset,
    }


@dataclass(frozen=True)
class Tombstone:
    """A record without a value on a keyed state topic: the key's state was deleted at ``at``.
    ``key`` is the uid or node name, ``cluster`` the cluster its record key was scoped to."""

    suffix: str
    key: str
    at: datetime
    cluster: str = DEFAULT_CLUSTER

    @classmethod
    def of_record_key(cls, suffix: str, record_key: str, at: datetime) -> Tombstone:
        """From a Kafka record key: ``<cluster>/<key>`` (``schemas.messages.scoped_key``) or a bare key."""
        cluster, _, key = record_key.rpartition("/")
        return cls(suffix, key, at, cluster or DEFAULT_CLUSTER)


def tombstone_rows(msg: Tombstone, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "state_tombstones", {"topic": msg.suffix, "key": msg.key, "at": msg.at,
                               "kafka_partition": partition, "kafka_offset": offset}


@dataclass(frozen=True)
class Plain:
    """A message validated into plain data (:func:`schemas.codec.decode_plain`), for a columnar builder."""

    type: type[Message]
    data: dict[str, Any]
    canonical: bool = False
    """Strictly valid (:func:`schemas.codec.decode_plain_canonical`): its bytes read the same anywhere."""
    complete: bool = True
    """False: only the fields the record has (:func:`schemas.codec.decode_canonical_sparse`), no
    defaults filled in; enough to check and count a GPU sample the engine unpacks, not to build rows."""


Decoded = Message | Tombstone | Plain
"""What one Kafka record decodes to."""

_BUILDERS: dict[type[Message | Tombstone], Any] = {
    PodState: pod_rows,
    NodeState: node_rows,
    K8sEvent: event_rows,
    WorkloadProgress: progress_rows,
    PodWindow: window_rows,
    ClusterCapacity: capacity_rows,
    PodLifecycle: lifecycle_rows,
    Alert: alert_rows,
    Tombstone: tombstone_rows,
}
"""Builders of one message's rows."""

_COLUMN_BUILDERS: dict[type[Message | Tombstone], Any] = {GpuSample: sample_columns}
"""Builders of many messages' rows at once, column by column, from plain data (many rows per message)."""

PLAIN_TYPES: frozenset[type[Message | Tombstone]] = frozenset(_COLUMN_BUILDERS)
"""Message types the sink decodes into plain data (:class:`Plain`) for their columnar builders."""


def _kind_and_data(message: Decoded) -> tuple[type[Message | Tombstone], Any]:
    if isinstance(message, Plain):
        if not message.complete:
            raise ValueError(f"a sparse {message.type.__name__} has no defaults filled in: complete it first")
        return message.type, message.data
    if type(message) in _COLUMN_BUILDERS:
        return type(message), message.model_dump()  # type: ignore[union-attr]
    return type(message), message


def rows_for(message: Decoded, partition: int, offset: int) -> list[tuple[str, Row]]:
    """Every (table, row) one decoded message becomes."""
    return [(table, row) for table, columns in tables_for([(message, partition, offset)]).items()
            for row in columns.rows()]


def tables_for(items: Sequence[tuple[Decoded, int, int]]) -> dict[str, TableColumns]:
    """The rows of many (message, partition, offset), per table, in the items' order per message type.

    The same items always give the same tables: that is what makes a retried batch the same block.
    """
    tables: dict[str, TableColumns] = {}
    by_kind: dict[type[Message | Tombstone], list[tuple[Any, int, int]]] = {}
    for message, partition, offset in items:
        kind, data = _kind_and_data(message)
        by_kind.setdefault(kind, []).append((data, partition, offset))
    for kind, group in by_kind.items():
        columnar = _COLUMN_BUILDERS.get(kind)
        if columnar is not None:
            for table, columns in columnar(group).items():
                if table in tables:
                    tables[table].extend(columns.columns)
                else:
                    tables[table] = columns
            continue
        builder = _BUILDERS.get(kind)
        if builder is None:
            raise TypeError(f"no table for {kind.__name__}")
        for data, partition, offset in group:
            for table, row in builder(data, partition, offset):
                tables.setdefault(table, TableColumns()).append({"cluster": data.cluster, **row})
    return tables
