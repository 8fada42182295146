"""Windows without a utilisation figure (MIG devices, where NVML gives none) are stored and rolled
up like any other: the hourly rollup must not reject the insert (a NULL in a non-Nullable sum).
The same for windows and GPU samples without any optional figure, in every rollup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sinks.clickhouse import open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from tests.sinks import factories as f


def test_windows_with_no_util_figure_roll_up(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'ch'}")
    try:
        migrate(store, TtlDays(raw=36500, state=36500, rollup=36500))
        windows = [f.window("mig-pod", gpu, minute).model_copy(update={"avg_sm_util_pct": None,
                                                                         "max_sm_util_pct": None})
                   for gpu in range(2) for minute in range(3)]
        f.store_rows(store, windows)
        hourly = store.query("SELECT sum(allocated_gpu_hours), sum(util_hours) FROM rollup_hourly").rows[0]
        assert round(float(hourly[0]), 6) == round(6 * 60 / 3600, 6)
        assert float(hourly[1]) == 0.0
    finally:
        store.close()



def _without_optional_figures(model: BaseModel) -> Any:
    """``model`` with every field that may be None set to None."""
    return model.model_copy(update={name: None for name, field in type(model).model_fields.items()
                                    if not field.is_required() and field.default is None})


def test_windows_and_samples_without_any_optional_figure_roll_up(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'ch'}")
    try:
        migrate(store, TtlDays(raw=36500, state=36500, rollup=36500))
        windows = [_without_optional_figures(f.window("bare-pod", gpu, minute)) for gpu in range(2)
                   for minute in range(3)]
        sample = f.sample("n1", 0)
        bare = sample.model_copy(update={"gpus": [_without_optional_figures(g) for g in sample.gpus]})
        f.store_rows(store, [*windows, bare])
        for table in ("team_hourly", "team_daily"):
            rows = store.query(f"SELECT sum(windows), uniqExactMerge(pods), sum(allocated_gpu_s), "
                               f"max(peak_mem_bytes), sum(idle_cost_usd) FROM {table}").rows
            assert [int(rows[0][0]), int(rows[0][1]), float(rows[0][2])] == [6, 1, 6 * 60.0], table
        gpus = store.query("SELECT sum(samples), sum(allocated_idle_s), max(mem_total_bytes) FROM gpu_hourly").rows
        assert [int(gpus[0][0]), gpus[0][2]] == [8, None]
    finally:
        store.close()
