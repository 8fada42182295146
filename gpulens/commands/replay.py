"""``gpulens replay SCENARIO``: play a scenario file and print the report of FORMAT.md.

In-process by default (no broker): the simulator's records go through the same decoding, routing
and stages as the faust workers. ``--kafka BOOTSTRAP`` plays them through real topics and a
``gpulens worker`` child process instead (:mod:`simulation.kafka_replay`); both give the same report.
``--json`` prints the report (deterministic: the same file gives byte-identical output);
otherwise a readable summary. ``--store`` also writes the replay into the history
(``GPULENS_CLICKHOUSE__URL``) through the sink's write path, for ``report``, ``advise``, ``sql`` and
Grafana (:mod:`simulation.store`: the TTLs and time bounds that keep a past-dated scenario).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import orjson

from common.errors import UserError

if TYPE_CHECKING:
    from gpulens.kafka_local import LocalKafka
    from simulation.scenario import Scenario
    from simulation.store import StoreOutcome

T = TypeVar("T")


def _dump(report: dict[str, Any]) -> str:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()


def _print_summary(report: dict[str, Any]) -> None:
    """The readable summary; every string from the scenario or the fleet (names, teams, summaries) is
    a plain rich Text (never markup) with its control characters shown escaped."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from common.text import printable

    def plain(value: Any) -> Text:
        return Text("" if value is None else printable(str(value)))

    console = Console(width=None if Console().is_terminal else 160)
    console.print(Text.assemble(("scenario", "bold"), " ", plain(report["scenario"])))
    alerts = Table(title="alerts", show_lines=False)
    for column in ("at", "state", "type", "subject", "summary"):
        alerts.add_column(column, overflow="fold")
    for a in report["alerts"]:
        s = a["subject"]
        subject = "/".join(p for p in (s.get("namespace"), s.get("name")) if p)
        if s.get("gpu_uuid"):
            subject += f" [{s['gpu_uuid'][:12]}]"
        alerts.add_row(plain(a["at"]), plain(a["state"]), plain(a["type"]), plain(subject), plain(a["summary"]))
    console.print(alerts if report["alerts"] else "no alerts")
    pods = Table(title="pods")
    for column in ("pod", "team", "gpus", "node", "pending_s", "running_s", "gpu_h", "idle_gpu_h", "avg_util%",
                   "cost_usd", "end"):
        pods.add_column(column, justify="right" if column not in ("pod", "team", "node", "end") else "left")
    for p in report["pods"]:
        if not p.get("seen", True):
            pods.add_row(plain(f"{p['namespace']}/{p['name']}"), *["-"] * 9, "not seen")
            continue
        avg = p["avg_sm_util_pct"]
        pods.add_row(plain(f"{p['namespace']}/{p['name']}"), plain(str(p["team"])), str(p["gpus"]),
                     plain(p["node"] or "-"),
                     str(p["pending_s"]), str(p["running_s"]), f"{p['gpu_hours']:.4f}", f"{p['idle_gpu_hours']:.4f}",
                     "-" if avg is None else f"{avg:.1f}", f"{p['cost_usd']:.2f}", plain(p["end_reason"]))
    console.print(pods)
    c = report["cluster"]
    console.print(
        f"cluster: capacity {c['gpu_hours_capacity']:.4f} GPU-h, allocated {c['gpu_hours_allocated']:.4f}, "
        f"idle allocated {c['gpu_hours_idle_allocated']:.4f}, unallocated {c['gpu_hours_unallocated']:.4f}, "
        f"max stranded GPUs {c['max_stranded_gpus']}")
    stream = report.get("stream", {})
    if stream:
        console.print(plain("stream: " + ", ".join(f"{k}={v}" for k, v in stream.items())))


@click.command("replay")
@click.argument("scenario", type=click.Path(path_type=Path), required=False)
@click.option("--random", "random_seed", type=click.IntRange(min=0), default=None, metavar="SEED",
              help="play the random scenario of SEED instead of a file (`python -m simulation.random_scenario "
              "SEED` prints it): a file nobody wrote, for --kafka --chaos on your own broker")
