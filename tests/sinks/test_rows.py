"""Rows pivot to columns in the order the builders give them, each value under its own column."""

from __future__ import annotations

import pytest

from sinks.rows import TableColumns, rows_for
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
