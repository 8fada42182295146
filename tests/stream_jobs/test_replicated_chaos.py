"""A replicated Kafka (``gpulens kafka up --brokers 3``: three KRaft nodes, every topic with 3
replicas and ``min.insync.replicas`` 2) loses no sample when partition leaders die.

A scenario's records, made by the agents' sampling and the watcher's translation code and written
by the producer both use (``acks=all``, idempotent), go through 3 stream workers and 2 sinks while
the broker leading a partition of the input, internal, changelog and output topics is SIGKILLed and
restarted, twice each, one broker at a time, one of them down for 30 s. Then the report equals the
in-process one byte for byte, the sinks' stores hold every GPU sample once by its natural key, no
worker or sink exited in a loop, and both consumer groups are back to no lag within 2 minutes of
the last restart. The two sinks are static members of one group, each with its own embedded store
(chDB: one process per store): a sample both stored would count twice."""

from __future__ import annotations

import contextlib
import io
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from common.kafka import PartitionReplicas, group_lag, partition_replicas, topic_configs
from common.settings import CommonSettings, KafkaSettings, load_settings
from gpulens.cli import main
from gpulens.kafka_local import LocalKafka
from schemas.codec import decode
from schemas.messages import GpuSample
from schemas.topics import ALL_TOPICS, GPU_SAMPLES, INTERNAL_TOPICS
from simulation.fleet_state import Tick
from simulation.kafka_replay import KafkaReplay, LeaderChaos, LeaderKill
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from simulation.simulator import FleetSimulator
from sinks.clickhouse import open_store
from sinks.rows import SINK_TOPICS
from stream_jobs.pipeline import INPUT_TOPICS

pytestmark = pytest.mark.kafka

SCENARIO = Path(__file__).parent / "scenarios" / "replicated-1h-32gpu.yaml"
PLAN: tuple[tuple[str, float], ...] = (
    ("input", 0.0), ("internal", 0.0), ("changelog", 30.0), ("output", 0.0),
    ("input", 0.0), ("internal", 0.0), ("changelog", 0.0), ("output", 0.0),
)
"""(role, seconds down) of each leader kill, in order; 0: restarted once another replica leads."""
PACE_S = 0.4
"""Between two ticks while a kill is under way, so that records flow through every failover."""
LAG_RECOVERY_S = 120.0


def _free_port_block(size: int) -> int:
    """A base port such that ``base .. base + size - 1`` are all free on loopback now."""
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(20_000, 40_000, 2)
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + size):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError("no block of free loopback ports")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """Three nodes, as `gpulens kafka up --brokers 3` runs them (its own ports and data dir)."""
    base = _free_port_block(6)
    settings = load_settings(CommonSettings)
    kafka = LocalKafka(home=tmp_path_factory.mktemp("replicated") / "kafka", cache=settings.local_kafka.cache_dir,
                       version=settings.local_kafka.version, port=base, controller_port=base + 1, heap_mb=384,
                       brokers=3)
    kafka.up(progress=False, timeout_s=240)
    try:
        yield kafka
    finally:
        kafka.down()