@click.option("--json", "as_json", is_flag=True, help="print the JSON report of FORMAT.md")
@click.option("--kafka", "bootstrap", default=None, metavar="BOOTSTRAP",
              help="run through real topics and faust workers on this Kafka (host:port)")
@click.option("--lateness", "lateness_s", type=float, default=None,
              help="allowed lateness in seconds before a sample counts as late (default 30)")
@click.option("--topic-prefix", default=None, help="topic prefix for --kafka (default: a fresh one per run)")
@click.option("--expect", "expected_path", type=click.Path(path_type=Path), default=None,
              help="compare with an expected-results JSON file; exit 1 on any difference")
@click.option("--chaos", is_flag=True, help="with --kafka: SIGKILL and restart the worker on a seeded schedule")
@click.option("--seed", type=int, default=None, help="seed of the --chaos schedule (default: random, printed)")
@click.option("--kills", type=click.IntRange(min=1), default=8, show_default=True, help="SIGKILLs of --chaos")
@click.option("--workers", type=click.IntRange(min=1, max=16), default=1, show_default=True,
              help="with --kafka: worker processes in the group")
@click.option("--outage", "outage_s", type=click.FloatRange(min=0), default=0.0,
              help="with --chaos: stop the local broker (`gpulens kafka up`) once for this many seconds")
@click.option("--store", "store", is_flag=True,
              help="also store the replay in the history (GPULENS_CLICKHOUSE__URL, default embedded) through the "
              "sink, with the scenario's prices and TTLs that keep its dates; then try report, advise, sql")
def replay(scenario: Path | None, random_seed: int | None, as_json: bool, bootstrap: str | None,
           lateness_s: float | None, topic_prefix: str | None, expected_path: Path | None, chaos: bool,
           seed: int | None, kills: int, workers: int, outage_s: float, store: bool) -> None:
    """Play SCENARIO (a YAML file, see docs/scenarios.md) and print what gpulens saw."""
    from simulation.replay import DEFAULT_LATENESS_S, run_in_process

    parsed = _scenario(scenario, random_seed)
    lateness = DEFAULT_LATENESS_S if lateness_s is None else lateness_s
    _check_flags(lateness, bootstrap, chaos, seed, workers, outage_s)
    from common.settings import WorkerSettings, load_settings

    accept_clusters = load_settings(WorkerSettings).accepted_clusters()
    stored: list[StoreOutcome] = []
    if bootstrap:
        report = _through_kafka(parsed, bootstrap, lateness, topic_prefix, chaos, seed, kills, workers, outage_s,
                                accept_clusters, stored if store else None)
    else:
        result = run_in_process(parsed, lateness_s=lateness, accept_clusters=accept_clusters)
        report = result.report
        if store:
            from simulation.store import store_in_process

            stored.append(_storing(lambda: store_in_process(parsed, result)))
    if as_json:
        click.echo(_dump(report))
    else:
        _print_summary(report)
    if stored:
        from simulation.store import describe_outcome

        for line in describe_outcome(parsed, stored[0]):
            click.echo(line, err=True)
    if expected_path is not None:
        _check_expected(report, expected_path, parsed.sample_interval_s)


def _scenario(path: Path | None, random_seed: int | None) -> Scenario:
    """The scenario of the file or of ``--random SEED`` (exactly one of them)."""
    from simulation.random_scenario import random_scenario
    from simulation.scenario import load_scenario, parse_scenario

    if path is not None and random_seed is None:
        return load_scenario(path)
    if random_seed is not None and path is None:
        return parse_scenario(random_scenario(random_seed), source=f"random scenario {random_seed}")
    raise UserError("give a SCENARIO file or --random SEED (one of them)")


