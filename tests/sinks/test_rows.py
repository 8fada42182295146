"""Rows pivot to columns in the order the builders give them, each value under its own column."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.codec import decode_plain, encode
from schemas.messages import GpuProcess, GpuReading, GpuSample, PodRef, XidEvent
from sinks.rows import Plain, TableColumns, Tombstone, rows_for, tables_for
from tests.sinks import factories as f


def test_columns_follow_the_rows_and_a_row_in_another_column_order_is_refused() -> None:
    table = TableColumns()
    table.append({"a": 1, "b": "x"})
    table.append({"a": 2, "b": "y"})
    assert table.columns == {"a": [1, 2], "b": ["x", "y"]}
    assert table.column("b") == ["x", "y"] and table.n_rows == 2
    with pytest.raises(ValueError, match="differ"):
        table.append({"b": "z", "a": 3})
    table.keep([1])
    assert table.columns == {"a": [2], "b": ["y"]}
    assert TableColumns().columns == {}


def test_sample_rows_carry_each_gpu_and_process_value_under_its_column() -> None:
    sample = f.sample("node-a", 3, gpus=2)
    rows = rows_for(sample, 4, 9)
    gpu_rows = [row for table, row in rows if table == "gpu_samples"]
    assert [row["gpu_uuid"] for row in gpu_rows] == [gpu.uuid for gpu in sample.gpus]
    for row, gpu in zip(gpu_rows, sample.gpus, strict=True):
        assert (row["gpu_util_pct"], row["mem_used_bytes"], row["power_w"]) == (
            gpu.gpu_util_pct, gpu.mem_used_bytes, gpu.power_w)
        assert (row["seq"], row["kafka_partition"], row["kafka_offset"]) == (sample.seq, 4, 9)
    procs = [row for table, row in rows if table == "gpu_processes"]
    assert [row["pid"] for row in procs] == [p.pid for gpu in sample.gpus for p in gpu.processes]


def _full_sample() -> GpuSample:
    """One sample whose every stored field has a value of its own (a swapped column shows)."""
    ts = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    gpu = GpuReading(
        uuid="GPU-x", index=3, model="H100", mig_parent_uuid="GPU-parent", mig_profile=None,
        gpu_util_pct=11.0, mem_util_pct=12.0, mem_used_bytes=13, mem_total_bytes=14, power_w=15.5,
        temperature_c=16.0, sm_clock_mhz=17, mem_clock_mhz=18, pcie_tx_bytes_per_s=19.0, pcie_rx_bytes_per_s=20.0,
        nvlink_tx_bytes_per_s=21.0, nvlink_rx_bytes_per_s=None, health="degraded", health_reason="hot",
        xids=[XidEvent(xid=48, at=ts, critical=False, message=None),
              XidEvent(xid=79, at=ts, critical=True, message="fell off the bus")],
        assigned_to=[PodRef(namespace="ns-a", pod="pod-a", container="c", pod_uid="uid-a"),
                     PodRef(namespace="ns-b", pod="pod-b", container="c", pod_uid=None)],
        processes=[GpuProcess(pid=101, pod_uid="uid-a", mem_used_bytes=22, sm_util_pct=23.0, process_name="python"),
                   GpuProcess(pid=102, container_id="cid", container_name="main", pod_namespace="ns-b",
                              pod_name="pod-b")],
        shared=True,
    )
    return GpuSample(cluster="prod-eu", node="node-x", ts=ts, agent_boot_id="boot-x", seq=42, sample_interval_s=5.0,
                     driver_version="550", cuda_driver_version=None, gpus=[gpu, GpuReading(uuid="GPU-y", index=4,
                                                                                            model="H100")])


def test_every_sample_column_holds_its_own_field() -> None:
    sample = _full_sample()
    rows = rows_for(sample, 2, 77)
    ts = sample.ts
    busy, idle = (row for table, row in rows if table == "gpu_samples")
    assert busy == {
        "cluster": "prod-eu", "ts": ts, "node": "node-x", "gpu_uuid": "GPU-x", "gpu_index": 3, "gpu_model": "H100",
        "mig_parent_uuid": "GPU-parent", "mig_profile": "", "agent_boot_id": "boot-x", "seq": 42,
        "sample_interval_s": 5.0, "driver_version": "550", "cuda_driver_version": "",
        "gpu_util_pct": 11.0, "mem_util_pct": 12.0, "mem_used_bytes": 13, "mem_total_bytes": 14, "power_w": 15.5,
        "temperature_c": 16.0, "sm_clock_mhz": 17, "mem_clock_mhz": 18, "pcie_tx_bytes_per_s": 19.0,
        "pcie_rx_bytes_per_s": 20.0, "nvlink_tx_bytes_per_s": 21.0, "nvlink_rx_bytes_per_s": None,
        "health": "degraded", "health_reason": "hot", "xids": [48, 79], "critical_xid": True,
        "pod_uids": ["uid-a", ""], "pod_namespaces": ["ns-a", "ns-b"], "pod_names": ["pod-a", "pod-b"],
        "process_count": 2, "shared": True, "kafka_partition": 2, "kafka_offset": 77,
    }
    assert (idle["gpu_uuid"], idle["xids"], idle["critical_xid"], idle["pod_uids"], idle["process_count"],
            idle["health"], idle["gpu_util_pct"]) == ("GPU-y", [], False, [], 0, "ok", None)
    assert [row for table, row in rows if table == "gpu_processes"] == [
        {"cluster": "prod-eu",
         "ts": ts, "node": "node-x", "gpu_uuid": "GPU-x", "pid": 101, "process_name": "python", "container_id": "",
         "container_name": "", "pod_uid": "uid-a", "pod_namespace": "", "pod_name": "", "mem_used_bytes": 22,
         "sm_util_pct": 23.0, "kafka_partition": 2, "kafka_offset": 77},
        {"cluster": "prod-eu",
         "ts": ts, "node": "node-x", "gpu_uuid": "GPU-x", "pid": 102, "process_name": "", "container_id": "cid",
         "container_name": "main", "pod_uid": "", "pod_namespace": "ns-b", "pod_name": "pod-b",
         "mem_used_bytes": None, "sm_util_pct": None, "kafka_partition": 2, "kafka_offset": 77},
    ]
    assert [row for table, row in rows if table == "gpu_xids"] == [
        {"cluster": "prod-eu",
         "at": ts, "ts": ts, "node": "node-x", "gpu_uuid": "GPU-x", "gpu_model": "H100", "xid": 48,
         "critical": False, "message": "", "kafka_partition": 2, "kafka_offset": 77},
        {"cluster": "prod-eu",
         "at": ts, "ts": ts, "node": "node-x", "gpu_uuid": "GPU-x", "gpu_model": "H100", "xid": 79,
         "critical": True, "message": "fell off the bus", "kafka_partition": 2, "kafka_offset": 77},
    ]


def test_a_batch_gives_the_rows_of_its_records_one_by_one_from_models_or_plain_data() -> None:
    """The columnar batch path and the per-record path (used to isolate a rejected record) agree."""
    messages: list[Any] = [f.sample("node-a", 0), _full_sample(), f.sample("node-b", 1, with_xid=True),
                           GpuSample(node="empty", ts=f.T0, agent_boot_id="b", seq=0, sample_interval_s=1.0),
                           f.pod("p1"), Tombstone("k8s.pods.v1", "research/p0", f.T0), f.pod("p2")]
    items = [(message, 0, offset) for offset, message in enumerate(messages)]
    plain = [(Plain(type(m), decode_plain(encode(m), type(m))) if isinstance(m, GpuSample) else m, p, o)
             for m, p, o in items]
    one_by_one: dict[str, list[dict[str, Any]]] = {}
    for message, partition, offset in items:
        for table, row in rows_for(message, partition, offset):
            one_by_one.setdefault(table, []).append(row)
    for batch in (tables_for(items), tables_for(plain)):
        assert {table: list(columns.rows()) for table, columns in batch.items()} == one_by_one
    assert set(one_by_one) == {"gpu_samples", "gpu_processes", "gpu_xids", "pod_states", "state_tombstones"}
    assert len(one_by_one["gpu_samples"]) == 8 + 2 + 8
