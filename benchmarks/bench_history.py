"""History at fleet scale, in ``make bench``: the history benchmark (benchmarks/history/) at a size
that fits minutes — 3 days of one 66-GPU template fleet (``--quick``: 2 days, one run per
subject). The full size is ``python -m benchmarks history --gpus 1024 --days 30``."""

from __future__ import annotations

from benchmarks.harness import Context, Result
from benchmarks.history.main import run_history


def run(ctx: Context) -> list[Result]:
    days, runs = (2, 1) if ctx.quick else (3, 3)
    return run_history(gpus=66, days=days, sample_interval_s=10.0, cache_dir=ctx.scratch / "history", runs=runs)
