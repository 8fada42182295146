"""Scenarios through real Kafka: the fleet driver, and ``gpulens replay --kafka``.

:class:`KafkaFleetDriver` puts a simulator's ticks on the input topics and, after each tick is
delivered, writes a watermark *mark* to the stream jobs' control topic: the tick's time and the
last offset written to every input partition so far. The workers apply exactly the inputs a mark
covers, then advance event time to the mark (minus the allowed lateness) — so a burst replay, a
wall-clock demo and the in-process replay all give the same results (docs/stream_jobs.md). The
driver knows nothing about replays: the demo uses it at wall-clock pace.

:class:`KafkaReplay` runs a whole scenario: fresh topics under a fresh prefix, one or more
``gpulens worker`` child processes of one consumer group (``watermark_source=control``, each with
its own data dir, log and static member id), the driver, a wait for the workers' ``done`` marker,
then the output topics are read back and turned into FORMAT.md's report by the same
:func:`simulation.replay.build_report` as in-process. Outputs are read deduplicated by their
deterministic ids (at-least-once transport may deliver one twice after a worker restart). A
:class:`ChaosPlan` kills, adds and removes workers and stops the broker while the driver sends.
With ``sinks``, ``gpulens sink`` processes of one consumer group store the topics as well.

On a replicated cluster (``gpulens kafka up --brokers 3``) :class:`LeaderChaos` SIGKILLs the
broker that leads a partition of the replay's input, internal, changelog or output topics, watches
the partition's leadership move to another replica, and restarts the broker once the cluster has
it back in every in-sync replica set, one broker at a time; a chaos plan's outage is such a kill
there (:meth:`KafkaReplay.run`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson

from common.errors import UserError
from common.kafka import (
    AdminRequestFailed,
    BoundedProducer,
    KafkaException,
    PartitionReplicas,
    ReadRecord,
    delete_prefixed,
    ensure_topics,
    partition_replicas,
    read_to_end,
)
from common.processes import terminate_as_interrupt, uninterrupted
from common.settings import CommonSettings, KafkaSettings, ProducerSettings, SinkSettings, load_settings
from schemas.codec import MessageError, decode
from schemas.control import STATE_TOPICS, DeliveredOffsets, state_mark_value
from schemas.messages import DEFAULT_CLUSTER, Message, scoped_key
from schemas.topics import (
    ALERTS,
    ALL_TOPICS,
    CLUSTER_CAPACITY,
    DEADLETTER,
    GPU_SAMPLES,
    INTERNAL_CONTROL,
    INTERNAL_TOPICS,
    POD_LIFECYCLE,
    POD_WINDOWS,
    TopicSpec,
    key_partition,
    node_stage_topics,
)
from simulation.fleet_state import SimulatedRecord, Tick
from simulation.replay import DEFAULT_LATENESS_S, build_report, engine_config
from simulation.scenario import Scenario
from simulation.simulator import FleetSimulator
from stream_jobs.offsets import EXIT_STALLED
from stream_jobs.watermark import Mark

OUTPUT_TOPICS: tuple[TopicSpec, ...] = (POD_WINDOWS, CLUSTER_CAPACITY, POD_LIFECYCLE, ALERTS)
DEFAULT_NODE_PARTITIONS = 4
CHAOS_READ_AHEAD_BYTES = 64 * 1024
"""A chaos replay's workers park at most this much of each node partition's samples ahead of the
marks (the worker's default is 16 MiB): partitions pause and resume their samples all along, so the
read-ahead bound goes through the kills, rebalances and outage too."""
PAUSE_EVENT = '"samples read ahead of the marks; pausing them"'
"""A worker's log line (JSON) when a node partition pauses its samples."""
_COMPACTED = {spec.suffix for spec in ALL_TOPICS if spec.cleanup_policy == "compact"}


def _epoch(ts: datetime) -> float:
    return ts.timestamp()


class KafkaFleetDriver:
    """Produces ticks to the input topics and a watermark mark after each (see module doc)."""

    def __init__(self, kafka: KafkaSettings, prefix: str, producer: ProducerSettings | None = None,
                 sample_partitions: int | None = None) -> None:
        self.prefix = prefix
        self.sample_partitions = sample_partitions
        """The partition count of the samples topic: a sample goes to its node's partition (below)."""
        self.control_topic = INTERNAL_CONTROL.name(prefix)
        # every input a scenario writes (poison records included), so that a mark covers them all
        self._offsets = DeliveredOffsets(None, exclude=frozenset({self.control_topic}))
        self._failed: list[str] = []
        self._producer = BoundedProducer(kafka, producer or ProducerSettings(linger_ms=5),
                                         on_delivery_report=self._delivered)
        self.ticks_sent = 0
        self.records_sent = 0

    def _delivered(self, topic: str, partition: int, offset: int, ok: bool) -> None:
        if not ok:
            self._failed.append(topic)
        self._offsets(topic, partition, offset, ok)

    def _produce(self, topic: str, key: str | None, value: bytes | None, partition: int | None = None) -> None:
        while not self._producer.produce(topic, key=key, value=value, partition=partition):
            self._producer.poll(0.05)

    def _sample_partition(self, value: bytes | None) -> int | None:
        """The partition of the node a sample names: where the agent, keying it by node, puts it
        (``key_partition``), and where the node stage reading that partition has the node's state.
        The same as its key's for every sample the simulator makes; a scenario's poison keyed
        otherwise lands there too, so that a replay through Kafka applies what in-process applies.
        None (placed by its key) when the value names no node."""
        if self.sample_partitions is None or value is None:
            return None
        try:
            data = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("node"), str):
            return None
        cluster = data.get("cluster")
        key = scoped_key(cluster if isinstance(cluster, str) else DEFAULT_CLUSTER, data["node"])
        return key_partition(key.encode(), self.sample_partitions)

    def _flush(self) -> None:
        left = self._producer.flush(60)
        if left or self._failed:
            raise RuntimeError(f"could not deliver to Kafka ({left} queued, failed: {sorted(set(self._failed))})")

    def _mark(self, ts: datetime, end: bool) -> dict[str, Any]:
        mark = Mark(seq=self._offsets.next_seq(), ts=_epoch(ts), offsets=self._offsets.snapshot(), end=end)
        self._produce(self.control_topic, None, mark.encode())
        return mark.to_dict()

    def state_mark(self, before: datetime, cluster: str = DEFAULT_CLUSTER) -> None:
        """What the cluster watcher writes live (``schemas.control``): the pod and node records of
        the ticks sent so far, observed before ``before``, are at or below their delivered offsets."""
        self._flush()
        state_topics = {topic.name(self.prefix) for topic in STATE_TOPICS}
        offsets = {key: off for key, off in self._offsets.snapshot().items() if key.rpartition(":")[0] in state_topics}
        self._produce(self.control_topic, None,
                      state_mark_value(self._offsets.next_seq(), _epoch(before), cluster, offsets))
        self._flush()

    def send_records(self, records: list[SimulatedRecord]) -> None:
        """Produce records and wait for their delivery (no mark: live workers mark time themselves)."""
        for record in records:
            key = record.key
            if key is None and record.topic in _COMPACTED:
                key = "unkeyed"  # a compacted topic refuses keyless records (a scenario's poison may have none)
            partition = self._sample_partition(record.value) if record.topic == GPU_SAMPLES.suffix else None
            self._produce(f"{self.prefix}.{record.topic}", key, record.value, partition)
        self._flush()
        self.records_sent += len(records)

    def send_tick(self, tick: Tick) -> dict[str, Any]:
        """Produce the tick's records, wait for their delivery, then write its mark."""
        self.send_records(tick.records)
        self.ticks_sent += 1
        mark = self._mark(tick.ts, end=False)
        self._producer.poll(0)
        return mark

    def finish(self, end: datetime) -> dict[str, Any]:
        """The input is complete: the workers flush everything at ``end``."""
        self._flush()
        mark = self._mark(end, end=True)
        self._flush()
        return mark

    def close(self) -> None:
        self._producer.close(10)


