"""The benchmark harness: discovers ``benchmarks/bench_*.py`` modules and prints their figures.

Each module defines ``run(ctx: Context) -> list[Result]``. Figures that have a baseline measured in
the same run (for example raw Kafka throughput on the same broker) carry the ratio to it, so a
number means something on any machine.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from common.kafka import delete_prefixed
from common.settings import CommonSettings, KafkaSettings, load_settings
from gpulens.kafka_local import LocalKafka


@dataclass
class Result:
    bench: str
    metric: str
    value: float
    unit: str
    baseline: str | None = None
    ratio_to_baseline: float | None = None
    target: str | None = None
    notes: str = ""


@dataclass
class Context:
    kafka: KafkaSettings
    topic_prefix: str
    scratch: Path
    quick: bool = False
    shared: dict[str, Any] = field(default_factory=dict)
    """Figures earlier benchmarks left for later ones (e.g. the raw Kafka baseline)."""


def stat_cpu_s(stat: Path) -> float:
    """CPU seconds (user + system) in a ``/proc`` stat file: a process's or one of its threads'."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds so far of process ``pid`` (all its threads)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat"))


def discover(only: list[str]) -> list[str]:
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    # the Kafka baseline runs first: other figures are compared to it
    names.sort(key=lambda n: (n != "bench_kafka_baseline", n))
    return [n for n in names if not only or any(o in n for o in only)]


def print_table(results: list[Result]) -> None:
    header = f"{'bench':24} {'metric':44} {'value':>14} {'unit':12} {'vs baseline':>12}  target"
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = f"{r.ratio_to_baseline:.2f}x" if r.ratio_to_baseline is not None else ""
        print(f"{r.bench:24} {r.metric:44} {r.value:14.2f} {r.unit:12} {ratio:>12}  {r.target or ''}")


USAGE = ("usage: python -m benchmarks [--quick] [NAME ...]  (NAME: part of a bench_*.py module's name, e.g. stream)"
         " | python -m benchmarks history [--gpus N] [--days N] [--sample-interval-s S] [--cache-dir DIR]")


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(USAGE)
        return 0
    unknown = [a for a in argv if a.startswith("-") and a != "--quick"]
    only = [a for a in argv if not a.startswith("-")]
    unmatched = [name for name in only if not discover([name])]
    if unknown or unmatched:
        what = f"unknown option {unknown[0]}" if unknown else f"no benchmark named like {unmatched[0]!r}"
        print(f"benchmarks: {what}; {USAGE} (benchmarks: {', '.join(discover([]))})", file=sys.stderr)
        return 2
    quick = "--quick" in argv
    settings = load_settings(CommonSettings)
    local = LocalKafka.from_settings(settings)
    print(local.up(), flush=True)
    scratch = settings.data_dir / "bench"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = Context(KafkaSettings(bootstrap_servers=local.bootstrap), f"bench{int(time.time())}", scratch, quick)
    results: list[Result] = []
    try:
        for name in discover(only):
            print(f"== {name}", flush=True)
            module = importlib.import_module(f"benchmarks.{name}")
            started = time.perf_counter()
            results.extend(module.run(ctx))
            print(f"   done in {time.perf_counter() - started:.1f}s", flush=True)
    finally:  # a broker that keeps every run's topics gets slower run after run
        print(f"deleted the run's {len(delete_prefixed(ctx.kafka, [ctx.topic_prefix]))} topics "
              f"(prefix {ctx.topic_prefix})", flush=True)
    print()
    print_table(results)
    out = scratch / "results.json"
    out.write_bytes(orjson.dumps([asdict(r) for r in results], option=orjson.OPT_INDENT_2))
    print("\nJSON:")
    print(orjson.dumps([asdict(r) for r in results]).decode())
    print(f"(also written to {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
