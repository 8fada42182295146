"""The stream jobs of one worker on faust: the app's topics, tables and agents.

faust supplies agents, partition assignment and changelog-backed tables; the event-time logic is
the plain code of :mod:`stream_jobs.node_stage` / :mod:`stream_jobs.cluster_stage`, unchanged, and
:mod:`stream_jobs.watermark` decides *when* each record is applied. This module declares the
topics and tables on the app of :mod:`stream_jobs.faust_runtime` and wires three agents, each in
its own module, over one shared :class:`~stream_jobs.delivery.Delivery` (admit, send, publish,
dead-letter, acknowledge):

- **route** (:mod:`stream_jobs.route_agent`) decodes the five input topics and the control topic,
  forwards valid records to the node / cluster inputs, holds and forwards watermark marks;
- **node** (:mod:`stream_jobs.node_agent`) runs the node stages of each node-inputs partition;
- **cluster** (:mod:`stream_jobs.cluster_agent`) runs the cluster stages once a mark has arrived
  from the route and every node partition, and says ``done`` after an end mark.

The agents read their records from an inbox each (:class:`~stream_jobs.faust_runtime.Inbox`),
not from faust's streams; faust's internals are touched only in :mod:`stream_jobs.faust_runtime`
and :mod:`stream_jobs.faust_port`, and this module imports neither faust nor its clients.

Delivery is at-least-once, results exactly-once: inputs are acknowledged (so their offsets can be
committed) only after the mark that applied them has been processed, its outputs delivered and
the stage state written to the table; after a crash the gates recognise what the restored state
already applied (source offsets and mark numbers are part of the state), so redelivered records
are not applied twice. Outputs may be written twice (a crash after sending, before the state
write); they carry deterministic ids and the sink deduplicates by id.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from common.letter_budget import LetterBudget
from common.logs import get_logger
from common.settings import WorkerSettings
from schemas.messages import Message
from schemas.outputs import Alert, ClusterCapacity, PodLifecycle, PodWindow
from schemas.topics import (
    ALERTS,
    CLUSTER_CAPACITY,
    DEADLETTER,
    GPU_SAMPLES,
    INTERNAL_CLUSTER_INPUTS,
    INTERNAL_CONTROL,
    INTERNAL_NODE_INPUTS,
    POD_LIFECYCLE,
    POD_WINDOWS,
    TopicSpec,
    key_partition,
)
from stream_jobs.cluster_agent import ClusterAgent
from stream_jobs.config import EngineConfig
from stream_jobs.delivery import Delivery, exit_for_restart
from stream_jobs.faust_port import DirectSender, FaustConsumerPort, durable_table
from stream_jobs.faust_runtime import (
    SESSION_TIMEOUT_S,
    WORKER_GC_THRESHOLDS,
    Inbox,
    RestartingWorker,
    app_id,
    direct_agent,
    make_app,
    raw_topic,
    use_uvloop,
)
from stream_jobs.fleet_metrics import OutputObserver
from stream_jobs.node_agent import NodeAgent, node_state_partition
from stream_jobs.offset_guard import OffsetGuard, WorkerMetrics
from stream_jobs.offsets import PartitionStalled
from stream_jobs.pipeline import INPUT_TOPICS
from stream_jobs.route_agent import RouteAgent, RouteTopics
from stream_jobs.state_store import ChunkedStore
from stream_jobs.watermark import tp_key

# the runtime's names the stream benchmark builds its passthrough app on are re-exported here
__all__ = ["SESSION_TIMEOUT_S", "WORKER_GC_THRESHOLDS", "DirectSender", "Inbox", "RestartingWorker", "StreamJobs",
           "app_id", "changelog_topics", "direct_agent", "engine_config", "make_app", "raw_topic",
           "run_stream_jobs", "use_uvloop"]

log = get_logger(__name__)

_PUBLIC_OUT: dict[type[Message], TopicSpec] = {
    PodWindow: POD_WINDOWS, ClusterCapacity: CLUSTER_CAPACITY, PodLifecycle: POD_LIFECYCLE, Alert: ALERTS}


def engine_config(settings: WorkerSettings) -> EngineConfig:
    return EngineConfig.from_settings(settings)



NODE_TABLE = "node-stages"
CLUSTER_TABLE = "cluster-stage"


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
        self.app = make_app(settings)
        self._declare()

    # ------------------------------------------------------------------ app and topics

    def _topic(self, *names: str, partitions: int | None = None) -> Any:
        return raw_topic(self.app, *names, partitions=partitions)

    def _node_partition(self, key: bytes) -> int:
        """The node-inputs (and samples) partition of a node key: a node's states go where its
        samples are, so that partition's stage reads both."""
        return key_partition(key, self.node_partitions)

    def _declare(self) -> None:
        app, prefix, s = self.app, self.prefix, self.settings
        self.input_names = {spec.name(prefix): spec.suffix for spec in INPUT_TOPICS}
        self.samples_name = GPU_SAMPLES.name(prefix)
        routed = {name: suffix for name, suffix in self.input_names.items() if name != self.samples_name}
        self.control_name = INTERNAL_CONTROL.name(prefix)
        self.node_name = INTERNAL_NODE_INPUTS.name(prefix)
        self.cluster_name = INTERNAL_CLUSTER_INPUTS.name(prefix)
        self.inputs = self._topic(*routed, self.control_name)
        # partition p of both holds the same nodes: faust assigns co-subscribed topics of one
        # partition count together (and the node-stages changelog with them)
        self.node_inputs = self._topic(self.node_name, self.samples_name)
        self.cluster_topic = self._topic(self.cluster_name, partitions=1)
        # keys and values are bytes (orjson documents): what is written is exactly what is restored
        # one document per node-inputs partition (its node stages + progress) and one for the cluster
        # stage: a state and the progress that says which inputs it holds are written atomically
        # (split into records under the broker's size limit, see ChunkedStore)
        limit = s.state_record_max_bytes
        self.node_durable = durable_table(app, NODE_TABLE, self.node_partitions, node_state_partition)
        self.cluster_durable = durable_table(app, CLUSTER_TABLE, 1, lambda key: 0)
        self.node_table = ChunkedStore(self.node_durable, limit)
        self.cluster_table = ChunkedStore(self.cluster_durable, limit)
        watched = {*self.input_names, self.control_name, self.node_name, self.cluster_name}
        self.consumer_port = FaustConsumerPort(app)
        self.offsets = OffsetGuard(self.consumer_port, self.metrics, watched=watched,
                                   stall_s=s.stall_s, give_up_s=s.stall_give_up_s)
        self.delivery = Delivery(
            config=self.config, metrics=self.metrics, offsets=self.offsets,
            deadletter_topic=DirectSender(app, DEADLETTER.name(prefix)),
            out_topics={cls: DirectSender(app, spec.name(prefix)) for cls, spec in _PUBLIC_OUT.items()},
            compacted={spec.name(prefix) for spec in INPUT_TOPICS if spec.cleanup_policy == "compact"},
            budget=LetterBudget(rate=s.deadletter_rate_per_s, burst=float(s.deadletter_burst)))
        self.route = RouteAgent(self.delivery, RouteTopics(
            input_names=routed, control_name=self.control_name, node_topic=DirectSender(app, self.node_name),
            cluster_topic=DirectSender(app, self.cluster_name), control_topic=DirectSender(app, self.control_name),
            node_partitions=self.node_partitions, node_partition=self._node_partition), self.consumer_port)
        self.node = NodeAgent(self.delivery, self.config, self.node_name, DirectSender(app, self.cluster_name),
                              self.node_table,
                              self.node_durable, self.lateness_s, s.checkpoint_interval_s, self.observer,
                              samples_topic=self.samples_name, partitioner=self._node_partition,
                              read_ahead_bytes=s.read_ahead_bytes)
        self.cluster = ClusterAgent(self.delivery, self.config, self.cluster_name, DirectSender(app, self.control_name),
                                    self.cluster_table, self.cluster_durable, self.node_partitions, self.lateness_s,
                                    s.checkpoint_interval_s, self.observer)
        self.offsets.state_positions = {self.node_name: self.node.saved_position,
                                        self.samples_name: self.node.saved_sample_position,
                                        self.cluster_name: self.cluster.saved_position}
        self.inboxes: dict[str, Inbox] = {}
        """Per agent, where it reads its records (:func:`direct_agent`)."""
        if s.stage in ("node", "all"):
            self._agent("route", self.inputs, self.route.run)
            self._agent("node", self.node_inputs, self.node.run)
            app.timer(0.5)(self.route.refresh_and_release)
            if s.watermark_source == "clock":
                app.timer(s.clock_interval_s, on_leader=True)(self.route.clock)
        if s.stage in ("cluster", "all"):
            self._agent("cluster", self.cluster_topic, self.cluster.run)
        app.on_partitions_revoked.connect(self._on_revoked)
        app.on_partitions_assigned.connect(self._on_assigned)
        app.timer(10.0)(self._report_waiting)
        self._watching: asyncio.Future[Any] | None = None

    def _agent(self, name: str, topic: Any, run: Callable[[Any], Awaitable[None]]) -> None:
        """Declare agent ``name``: ``run`` reads ``topic``'s records from its inbox and ends the
        process if it raises."""
        self.inboxes[name] = direct_agent(self.app, topic, name, self._exit_on_error(name, run))

    async def _watch_partitions(self) -> None:
        """:meth:`OffsetGuard.watch` every second: a partition that stays stalled, or a restore of
        the tables that reads nothing, ends the process (exit 70) so that it restarts from its
        checkpoints, rather than hang. Started at the first assignment, not as a faust timer:
        faust starts its timers once the first restore has finished, and a worker whose first
        restore read nothing waited for ever (tests/stream_jobs/test_faust_replay.py)."""
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.offsets.watch()
            except PartitionStalled as exc:
                exit_for_restart(str(exc))
            except Exception as exc:  # a worker no longer watched could hang unseen
                exit_for_restart(f"the partition watch failed: {exc!r}")

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
                exit_for_restart(f"agent {name} failed: {exc!r}")

        return agent

    async def _report_waiting(self) -> None:
        """Say what a stage waits for when it waits (a mark held for inputs or partitions)."""
        hold = self.route.hold
        if hold.held:
            mark = hold.held[0][0]
            log.info("route holds a mark", seq=mark.seq, held=len(hold.held),
                     missing=hold.missing(mark, self.route.committed()))
        for partition, part in sorted(self.node.parts.items()):
            if part.waiting:
                mark = part.waiting[0][0]
                log.info("node partition waits for its samples", partition=partition, seq=mark.seq,
                         wanted=(mark.offsets or {}).get(tp_key(self.samples_name, partition)),
                         next_offset=part.next_sample_offset)
        gate = self.cluster.gate
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
            if tp.topic in (self.node_name, self.samples_name):
                self.node.revoke(tp.partition)
            elif tp.topic == self.cluster_name:
                self.cluster.revoke()
            elif tp.topic == self.control_name:
                self.route.revoke_control()

    async def _on_assigned(self, sender: Any, assigned: set[Any], **kwargs: Any) -> None:
        if self._watching is None:
            self._watching = self.app.add_future(self._watch_partitions())
        self.offsets.assign(assigned)
        node = {tp.partition for tp in assigned if tp.topic == self.node_name}
        samples = {tp.partition for tp in assigned if tp.topic == self.samples_name}
        if node != samples:  # faust assigns them together; a group of workers of other versions might not
            log.error("node-inputs and samples partitions assigned apart: those node partitions wait for ever",
                      node_inputs=sorted(node), samples=sorted(samples))
        await self.offsets.read_committed()

def run_stream_jobs(settings: WorkerSettings, metrics: WorkerMetrics | None = None,
                    observer: OutputObserver | None = None) -> None:
    """Run a faust worker for ``settings`` until SIGTERM/SIGINT (blocks; exits the process). Its
    topics must exist (:func:`stream_jobs.service.run_worker` creates them first)."""
    gc.set_threshold(*WORKER_GC_THRESHOLDS)
    use_uvloop()
    jobs = StreamJobs(settings, metrics, observer)
    for name in ("faust", "mode", "aiokafka", "kafka"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(settings.log_level)))
    worker = RestartingWorker(jobs.app, loglevel=settings.log_level.lower(), override_logging=False, quiet=True)
    log.info("stream jobs starting", app_id=app_id(settings), stage=settings.stage,
             watermark_source=settings.watermark_source, prefix=settings.topic_prefix)
    worker.execute_from_commandline()