# --------------------------------------------------------------------------- the worker child


def child_env(settings: CommonSettings, prefix: str, data_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    """Environment of a ``gpulens`` child process: this process's Kafka connection (secrets
    included) and producer settings, the topic prefix and data dir, JSON logs; ``extra`` settings on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    kafka = settings.kafka.model_dump(mode="json", exclude_none=True)
    for secret in ("sasl_password", "ssl_key_password"):
        value = getattr(settings.kafka, secret)
        if value is not None:
            kafka[secret] = value.get_secret_value()
    env.update({
        "GPULENS_KAFKA": json.dumps(kafka),
        "GPULENS_PRODUCER": json.dumps(settings.producer.model_dump(mode="json")),
        "GPULENS_TOPICS": json.dumps(settings.topics.model_dump(mode="json")),
        "GPULENS_TOPIC_PREFIX": prefix,
        "GPULENS_DATA_DIR": str(data_dir),
        "GPULENS_LOG_FORMAT": "json",
        "GPULENS_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    })
    if settings.clickhouse.url:
        env["GPULENS_CLICKHOUSE__URL"] = settings.clickhouse.url
    env.update(extra)
    return env


def _worker_env(settings: CommonSettings, prefix: str, data_dir: Path, scenario: Scenario, lateness_s: float,
                node_partitions: int, app_id: str, index: int = 0) -> dict[str, str]:
    config = engine_config(scenario)
    return child_env(settings, prefix, data_dir, {
        "GPULENS_WATERMARK_SOURCE": "control",
        "GPULENS_LATENESS_S": repr(lateness_s),
        "GPULENS_APP_ID": app_id,
        "GPULENS_GROUP_INSTANCE_ID": f"{app_id}-{index}",
        "GPULENS_WEB_PORT": "0",
        "GPULENS_METRICS_PORT": "0",
        "GPULENS_NODE_INPUT_PARTITIONS": str(node_partitions),
        "GPULENS_WINDOW_S": repr(config.window_s),
        "GPULENS_SAMPLE_INTERVAL_S": repr(config.sample_interval_s),
        "GPULENS_PRICES_USD_PER_GPU_HOUR": json.dumps(dict(config.prices_usd_per_gpu_hour)),
        "GPULENS_THRESHOLDS": json.dumps(config.thresholds.to_dict()),
    })


@dataclass
class WorkerProcess:
    """A ``gpulens`` child process (by default the stream worker) in its own session, with its log file."""

    env: dict[str, str]
    log_path: Path
    args: tuple[str, ...] = ("worker", "--stage", "all")
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    log_offset: int = 0
    """Size of the log when the process was started last."""

    @property
    def name(self) -> str:
        return self.args[0]

    def start(self) -> None:
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out, uninterrupted():  # terminated meanwhile, it is still stopped
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpulens", *self.args], stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
            self.starts += 1

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no commit, no flush — a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def logged_since_start(self, text: str) -> bool:
        """Whether the process started last has logged a line containing ``text``."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                return text.encode() in log.read()
        except OSError:
            return False

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# --------------------------------------------------------------------------- the replay


@dataclass
class KafkaOutputs:
    """What the workers wrote, read back: outputs deduplicated by id, dead letters by source."""

    outputs: list[Message]
    deadletters: list[ReadRecord]
    alert_records: list[ReadRecord]
    duplicates: int
    done: dict[str, Any] = field(default_factory=dict)


class KafkaReplay:
    """One scenario through topics and a real worker. ``run()`` does it all; the steps are public
    so tests can crash the worker in the middle."""

    def __init__(self, scenario: Scenario, settings: CommonSettings, lateness_s: float = DEFAULT_LATENESS_S,
                 topic_prefix: str | None = None, node_partitions: int = DEFAULT_NODE_PARTITIONS,
                 work_dir: Path | None = None, workers: int = 1, worker_settings: dict[str, str] | None = None,
                 sinks: int = 0) -> None:
        self.scenario = scenario
        self.worker_settings = dict(worker_settings or {})
        """``GPULENS_*`` settings given to every worker on top of the replay's own."""
        self.settings = settings
        self.kafka = settings.kafka
        self.lateness_s = lateness_s
        self.prefix = topic_prefix or f"replay{uuid.uuid4().hex[:10]}"
        self._own_prefix = topic_prefix is None
        self.app_id = f"{self.prefix}-stream-jobs"
        """The workers' faust application id: their consumer group and the prefix of their changelogs."""
        self.node_partitions = node_partitions
        self._own_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="gpulens-replay-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.simulator = FleetSimulator(scenario)
        self.workers: list[WorkerProcess] = []
        """The worker processes of the group (one consumer group; a removed one stays listed)."""
        self.removed: set[int] = set()
        for _ in range(workers):
            self.add_worker()
        self.sink_group = f"{self.prefix}-sink"
        """The sinks' consumer group."""
        self.sinks: list[WorkerProcess] = [self._sink(index) for index in range(sinks)]
        """``gpulens sink`` processes of one group (static members), started with the workers."""
        self.driver: KafkaFleetDriver | None = None
        self.end_mark: dict[str, Any] | None = None
        self.done_at_ms: int | None = None
        """When a worker wrote ``done`` for the end mark (its record's create time), once seen."""
        self.unplanned_restarts = 0
        self.outputs: KafkaOutputs | None = None
        """What :meth:`run` read back."""

    @property
    def worker(self) -> WorkerProcess:
        """The first worker process (the only one unless ``workers`` > 1)."""
        return self.workers[0]

    def add_worker(self) -> WorkerProcess:
        """A new worker process of the group (not started): its own data dir, log and instance id."""
        index = len(self.workers)
        name = "worker" if index == 0 else f"worker-{index}"
        env = _worker_env(self.settings, self.prefix, self.work_dir / name, self.scenario, self.lateness_s,
                          self.node_partitions, self.app_id, index)
        worker = WorkerProcess(env | self.worker_settings, self.work_dir / f"{name}.log")
        self.workers.append(worker)
        return worker

    def _sink(self, index: int) -> WorkerProcess:
        """A ``gpulens sink`` of the replay's group (not started), with the settings that store the
        scenario whole (:func:`simulation.store.store_settings`: TTLs that keep its dates, its
        prices). Each has its own embedded store under its data dir (chDB: one process per store)
        unless the settings name a ClickHouse server, which they then share."""
        from simulation.store import store_settings

        stored, _lengthened = store_settings(self.scenario, load_settings(SinkSettings))
        data_dir = self.work_dir / f"sink-{index}"
        env = child_env(self.settings, self.prefix, data_dir, {
            "GPULENS_GROUP_ID": self.sink_group,
            "GPULENS_GROUP_INSTANCE_ID": f"{self.sink_group}-{index}",
            "GPULENS_METRICS_PORT": "0",
            "GPULENS_RAW_SAMPLE_TTL_DAYS": str(stored.raw_sample_ttl_days),
            "GPULENS_STATE_TTL_DAYS": str(stored.state_ttl_days),
            "GPULENS_ROLLUP_TTL_DAYS": str(stored.rollup_ttl_days),
            "GPULENS_MAX_FUTURE_SKEW_S": repr(stored.max_future_skew_s),
            "GPULENS_PRICES_USD_PER_GPU_HOUR": json.dumps(stored.prices_usd_per_gpu_hour),
        })
        if self.settings.clickhouse_target().embedded:
            env["GPULENS_CLICKHOUSE__URL"] = f"chdb://{data_dir / 'clickhouse'}"
        return WorkerProcess(env, self.work_dir / f"sink-{index}.log", ("sink",))

    def sink_store_urls(self) -> list[str]:
        """The ClickHouse target of each sink (one shared server, or an embedded store each)."""
        return sorted({sink.env.get("GPULENS_CLICKHOUSE__URL", "") for sink in self.sinks})

    def active(self) -> list[tuple[int, WorkerProcess]]:
        """The workers meant to run (started and not removed)."""
        return [(i, w) for i, w in enumerate(self.workers) if i not in self.removed and w.starts]

    def start_workers(self) -> None:
        for worker in [*self.workers, *self.sinks]:
            worker.start()

    def create_topics(self) -> None:
        node_topics = node_stage_topics(self.node_partitions)  # the samples with node-inputs' partition count
        names = {spec.suffix for spec in node_topics}
        ensure_topics(self.kafka, [*(spec for spec in ALL_TOPICS if spec.suffix not in names), *node_topics],
                      self.prefix, self.settings.topics)

    def partition_roles(self) -> dict[str, list[str]]:
        """The replay's topics by role: what the producers write (``input``), what the workers pass
        between their stages (``internal``), their tables' changelogs (``changelog``), what they
        write for the sink and the readers (``output``)."""
        from stream_jobs.faust_app import CLUSTER_TABLE, NODE_TABLE

        outputs = {spec.suffix for spec in OUTPUT_TOPICS}
        internal = {spec.suffix for spec in INTERNAL_TOPICS}
        return {
            "input": [spec.name(self.prefix) for spec in ALL_TOPICS
                      if spec.suffix not in outputs and spec.suffix not in internal and spec is not DEADLETTER],
            "internal": [spec.name(self.prefix) for spec in INTERNAL_TOPICS],
            "changelog": [f"{self.app_id}-{table}-changelog" for table in (NODE_TABLE, CLUSTER_TABLE)],
            "output": [spec.name(self.prefix) for spec in OUTPUT_TOPICS],
        }

    def ticks(self) -> list[Tick]:
        return list(self.simulator.run())

    def send(self, ticks: list[Tick]) -> None:
        if self.driver is None:
            self.driver = KafkaFleetDriver(self.kafka, self.prefix, sample_partitions=self.node_partitions)
        for tick in ticks:
            self.driver.send_tick(tick)

    def finish(self) -> None:
        assert self.driver is not None
        end = self.scenario.start + timedelta(seconds=self.scenario.end_offset_s)
        self.end_mark = self.driver.finish(end)

    def wait_done(self, timeout_s: float = 300.0, say: Callable[[str], None] = lambda line: None,
                  chaos: bool = False) -> dict[str, Any]:
        """Wait for the workers' ``done`` marker of the end mark; returns its counters. Workers
        that exit on their own meanwhile are handled by :meth:`supervise`."""
        assert self.end_mark is not None
        deadline = time.monotonic() + timeout_s
        control = INTERNAL_CONTROL.name(self.prefix)
        while time.monotonic() < deadline:
            for record in read_to_end(self.kafka, control, timeout_s=30):
                data = orjson.loads(record.value or b"{}")
                if data.get("k") == "done" and data.get("seq") == self.end_mark["seq"]:
                    self.done_at_ms = record.timestamp_ms
                    return dict(data.get("stats") or {})
            self.supervise(say, chaos)
            time.sleep(0.5)
        raise self._worker_error(f"the stream workers did not finish within {timeout_s:.0f}s", self.worker)

    def supervise(self, say: Callable[[str], None], chaos: bool = False) -> None:
        """What a process supervisor does with a worker that exited on its own: restart it when it
        asked to be (exit ``EXIT_STALLED``: a partition stalled), or, in a chaos run, whatever the
        exit (at most ``MAX_UNPLANNED_RESTARTS`` times); else fail the replay with its log."""
        running = [(f"worker {index}", worker) for index, worker in self.active()]
        running += [(f"sink {index}", sink) for index, sink in enumerate(self.sinks) if sink.starts]
        for name, worker in running:
            if worker.alive():
                continue
            code = worker.process.returncode if worker.process else None
            if (not chaos and code != EXIT_STALLED) or self.unplanned_restarts >= MAX_UNPLANNED_RESTARTS:
                raise self._worker_error(f"the {'sink' if worker.name == 'sink' else 'stream worker'} stopped "
                                         f"(exit {code})", worker)
            self.unplanned_restarts += 1
            worker.start()
            pid = worker.process.pid if worker.process else None
            say(f"{name} exited by itself (exit {code}); restarted (pid {pid})")

    def read_outputs(self, done: dict[str, Any]) -> KafkaOutputs:
        outputs: list[Message] = []
        seen: set[tuple[str, ...]] = set()
        duplicates = 0
        alert_records: list[ReadRecord] = []
        for spec in OUTPUT_TOPICS:
            records = read_to_end(self.kafka, spec.name(self.prefix))
            if spec is ALERTS:
                alert_records = records
            for record in records:
                try:
                    message = decode(record.value, spec.message)
                except MessageError as exc:
                    raise RuntimeError(f"{spec.name(self.prefix)} holds an invalid record: {exc}") from None
                key = _identity(message)
                if key in seen:
                    duplicates += 1
                    continue
                seen.add(key)
                outputs.append(message)
        outputs.sort(key=_canonical_order)
        letters: dict[tuple[bytes, bytes, bytes], ReadRecord] = {}
        for record in read_to_end(self.kafka, DEADLETTER.name(self.prefix)):
            source = (record.headers.get("source_topic", b""), record.headers.get("source_partition", b""),
                      record.headers.get("source_offset", b""))
            letters.setdefault(source, record)
        return KafkaOutputs(outputs, list(letters.values()), alert_records, duplicates, done)

    def report(self, outputs: KafkaOutputs) -> dict[str, Any]:
        stats = {"deadletters": len(outputs.deadletters),
                 "late_samples_dropped": int(outputs.done.get("late_samples_dropped", 0)),
                 "sample_gaps": int(outputs.done.get("sample_gaps", 0))}
        return build_report(self.scenario, outputs.outputs, self.simulator.pod_uids(),
                            stats)

    def close(self, keep_work_dir: bool = False) -> None:
        """Stop the workers and the driver; remove the work directory this replay made, unless
        ``keep_work_dir`` (a failed run: its workers' logs explain it)."""
        for worker in [*self.workers, *self.sinks]:
            worker.stop()
        if self.driver is not None:
            self.driver.close()
        if self._own_dir and not keep_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _worker_error(self, what: str, worker: WorkerProcess) -> UserError:
        return UserError(f"{what}; last lines of {worker.log_path}:\n{worker.tail()}\n"
                         f"(the logs of every worker are kept in {self.work_dir})")

    def run(self, timeout_s: float = 300.0, chaos: ChaosPlan | None = None,
            say: Callable[[str], None] = lambda line: None, broker: BrokerControl | None = None,
            store: Callable[[str], None] | None = None) -> dict[str, Any]:
        """The whole replay; with ``chaos``, its actions (SIGKILL and restart a worker, add and
        remove one, stop the broker: ``broker``) happen on its schedule, each reported through
        ``say``; a worker that exits on its own is then restarted too. A run that fails keeps its
        work directory (every worker's log) and its error names it. Terminated (SIGTERM), it stops
        its workers as when it is interrupted. ``store``: called with the topic prefix once the
        outputs are read, before the topics are removed (``replay --kafka --store`` drains them into
        the history with the sink)."""
        with terminate_as_interrupt():
            return self._run(timeout_s, chaos, say, broker, store)

    def _run(self, timeout_s: float, chaos: ChaosPlan | None, say: Callable[[str], None],
             broker: BrokerControl | None, store: Callable[[str], None] | None = None) -> dict[str, Any]:
        succeeded = False
        try:
            self.create_topics()
            self.start_workers()
            ticks = self.ticks()
            if chaos is None:
                self.send(ticks)
            else:
                self._send_with_chaos(ticks, chaos, say, broker)
            self.finish()
            done = self.wait_done(timeout_s, say, chaos=chaos is not None)
            outputs = self.outputs = self.read_outputs(done)
            if chaos is not None:
                say(f"chaos: done; {sum(w.starts for w in self.workers)} worker starts, "
                    f"{self.unplanned_restarts} unplanned restarts, {outputs.duplicates} duplicate outputs dropped, "
                    f"{self.read_ahead_pauses()} read-ahead pauses")
            report = self.report(outputs)
            if store is not None:
                store(self.prefix)
            succeeded = True
            return report
        finally:
            self.close(keep_work_dir=not succeeded and any(worker.starts for worker in self.workers))
            if succeeded and self._own_prefix:
                self.remove_topics(say)

    def read_ahead_pauses(self) -> int:
        """How often the workers' node partitions paused their samples (said in their logs)."""
        return sum(worker.log_path.read_text(errors="replace").count(PAUSE_EVENT)
                   for worker in self.workers if worker.log_path.exists())

    def remove_topics(self, say: Callable[[str], None] = lambda line: None) -> None:
        """Delete the topics of this replay's prefix (its workers' changelogs included). A replay
        with a generated prefix (nobody can name its topics in advance) that succeeded leaves no
        topic on the cluster; one that failed keeps them, as it keeps its work directory, to be
        looked into. (The consumer group's offsets go with the topics; the empty group expires.)"""
        try:
            removed = delete_prefixed(self.kafka, [f"{self.prefix}.", f"{self.app_id}-"])
        except AdminRequestFailed as exc:
            say(f"the topics under the prefix {self.prefix} were not deleted: {exc}")
            return
        say(f"deleted the replay's {len(removed)} topics (prefix {self.prefix})")

    def _send_with_chaos(self, ticks: list[Tick], chaos: ChaosPlan, say: Callable[[str], None],
                         broker: BrokerControl | None) -> None:
        sent = 0
        leaders: LeaderChaos | None = None
        for action in chaos.actions:
            self.send(ticks[sent:action.tick])
            sent = action.tick
            self.supervise(say, chaos=True)
            where = f"chaos: tick {action.tick}/{len(ticks)} sent, +{action.delay_s:.2f}s:"
            if action.kind == "kill":
                worker = self.workers[action.worker]
                self.wait_consuming(worker)
                time.sleep(action.delay_s)  # the worker is in the middle of what was just sent
                pid = worker.process.pid if worker.process else None
                worker.kill()
                say(f"{where} SIGKILL worker {action.worker} (pid {pid})")
                worker.start()
                say(f"chaos: worker {action.worker} restarted (pid {worker.process.pid if worker.process else None})")
            elif action.kind == "add":
                time.sleep(action.delay_s)
                worker = self.add_worker()
                worker.start()
                pid = worker.process.pid if worker.process else None
                say(f"{where} worker {len(self.workers) - 1} added (pid {pid}): the group rebalances")
            elif action.kind == "remove":
                time.sleep(action.delay_s)
                index = max(i for i, _w in self.active())
                self.removed.add(index)
                self.workers[index].stop()
                say(f"{where} worker {index} stopped (SIGTERM) and removed: the group rebalances")
            elif action.kind == "outage":
                if broker is None:
                    raise UserError("a broker outage needs the local broker (`gpulens kafka up`)")
                time.sleep(action.delay_s)
                if broker.brokers > 1:  # a replicated cluster: the leader of a partition dies instead
                    leaders = leaders or LeaderChaos(broker, self.kafka, self.partition_roles())
                    kill = leaders.kill(ROLES[len(leaders.kills) % len(ROLES)], chaos.outage_s, say)
                    say(f"{where} {kill.describe()}")
                    continue
                started = time.monotonic()
                broker.stop()
                say(f"{where} broker stopped")
                time.sleep(chaos.outage_s)
                broker.start()
                say(f"chaos: broker started again after {time.monotonic() - started:.1f}s")
        self.send(ticks[sent:])

    def wait_consuming(self, worker: WorkerProcess, timeout_s: float = 120.0) -> None:
        """Until ``worker`` (started last) has taken up a partition (so a kill lands in its work,
        not in its start-up); a worker of a group may own no partition: then give up after 20 s."""
        deadline = time.monotonic() + (timeout_s if len(self.active()) == 1 else 20.0)
        while not worker.logged_since_start(CONSUMING_LOG_LINE):
            if not worker.alive():
                raise self._worker_error("the stream worker stopped", worker)
            if time.monotonic() > deadline:
                if len(self.active()) > 1:
                    return
                raise UserError(f"the stream worker did not start consuming within {timeout_s:.0f}s")
            time.sleep(0.2)


MAX_UNPLANNED_RESTARTS = 10
"""How often a replay restarts workers that exited on their own before it gives up."""

CONSUMING_LOG_LINE = "partition position"
"""What a worker logs when it takes up an assigned partition (stream_jobs.faust_app.OffsetGuard)."""


class BrokerControl(Protocol):
    """Stops and starts the broker a chaos replay runs on, and each node of a cluster
    (:class:`gpulens.kafka_local.LocalKafka`)."""

    @property
    def brokers(self) -> int: ...

    def stop(self) -> None: ...

    def start(self) -> None: ...

    def kill_node(self, index: int) -> int: ...

    def start_node(self, index: int, timeout_s: float = 90.0) -> int: ...


ROLES = ("input", "internal", "changelog", "output")
"""The roles of a replay's topics whose partition leaders :class:`LeaderChaos` kills."""


@dataclass(frozen=True)
class LeaderKill:
    """One partition leader's broker SIGKILLed and restarted, and what the cluster did."""

    role: str
    topic: str
    partition: int
    broker: int
    """The broker id killed (node ``broker - 1``)."""
    pid: int
    down_s: float
    """From the SIGKILL to the restart."""
    failover_s: float | None
    """From the SIGKILL to the metadata naming another leader of the partition (None: not within ``down_s``)."""
    new_leader: int | None
    rejoin_s: float
    """From the restart to the broker back in every partition's in-sync replicas."""
    restarted_at: float
    """``time.monotonic()`` when the broker answered again."""

    def describe(self) -> str:
        moved = (f"leadership moved to broker {self.new_leader} after {self.failover_s:.1f}s"
                 if self.failover_s is not None else "no other leader while it was down")
        return (f"leader kill: broker {self.broker} (pid {self.pid}), leader of {self.role} partition "
                f"{self.topic}[{self.partition}]: {moved}; down {self.down_s:.1f}s, "
                f"back in every in-sync replica set {self.rejoin_s:.1f}s after its restart")


class LeaderChaos:
    """Kills the broker leading a partition of a role (:data:`ROLES`), one broker at a time: before
    each kill it waits until every partition of the cluster (``__consumer_offsets`` included) has all
    its replicas in sync, so no partition ever has fewer than 2 replicas alive and ``acks=all``
    writes with ``min.insync.replicas`` 2 go on throughout."""

    def __init__(self, cluster: BrokerControl, kafka: KafkaSettings, topics: dict[str, list[str]],
                 settle_timeout_s: float = 120.0) -> None:
        self.cluster = cluster
        self.kafka = kafka
        self.topics = topics
        self.settle_timeout_s = settle_timeout_s
        self.kills: list[LeaderKill] = []

    def _replicas(self, topics: list[str] | None = None) -> dict[tuple[str, int], PartitionReplicas]:
        try:
            return partition_replicas(self.kafka, topics, timeout_s=5.0)
        except KafkaException:
            return {}

    def wait_in_sync(self, timeout_s: float | None = None) -> float:
        """Until every partition has a leader and all its replicas in sync; the seconds it took."""
        started = time.monotonic()
        deadline = started + (timeout_s or self.settle_timeout_s)
        while True:
            state = self._replicas()
            lagging = sorted(key for key, p in state.items() if p.leader < 0 or set(p.isr) != set(p.replicas))
            if state and not lagging:
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise UserError(f"the cluster did not get every replica in sync within "
                                f"{timeout_s or self.settle_timeout_s:.0f}s: {lagging[:5]}")
            time.sleep(0.25)

    def target(self, role: str) -> tuple[str, int, int]:
        """(topic, partition, leader) of the role's partition to kill next: they take turns."""
        state = self._replicas(self.topics[role])
        partitions = sorted(key for key, p in state.items() if p.leader >= 0)
        if not partitions:
            raise UserError(f"no {role} partition with a leader among {self.topics[role]}")
        topic, partition = partitions[sum(k.role == role for k in self.kills) % len(partitions)]
        return topic, partition, state[(topic, partition)].leader

    def kill(self, role: str, down_s: float, say: Callable[[str], None] = lambda line: None) -> LeaderKill:
        """SIGKILL the leader of a ``role`` partition, keep it down ``down_s`` (at least until the
        partition has another leader), restart it and wait until it is back in sync everywhere."""
        self.wait_in_sync()
        topic, partition, leader = self.target(role)
        killed_at = time.monotonic()
        pid = self.cluster.kill_node(leader - 1)
        say(f"chaos: SIGKILL broker {leader} (pid {pid}), leader of {role} partition {topic}[{partition}]")
        failover_s: float | None = None
        new_leader: int | None = None
        while True:
            now = time.monotonic()
            if failover_s is None:
                current = self._replicas([topic]).get((topic, partition))
                if current is not None and current.leader >= 0 and current.leader != leader:
                    failover_s, new_leader = now - killed_at, current.leader
                    say(f"chaos: {topic}[{partition}] is led by broker {new_leader} after {failover_s:.1f}s")
            if now - killed_at >= down_s and (failover_s is not None or now - killed_at >= down_s + 60):
                break
            time.sleep(0.2)
        down = time.monotonic() - killed_at
        restarted = time.monotonic()
        self.cluster.start_node(leader - 1)
        answered = time.monotonic()
        rejoin_s = (answered - restarted) + self.wait_in_sync()
        kill = LeaderKill(role, topic, partition, leader, pid, down, failover_s, new_leader, rejoin_s, answered)
        self.kills.append(kill)
        say(f"chaos: broker {leader} restarted after {down:.1f}s down; in sync again {rejoin_s:.1f}s later")
        return kill


@dataclass(frozen=True)
class ChaosAction:
    """One chaos step, taken after the ticks before ``tick`` are sent and ``delay_s`` more:
    ``kill`` (SIGKILL worker ``worker``, restart it), ``add`` (start one more worker), ``remove``
    (stop the newest running worker for good: SIGTERM), ``outage`` (stop the broker for the plan's
    ``outage_s``, start it again)."""

    tick: int
    delay_s: float
    kind: Literal["kill", "add", "remove", "outage"]
    worker: int = 0


@dataclass(frozen=True)
class ChaosPlan:
    """What a chaos replay does, when: the actions in tick order."""

    actions: tuple[ChaosAction, ...]
    outage_s: float = 0.0

    @property
    def kills(self) -> tuple[ChaosAction, ...]:
        return tuple(a for a in self.actions if a.kind == "kill")

    @classmethod
    def seeded(cls, seed: int, ticks: int, kills: int, workers: int = 1, outage_s: float = 0.0,
               max_delay_s: float = 3.0) -> ChaosPlan:
        """From ``seed`` alone: ``kills`` SIGKILLs at distinct ticks in ``[1, ticks)`` of seeded
        workers, one worker added and later removed (a rebalance each), and with ``outage_s`` one
        broker stop of that long; each with a delay of up to ``max_delay_s``."""
        rng = random.Random(seed)
        points = sorted(rng.sample(range(1, ticks), min(kills + 3, max(ticks - 1, 0))))
        actions = []
        special = rng.sample(range(len(points)), min(3, len(points)))
        add, remove, outage = (sorted(special[:2]) + special[2:] + [-1, -1, -1])[:3]
        for index, point in enumerate(points):
            delay = round(rng.uniform(0.0, max_delay_s), 2)
            if index == add:
                actions.append(ChaosAction(point, delay, "add"))
            elif index == remove:
                actions.append(ChaosAction(point, delay, "remove"))
            elif index == outage:
                if outage_s > 0:
                    actions.append(ChaosAction(point, delay, "outage"))
            else:
                actions.append(ChaosAction(point, delay, "kill", rng.randrange(workers)))
        return cls(tuple(actions), outage_s)

    def describe(self) -> str:
        return ", ".join(f"{a.kind}{'' if a.kind != 'kill' else f' {a.worker}'}@{a.tick}" for a in self.actions)


def _identity(message: Message) -> tuple[str, ...]:
    """Deterministic output ids: what the sink deduplicates by (within the message's cluster)."""
    for attr in ("window_id",):
        if hasattr(message, attr):
            return (type(message).__name__, message.cluster, str(getattr(message, attr)))
    if hasattr(message, "state") and hasattr(message, "id"):
        return ("Alert", message.cluster, str(message.id), str(message.state))
    return (type(message).__name__, message.cluster, str(getattr(message, "pod_uid", "")))


def _canonical_order(message: Message) -> tuple[Any, ...]:
    """Capacity windows by start (the report sums them; in-process emits them in this order)."""
    start = getattr(message, "window_start", None)
    return (type(message).__name__, start.timestamp() if start is not None else 0.0)


def run_through_kafka(scenario: Scenario, bootstrap: str, lateness_s: float = DEFAULT_LATENESS_S,
                      topic_prefix: str | None = None, chaos_seed: int | None = None, kills: int = 8,
                      say: Callable[[str], None] = lambda line: None, workers: int = 1, outage_s: float = 0.0,
                      broker: BrokerControl | None = None,
                      accept_clusters: frozenset[str] | None = None,
                      store: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``gpulens replay --kafka BOOTSTRAP [--workers N] [--chaos]``: the report of ``scenario``
    through Kafka and ``workers`` worker processes of one group (with ``chaos_seed``: ``kills``
    SIGKILLs and restarts, one worker added and one removed, and with ``outage_s`` a broker
    stop/start through ``broker``, on a seeded schedule); ``accept_clusters``: the workers'
    ``GPULENS_ACCEPT_CLUSTERS``; ``store``: see :meth:`KafkaReplay.run`."""
    settings = load_settings(CommonSettings)
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": bootstrap})
    settings = settings.model_copy(update={"kafka": kafka})
    worker_settings = {} if chaos_seed is None else {"GPULENS_READ_AHEAD_BYTES": str(CHAOS_READ_AHEAD_BYTES)}
    if accept_clusters is not None:
        worker_settings["GPULENS_ACCEPT_CLUSTERS"] = ",".join(sorted(accept_clusters))
    replay = KafkaReplay(scenario, settings, lateness_s=lateness_s, topic_prefix=topic_prefix, workers=workers,
                         worker_settings=worker_settings)
    chaos = None
    if chaos_seed is not None:
        chaos = ChaosPlan.seeded(chaos_seed, sum(1 for _ in FleetSimulator(scenario).run()), kills, workers,
                                 outage_s)
        outage = "partition leader's broker kill" if broker is not None and broker.brokers > 1 else "broker outage"
        say(f"chaos: seed {chaos_seed}, {len(chaos.kills)} SIGKILLs, {workers} workers"
            f"{f', a {outage_s:.0f}s {outage}' if outage_s else ''}, read-ahead "
            f"{CHAOS_READ_AHEAD_BYTES // 1024} KiB per node partition: {chaos.describe()}")
    return replay.run(chaos=chaos, say=say, broker=broker, store=store)
