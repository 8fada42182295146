"""The faust runtime around the stages: the one module that imports faust (and mode).

faust supplies agents, partition assignment and changelog-backed tables; the event-time logic is
the plain code of :mod:`stream_jobs.node_stage` / :mod:`stream_jobs.cluster_stage`, unchanged, and
:mod:`stream_jobs.watermark` decides *when* each record is applied. Three agents:

- **route** consumes the five input topics and the internal control topic. It decodes every
  record (undecodable or invalid -> ``deadletter.v1`` with the reason and source position as
  headers; the stream goes on), forwards valid ones to ``internal.node-inputs.v1`` (keyed by
  node, per :func:`stream_jobs.pipeline.route`) and/or ``internal.cluster-inputs.v1``, and holds
  each watermark mark until it has consumed the inputs the mark covers; then it forwards the mark
  in-band to every node-inputs partition and to cluster-inputs.
- **node** (one stream over the node-inputs partitions): per partition, records wait in a gate
  until a mark releases them; then the partition's :class:`NodeStage` s (one per node, kept in the
  ``node-stages`` table) apply them and advance to ``mark.ts - lateness`` (or flush at an end
  mark). Public outputs go to their topics; :class:`NodeSummary` / :class:`PodUsage` go to
  cluster-inputs numbered by (partition, mark, index); then the mark itself, with the partition's
  counters.
- **cluster** (one partition): when the route's mark and every node partition's copy of it have
  arrived, the :class:`ClusterStages` (one ``ClusterStage`` per cluster, ``cluster-stage`` table)
  apply what the mark covers and advance; after an end mark it writes a ``done`` marker to the control topic.

Delivery is at-least-once, results exactly-once: inputs are acknowledged (so their offsets can be
committed) only after the mark that applied them has been processed, its outputs delivered and
the stage state written to the table; after a crash the gates recognise what the restored state
already applied (source offsets and mark numbers are part of the state), so redelivered records
are not applied twice. Outputs may be written twice (a crash after sending, before the state
write); they carry deterministic ids and the sink deduplicates by id.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import faust
import orjson
from faust.types import TP

from common.logs import get_logger
from common.metrics import MetricsRegistry
from common.settings import WorkerSettings
from schemas.codec import WIRE_HEADERS, MessageError, encode, validate
from schemas.messages import Alert, ClusterCapacity, Message, PodLifecycle, PodWindow, scoped_key
from schemas.topics import (
    ALERTS,
    CLUSTER_CAPACITY,
    DEADLETTER,
    INTERNAL_CLUSTER_INPUTS,
    INTERNAL_CONTROL,
    INTERNAL_NODE_INPUTS,
    POD_LIFECYCLE,
    POD_WINDOWS,
    TopicSpec,
)
from stream_jobs.clusters import ClusterStages
from stream_jobs.config import EngineConfig, Thresholds
from stream_jobs.fleet_metrics import OutputObserver
from stream_jobs.internal import NodeSummary, PodUsage
from stream_jobs.node_stage import NodeStage
from stream_jobs.offsets import EXIT_STALLED, AckOrder, PartitionStalled, Positions
from stream_jobs.pipeline import (
    INPUT_TOPICS,
    Tombstone,
    dead_letter,
    decode_record,
    event_time_error,
    route,
)
from stream_jobs.scoping import node_key
from stream_jobs.state_store import ChunkedStore
from stream_jobs.timeutil import from_epoch
from stream_jobs.watermark import (
    ClusterGate,
    InputGate,
    Mark,
    MarkHold,
    Parked,
    decode_envelope,
    done_envelope,
    node_mark_envelope,
    output_envelope,
    record_envelope,
    tp_key,
)

log = get_logger(__name__)

_INPUT_BY_SUFFIX = {spec.suffix: spec for spec in INPUT_TOPICS}
_INTERNAL_TYPES: dict[str, type[Message]] = {"summary": NodeSummary, "usage": PodUsage}
_PUBLIC_OUT = {PodWindow: POD_WINDOWS, ClusterCapacity: CLUSTER_CAPACITY, PodLifecycle: POD_LIFECYCLE,
               Alert: ALERTS}


def engine_config(settings: WorkerSettings) -> EngineConfig:
    return EngineConfig(window_s=settings.window_s, sample_interval_s=settings.sample_interval_s,
                        prices_usd_per_gpu_hour=dict(settings.prices_usd_per_gpu_hour),
                        thresholds=Thresholds().with_overrides(settings.thresholds),
                        max_skew_s=settings.max_skew_s, horizon_s=settings.horizon_s)


def app_id(settings: WorkerSettings) -> str:
    return settings.app_id or f"{settings.topic_prefix}-stream-jobs"


ROUTE_BATCH = 256
"""Routed records whose deliveries the route awaits together (also at each control record and
every 0.5 s)."""

NODE_TABLE = "node-stages"
CLUSTER_TABLE = "cluster-stage"


class DurableTable(faust.Table):  # type: ignore[misc]
    """A faust table whose changelog writes can be awaited (:meth:`confirm`).

    faust hands a table write to its producer buffer and returns; the commit before which it
    flushes that buffer gives up after 0.1 s without a message leaving it (a loaded process, a
    broker away) and does not fail on a send that failed. A stage checkpoint acknowledged its
    inputs right after writing its state, so offsets could be committed while the state that
    applied them was still in the buffer: a SIGKILL, or a rebalance whose new owner restored the
    changelog before the write arrived, lost those inputs (a chaos run with a broker outage lost
    pod-window samples). A checkpoint now awaits the delivery of its state before acknowledging.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unconfirmed: list[Any] = []

    def send_changelog(self, *args: Any, **kwargs: Any) -> Any:
        fut = super().send_changelog(*args, **kwargs)
        self._unconfirmed.append(fut)
        return fut

    async def confirm(self) -> None:
        """Until every changelog write made so far is delivered; raises if one failed."""
        pending, self._unconfirmed = self._unconfirmed, []
        await asyncio.gather(*pending)


