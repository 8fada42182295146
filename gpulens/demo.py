"""``gpulens demo``: the whole product on one machine, on a simulated live fleet.

It starts (or reuses) the local Kafka broker, creates the topics, starts the stream workers and the
ClickHouse sink as child processes — the same commands an operator runs — and plays a seeded fleet
(:mod:`simulation.demo_fleet`) through the simulator at wall-clock pace: the agents' sampling code and
the watcher's translation code produce every record, exactly as in production. A live view
(:mod:`gpulens.top`) shows what the pipeline reports. On Ctrl-C or after ``--duration`` it ends the
fleet, lets the workers and the sink catch up, stops everything it started, and says where to look
next. Simulated time runs ``speed`` times faster than the wall clock so that alerts with
minutes-long thresholds show up within the first two minutes.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from common.errors import UserError
from common.kafka import group_lag
from common.logs import get_logger
from common.processes import terminate_as_interrupt
from common.settings import AdviseThresholds, CommonSettings, KafkaSettings
from gpulens.kafka_local import LocalKafka
from gpulens.top import FleetView, drain_topics, render
from schemas.topics import ALERTS, CLUSTER_CAPACITY, DEADLETTER, POD_LIFECYCLE, POD_WINDOWS
from simulation.demo_fleet import demo_scenario
from simulation.kafka_replay import KafkaReplay, WorkerProcess, child_env
from simulation.scenario import Scenario, parse_scenario
from simulation.simulator import FleetSimulator

log = get_logger(__name__)

OUTPUT_TOPICS = (POD_WINDOWS, CLUSTER_CAPACITY, POD_LIFECYCLE, ALERTS, DEADLETTER)


@dataclass(frozen=True)
class DemoOptions:
    nodes: int = 16
    gpus_per_node: int = 8
    speed: float = 6.0
    duration_s: float | None = None
    seed: int = 7
    live_view: bool = True


@dataclass
class DemoRun:
    settings: CommonSettings
    options: DemoOptions
    console: Console
    run_dir: Path
    prefix: str
    scenario: Scenario
    children: list[WorkerProcess] = field(default_factory=list)
    view: FleetView = field(default_factory=FleetView)
    stop_event: threading.Event = field(default_factory=threading.Event)
    view_done: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    ticks_sent: int = 0
    sim_now: datetime | None = None
    driver_error: BaseException | None = None
    replay: KafkaReplay | None = None

    @property
    def sink_group(self) -> str:
        return f"{self.prefix}-sink"


def build_scenario(options: DemoOptions, wall_start: datetime) -> Scenario:
    start = wall_start.replace(microsecond=0, second=wall_start.second - wall_start.second % 10)
    sim_minutes = 24 * 60 if options.duration_s is None else options.duration_s * options.speed / 60 + 1
    document = demo_scenario(options.nodes, options.gpus_per_node, duration_m=sim_minutes, seed=options.seed,
                             start=start.isoformat().replace("+00:00", "Z"))
    return parse_scenario(document, source="demo")


def _spawn(run: DemoRun, args: tuple[str, ...], env: dict[str, str]) -> WorkerProcess:
    child = WorkerProcess(env, run.run_dir / f"{args[0]}.log", args)
    run.children.append(child)  # before it starts: terminated meanwhile, the demo still stops it
    child.start()
    return child


def _drive(run: DemoRun, replay: KafkaReplay, wall_start: float) -> None:
    """Play the fleet at ``speed`` x wall-clock pace until stopped or the scenario ends."""
    try:
        for tick in FleetSimulator(run.scenario).run():
            due = wall_start + tick.offset_s / run.options.speed
            while not run.stop_event.is_set() and time.monotonic() < due:
                run.stop_event.wait(min(0.2, max(0.0, due - time.monotonic())))
            if run.stop_event.is_set():
                break
            replay.send([tick])
            run.ticks_sent += 1
            run.sim_now = tick.ts
    except BaseException as exc:  # the main thread reports it and stops the demo
        run.driver_error = exc
        run.stop_event.set()


def _status_line(run: DemoRun, wall_started: float) -> Text:
    elapsed = time.monotonic() - wall_started
    sim = f"{run.sim_now:%H:%M:%S}Z" if run.sim_now else "starting"
    children = "  ".join(f"{c.name}:{'up' if c.alive() else 'DOWN'}" for c in run.children)
    line = Text(f"demo  wall {elapsed:5.0f}s  simulated {sim} ({run.options.speed:g}x)  ticks {run.ticks_sent}  "
                f"alerts seen {run.view.alert_transitions}  {children}  — Ctrl-C to stop", style="bold cyan")
    return line


def _wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def _settle(run: DemoRun, quiet_s: float = 4.0, timeout_s: float = 60.0) -> None:
    """Wait until the workers' outputs stop changing (the end mark's flush included)."""
    last = (-1, time.monotonic())

    def quiet() -> bool:
        nonlocal last
        seen = run.view.messages_seen
        if seen != last[0]:
            last = (seen, time.monotonic())
        return time.monotonic() - last[1] >= quiet_s

    _wait_until(quiet, timeout_s)


def run_demo(settings: CommonSettings, options: DemoOptions, console: Console | None = None) -> int:
    console = console or Console()
    local = LocalKafka.from_settings(settings)
    started_broker = local.running_pid() is None and not local.answering()
    console.print(local.up())
    kafka = KafkaSettings(**(settings.kafka.model_dump() | {"bootstrap_servers": local.bootstrap}))
    settings = settings.model_copy(update={"kafka": kafka})
    wall_start_utc = datetime.now(UTC)
    run_id = wall_start_utc.strftime("%Y%m%d-%H%M%S")
    # a prefix per run: the workers and the sink start from the beginning of their own topics
    run = DemoRun(settings=settings, options=options, console=console,
                  run_dir=settings.data_dir / "demo" / run_id, prefix=f"{settings.topic_prefix}-demo-{run_id}",
                  scenario=build_scenario(options, wall_start_utc))
    run.run_dir.mkdir(parents=True, exist_ok=True)
    replay = run.replay = KafkaReplay(run.scenario, settings, topic_prefix=run.prefix, work_dir=run.run_dir)
    with terminate_as_interrupt():  # terminated, the demo stops its workers and sink (below) as on Ctrl-C
        return _run_demo(run, local, started_broker, kafka, replay)


def _run_demo(run: DemoRun, local: LocalKafka, started_broker: bool, kafka: KafkaSettings,
              replay: KafkaReplay) -> int:
    console, settings = run.console, run.settings
    try:
        replay.create_topics()
        console.print(f"topics created under the prefix {run.prefix}")
        run.children.append(replay.worker)
        replay.worker.start()
        # the sink gets the same price table as the workers: it fills gpu_prices for the list-price views;
        # the simulated clock runs ahead of the wall clock by up to the scenario's length
        sink_env = child_env(settings, run.prefix, settings.data_dir, {
            "GPULENS_GROUP_ID": run.sink_group,
            "GPULENS_PRICES_USD_PER_GPU_HOUR": json.dumps(dict(run.scenario.prices)),
            "GPULENS_MAX_FUTURE_SKEW_S": repr(run.scenario.duration_s + 600.0),
        })
        sink = _spawn(run, ("sink",), sink_env)
        assert replay.worker.process is not None and sink.process is not None
        console.print(f"started the stream workers (pid {replay.worker.process.pid}) and the sink "
                      f"(pid {sink.process.pid}); logs in {run.run_dir}")
        return _play(run, kafka, replay)
    finally:
        # on any exit: stop our threads' Kafka clients before the broker goes away
        run.stop_event.set()
        run.view_done.set()
        for thread in run.threads:
            thread.join(15)
        for child in reversed(run.children):
            child.stop(30)
        if replay.driver is not None:
            replay.driver.close()
        if started_broker:
            console.print(local.down())


def _play(run: DemoRun, kafka: KafkaSettings, replay: KafkaReplay) -> int:
    console, options = run.console, run.options
    reader = threading.Thread(target=drain_topics, name="demo-view", daemon=True,
                              args=(kafka, run.prefix, run.view, run.view_done.is_set))
    reader.start()
    run.threads.append(reader)
    wall_started = time.monotonic()
    player = threading.Thread(target=_drive, name="demo-fleet", args=(run, replay, wall_started), daemon=True)
    player.start()
    run.threads.append(player)
    deadline = None if options.duration_s is None else wall_started + options.duration_s
    try:
        if options.live_view and console.is_terminal:
            with Live(console=console, refresh_per_second=2, screen=False) as live:
                while not _finished(run, deadline):
                    live.update(Group(_status_line(run, wall_started), render(run.view, "gpulens demo")))
                    time.sleep(0.5)
        else:
            last_print = 0.0
            while not _finished(run, deadline):
                if time.monotonic() - last_print >= 10:
                    console.print(_progress_line(run, wall_started))
                    last_print = time.monotonic()
                time.sleep(0.5)
    except KeyboardInterrupt:
        console.print("stopping the demo (Ctrl-C): ending the fleet and letting the pipeline catch up…")
    run.stop_event.set()
    player.join(30)
    if run.driver_error is not None:
        raise UserError(f"the simulated fleet stopped: {run.driver_error}") from run.driver_error
    dead = [c for c in run.children if not c.alive()]
    if dead:
        details = "\n".join(f"--- {c.name} (exit {c.process.poll() if c.process else '?'}), "
                            f"last lines of {c.log_path}:\n{c.tail()}"
                            for c in dead)
        raise UserError(f"a pipeline process stopped unexpectedly:\n{details}")
    console.print("fleet ended; waiting for the stream workers to flush…")
    if run.ticks_sent:
        end = (run.sim_now or run.scenario.start) + timedelta(seconds=run.scenario.sample_interval_s)
        assert replay.driver is not None
        replay.end_mark = replay.driver.finish(end)
        replay.wait_done(timeout_s=120)
    _settle(run)
    console.print("waiting for the sink to store everything…")
    topics = [spec.name(run.prefix) for spec in OUTPUT_TOPICS]
    caught_up = _wait_until(lambda: group_lag(kafka, run.sink_group, topics) == 0, timeout_s=90, poll_s=1.0)
    run.view_done.set()
    reader.join(10)
    for child in reversed(run.children):
        child.stop(60)
    _summary(run, caught_up)
    return 0


def _finished(run: DemoRun, deadline: float | None) -> bool:
    if run.stop_event.is_set() or any(not c.alive() for c in run.children):
        return True
    return deadline is not None and time.monotonic() >= deadline


def _progress_line(run: DemoRun, wall_started: float) -> str:
    cap = run.view.capacity
    figures = ""
    if cap is not None:
        figures = (f" | GPUs busy {cap.gpus_busy} idle-allocated {cap.gpus_idle_allocated} free {cap.gpus_free} "
                   f"stranded {cap.stranded_gpus} pending pods {cap.pending_pods}")
    sim = f"{run.sim_now:%H:%M:%S}Z" if run.sim_now else "starting"
    return (f"[{time.monotonic() - wall_started:5.0f}s] simulated {sim} | ticks {run.ticks_sent} | "
            f"alerts firing {len(run.view.alerts)} (transitions {run.view.alert_transitions}){figures}")


def _summary(run: DemoRun, caught_up: bool) -> None:
    console, view = run.console, run.view
    console.print()
    console.print(render(view, "gpulens demo — final state"))
    console.print(f"\nplayed {run.ticks_sent} ticks of the simulated fleet; "
                  f"{view.alert_transitions} alert transitions; sink {'caught up' if caught_up else 'NOT caught up'}")
    fired = ", ".join(f"{kind} {count}" for kind, count in sorted(view.fired_by_type.items()))
    console.print(f"alerts fired by type: {fired or 'none'}")
    console.print("\nWhere to look next (the history is in the embedded ClickHouse under "
                  f"{run.settings.data_dir}):")
    for line in where_to_look(run.prefix):
        console.print(line, markup=False, highlight=False)
    console.print(f"  logs of this run: {run.run_dir}")
    console.print(f"\nReclaimable capacity: {_advice_headline(run.settings)}")


def gpulens_command(which: Callable[[str], str | None] = shutil.which, executable: str = sys.executable,
                    cwd: Path | None = None) -> tuple[str, str | None]:
    """How the user types ``gpulens`` in their shell, and a line on activating the environment when
    that is not the bare name: ``gpulens`` when the name on PATH is this installation; otherwise this
    environment's entry point (``.venv/bin/gpulens`` relative to the working directory when under it,
    ``bash scripts/demo.sh`` runs from the repository root) or, without one, ``python -m gpulens``."""
    here = Path(executable).parent  # the environment's bin/ (not resolved: a venv's python is a symlink)
    entry = here / "gpulens"
    on_path = which("gpulens")
    if on_path is not None and (not entry.exists() or Path(on_path).resolve() == entry.resolve()):
        return "gpulens", None
    if not entry.exists():
        return f"{executable} -m gpulens", None
    cwd = cwd or Path.cwd()
    try:
        shown = str(entry.relative_to(cwd))
    except ValueError:
        shown = str(entry)
    activate = here / "activate"
    note = (f"(or run `source {activate.relative_to(cwd) if activate.is_relative_to(cwd) else activate}` "
            "first, then type `gpulens ...`)") if activate.exists() else None
    return shown, note


def where_to_look(prefix: str, command: tuple[str, str | None] | None = None) -> list[str]:
    """The demo's closing hints, with ``gpulens`` as the user can type it (:func:`gpulens_command`)."""
    gpulens, note = command or gpulens_command()
    lines = [
        f"  {gpulens} report                      # canned analyses: consumers, idle, pending, cost",
        f"  {gpulens} report --html report.html   # the same as a self-contained HTML report with plots",
        f'  {gpulens} sql "SELECT team, round(sum(idle_s)/3600, 2) AS idle_gpu_hours '
        'FROM pod_windows FINAL GROUP BY team ORDER BY idle_gpu_hours DESC"',
        f"  {gpulens} top --topic-prefix {prefix} --once   # the live view's figures, as JSON",
        f"  {gpulens} advise {DEMO_ADVISE_FLAGS}   # reclaimable GPUs, the pods behind them",
    ]
    if note:
        lines.append(f"  {note}")
    return lines


DEMO_ADVISE = AdviseThresholds(min_evidence_s=300, idle_stretch_s=300, bucket_s=300)
"""The advisor's thresholds for the demo's short history (minutes, not days): 5 minutes of evidence, a
5-minute idle run, 5-minute buckets; the defaults (an hour each) are for production history."""
DEMO_ADVISE_FLAGS = "--min-evidence 5m --idle-stretch 5m --bucket 5m"


def _advice_headline(settings: CommonSettings) -> str:
    """The advisor's headline over what the demo stored ("N GPUs (P %) reclaimable, $X/month")."""
    from reports.advise import advise
    from sinks.clickhouse import StoreError
    from sinks.query_server import open_reader
    from sinks.readonly import ReadLimits

    try:
        reader = open_reader(settings.clickhouse_url(), Path(settings.data_dir),
                             ReadLimits.from_settings(settings.clickhouse))
        try:
            advice = advise(reader, DEMO_ADVISE)
        finally:
            reader.close()
    except StoreError as exc:
        return f"not available ({exc})"
    return str(advice["headline_text"])