def _replicas_seen(kafka: KafkaSettings, names: list[str], timeout_s: float = 30.0) -> dict[tuple[str, int],
                                                                                          PartitionReplicas]:
    """The partitions of ``names`` once every broker a client may ask knows them all (a new topic
    reaches each broker's metadata a moment after the controller has it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        replicas = partition_replicas(kafka, names)
        if {topic for topic, _p in replicas} == set(names) or time.monotonic() > deadline:
            return replicas
        time.sleep(0.5)


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_the_cli_runs_three_brokers_and_replicates_every_topic(cluster: LocalKafka, tmp_path: Path) -> None:
    flags = ("--brokers", "3", "--port", str(cluster.port), "--controller-port", str(cluster.controller_port),
             "--data-dir", str(cluster.home.parent))
    code, said, _err = _cli("kafka", "status", *flags)
    assert code == 0 and said.count("running (pid") == 3 and said.count("answering") == 3, said
    code, said, _err = _cli("kafka", "up", *flags)
    assert code == 0 and "already running" in said and cluster.bootstrap in said, said
    # a single broker on the same data dir is refused while the cluster runs
    code, _out, err = _cli("kafka", "up", *flags[2:])
    assert code == 2 and "3 broker(s)" in err and "gpulens kafka down" in err, err

    prefix = f"repl{int(time.time() * 1000) % 10**9}"
    code, said, err = _cli("topics", "create", "--bootstrap-servers", cluster.bootstrap, "--topic-prefix", prefix)
    assert code == 0 and "(replication factor 3, min.insync.replicas 2)" in said, said + err
    names = [line.split()[1] for line in said.splitlines() if line.startswith("created  ")]
    assert len(names) == len(ALL_TOPICS), said
    replicas = _replicas_seen(cluster.client(), names)
    assert replicas and {len(p.replicas) for p in replicas.values()} == {3}, replicas
    assert {c["min.insync.replicas"] for c in topic_configs(cluster.client(), names).values()} == {"2"}

    code, said, err = _cli("check", "--json", "--only", "kafka,topics", "--topic-prefix", prefix,
                           "--bootstrap-servers", cluster.bootstrap, "--data-dir", str(tmp_path), "--timeout", "10")
    assert said, err
    results = {r["name"]: r for r in orjson.loads(said)["results"]}
    assert results["kafka"]["state"] == "ok" and "3 broker(s)" in results["kafka"]["detail"], results
    assert results["replication"]["state"] == "ok", results
    assert "replication factor 3, min.insync.replicas 2, 3 broker(s)" in results["replication"]["detail"]


def _json(report: dict[str, object]) -> bytes:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2)


def _readings(ticks: list[Tick]) -> int:
    """GPU readings the simulated agents wrote: one row each in ``gpu_samples``."""
    return sum(len(decode(record.value, GpuSample).gpus) for tick in ticks for record in tick.records
               if record.topic == GPU_SAMPLES.suffix and record.value is not None)


def _segments(ticks: list[Tick], parts: int) -> list[list[Tick]]:
    size = -(-len(ticks) // parts)
    return [ticks[i * size:(i + 1) * size] for i in range(parts)]


def _kill_in_background(chaos: LeaderChaos, role: str, down_s: float, say: list[str]) -> tuple[threading.Thread,
                                                                                               list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            chaos.kill(role, down_s, say.append)
        except BaseException as exc:  # raised again in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"kill-{role}", daemon=True)
    thread.start()
    return thread, errors


def _wait_no_lag(replay: KafkaReplay, since: float) -> dict[str, float]:
    """Seconds from ``since`` until each group has committed everything it reads: the workers'
    inputs and their stages' internal inputs (the control topic's marks included), every topic the
    sinks store."""
    worker_topics = (*INPUT_TOPICS, *INTERNAL_TOPICS)
    groups = {replay.app_id: [spec.name(replay.prefix) for spec in worker_topics],
              replay.sink_group: [spec.name(replay.prefix) for spec in SINK_TOPICS]}
    recovered: dict[str, float] = {}
    deadline = since + LAG_RECOVERY_S + 60
    while len(recovered) < len(groups) and time.monotonic() < deadline:
        for group, topics in groups.items():
            if group not in recovered and group_lag(replay.kafka, group, topics, timeout_s=10) == 0:
                recovered[group] = time.monotonic() - since
        time.sleep(1.0)
    lags = {(group, topic): lag for group, topics in groups.items() if group not in recovered
            for topic in topics if (lag := group_lag(replay.kafka, group, [topic]))}
    assert not lags, f"still behind {LAG_RECOVERY_S + 60:.0f}s after the last restart: {lags}"
    return recovered


def _stored_samples(urls: list[str]) -> tuple[int, set[tuple[str, str, int, str]], list[int], list[int]]:
    """(rows, distinct natural keys over every store, rows per store) of ``gpu_samples``, without
    FINAL, and the rows of every table per store."""
    keys: set[tuple[str, str, int, str]] = set()
    rows, per_store, everything = 0, [], []
    for url in urls:
        store = open_store(url)
        try:
            found = store.query("SELECT node, agent_boot_id, seq, gpu_uuid FROM gpu_samples").rows
            everything.append(int(store.query("SELECT sum(rows) FROM system.parts WHERE active "
                                              "AND database = currentDatabase()").rows[0][0] or 0))
        finally:
            store.close()
        per_store.append(len(found))
        rows += len(found)
        keys |= {(str(n), str(b), int(s), str(g)) for n, b, s, g in found}
    return rows, keys, per_store, everything


def test_leaders_die_twice_per_role_and_nothing_is_lost_or_doubled(cluster: LocalKafka, tmp_path: Path) -> None:
    started = time.monotonic()
    scenario = load_scenario(SCENARIO)
    expected = run_in_process(scenario).report
    ticks = list(FleetSimulator(scenario).run())
    readings = _readings(ticks)
    settings = load_settings(CommonSettings, kafka={"bootstrap_servers": cluster.bootstrap}, data_dir=tmp_path)
    replay = KafkaReplay(scenario, settings, workers=3, sinks=2, work_dir=tmp_path / "replay")
    said: list[str] = []
    succeeded = False
    try:
        replay.create_topics()
        replay.start_workers()
        for worker in replay.workers:
            replay.wait_consuming(worker)
        for sink in replay.sinks:
            deadline = time.monotonic() + 120
            while not sink.logged_since_start("partitions assigned") and time.monotonic() < deadline:
                assert sink.alive(), sink.tail()
                time.sleep(0.2)
            assert sink.logged_since_start("partitions assigned"), sink.tail()
        roles = replay.partition_roles()
        every = [topic for topics in roles.values() for topic in topics]
        replicas = _replicas_seen(replay.kafka, every)
        assert {len(p.replicas) for p in replicas.values()} == {3}, "every topic of the replay has 3 replicas"
        assert len({topic for topic, _p in replicas}) == len(every), sorted(set(every) - {t for t, _p in replicas})
        assert {c.get("min.insync.replicas") for c in topic_configs(replay.kafka, every).values()} == {"2"}

        chaos = LeaderChaos(cluster, replay.kafka, roles)
        segments = _segments(ticks, len(PLAN) + 1)
        for (role, down_s), segment in zip(PLAN, segments, strict=False):
            thread, errors = _kill_in_background(chaos, role, down_s, said)
            for tick in segment:
                replay.send([tick])
                replay.supervise(said.append, chaos=True)
                if thread.is_alive():
                    time.sleep(PACE_S)
            while thread.is_alive():
                replay.supervise(said.append, chaos=True)
                thread.join(0.5)
            assert not errors, f"{errors[0]!r}\n" + "\n".join(said)
        replay.send(segments[-1])
        replay.finish()
        done = replay.wait_done(300, said.append, chaos=True)
        outputs = replay.outputs = replay.read_outputs(done)
        report = replay.report(outputs)
        lag_s = _wait_no_lag(replay, chaos.kills[-1].restarted_at)
        log = "\n".join(said)

        assert _json(report) == _json(expected), log
        kills: list[LeaderKill] = chaos.kills
        assert [k.role for k in kills] == [role for role, _down in PLAN], log
        assert all(k.failover_s is not None and k.new_leader != k.broker for k in kills), log
        assert max(k.down_s for k in kills) >= 30.0, log
        assert max(lag_s.values()) <= LAG_RECOVERY_S, lag_s
        restarts = {w.log_path.name: w.starts for w in [*replay.workers, *replay.sinks]}
        assert max(restarts.values()) <= 2, f"a worker or sink exited more than once: {restarts}\n{log}"

        for sink in replay.sinks:
            sink.stop(60)
        urls = replay.sink_store_urls()
        assert len(urls) == 2, urls
        rows, keys, per_store, everything = _stored_samples(urls)
        assert rows == len(keys) == readings, f"{rows} rows, {len(keys)} natural keys, {readings} readings " \
                                              f"written (per store {per_store})"
        assert all(everything), f"the two sinks split the partitions: rows per store {everything}"
        succeeded = True
        print(f"\nreplicated chaos: {len(kills)} leader kills in {time.monotonic() - started:.0f}s; "
              + "; ".join(f"{k.role} {k.topic.rsplit('.', 2)[-2] if '.' in k.topic else k.topic}[{k.partition}] "
                          f"broker {k.broker}: failover {k.failover_s:.1f}s, down {k.down_s:.1f}s, "
                          f"in sync {k.rejoin_s:.1f}s after restart" for k in kills)
              + f"; lag 0 after {', '.join(f'{g}: {s:.1f}s' for g, s in lag_s.items())}; "
              f"starts {restarts}; samples {rows} in stores {per_store}; rows per store {everything}")
    finally:
        replay.close(keep_work_dir=not succeeded)