def _durable_table(app: Any, name: str, partitions: int) -> DurableTable:
    """A :class:`DurableTable` registered with ``app`` as ``app.Table`` would (bytes keys/values)."""
    table = DurableTable(app, name=name, default=None, beacon=app.tables.beacon, partitions=partitions,
                         key_type=bytes, value_type=bytes)
    app.tables.add(table)
    return table


@dataclass(frozen=True)
class ChangelogSpec(TopicSpec):
    """A faust table's changelog topic: named ``<app id>-<table>-changelog``."""

    def name(self, prefix: str = "") -> str:
        return f"{prefix}-{self.suffix}"


def changelog_topics(settings: WorkerSettings) -> list[TopicSpec]:
    """The tables' changelog topics (create them with ``app_id(settings)`` as the prefix). Created
    before the worker starts, with their source topics' partition counts: faust otherwise creates
    them itself and, on a fresh broker, can read their metadata before it lists any partition
    (PartitionsMismatch on the first state write)."""
    def spec(table: str, partitions: int) -> TopicSpec:
        return ChangelogSpec(f"{table}-changelog", "stage", Message, partitions, "compact", -1,
                             f"internal: faust changelog of the {table} table")

    return [spec(NODE_TABLE, settings.node_input_partitions), spec(CLUSTER_TABLE, 1)]


def _output_key(message: Message) -> str:
    if isinstance(message, PodWindow | PodLifecycle):
        return scoped_key(message.cluster, message.pod_uid)
    if isinstance(message, Alert):
        return message.id
    return scoped_key(message.cluster, "cluster")


class WorkerMetrics:
    """The worker's ``/metrics``: records in/out per topic, dead letters, late samples, watermark
    lag, stage processing time."""

    def __init__(self, registry: MetricsRegistry | None = None) -> None:
        self.registry = registry or MetricsRegistry()
        r = self.registry
        self.records_in = r.counter("stream_records_in_total", "records consumed", ("topic",))
        self.records_out = r.counter("stream_records_out_total", "records produced", ("topic",))
        self.deadletters = r.counter("stream_deadletters_total", "input records dead-lettered", ("topic",))
        self.late_samples = r.counter("stream_late_samples_total", "samples older than the watermark, dropped")
        self.skips = r.counter("stream_consumer_skips_total", "forward jumps of the consumer, read again")
        self.duplicates = r.counter("stream_redelivered_total", "redelivered records and marks recognised",
                                    ("stage",))
        self.marks = r.counter("stream_marks_total", "watermark marks processed", ("stage",))
        self.watermark_lag = r.gauge("stream_watermark_lag_seconds",
                                     "wall clock minus the stage's event-time watermark", ("stage",))
        self.stage_seconds = r.histogram("stream_stage_seconds", "processing time of one mark", ("stage",))


