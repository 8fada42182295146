"""Topic messages -> ClickHouse rows, column-oriented, as plain deterministic Python.

The same Kafka records always give the same rows in the same order: that is what lets a batch
retried after a crash or an outage carry the same deduplication token and be dropped by the
engine. Values the source did not provide stay ``None`` (Nullable columns), never a made-up zero;
optional names become ``''`` in LowCardinality columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from schemas.messages import (
    Alert,
    ClusterCapacity,
    GpuSample,
    K8sEvent,
    Message,
    NodeState,
    PodLifecycle,
    PodState,
    PodWindow,
    WorkloadProgress,
)
from schemas.topics import (
    ALERTS,
    ALL_TOPICS,
    CLUSTER_CAPACITY,
    DEADLETTER,
    GPU_SAMPLES,
    K8S_EVENTS,
    K8S_NODES,
    K8S_PODS,
    POD_LIFECYCLE,
    POD_WINDOWS,
    WORKLOAD_PROGRESS,
    TopicSpec,
)

SINK_TOPICS: tuple[TopicSpec, ...] = tuple(spec for spec in ALL_TOPICS if spec is not DEADLETTER)
"""The topics the sink stores (every topic except the dead-letter topic it writes to)."""

TABLES_BY_TOPIC: dict[str, tuple[str, ...]] = {
    GPU_SAMPLES.suffix: ("gpu_samples", "gpu_processes", "gpu_xids"),
    K8S_PODS.suffix: ("pod_states", "state_tombstones"),
    K8S_NODES.suffix: ("node_states", "state_tombstones"),
    K8S_EVENTS.suffix: ("k8s_events",),
    WORKLOAD_PROGRESS.suffix: ("workload_progress",),
    POD_WINDOWS.suffix: ("pod_windows",),
    CLUSTER_CAPACITY.suffix: ("cluster_capacity",),
    POD_LIFECYCLE.suffix: ("pod_lifecycle",),
    ALERTS.suffix: ("alerts",),
}

Row = dict[str, Any]


@dataclass
class TableColumns:
    """Rows of one table, kept as value tuples in one column order and pivoted to columns at the end.

    A builder's dict literal fixes the column order (dicts keep insertion order), so a row costs one
    tuple here and the pivot is one ``zip``, not a Python append per value.
    """

    names: tuple[str, ...] = ()
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def append(self, row: Row) -> None:
        if not self.names:
            self.names = tuple(row)
        elif tuple(row) != self.names:
            raise ValueError(f"row columns {tuple(row)} differ from the table's {self.names}")
        self.rows.append(tuple(row.values()))

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    @property
    def columns(self) -> dict[str, list[Any]]:
        if not self.rows:
            return {}
        return {name: list(values) for name, values in zip(self.names, zip(*self.rows, strict=True), strict=True)}

    def column(self, name: str) -> list[Any]:
        index = self.names.index(name)
        return [row[index] for row in self.rows]

    def keep(self, indices: list[int]) -> None:
        """Keep only the rows at ``indices`` (in that order)."""
        self.rows = [self.rows[i] for i in indices]


def _s(value: str | None) -> str:
    return value or ""


def sample_rows(msg: GpuSample, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    # the hot path of the sink (one row per GPU and per process): locals and inline ``or ""``
    ts, node, boot_id, seq, interval = msg.ts, msg.node, msg.agent_boot_id, msg.seq, msg.sample_interval_s
    driver, cuda = msg.driver_version or "", msg.cuda_driver_version or ""
    for gpu in msg.gpus:
        uuid, xids, assigned, processes = gpu.uuid, gpu.xids, gpu.assigned_to, gpu.processes
        yield "gpu_samples", {
            "ts": ts,
            "node": node,
            "gpu_uuid": uuid,
            "gpu_index": gpu.index,
            "gpu_model": gpu.model,
            "mig_parent_uuid": gpu.mig_parent_uuid or "",
            "mig_profile": gpu.mig_profile or "",
            "agent_boot_id": boot_id,
            "seq": seq,
            "sample_interval_s": interval,
            "driver_version": driver,
            "cuda_driver_version": cuda,
            "gpu_util_pct": gpu.gpu_util_pct,
            "mem_util_pct": gpu.mem_util_pct,
            "mem_used_bytes": gpu.mem_used_bytes,
            "mem_total_bytes": gpu.mem_total_bytes,
            "power_w": gpu.power_w,
            "temperature_c": gpu.temperature_c,
            "sm_clock_mhz": gpu.sm_clock_mhz,
            "mem_clock_mhz": gpu.mem_clock_mhz,
            "pcie_tx_bytes_per_s": gpu.pcie_tx_bytes_per_s,
            "pcie_rx_bytes_per_s": gpu.pcie_rx_bytes_per_s,
            "nvlink_tx_bytes_per_s": gpu.nvlink_tx_bytes_per_s,
            "nvlink_rx_bytes_per_s": gpu.nvlink_rx_bytes_per_s,
            "health": gpu.health,
            "health_reason": gpu.health_reason or "",
            "xids": [x.xid for x in xids],
            "critical_xid": any(x.critical for x in xids) if xids else False,
            "pod_uids": [p.pod_uid or "" for p in assigned],
            "pod_namespaces": [p.namespace for p in assigned],
            "pod_names": [p.pod for p in assigned],
            "process_count": len(processes),
            "shared": gpu.shared,
            "kafka_partition": partition, "kafka_offset": offset,
        }
        for proc in processes:
            yield "gpu_processes", {
                "ts": ts,
                "node": node,
                "gpu_uuid": uuid,
                "pid": proc.pid,
                "process_name": proc.process_name or "",
                "container_id": proc.container_id or "",
                "container_name": proc.container_name or "",
                "pod_uid": proc.pod_uid or "",
                "pod_namespace": proc.pod_namespace or "",
                "pod_name": proc.pod_name or "",
                "mem_used_bytes": proc.mem_used_bytes,
                "sm_util_pct": proc.sm_util_pct,
                "kafka_partition": partition, "kafka_offset": offset,
            }
        for xid in xids:
            yield "gpu_xids", {
                "at": xid.at,
                "ts": ts,
                "node": node,
                "gpu_uuid": uuid,
                "gpu_model": gpu.model,
                "xid": xid.xid,
                "critical": xid.critical,
                "message": _s(xid.message),
                "kafka_partition": partition, "kafka_offset": offset,
            }


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


def tombstone_rows(suffix: str, key: str, at: datetime, partition: int, offset: int) -> Iterator[tuple[str, Row]]:
    yield "state_tombstones", {"topic": suffix, "key": key, "at": at,
                               "kafka_partition": partition, "kafka_offset": offset}


_BUILDERS: dict[type[Message], Any] = {
    GpuSample: sample_rows,
    PodState: pod_rows,
    NodeState: node_rows,
    K8sEvent: event_rows,
    WorkloadProgress: progress_rows,
    PodWindow: window_rows,
    ClusterCapacity: capacity_rows,
    PodLifecycle: lifecycle_rows,
    Alert: alert_rows,
}


def rows_for(message: Message, partition: int, offset: int) -> list[tuple[str, Row]]:
    """Every (table, row) one decoded message becomes."""
    builder = _BUILDERS.get(type(message))
    if builder is None:
        raise TypeError(f"no table for {type(message).__name__}")
    return list(builder(message, partition, offset))
