"""Deterministic messages of every topic the sink stores, built directly from the contracts."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Literal

from schemas.messages import (
    GpuProcess,
    GpuReading,
    GpuSample,
    K8sEvent,
    NodeState,
    PodPhase,
    PodRef,
    PodState,
    WorkloadProgress,
    XidEvent,
)
from schemas.outputs import Alert, AlertSubject, AlertType, ClusterCapacity, EndReason, PodLifecycle, PodWindow
from sinks.clickhouse import ClickHouseStore
from sinks.rows import Decoded, rows_for

T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
"""Recent on purpose: raw samples older than their TTL (14 days) are dropped on insert."""
H100 = "NVIDIA H100 80GB HBM3"
GIB = 1024**3


def sample(node: str, seq: int, gpus: int = 8, interval_s: float = 10.0, busy_until: int = 4,
           util: float = 90.0, with_xid: bool = False) -> GpuSample:
    ts = T0 + timedelta(seconds=seq * interval_s)
    readings = []
    for i in range(gpus):
        assigned = i < busy_until
        readings.append(GpuReading(
            uuid=f"GPU-{node}-{i}", index=i, model=H100,
            gpu_util_pct=util if assigned else 0.0, mem_util_pct=40.0 if assigned else 0.0,
            mem_used_bytes=40 * GIB if assigned else 0, mem_total_bytes=80 * GIB,
            power_w=350.0 + (seq % 7) if assigned else 70.0, temperature_c=60.0 + (seq % 3),
            sm_clock_mhz=1980, mem_clock_mhz=2619,
            xids=[XidEvent(xid=79, at=ts, critical=True, message="fell off the bus")] if with_xid and i == 0 else [],
            assigned_to=[PodRef(namespace="research", pod=f"train-{node}", container="main",
                                pod_uid=f"uid-{node}")] if assigned else [],
            processes=[GpuProcess(pid=1000 + i, pod_uid=f"uid-{node}", pod_namespace="research",
                                  pod_name=f"train-{node}", container_name="main",
                                  mem_used_bytes=40 * GIB)] if assigned else [],
        ))
    return GpuSample(node=node, ts=ts, agent_boot_id=f"boot-{node}", seq=seq, sample_interval_s=interval_s,
                     driver_version="550.54.15", cuda_driver_version="12.4", gpus=readings)


def pod(uid: str, phase: PodPhase = "Running", minute: int = 0, team: str | None = "nlp", gpus: int = 4,
        node: str | None = "gpu-a") -> PodState:
    return PodState(uid=uid, namespace="research", name=f"pod-{uid}", ts=T0 + timedelta(minutes=minute),
                    node=node, phase=phase, gpu_requests={"nvidia.com/gpu": gpus}, team=team, project="chat",
                    labels={"team": team or ""}, created_at=T0,
                    scheduled_at=T0 if phase != "Pending" else None)


def node_state(name: str, minute: int = 0, ready: bool = True) -> NodeState:
    return NodeState(node=name, ts=T0 + timedelta(minutes=minute), gpu_capacity={"nvidia.com/gpu": 8},
                     gpu_allocatable={"nvidia.com/gpu": 8}, gpu_product=H100, ready=ready)


def event(uid: str, minute: int = 0) -> K8sEvent:
    return K8sEvent(uid=uid, ts=T0 + timedelta(minutes=minute), category="scheduling_failed",
                    reason="FailedScheduling", message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    type="Warning", involved_kind="Pod", involved_uid="uid-p", involved_namespace="research",
                    involved_name="pod-p")


def progress(pod_uid: str, minute: int, steps: float) -> WorkloadProgress:
    return WorkloadProgress(pod_uid=pod_uid, namespace="research", pod=f"pod-{pod_uid}",
                            ts=T0 + timedelta(minutes=minute), steps_total=steps, tokens_total=steps * 1000)


def window(pod_uid: str, gpu: int, minute: int, busy_s: float = 60.0, team: str | None = "nlp",
           project: str | None = "chat", cost_usd: float = 2.5 / 60, mem: int | None = 40 * GIB,
           node: str = "gpu-a", steps: float | None = None) -> PodWindow:
    start = T0 + timedelta(minutes=minute)
    return PodWindow(
        window_id=f"{pod_uid}/GPU-{node}-{gpu}/{start.isoformat()}", pod_uid=pod_uid, namespace="research",
        pod=f"pod-{pod_uid}", node=node, gpu_uuid=f"GPU-{node}-{gpu}", gpu_model=H100,
        window_start=start, window_end=start + timedelta(minutes=1), team=team, project=project,
        allocated_s=60.0, busy_s=busy_s, idle_s=60.0 - busy_s, samples=6,
        avg_sm_util_pct=90.0 if busy_s else 0.0, max_sm_util_pct=95.0 if busy_s else 0.0,
        avg_mem_used_bytes=float(mem) if mem is not None else None, max_mem_used_bytes=mem,
        energy_j=350.0 * 60, cost_usd=cost_usd, steps=steps)


def stamped(windows: Iterable[PodWindow]) -> list[PodWindow]:
    """``windows`` with the stamps a node stage gives the windows it closes together, written here
    from their definitions (schemas.outputs.PodWindow) over all of ``windows`` of each start."""
    listed = list(windows)
    pod_busy: dict[tuple[datetime, str], float] = {}
    on_gpu: dict[tuple[datetime, str], list[PodWindow]] = {}
    for w in listed:
        pod_busy[w.window_start, w.pod_uid] = max(pod_busy.get((w.window_start, w.pod_uid), 0.0), w.busy_s)
        on_gpu.setdefault((w.window_start, w.gpu_uuid), []).append(w)
    return [w.model_copy(update={
        "pod_busy_s": pod_busy[w.window_start, w.pod_uid], "gpu_pods": len(on_gpu[w.window_start, w.gpu_uuid]),
        "gpu_busy_s": sum(o.busy_s for o in on_gpu[w.window_start, w.gpu_uuid]),
        "gpu_allocated_s": max(o.allocated_s for o in on_gpu[w.window_start, w.gpu_uuid])}) for w in listed]


def capacity(minute: int, free: int = 4, stranded: int = 0) -> ClusterCapacity:
    start = T0 + timedelta(minutes=minute)
    return ClusterCapacity(window_id=f"cluster/{start.isoformat()}", window_start=start,
                           window_end=start + timedelta(minutes=1), gpus_total=16, gpus_allocated=16 - free,
                           gpus_busy=8, gpus_idle_allocated=16 - free - 8, gpus_free=free,
                           free_gpus_by_node={"gpu-a": free // 2, "gpu-b": free - free // 2},
                           largest_free_block=free - free // 2, stranded_gpus=stranded,
                           pending_pods=1 if stranded else 0, pending_gpu_demand=4 if stranded else 0)


def lifecycle(pod_uid: str, pending_s: float = 120.0, running_s: float = 1800.0, gpus: int = 4,
              end_reason: EndReason = "Succeeded", team: str = "nlp") -> PodLifecycle:
    return PodLifecycle(
        pod_uid=pod_uid, namespace="research", name=f"pod-{pod_uid}", team=team, project="chat", node="gpu-a",
        gpus=gpus, gpu_model=H100, created_at=T0, scheduled_at=T0 + timedelta(seconds=pending_s),
        started_at=T0 + timedelta(seconds=pending_s),
        finished_at=T0 + timedelta(seconds=pending_s + running_s),
        pending_reasons=["0/3 nodes are available: 3 Insufficient nvidia.com/gpu."] if pending_s else [],
        pending_s=pending_s, running_s=running_s, gpu_hours=gpus * running_s / 3600, idle_gpu_hours=0.5,
        peak_mem_bytes=40 * GIB, avg_sm_util_pct=80.0, cost_usd=gpus * running_s / 3600 * 2.5,
        end_reason=end_reason)


def alert(n: int, state: Literal["firing", "resolved"] = "firing", kind: AlertType = "idle_gpu") -> Alert:
    started = T0 + timedelta(minutes=n)
    return Alert(id=f"alert-{n}", type=kind, severity="warning", state=state,
                 at=started + (timedelta(minutes=10) if state == "resolved" else timedelta()),
                 started_at=started, subject=AlertSubject(kind="pod", namespace="research", name=f"pod-{n}",
                                                          gpu_uuid="GPU-gpu-a-0"),
                 summary=f"pod-{n} holds an idle GPU", details={"reason": "vram_held", "n": n})


def store_rows(store: ClickHouseStore, messages: Iterable[Decoded]) -> None:
    """Insert ``messages`` as the sink maps them to rows (:func:`sinks.rows.rows_for`), one insert per
    table, at offsets 0.. of partition 0."""
    columns: dict[str, dict[str, list[object]]] = {}
    for offset, message in enumerate(messages):
        for table, row in rows_for(message, 0, offset):
            for name, value in row.items():
                columns.setdefault(table, {}).setdefault(name, []).append(value)
    for table, data in columns.items():
        store.insert(table, data)
