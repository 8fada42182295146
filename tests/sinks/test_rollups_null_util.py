"""Windows without a utilisation figure (MIG devices, where NVML gives none) are stored and rolled
up like any other: the hourly rollup must not reject the insert (a NULL in a non-Nullable sum)."""

from __future__ import annotations

from pathlib import Path

from sinks.clickhouse import open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from sinks.rows import rows_for
from tests.sinks import factories as f


def test_windows_with_no_util_figure_roll_up(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'ch'}")
    try:
        migrate(store, TtlDays(raw=36500, state=36500, rollup=36500))
        windows = [f.window("mig-pod", gpu, minute).model_copy(update={"avg_sm_util_pct": None,
                                                                         "max_sm_util_pct": None})
                   for gpu in range(2) for minute in range(3)]
        columns: dict[str, dict[str, list[object]]] = {}
        for offset, window in enumerate(windows):
            for table, row in rows_for(window, 0, offset):
                for name, value in row.items():
                    columns.setdefault(table, {}).setdefault(name, []).append(value)
        for table, data in columns.items():
            store.insert(table, data)
        hourly = store.query("SELECT sum(allocated_gpu_hours), sum(util_hours) FROM rollup_hourly").rows[0]
        assert round(float(hourly[0]), 6) == round(6 * 60 / 3600, 6)
        assert float(hourly[1]) == 0.0
    finally:
        store.close()