class ConsumerPort(Protocol):
    """What :class:`OffsetGuard` needs from the consumer."""

    async def committed(self, tp: Any) -> int:
        """The group's committed offset of ``tp`` (the log start when nothing is committed)."""

    async def log_start(self, tp: Any) -> int: ...

    async def log_end(self, tp: Any) -> int:
        """The offset the next record written to ``tp`` will get (the high watermark)."""

    def assignment(self) -> set[Any]:
        """The partitions the consumer owns now."""

    def settled(self) -> bool:
        """False while the group rebalances or the consumer's flow is stopped (no records come
        then, by design: not a stall)."""

    async def seek(self, tp: Any, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` again, forgetting any gap the consumer recorded beyond it."""


class _FaustConsumerPort:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def committed(self, tp: Any) -> int:
        consumer = self.app.consumer
        thread = consumer._thread  # faust's aiokafka driver: the client lives in its own thread
        offset = await thread.call_thread(thread._ensure_consumer().committed, tp)
        return int(offset) if offset is not None else await self.log_start(tp)

    async def log_start(self, tp: Any) -> int:
        return int((await self.app.consumer.earliest_offsets(tp))[tp])

    async def log_end(self, tp: Any) -> int:
        return int((await self.app.consumer.highwaters(tp))[tp])

    async def group_committed(self, keys: list[str]) -> dict[str, int]:
        """The group's committed offsets of ``topic:partition`` keys, owned by this consumer or not
        (keys with no commit are left out)."""
        thread = self.app.consumer._thread
        coordinator = thread._ensure_consumer()._coordinator
        tps = [TP(topic, int(partition)) for topic, partition in (key.rsplit(":", 1) for key in keys)]
        found = await thread.call_thread(coordinator.fetch_committed_offsets, tps)
        return {tp_key(tp.topic, tp.partition): int(meta.offset) for tp, meta in found.items() if meta.offset >= 0}

    def assignment(self) -> set[Any]:
        return set(self.app.consumer.assignment())

    def settled(self) -> bool:
        return not self.app.rebalancing and bool(self.app.consumer.flow_active)

    async def seek(self, tp: Any, offset: int) -> None:
        consumer = self.app.consumer
        consumer._gap.pop(tp, None)  # else faust counts the skipped offsets as acknowledged
        await consumer.seek(tp, offset)


class OffsetGuard:
    """Admits consumed records and releases their acknowledgements (:mod:`stream_jobs.offsets`),
    seeking the consumer back when it skipped records.

    :meth:`watch` (every second) guarantees progress. faust 0.15 can drop fetched records without
    a trace after an assignment (its stream buffers are cleared when the flow resumes, while the
    fetch position is already past them) and a seek back can be undone by a batch fetched before
    it (faust's read offset moves past the re-read). A skip is noticed when a later record
    arrives, but at the tail of a partition no later record comes. So a watched partition whose
    next offset is below the log end and which admitted nothing for ``stall_s`` is sought back
    to that offset; one that still admits nothing after ``give_up_s`` raises
    :class:`PartitionStalled` (the worker exits and restarts) — never a silent hang.
    """

    def __init__(self, port: ConsumerPort, metrics: WorkerMetrics | None = None,
                 watched: Iterable[str] | None = None, stall_s: float = 5.0, give_up_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.port = port
        self.metrics = metrics or WorkerMetrics()
        self.positions = Positions()
        self.acks: AckOrder[Any] = AckOrder()
        self._revoked: set[Any] = set()
        self.watched: set[str] | None = None if watched is None else set(watched)
        """Topics whose partitions :meth:`watch` checks (None: all owned)."""
        self.stall_s, self.give_up_s, self.clock = stall_s, give_up_s, clock
        self._progress: dict[Any, float] = {}
        """Per owned partition: when it last admitted a record (or was assigned, or checked)."""
        self._stalled: dict[Any, float] = {}
        """Per stalled partition: since when it has admitted nothing though the log has more."""

    def assign(self, assignment: set[Any]) -> None:
        """The assignment signal (the worker's whole assignment)."""
        for tp in self.positions.owned - set(assignment):
            self.acks.forget(tp)
        self.positions.assign(assignment)
        self._revoked.clear()
        self._reset_watch()

    def revoke(self, revoked: set[Any]) -> None:
        self.positions.revoke(revoked)
        self._revoked |= set(revoked)
        for tp in revoked:
            self.acks.forget(tp)
        self._reset_watch()

    def _reset_watch(self) -> None:
        now = self.clock()
        self._progress = {tp: self._progress.get(tp, now) for tp in self.positions.owned}
        self._stalled = {tp: t for tp, t in self._stalled.items() if tp in self.positions.owned}

    async def admit(self, tp: Any, offset: int, compacted: bool, token: Any) -> bool:
        if tp not in self.positions.owned:
            # before the first assignment signal the consumer's own assignment decides (records
            # can come first); after a revocation only the next signal does (the consumer still
            # lists revoked partitions while the group rebalances)
            if tp in self._revoked or tp not in self.port.assignment():
                return False
            self.positions.assign(self.positions.owned | self.port.assignment())
            self._reset_watch()
        if self.positions.needs_start(tp):
            await self._start(tp)
        verdict = self.positions.admit(tp, offset, compacted)
        if verdict.seek is not None:
            log.warning("consumer skipped records; reading them again", topic=tp.topic, partition=tp.partition,
                        expected=verdict.seek, got=offset)
            self.metrics.skips.inc()
            await self.port.seek(tp, verdict.seek)
        if not verdict.accept:
            return False
        self._progress[tp] = self.clock()
        self._stalled.pop(tp, None)
        return self.acks.track(tp, offset, token)

    async def _start(self, tp: Any) -> int:
        committed = await self.port.committed(tp)
        self.positions.start(tp, committed)
        log.info("partition position", topic=tp.topic, partition=tp.partition, committed=committed)
        return committed

    def done(self, tp: Any, offset: int, token: Any) -> list[Any]:
        return self.acks.done(tp, offset, token)

    async def _seek_back(self, tp: Any, target: int) -> None:
        """Seek ``tp`` back to ``target``, or to the log start when retention deleted ``target``
        before it was read (said as an error: loss the worker cannot prevent)."""
        start = await self.port.log_start(tp)
        if tp not in self.positions.owned:
            return  # revoked meanwhile
        if start > target:
            log.error("records deleted before they were read", topic=tp.topic, partition=tp.partition,
                      first_missing=target, log_start=start)
            self.positions.restart(tp, start)
            target = start
        await self.port.seek(tp, target)

    async def watch(self) -> None:
        """The liveness check (see the class docstring); raises :class:`PartitionStalled`."""
        now = self.clock()
        if not self.port.settled():
            self._progress = {tp: now for tp in self._progress}  # waiting by design: not a stall
            return
        idle = [tp for tp, at in self._progress.items() if now - at >= self.stall_s
                and (self.watched is None or tp.topic in self.watched)]
        for tp in idle:
            try:
                await self._check_stall(tp, now)
            except PartitionStalled:
                raise
            except Exception as exc:  # a rebalance can take the partition away: the next round decides
                log.warning("stall check failed; retrying", topic=tp.topic, partition=tp.partition, error=str(exc))

    async def _check_stall(self, tp: Any, now: float) -> None:
        end = await self.port.log_end(tp)
        if tp not in self.positions.owned:
            return
        wanted = self.positions.next_offset(tp)
        if wanted is None:
            wanted = await self._start(tp)
        self._progress[tp] = now
        if wanted >= end:
            self._stalled.pop(tp, None)  # caught up: nothing to wait for
            return
        since = self._stalled.setdefault(tp, now - self.stall_s)
        if now - since >= self.give_up_s:
            log.error("partition stalled: its records do not come although the log holds them; restarting",
                      topic=tp.topic, partition=tp.partition, expected=wanted, log_end=end,
                      stalled_s=round(now - since, 1))
            raise PartitionStalled(f"{tp.topic}:{tp.partition} admitted nothing for {now - since:.0f}s "
                                   f"(expected offset {wanted}, log end {end})")
        log.warning("partition stalled; reading it again", topic=tp.topic, partition=tp.partition,
                    expected=wanted, log_end=end, stalled_s=round(now - since, 1))
        self.metrics.skips.inc()
        self.positions.reverify(tp)
        await self._seek_back(tp, wanted)


@dataclass
class _NodePartition:
    """One node-inputs partition: its gate and the stages of the nodes keyed to it."""

    gate: InputGate[Any]
    stages: dict[str, NodeStage] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    unacked: list[Any] = field(default_factory=list)
    """Events applied since the last checkpoint (acknowledged when it is written)."""
    futures: list[Any] = field(default_factory=list)
    """Deliveries of outputs sent since the last checkpoint."""
    checkpointed_at: float = 0.0

    def stage(self, key: str, node: str, cluster: str, config: EngineConfig) -> NodeStage:
        """The stage of ``node`` of ``cluster`` (``key``: their node key)."""
        stage = self.stages.get(key)
        if stage is None:
            stage = self.stages[key] = NodeStage(node, config, cluster)
        return stage


class StreamJobs:
    """Builds the faust app for one worker process (``settings.stage`` picks the agents)."""

    def __init__(self, settings: WorkerSettings, metrics: WorkerMetrics | None = None,
                 observer: OutputObserver | None = None) -> None:
        self.settings = settings
        self.observer = observer
        """Shown every batch of stage outputs (the fleet's Prometheus series)."""
        self.config = engine_config(settings)
        self.metrics = metrics or WorkerMetrics()
        self.prefix = settings.topic_prefix
        self.lateness_s = settings.lateness_s
        self.node_partitions = settings.node_input_partitions
        self.app = self._make_app()
        self._declare()

    # ------------------------------------------------------------------ app and topics

    def _make_app(self) -> Any:
        s = self.settings
        kafka = s.kafka
        credentials: Any = None
        if kafka.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            credentials = faust.SASLCredentials(
                username=kafka.sasl_username,
                password=kafka.sasl_password.get_secret_value() if kafka.sasl_password else None,
                ssl_context=kafka.ssl_context() if kafka.security_protocol == "SASL_SSL" else None,
                mechanism=kafka.sasl_mechanism)
        elif kafka.security_protocol == "SSL":
            credentials = faust.SSLCredentials(kafka.ssl_context())
        datadir = s.data_dir / "stream-jobs" / app_id(s)
        datadir.mkdir(parents=True, exist_ok=True)
        return faust.App(
            app_id(s),
            broker=kafka.faust_broker_url(),
            broker_credentials=credentials,
            broker_client_id=kafka.client_id,
            datadir=str(datadir),
            store="memory://",
            processing_guarantee="at_least_once",
            consumer_auto_offset_reset="earliest",
            stream_wait_empty=False,
            broker_commit_interval=1.0,
            # a crashed worker's partitions move after this long (faust's default is 60 s)
            broker_session_timeout=10.0,
            broker_heartbeat_interval=1.0,
            consumer_group_instance_id=s.group_instance_id,
            producer_acks=-1,
            producer_linger_ms=0,
            table_standby_replicas=0,
            topic_replication_factor=1,
            web_enabled=s.web_port > 0,
            web_port=s.web_port or 6066,
            web_bind=str(s.web_bind),
            autodiscover=False,
            key_serializer="raw",  # every topic and changelog holds bytes we encode ourselves
            value_serializer="raw",
        )

    def _topic(self, name: str, partitions: int | None = None) -> Any:
        return self.app.topic(name, partitions=partitions, key_serializer="raw", value_serializer="raw")

    def _declare(self) -> None:
        app, prefix = self.app, self.prefix
        self.input_names = {spec.name(prefix): spec.suffix for spec in INPUT_TOPICS}
        self.control_name = INTERNAL_CONTROL.name(prefix)
        self.node_name = INTERNAL_NODE_INPUTS.name(prefix)
        self.cluster_name = INTERNAL_CLUSTER_INPUTS.name(prefix)
        self.inputs = self.app.topic(*self.input_names, self.control_name, key_serializer="raw",
                                     value_serializer="raw")
        self.node_topic = self._topic(self.node_name, self.node_partitions)
        self.cluster_topic = self._topic(self.cluster_name, 1)
        self.control_topic = self._topic(self.control_name, 1)
        self.deadletter_topic = self._topic(DEADLETTER.name(prefix))
        self.out_topics = {cls: self._topic(spec.name(prefix)) for cls, spec in _PUBLIC_OUT.items()}
        # keys and values are bytes (orjson documents): what is written is exactly what is restored
        # one document per node-inputs partition (its node stages + progress) and one for the cluster
        # stage: a state and the progress that says which inputs it holds are written atomically
        # (split into records under the broker's size limit, see ChunkedStore)
        limit = self.settings.state_record_max_bytes
        self.node_durable = _durable_table(app, NODE_TABLE, self.node_partitions)
        self.cluster_durable = _durable_table(app, CLUSTER_TABLE, 1)
        self.node_table = ChunkedStore(self.node_durable, limit)
        self.cluster_table = ChunkedStore(self.cluster_durable, limit)
        self.hold = MarkHold()
        watched = {*self.input_names, self.control_name, self.node_name, self.cluster_name}
        self.consumer_port = _FaustConsumerPort(app)
        self.offsets = OffsetGuard(self.consumer_port, self.metrics, watched=watched,
                                   stall_s=self.settings.stall_s, give_up_s=self.settings.stall_give_up_s)
        self._route_events: Any = None
        self._forward_lock = asyncio.Lock()
        self._route_pending: list[tuple[list[Any], Any, str, int, int]] = []
        """Routed input records whose forwarded copies are not yet known to be delivered."""
        self._marks_pending: list[tuple[list[Any], Any]] = []
        """Forwarded marks (their copies' deliveries, the control record) not yet acknowledged."""
        self._group_committed: dict[str, int] = {}
        """Committed offsets (next to read) of the group's input partitions, ``topic:partition``."""
        self._cluster_unacked: list[Any] = []
        self._cluster_futures: list[Any] = []
        self._compacted = {spec.name(self.prefix) for spec in INPUT_TOPICS if spec.cleanup_policy == "compact"}
        self.node_parts: dict[int, _NodePartition] = {}
        self.cluster_gate: ClusterGate[Any] | None = None
        self.cluster_stage: ClusterStages | None = None
        stage = self.settings.stage
        if stage in ("node", "all"):
            app.agent(self.inputs, name="route")(self._exit_on_error("route", self._route_agent))
            app.agent(self.node_topic, name="node")(self._exit_on_error("node", self._node_agent))
            app.timer(0.5)(self._refresh_and_release)
            if self.settings.watermark_source == "clock":
                app.timer(self.settings.clock_interval_s, on_leader=True)(self._clock)
        if stage in ("cluster", "all"):
            app.agent(self.cluster_topic, name="cluster")(self._exit_on_error("cluster", self._cluster_agent))
        app.on_partitions_revoked.connect(self._on_revoked)
        app.on_partitions_assigned.connect(self._on_assigned)
        app.timer(10.0)(self._report_waiting)
        app.timer(1.0)(self._watch_partitions)

    async def _watch_partitions(self) -> None:
        """:meth:`OffsetGuard.watch`: a partition that stays stalled ends the process (exit 70)
        so that it restarts from its checkpoints, rather than hang."""
        try:
            await self.offsets.watch()
        except PartitionStalled as exc:
            self._exit_for_restart(str(exc))

    def _exit_on_error(self, name: str, fun: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        """An agent that raises (e.g. a send that failed while the broker was away) ends the process
        (exit 70). faust would restart the agent in this process with the stages' in-memory state
        half-way through a mark (the gate advanced, the outputs lost) and a later checkpoint would
        store that state: a silent loss, seen in a chaos run. The restarted worker resumes from
        its checkpoints instead."""
        async def agent(stream: Any) -> None:
            try:
                await fun(stream)
            except Exception as exc:
                log.error("stream agent failed", exc_info=True, agent=name)
                self._exit_for_restart(f"agent {name} failed: {exc!r}")

        return agent

    def _exit_for_restart(self, reason: str) -> None:
        log.error("stream jobs exiting to restart from their checkpoints", reason=reason)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_STALLED)

    async def _report_waiting(self) -> None:
        """Say what a stage waits for when it waits (a mark held for inputs or partitions)."""
        if self.hold.held:
            mark = self.hold.held[0][0]
            log.info("route holds a mark", seq=mark.seq, held=len(self.hold.held),
                     missing=self.hold.missing(mark, self._committed()))
        gate = self.cluster_gate
        if gate is not None and gate.marks:
            seq = min(gate.marks)
            behind = [p for p in range(self.node_partitions)
                      if not any(s >= seq for s, _c, _t in gate.node_marks.get(p, []))]
            log.info("cluster stage waits for node partitions", seq=seq, partitions=behind,
                     parked=len(gate.records) + len(gate.outputs))

    async def _on_revoked(self, sender: Any, revoked: set[Any], **kwargs: Any) -> None:
        """Forget in-memory gates and stages of partitions this worker no longer owns (their
        unacknowledged records go to the new owner, which restores the state from the tables)."""
        self.offsets.revoke(revoked)
        for tp in revoked:
            if tp.topic == self.node_name:
                log.info("node partition revoked", partition=tp.partition)
                self.node_parts.pop(tp.partition, None)
            elif tp.topic == self.cluster_name:
                self.cluster_gate = None
                self.cluster_stage = None
                self._cluster_unacked = []
                self._cluster_futures = []
            elif tp.topic == self.control_name:
                self._marks_pending = []
                self.hold = MarkHold()  # the held marks are unacknowledged: their new owner reads them again

    async def _on_assigned(self, sender: Any, assigned: set[Any], **kwargs: Any) -> None:
        self.offsets.assign(assigned)

    async def _admit(self, event: Any) -> bool:
        """Whether to process a consumed event (:class:`OffsetGuard`)."""
        message = event.message
        return await self.offsets.admit(message.tp, message.offset, message.topic in self._compacted, event)

    async def _ack(self, events: Any, event: Any) -> None:
        """The event is done; acknowledge it and what waited for it (offset order, see AckOrder)."""
        for ready in self.offsets.done(event.message.tp, event.message.offset, event):
            await events.ack(ready)

    async def _send(self, topic: Any, key: str | None, value: bytes, partition: int | None = None,
                    headers: list[tuple[str, bytes]] | None = None) -> Any:
        fut = await topic.send(key=key.encode() if key is not None else None, value=value, partition=partition,
                               headers=headers)
        self.metrics.records_out.labels(topic.get_topic_name()).inc()
        return fut

    # ------------------------------------------------------------------ clock marks (live mode)

    async def _clock(self) -> None:
        now = time.time()
        await self._send(self.control_topic, None, Mark(seq=int(now * 1e6), ts=now).encode())

    # ------------------------------------------------------------------ route

    def _committed(self) -> dict[str, int]:
        committed = getattr(self.app.consumer, "_committed_offset", {}) or {}
        out = dict(self._group_committed)
        for tp, off in list(committed.items()):
            if off is not None:
                key = tp_key(tp.topic, tp.partition)
                out[key] = max(out.get(key, 0), int(off))
        return out

    async def _refresh_and_release(self) -> None:
        """The timer of the route: read the group's committed offsets of the input partitions the
        first held mark still misses (other worker processes consume them: their commits come
        after the records they forwarded are delivered), then forward what is ready."""
        await self._settle_route()
        if self.hold.held:
            missing = self.hold.missing(self.hold.held[-1][0], self._committed())
            if missing:
                try:
                    found = await asyncio.wait_for(self.consumer_port.group_committed(sorted(missing)), 10.0)
                except Exception as exc:  # the broker may be away: the next round asks again
                    log.warning("committed offsets not read", error=str(exc))
                else:
                    for key, off in found.items():
                        self._group_committed[key] = max(self._group_committed.get(key, 0), off)
        await self._release_marks()

    async def _route_agent(self, stream: Any) -> None:
        events = self._route_events = stream.noack()
        async for event in events.events():
            if not await self._admit(event):
                continue
            message = event.message
            topic, partition, offset = message.topic, message.partition, message.offset
            self.metrics.records_in.labels(topic).inc()
            if topic == self.control_name:
                try:
                    data = decode_envelope(event.value)
                    if data["k"] == "m":
                        self.hold.hold(Mark.from_dict(data), event)
                    else:
                        await self._ack(events, event)
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("bad control record ignored", offset=offset, error=str(exc))
                    await self._ack(events, event)
            else:
                futures = await self._route_record(topic, partition, offset, message.key, event.value)
                self._route_pending.append((futures, event, topic, partition, offset))
                if len(self._route_pending) < ROUTE_BATCH:
                    continue
            await self._settle_route()
            await self._release_marks()

    async def _settle_route(self) -> None:
        """Once the forwarded copies of routed records are delivered, count those records consumed
        and acknowledge them (so committed). faust's flush before a commit does not fail on a send
        that failed (the broker away too long): acknowledging at hand-over could commit an input
        whose copy was lost. A failed delivery ends the worker (exit 70; it reads them again)."""
        pending, self._route_pending = self._route_pending, []
        marks, self._marks_pending = self._marks_pending, []
        if not (pending or marks) or self._route_events is None:
            return
        try:
            await asyncio.gather(*(future for futures, *_rest in pending for future in futures),
                                 *(future for futures, _token in marks for future in futures))
        except Exception as exc:
            self._exit_for_restart(f"a forwarded input record or mark was not delivered: {exc!r}")
        for _futures, event, topic, partition, offset in pending:
            self.hold.consume(topic, partition, offset)
            await self._ack(self._route_events, event)
        for _futures, token in marks:
            await self._ack(self._route_events, token)

    async def _release_marks(self) -> None:
        """Forward the held marks whose inputs are consumed (after each input record, and on a
        timer: commits made after the last record can complete a mark too)."""
        if not self.hold.held or self._route_events is None:
            return
        async with self._forward_lock:  # marks leave in order
            for mark, token in self.hold.ready(self._committed()):
                self._marks_pending.append((await self._forward_mark(mark), token))

    async def _route_record(self, topic: str, partition: int, offset: int, key: bytes | None,
                            value: bytes | None) -> list[Any]:
        """Forward a decoded input record to its stages; the deliveries to await (none for a
        tombstone or a dead letter, which is delivered already)."""
        suffix = self.input_names[topic]
        try:
            decoded = decode_record(suffix, value)
        except Tombstone:
            return []
        except MessageError as exc:
            await self._dead_letter(topic, partition, offset, key, value, str(exc))
            return []
        envelope = record_envelope(topic, suffix, partition, offset, value or b"")
        futures = []
        for stage, node in route(decoded):
            if stage == "node":
                futures.append(await self._send(self.node_topic, node, envelope))
            else:
                futures.append(await self._send(self.cluster_topic, "cluster", envelope))
        return futures

    async def _dead_letter(self, topic: str, partition: int, offset: int, key: bytes | None,
                           value: bytes | None, error: str) -> None:
        letter = dead_letter(error, topic, value, from_epoch(time.time()), partition, offset)
        headers = [*WIRE_HEADERS, ("error", error.encode()), ("source_topic", topic.encode()),
                   ("source_partition", str(partition).encode()), ("source_offset", str(offset).encode())]
        fut = await self.deadletter_topic.send(key=key, value=encode(letter), headers=headers)
        await fut  # rare: make it durable before the stream moves on
        self.metrics.deadletters.labels(topic).inc()
        self.metrics.records_out.labels(self.deadletter_topic.get_topic_name()).inc()
        log.warning("dead letter", topic=topic, partition=partition, offset=offset, error=error)

    async def _released_input(self, parked: Parked[Any], mark: Mark) -> Message | None:
        """A forwarded input record a mark released, or None when its event time is out of the
        bounds of the mark's clock (then it is dead-lettered: by both stages when it went to both,
        with the same source headers; ``replay --kafka`` counts letters once per source)."""
        data = parked.data
        message = validate(data["v"], _INPUT_BY_SUFFIX[data["s"]].message)
        error = event_time_error(message, mark.ts, self.config)
        if error is None:
            return message
        await self._dead_letter(str(data["t"]), int(data["p"]), int(data["o"]), None, orjson.dumps(data["v"]), error)
        return None

    async def _forward_mark(self, mark: Mark) -> list[Any]:
        """Send the mark to every node-inputs partition and to cluster-inputs; the deliveries."""
        value = mark.encode()
        futures = [await self._send(self.node_topic, None, value, partition=partition)
                   for partition in range(self.node_partitions)]
        futures.append(await self._send(self.cluster_topic, "cluster", value))
        return futures

    # ------------------------------------------------------------------ node stage

    def _node_part(self, partition: int) -> _NodePartition:
        part = self.node_parts.get(partition)
        if part is None:
            saved = self.node_table.get(f"p{partition}") or {}
            progress = saved.get("progress", {})
            part = _NodePartition(InputGate(int(progress.get("seq", 0)), progress.get("applied")),
                                  stats=dict(saved.get("stats", {})))
            for node, state in saved.get("stages", {}).items():
                part.stages[node] = NodeStage.from_dict(state, self.config)
            self.node_parts[partition] = part
        return part

    async def _node_agent(self, stream: Any) -> None:
        events = stream.noack()
        async for event in events.events():
            if not await self._admit(event):
                continue
            partition = event.message.partition
            self.metrics.records_in.labels(self.node_name).inc()
            if partition not in self.node_parts:
                part = self._node_part(partition)
                log.info("node partition resumed", partition=partition, offset=event.message.offset,
                         seq=part.gate.applied_seq, applied=part.gate.applied, nodes=sorted(part.stages))
            part = self._node_part(partition)
            data = decode_envelope(event.value)
            if data["k"] == "r":
                if not part.gate.offer(data, event):
                    self.metrics.duplicates.labels("node").inc()
                    await self._ack(events, event)
                continue
            mark = Mark.from_dict(data)
            if not part.gate.is_new(mark.seq):
                self.metrics.duplicates.labels("node").inc()
                await self._ack(events, event)
                continue
            started = time.perf_counter()
            released = part.gate.release(mark)
            await self._node_mark(partition, part, mark, released)
            part.unacked.extend([*(parked.token for parked in released), event])
            if mark.end or time.monotonic() - part.checkpointed_at >= self.settings.checkpoint_interval_s:
                await self._node_checkpoint(events, partition, part)
            self.metrics.marks.labels("node").inc()
            self.metrics.stage_seconds.labels("node").observe(time.perf_counter() - started)

    async def _node_mark(self, partition: int, part: _NodePartition, mark: Mark,
                         released: list[Parked[Any]]) -> None:
        for parked in released:
            message = await self._released_input(parked, mark)
            if message is None:
                continue
            node = getattr(message, "node", None)
            if not node:
                continue
            stage = part.stage(node_key(message.cluster, node), node, message.cluster, self.config)
            late = stage.counters["late_samples"]
            stage.submit(message)
            if stage.counters["late_samples"] > late:
                self.metrics.late_samples.inc()
        outputs: list[Message] = []
        wm = mark.ts if mark.end else mark.ts - self.lateness_s
        for node in sorted(part.stages):  # the in-process pipeline's order
            stage = part.stages[node]
            outputs.extend(stage.flush(mark.ts) if mark.end else stage.advance(wm))
        if self.observer is not None:
            self.observer.observe(outputs)
        public: list[Any] = []
        internal: list[tuple[str, bytes]] = []
        for message in outputs:
            if isinstance(message, NodeSummary | PodUsage):
                internal.append(("summary" if isinstance(message, NodeSummary) else "usage", encode(message)))
            else:
                public.append(await self._send(self.out_topics[type(message)], _output_key(message),
                                               encode(message), headers=list(WIRE_HEADERS)))
        part.futures.extend(public)
        if mark.end:  # every public output is out before the cluster can say done
            await asyncio.gather(*part.futures)
            part.futures = []
        futures = part.futures
        for index, (kind, value) in enumerate(internal):
            futures.append(await self._send(self.cluster_topic, "cluster",
                                            output_envelope(partition, mark.seq, index, kind, value)))
        stats = {"late_samples_dropped": 0, "sample_gaps": 0}
        for stage in part.stages.values():
            counters = stage.counters
            stats["late_samples_dropped"] += counters["late_samples"]
            stats["sample_gaps"] += counters["gaps"]
        part.stats = stats
        futures.append(await self._send(self.cluster_topic, "cluster", node_mark_envelope(partition, mark, stats)))
        self.metrics.watermark_lag.labels("node").set(max(0.0, time.time() - wm))

    async def _node_checkpoint(self, events: Any, partition: int, part: _NodePartition) -> None:
        """Outputs delivered -> state written -> inputs acknowledged, in this order: a crash at any
        point replays from the previous checkpoint and only repeats outputs (same ids)."""
        await asyncio.gather(*part.futures)
        part.futures = []
        self.node_table[f"p{partition}"] = {
            "progress": part.gate.progress(), "stats": part.stats,
            "stages": {node: stage.to_dict() for node, stage in sorted(part.stages.items())}}
        await self.node_durable.confirm()
        for token in part.unacked:
            await self._ack(events, token)
        part.unacked = []
        part.checkpointed_at = time.monotonic()

    # ------------------------------------------------------------------ cluster stage

    def _cluster(self) -> tuple[ClusterGate[Any], ClusterStages]:
        if self.cluster_gate is None or self.cluster_stage is None:
            record = self.cluster_table.get("cluster") or {}
            meta = record.get("progress") or {}
            saved = record.get("stage")
            self.cluster_gate = ClusterGate(self.node_partitions, int(meta.get("seq", 0)), meta.get("applied"))
            self.cluster_stage = ClusterStages.from_dict(saved, self.config) if saved else ClusterStages(self.config)
            self._cluster_done = meta.get("done")
        return self.cluster_gate, self.cluster_stage

    async def _cluster_agent(self, stream: Any) -> None:
        events = stream.noack()
        async for event in events.events():
            if not await self._admit(event):
                continue
            self.metrics.records_in.labels(self.cluster_name).inc()
            gate, stage = self._cluster()
            data = decode_envelope(event.value)
            kind = data["k"]
            if kind == "r":
                accepted = gate.offer(data, event)
            elif kind == "o":
                accepted = gate.offer_output(data, event)
            elif kind == "nm":
                accepted = gate.offer_node_mark(data, event)
            else:
                mark = Mark.from_dict(data)
                accepted = gate.offer_mark(mark, event)
                if not accepted and mark.end and self._cluster_done is not None:
                    # the end was processed before a restart: say done again (the driver waits)
                    await self._send(self.control_topic, None, done_envelope(mark.seq, self._cluster_done))
            if not accepted:
                self.metrics.duplicates.labels("cluster").inc()
                await self._ack(events, event)
                continue
            while (ready := gate.next_complete()) is not None:
                started = time.perf_counter()
                direct, outs, tokens, stats = gate.complete(ready)
                await self._cluster_mark(gate, stage, ready, direct, outs, stats)
                self._cluster_unacked.extend([*(p.token for p in direct), *(p.token for p in outs), *tokens])
                interval = self.settings.checkpoint_interval_s
                if ready.end or time.monotonic() - self._cluster_checkpointed_at >= interval:
                    await self._cluster_checkpoint(events, gate, stage, ready if ready.end else None, stats)
                self.metrics.marks.labels("cluster").inc()
                self.metrics.stage_seconds.labels("cluster").observe(time.perf_counter() - started)

    async def _cluster_mark(self, gate: ClusterGate[Any], stage: ClusterStages, mark: Mark,
                            direct: list[Parked[Any]], outs: list[Parked[Any]], stats: dict[str, int]) -> None:
        for parked in direct:
            message = await self._released_input(parked, mark)
            if message is not None:
                stage.submit(message)
        for parked in outs:
            stage.submit(validate(parked.data["v"], _INTERNAL_TYPES[parked.data["c"]]))
        wm = mark.ts if mark.end else mark.ts - self.lateness_s
        outputs = stage.flush(mark.ts) if mark.end else stage.advance(wm)
        if self.observer is not None:
            self.observer.observe(outputs)
        for m in outputs:
            self._cluster_futures.append(await self._send(self.out_topics[type(m)], _output_key(m), encode(m),
                                                          headers=list(WIRE_HEADERS)))
        self.metrics.watermark_lag.labels("cluster").set(max(0.0, time.time() - wm))

    async def _cluster_checkpoint(self, events: Any, gate: ClusterGate[Any], stage: ClusterStages,
                                  end: Mark | None, stats: dict[str, int]) -> None:
        """As :meth:`_node_checkpoint`; after an end mark, also say ``done`` on the control topic."""
        await asyncio.gather(*self._cluster_futures)
        self._cluster_futures = []
        progress = gate.progress()
        if end is not None:
            self._cluster_done = stats
            progress["done"] = stats
        self.cluster_table["cluster"] = {"stage": stage.to_dict(), "progress": progress}
        await self.cluster_durable.confirm()
        for token in self._cluster_unacked:
            await self._ack(events, token)
        self._cluster_unacked = []
        self._cluster_checkpointed_at = time.monotonic()
        if end is not None:
            fut = await self._send(self.control_topic, None, done_envelope(end.seq, stats))
            await fut
            log.info("end of input processed", seq=end.seq, **stats)

    _cluster_done: dict[str, int] | None = None
    _cluster_checkpointed_at: float = 0.0


def run_worker(settings: WorkerSettings, metrics: WorkerMetrics | None = None,
               observer: OutputObserver | None = None) -> None:
    """Run a faust worker for ``settings`` until SIGTERM/SIGINT (blocks; exits the process)."""
    jobs = StreamJobs(settings, metrics, observer)
    for name in ("faust", "mode", "aiokafka", "kafka"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(settings.log_level)))
    worker = faust.Worker(jobs.app, loglevel=settings.log_level.lower(), override_logging=False, quiet=True)
    log.info("stream jobs starting", app_id=app_id(settings), stage=settings.stage,
             watermark_source=settings.watermark_source, prefix=settings.topic_prefix)
    worker.execute_from_commandline()
