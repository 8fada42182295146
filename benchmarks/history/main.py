"""``python -m benchmarks history [--gpus N] [--days N] [--sample-interval-s S] [--cache-dir DIR]
[--runs N] [--end YYYY-MM-DD]``: fill (or reuse) a 1-day and an N-day store of the same fleet, measure both, print the
table (docs/performance.md, "History at fleet scale").

Figures and their baselines, all from one run:

- per subject (report, advise, each section of the report, each Grafana panel, each cookbook
  query): CPU time and bytes read over N days, with the ratio to the same over 1 day (target: at
  most 2x for a fleet- or team-level aggregate; per row of the answer for a subject that lists pods
  or rows, and for a cookbook query whose N-day answer has at least twice the rows of its 1-day
  one; per pod of the range for one that judges or ranks every pod of it, :class:`Rating`); its
  largest query's peak memory and duration against the product's read limits with a margin of 4x
  (512 MiB, 15 s);
- ``gpulens report --since 1d`` on the N-day store against the same on the 1-day store (the last day
  of a long history costs what the day alone costs);
- report and advise over N days against one full scan of one raw-samples column over the same N
  days (target: at most 3x);
- bytes on disk per GPU-day, per table and in total (target: at most 150 KB);
- the fill's rate (GPU rows per second).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from datetime import date, timedelta
from pathlib import Path

import orjson

from benchmarks.harness import Result, print_table
from benchmarks.history.fill import TABLES, FillOutcome, FillSpec, fill
from benchmarks.history.measure import RUNS, Rating, StoreFigures, measure_store, rating_of
from common.settings import CommonSettings, load_settings
from sinks.rollups import ROLLUPS

BENCH = "history"
MIB = 1024**2
MEMORY_TARGET = 2 * 1024**3 // 4
TIME_TARGET_S = 60.0 / 4
REPORT_AND_ADVISE = ("gpulens report (text)", "gpulens report --json", "gpulens report --html",
                     "gpulens advise --since <range>")
DISK_TARGET_BYTES = 150_000


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks history", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1024, help="GPUs of the fleet, at least (default 1024)")
    parser.add_argument("--days", type=int, default=30, help="days of history (default 30)")
    parser.add_argument("--sample-interval-s", type=float, default=10.0, help="GPU sample interval (default 10)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where filled stores are kept between runs (default $GPULENS_DATA_DIR/bench/history)")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"warm runs per subject, best kept (default {RUNS})")
    parser.add_argument("--template-nodes", type=int, default=8, help="8-GPU nodes of the played template (default 8)")
    parser.add_argument("--variants", type=int, default=2, help="distinct played days (default 2)")
    parser.add_argument("--end", type=date.fromisoformat, default=None,
                        help="the day the history ends on, exclusive, YYYY-MM-DD (default today, UTC); "
                             "the same day reuses the cached stores")
    args = parser.parse_args(argv)
    if args.gpus < 1 or args.days < 1 or args.sample_interval_s <= 0 or args.runs < 1:
        parser.error("--gpus, --days and --runs must be at least 1, --sample-interval-s above 0")
    return args


def fill_figures(outcome: FillOutcome) -> list[Result]:
    spec = outcome.spec
    what = f"{spec.days} d x {spec.fleet_gpus} GPUs"
    if outcome.cached:
        note = f"cached store ({outcome.path.parent.name}); filled in {outcome.played_s + outcome.extended_s:.0f} s"
        if outcome.upgraded_from:
            note += f"; migrated from {outcome.upgraded_from} in {outcome.migrated_s:.0f} s"
    else:
        note = f"played {outcome.played_s:.0f} s, extended {outcome.extended_s:.0f} s, merged {outcome.merged_s:.0f} s"
    return [
        Result(BENCH, f"fill rate, {what}", outcome.gpu_rows_per_s, "GPU rows/s",
               notes=f"{outcome.rows.get('gpu_samples', 0)} GPU rows; {note}"),
        Result(BENCH, f"fill time, {what}", outcome.played_s + outcome.extended_s + outcome.merged_s, "s",
               target="<= 1800 s at 30 d x 1024 GPUs"),
    ]


def disk_figures(figures: StoreFigures) -> list[Result]:
    gpu_days = figures.gpus * figures.days
    tables = [t for t in (*TABLES, "rollup_hourly", "rollup_daily", *(r.table.name for r in ROLLUPS))
              if t in figures.disk]
    results = [Result(BENCH, f"disk per GPU-day: {t}", figures.disk[t] / gpu_days, "bytes") for t in tables]
    total = sum(figures.disk.values())
    results.append(Result(BENCH, "disk per GPU-day: all tables", total / gpu_days, "bytes",
                          target=f"<= {DISK_TARGET_BYTES}", notes=f"{total / MIB:.1f} MiB in all"))
    return results


def _ratio(long: float, short: float) -> float | None:
    return long / short if short > 0 else None


def cost_figures(short: StoreFigures, long: StoreFigures) -> list[Result]:
    results: list[Result] = []
    n = long.days
    baseline = long.costs["baseline: one raw column, full scan"]
    for name, cost in long.costs.items():
        subject = long.subjects[name]
        one = short.costs.get(name)
        label = name[:44]
        if one is not None and subject.kind != "baseline":
            rating = rating_of(subject, one, cost)
            whole = _ratio(cost.cpu_s, one.cpu_s)
            if rating is Rating.AGGREGATE:
                ratio, target, size = whole, "<= 2x (1 d)", ""
            elif rating is Rating.PER_ROW:
                ratio = _ratio(cost.cpu_s / max(cost.result_rows, 1), one.cpu_s / max(one.result_rows, 1))
                target, size = "<= 2x per row (1 d)", f"; {whole or 0:.2f}x 1 d as a whole"
            else:
                ratio = _ratio(cost.cpu_s / max(long.pods, 1), one.cpu_s / max(short.pods, 1))
                target = "<= 2x per pod (1 d)"
                size = f"; weighs {long.pods} pods (1 d: {short.pods}), {whole or 0:.2f}x 1 d as a whole"
            results.append(Result(BENCH, label, cost.cpu_s, f"CPU s {n}d", baseline=f"{name}, 1 d",
                                  ratio_to_baseline=ratio, target=target,
                                  notes=f"{cost.queries} queries, {cost.read_rows} rows / {cost.read_bytes} bytes "
                                        f"read ({_ratio(cost.read_bytes, one.read_bytes) or 0:.2f}x 1 d), "
                                        f"{cost.result_rows} result rows, wall {cost.wall_s:.2f} s (1 d: "
                                        f"{one.cpu_s:.3f} CPU s, {one.read_bytes} bytes, wall {one.wall_s:.2f} s)"
                                        f"{size}"))
        if subject.kind == "baseline" or name in REPORT_AND_ADVISE:
            read = _ratio(cost.read_bytes, baseline.read_bytes) or 0
            results.append(Result(BENCH, f"{label[:34]} vs scan", cost.cpu_s, f"CPU s {n}d",
                                  baseline="one raw column, full scan",
                                  ratio_to_baseline=_ratio(cost.cpu_s, baseline.cpu_s),
                                  target="<= 3x" if subject.kind != "baseline" else None,
                                  notes=f"bytes read {read:.2f}x the scan's"))
        results.append(Result(BENCH, f"{label[:33]} peak memory", cost.peak_memory_bytes / MIB, "MiB",
                              target=f"<= {MEMORY_TARGET // MIB}",
                              notes=f"largest query {cost.max_query_s:.2f} s (target <= {TIME_TARGET_S:.0f} s)"))
    return results


def run_history(gpus: int, days: int, sample_interval_s: float, cache_dir: Path, runs: int = RUNS,
                template_nodes: int = 8, variants: int = 2, end: date | None = None) -> list[Result]:
    """Fill (or reuse) the 1-day and the ``days``-day store and measure both."""
    results: list[Result] = []
    figures: dict[int, StoreFigures] = {}
    for n in sorted({1, days}):
        spec = FillSpec(gpus=gpus, days=n, sample_interval_s=sample_interval_s, template_nodes=template_nodes,
                        variants=variants, end=end.isoformat() if end else "")
        print(f"== history: {n} d x {spec.fleet_gpus} GPUs @ {sample_interval_s:g} s ({spec.key()})", flush=True)
        started = time.perf_counter()
        outcome = fill(spec, cache_dir, progress=lambda step: print(f"   {step}", flush=True))
        print(f"   {'cached' if outcome.cached else 'filled'} in {time.perf_counter() - started:.1f} s: "
              f"{outcome.rows.get('gpu_samples', 0)} GPU rows", flush=True)
        results += fill_figures(outcome)
        started = time.perf_counter()
        end = spec.start + timedelta(seconds=spec.days * spec.day_s)
        figures[n] = measure_store(outcome.path, n, spec.fleet_gpus, spec.start, end, cache_dir / "scratch", runs)
        print(f"   measured {len(figures[n].costs)} subjects in {time.perf_counter() - started:.1f} s", flush=True)
    results += disk_figures(figures[days])
    results += cost_figures(figures[1], figures[days])
    return results


def main(argv: list[str]) -> int:
    args = parse(argv)
    cache_dir = args.cache_dir or load_settings(CommonSettings).data_dir / "bench" / "history"
    results = run_history(args.gpus, args.days, args.sample_interval_s, cache_dir, args.runs, args.template_nodes,
                          args.variants, args.end)
    print()
    print_table(results)
    out = cache_dir / "results.json"
    out.write_bytes(orjson.dumps([asdict(r) for r in results], option=orjson.OPT_INDENT_2))
    print(f"\n(also written to {out})")
    return 0