def _check_flags(lateness_s: float, bootstrap: str | None, chaos: bool, seed: int | None, workers: int,
                 outage_s: float) -> None:
    """The flags that only make sense together: one clear line for the first pair that does not."""
    if lateness_s < 0:
        raise UserError("--lateness must not be negative")
    if (chaos or seed is not None) and not bootstrap:
        raise UserError("--chaos and --seed need --kafka BOOTSTRAP (they kill worker processes)")
    if seed is not None and not chaos:
        raise UserError("--seed is the seed of --chaos; add --chaos")
    if workers > 1 and not bootstrap:
        raise UserError("--workers needs --kafka BOOTSTRAP (the in-process replay has no worker processes)")
    if outage_s and not chaos:
        raise UserError("--outage is a step of --chaos; add --chaos")


def _through_kafka(parsed: Scenario, bootstrap: str, lateness_s: float, topic_prefix: str | None, chaos: bool,
                   seed: int | None, kills: int, workers: int, outage_s: float,
                   accept_clusters: frozenset[str] | None, stored: list[StoreOutcome] | None) -> dict[str, Any]:
    """The replay through real topics and ``gpulens worker`` processes (``stored``: also ``--store``)."""
    import random

    from common.kafka import BrokerUnavailable, broker_unavailable
    from simulation.kafka_replay import run_through_kafka

    chaos_seed = (seed if seed is not None else random.SystemRandom().randrange(10**6)) if chaos else None
    broker = _local_broker(bootstrap) if outage_s else None
    try:
        return run_through_kafka(parsed, bootstrap, lateness_s=lateness_s, topic_prefix=topic_prefix,
                                 chaos_seed=chaos_seed, kills=kills, workers=workers, outage_s=outage_s,
                                 broker=broker, say=lambda line: click.echo(line, err=True),
                                 accept_clusters=accept_clusters,
                                 store=None if stored is None else _kafka_store(parsed, bootstrap, stored))
    except BrokerUnavailable as exc:
        raise broker_unavailable(exc, env_hint=False) from None


def _storing(action: Callable[[], T]) -> T:
    """``action()``, with the store's errors (locked, unreachable, a TTL it cannot keep) as one line."""
    from sinks.clickhouse import StoreError, StoreLocked

    try:
        return action()
    except StoreLocked as exc:
        raise UserError(f"--store: {exc}; a running `gpulens sink` (or demo) holds the embedded store: stop it, "
                        "or point GPULENS_CLICKHOUSE__URL elsewhere") from None
    except StoreError as exc:
        raise UserError(f"--store: {exc}") from None


def _kafka_store(parsed: Scenario, bootstrap: str, stored: list[StoreOutcome]) -> Callable[[str], None]:
    """The step of ``--kafka --store``: the sink drains the replay's topics into the store."""
    from simulation.store import store_from_kafka

    def step(prefix: str) -> None:
        click.echo(f"storing: the sink drains the topics of prefix {prefix} into the history", err=True)
        stored.append(_storing(lambda: store_from_kafka(parsed, bootstrap, prefix)))

    return step


def _local_broker(bootstrap: str) -> LocalKafka:
    """The broker ``gpulens kafka up`` runs on ``bootstrap`` (a chaos replay's outage stops it)."""
    from common.settings import CommonSettings, load_settings
    from gpulens.kafka_local import LocalKafka

    local = LocalKafka.from_settings(load_settings(CommonSettings))
    if local.running_pid() is None or bootstrap.rsplit(":", 1)[-1] != str(local.port):
        raise UserError(f"--outage stops and starts the broker `gpulens kafka up` runs (port {local.port}, "
                        f"GPULENS_LOCAL_KAFKA__PORT); none runs there for {bootstrap}")
    return local


def _check_expected(report: dict[str, Any], path: Path, sample_interval_s: float) -> None:
    from simulation.replay import compare_report

    try:
        expected = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot read expected results: {exc}") from None
    problems = compare_report(report, expected, sample_interval_s)
    from common.text import printable

    for line in problems:  # a line names pods and teams of the scenario: cluster text
        click.echo(f"MISMATCH {printable(line)}", err=True)
    if problems:
        raise click.ClickException(f"{len(problems)} difference(s) from {path}")
    click.echo(f"matches {path}", err=True)


COMMANDS = [replay]
