"""The faust runtime around the stages: the one module that imports faust (and mode).

faust supplies agents, partition assignment and changelog-backed tables; the event-time logic is
the plain code of :mod:`stream_jobs.node_stage` / :mod:`stream_jobs.cluster_stage`, unchanged, and
:mod:`stream_jobs.watermark` decides *when* each record is applied. This module builds the app,
its topics and tables, and wires three agents, each in its own module, over one shared
:class:`~stream_jobs.delivery.Delivery` (admit, send, publish, dead-letter, acknowledge):

- **route** (:mod:`stream_jobs.route_agent`) decodes the five input topics and the control topic,
  forwards valid records to the node / cluster inputs, holds and forwards watermark marks;
- **node** (:mod:`stream_jobs.node_agent`) runs the node stages of each node-inputs partition;
- **cluster** (:mod:`stream_jobs.cluster_agent`) runs the cluster stages once a mark has arrived
  from the route and every node partition, and says ``done`` after an end mark.

The agents read their records from an :class:`Inbox` each, which faust's conductor fills
(:class:`DirectConductor`), not from faust's streams: faust subscribes, assigns, fetches and
commits, and none of its per-record event path runs. faust's private internals (the aiokafka
consumer thread, ``_committed_offset``, ``_gap``, the conductor's handlers) are touched only here.

Delivery is at-least-once, results exactly-once: inputs are acknowledged (so their offsets can be
committed) only after the mark that applied them has been processed, its outputs delivered and
the stage state written to the table; after a crash the gates recognise what the restored state
already applied (source offsets and mark numbers are part of the state), so redelivered records
are not applied twice. Outputs may be written twice (a crash after sending, before the state
write); they carry deterministic ids and the sink deduplicates by id.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import faust
import uvloop
from aiokafka.partitioner import DefaultPartitioner, murmur2
from faust.sensors import Monitor
from faust.transport.conductor import Conductor
from faust.transport.consumer import Fetcher
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaDriverConsumer
from faust.types import TP
from mode.services import WaitResults
from mode.worker import EX_FAILURE

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
from stream_jobs.config import EngineConfig, Thresholds
from stream_jobs.delivery import Delivery, exit_for_restart
from stream_jobs.fleet_metrics import OutputObserver
from stream_jobs.node_agent import NodeAgent, node_state_partition
from stream_jobs.offset_guard import OffsetGuard, WorkerMetrics
from stream_jobs.offsets import PartitionStalled
from stream_jobs.pipeline import INPUT_TOPICS
from stream_jobs.route_agent import RouteAgent, RouteTopics
from stream_jobs.state_store import ChunkedStore
from stream_jobs.watermark import tp_key

__all__ = ["DirectSender", "DurableTable", "OffsetGuard", "StreamJobs", "WorkerMetrics", "app_id", "changelog_topics",
           "engine_config", "make_app", "raw_topic", "run_worker"]

log = get_logger(__name__)

_PUBLIC_OUT: dict[type[Message], TopicSpec] = {
    PodWindow: POD_WINDOWS, ClusterCapacity: CLUSTER_CAPACITY, PodLifecycle: POD_LIFECYCLE, Alert: ALERTS}


def engine_config(settings: WorkerSettings) -> EngineConfig:
    return EngineConfig(window_s=settings.window_s, sample_interval_s=settings.sample_interval_s,
                        prices_usd_per_gpu_hour=dict(settings.prices_usd_per_gpu_hour),
                        thresholds=Thresholds().with_overrides(settings.thresholds),
                        max_skew_s=settings.max_skew_s, horizon_s=settings.horizon_s,
                        accept_clusters=settings.accepted_clusters())


def app_id(settings: WorkerSettings) -> str:
    return settings.app_id or f"{settings.topic_prefix}-stream-jobs"


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

    def __init__(self, *args: Any, partition_of: Callable[[bytes], int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unconfirmed: list[Any] = []
        self._partition_of = partition_of

    def partition_for_key(self, key: Any) -> int:
        """The changelog partition of ``key``, from the key itself: faust takes it from the event
        being processed, which the agents' :class:`Inbox` does not make."""
        return self._partition_of(key)

    def send_changelog(self, *args: Any, **kwargs: Any) -> Any:
        fut = super().send_changelog(*args, **kwargs)
        self._unconfirmed.append(fut)
        return fut

    async def confirm(self) -> None:
        """Until every changelog write made so far is delivered; raises if one failed."""
        pending, self._unconfirmed = self._unconfirmed, []
        await asyncio.gather(*pending)


class ExitingFetcher(Fetcher):  # type: ignore[misc]
    """faust's fetcher, except that a crash ends the process (exit 70) so that it restarts from its
    checkpoints. faust's own handling stops the worker, and a chaos run's worker whose fetcher
    raised ``KeyError(TopicPartition(...))`` in "Drain messages" (right after a seek) began to stop
    and never exited: nothing restarted it and the replay hung. The crash faust uses to restart
    the fetcher after a rebalance (a cancellation while rebalancing) keeps faust's path, which
    wakes a supervisor the fetcher does not have: that error crashes it again, and ends the process.

    So does a fetch loop that ends without the fetcher being stopped: faust ends it without a word
    on a cancellation outside a rebalance, and every later ``maybe_start`` (each restore of the
    tables) takes the fetcher for running. Nothing would be fetched again."""

    async def crash(self, reason: BaseException) -> None:
        if isinstance(reason, asyncio.CancelledError) and self.app.rebalancing:
            await super().crash(reason)
            return
        exit_for_restart(f"faust's fetcher crashed: {reason!r}")

    def set_shutdown(self) -> None:
        """Called as the fetch loop ends, and as the fetcher stops."""
        super().set_shutdown()
        if not (self.should_stop or self.app.should_stop or self.app.consumer.should_stop):
            exit_for_restart("faust's fetch loop ended without the fetcher being stopped")


class _Resumed:
    """The rest of a coroutine whose first step has run and yielded ``pending``: awaiting this
    waits for ``pending`` and drives the coroutine on from there (what ``await coro`` would have
    done had it not been started)."""

    def __init__(self, coro: Any, pending: Any) -> None:
        self.coro, self.pending = coro, pending

    def __await__(self) -> Any:
        coro, value = self.coro, self.pending
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # a cancellation, say: the coroutine handles it
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                value = coro.send(sent)
            except StopIteration as stop:
                return stop.value


SESSION_TIMEOUT_S = 10.0
"""A crashed worker's partitions move to the others after this long (faust's default is 60 s)."""

FETCH_MIN_BYTES = 64 * 1024
FETCH_MAX_WAIT_MS = 100
"""A fetch returns once 64 KiB are there or after 100 ms (faust's consumer: 1 byte, 1,500 ms).

With 1 byte, a busy worker's consumer thread fetched again the moment anything was there: many
small fetches, each a request to write and a response to take apart, and a hand-over to the main
thread, all competing with the stages for the GIL. In alternating runs of the stream benchmark's
throughput phase (one worker, 64 nodes x 8 GPUs, 3,776 samples; 7 before, 10 after) the worker
needed about a fifth less CPU per sample (median 678 against 537 samples/s). A partition that gets fewer
than 64 KiB waits at most 100 ms, which each hop between the stages in live mode (input -> route
-> node-inputs -> node) can add to an alert's latency; with faust's 1,500 ms a record that arrived
while the one fetch in flight was out for other partitions waited up to that long (the bench's
live p50 / p99 went from 821 / 882 ms to 473-528 / 595-618 ms)."""


class _BatchingFetchThread(AIOKafkaConsumerThread):  # type: ignore[misc]
    """faust's consumer thread with :data:`FETCH_MIN_BYTES` and :data:`FETCH_MAX_WAIT_MS`."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # read when the consumer starts its fetcher; faust passes no setting for either
        consumer._fetch_min_bytes = FETCH_MIN_BYTES
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer


class DirectHandoffConsumer(AIOKafkaDriverConsumer):  # type: ignore[misc]
    """faust's aiokafka consumer, except that it hands a fetched message to the streams without four
    asyncio tasks when the hand-over does not have to wait.

    faust's fetcher loop hands each message over with ``wait_first(callback(message),
    suspend_flow.wait())``, and mode's ``wait_first`` starts a task for each of those two and for
    the service's stopped and crashed events, then cancels three of them: about a tenth of a
    worker's CPU went there (cProfile of the stream benchmark, 2.3 Kafka records per sample). The
    hand-over only waits when a stream's buffer is full; otherwise it completes at its first step.
    That step is run here; a hand-over that does wait goes on under mode's ``wait_first`` as
    before, so a rebalance or stop still interrupts it. A hand-over that waits for room in a queue
    faust then empties (the tables' changelog queue, full while a restore reads a long changelog,
    as a rebalance suspends the flow) goes with the queue's other records; in faust it ended the
    fetch loop. Its consumer thread fetches in larger batches (:data:`FETCH_MIN_BYTES`)."""

    async def wait_first(self, *coros: Any, timeout: Any = None) -> Any:
        if timeout is not None or len(coros) != 2 or not asyncio.iscoroutine(coros[0]):
            return await super().wait_first(*coros, timeout=timeout)
        handoff, flow = coros
        try:
            pending = handoff.send(None)
        except BaseException as exc:  # done at its first step (StopIteration), or failed: flow unused
            if asyncio.iscoroutine(flow):
                flow.close()
            if isinstance(exc, StopIteration):
                return WaitResults([handoff], [exc.value], False)
            raise
        try:
            return await super().wait_first(_Resumed(handoff, pending), flow)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the fetch loop itself is cancelled
            # faust emptied the queue the record waited to enter (its flow control clears the
            # queues, and a cleared queue cancels the puts that wait): the record went with the
            # queue's others. Raised on, this ended faust's fetch loop, for good outside a rebalance.
            return WaitResults([], [], False)

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return _BatchingFetchThread(self, loop=self.loop, beacon=self.beacon)


def raw_topic(app: Any, *names: str, partitions: int | None = None) -> Any:
    """A faust topic of one or several names, keys and values bytes (every gpulens topic holds JSON
    the stages decode and validate themselves; the agents read it through an :class:`Inbox`)."""
    return app.topic(*names, partitions=partitions, key_serializer="raw", value_serializer="raw")


class DirectEvent:
    """A record as an agent takes it from its :class:`Inbox`: what the agents read of a faust
    event (``message``: the consumer's record; ``value``: its bytes)."""

    __slots__ = ("message", "value")

    def __init__(self, message: Any) -> None:
        self.message = message
        self.value = message.value


class Inbox:
    """An agent's records, handed over by faust's fetch loop in the order fetched, read by the agent
    as it would read its stream: ``noack()``, ``events()``, ``ack(event)``.

    faust turns each record into an event, puts it on every subscribed channel's queue and takes
    it off in the agent's stream, tracking and timing it on the way, then acknowledges it through
    the stream and the message's reference count; the stream jobs use none of that (each topic has
    one agent, which acknowledges in offset order itself, :class:`~stream_jobs.offset_guard.OffsetGuard`).
    The records of the topics routed here (:class:`DirectConductor`) skip it: the conductor appends
    each to this inbox, and an acknowledgement goes straight to the consumer's, which commits.

    Kept from faust's path: nothing is appended while faust suspends the flow (a rebalance, the
    tables' recovery), the inbox is emptied whenever faust empties its streams' buffers (a
    revocation, the flow's resumption: the flow control manages it as a queue), and a full inbox
    (``limit`` records, faust's ``stream_buffer_maxsize``) holds the fetch loop until the agent
    has taken half of it. Each record taken is noted as the partition's stream's last event, which
    faust's consumer reads to log a stream that stopped processing."""

    def __init__(self, app: Any, limit: int | None = None) -> None:
        self.app = app
        self.limit = limit or int(app.conf.stream_buffer_maxsize)
        self._items: deque[Any] = deque()
        self._ready = asyncio.Event()
        self._space: asyncio.Event | None = None
        app.flow_control.manage_queue(self)

    async def put(self, message: Any) -> None:
        """The conductor's callback for a record of a routed topic."""
        await self.app.flow_control.acquire()
        self._items.append(message)
        self._ready.set()
        if len(self._items) >= self.limit:
            self._space = space = asyncio.Event()
            await space.wait()

    def clear(self) -> None:
        """Drop what waits (faust's flow control calls this as it empties its queues)."""
        self._items.clear()
        self._make_space()

    def _make_space(self) -> None:
        if self._space is not None and 2 * len(self._items) <= self.limit:
            self._space.set()
            self._space = None

    @property
    def full(self) -> bool:
        """True while the inbox holds the fetch loop (it waits for the agent to take half)."""
        return self._space is not None

    def noack(self) -> Inbox:
        return self

    async def events(self) -> Any:
        items, ready = self._items, self._ready
        inbound = self.app.monitor.stream_inbound_time
        clock = time.monotonic
        while True:
            while items:
                message = items.popleft()
                if self._space is not None:
                    self._make_space()
                inbound[message.tp] = clock()
                yield DirectEvent(message)
            ready.clear()
            await ready.wait()

    async def ack(self, event: Any) -> None:
        self.app.consumer.ack(event.message)


class DirectConductor(Conductor):  # type: ignore[misc]
    """faust's conductor, except that the records of the topics in ``direct`` go to their
    :class:`Inbox` instead of faust's channels (see there). faust still subscribes to those topics
    for the agents declared over them, assigns their partitions, fetches and commits them."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.direct: dict[str, Inbox] = {}

    def _build_handler(self, tp: TP, channels: Any) -> Any:
        inbox = self.direct.get(tp.topic)
        return inbox.put if inbox is not None else super()._build_handler(tp, channels)


def direct_agent(app: Any, topic: Any, name: str, fun: Callable[[Inbox], Awaitable[None]]) -> Inbox:
    """Declare an agent ``name`` over ``topic`` (a faust topic of one or several names) that reads
    the topic's records from an :class:`Inbox` (``fun(inbox)``) rather than from faust's stream;
    returns the inbox."""
    inbox = Inbox(app)
    conductor = app.topics
    for topic_name in topic.topics:
        conductor.direct[topic_name] = inbox

    async def agent(stream: Any) -> None:
        await fun(inbox)

    app.agent(topic, name=name)(agent)
    return inbox


class LeanMonitor(Monitor):  # type: ignore[misc]
    """faust's monitor without its per-record bookkeeping. faust's :class:`Monitor` counts every
    message and stream event by topic, stream and task and times each one, for faust's own web
    views, which a worker does not serve (its figures are on ``/metrics``): about 2 % of a
    worker's cProfile (the stream benchmark). The agents' inboxes note when a partition's stream
    last took an event (:meth:`Inbox.events`), which faust's consumer reads to log a stream that
    stopped processing."""

    def on_message_in(self, tp: TP, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: TP, offset: int, stream: Any, event: Any) -> None:
        return None

    def on_stream_event_out(self, tp: TP, offset: int, stream: Any, event: Any, state: Any = None) -> None:
        return None

    def on_message_out(self, tp: TP, offset: int, message: Any) -> None:
        return None


class KeyHashCache:
    """aiokafka's default partitioner (murmur2 of the key, as the Java client's), with each key's
    hash kept: it is pure Python, about 10 us a record, and a worker keys its outputs by pod and
    sends each pod's windows, usage and alerts under the same key again and again. The same
    partition for every key as the default partitioner; a record without a key goes to a random
    available partition, as there."""

    def __init__(self, size: int = 65_536) -> None:
        self._hash = functools.lru_cache(maxsize=size)(murmur2)

    def __call__(self, key: bytes | bytearray | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return int(DefaultPartitioner()(key, all_partitions, available))
        return all_partitions[(self._hash(bytes(key)) & 0x7FFFFFFF) % len(all_partitions)]


class RestartingWorker(faust.Worker):  # type: ignore[misc]
    """faust's worker, except that an error that ends it (one raised while it starts, above all)
    ends the process with ``EXIT_STALLED``, like every other crash of the stream jobs, instead of
    mode's status 1 (``exiting()``): a supervisor that restarts only the status that asks for it
    (``gpulens replay --kafka`` outside a chaos run) would otherwise give up on a worker that met,
    say, a broker going away while it joined its group. Out of memory keeps mode's status; a clean
    stop keeps 0."""

    def execute_from_commandline(self) -> NoReturn:
        try:
            super().execute_from_commandline()
        except SystemExit as exc:
            if exc.code == EX_FAILURE:
                exit_for_restart(f"the worker stopped on an error: {exc.__context__!r}")  # what exiting() caught
            raise
        raise SystemExit(0)  # for mypy: mode's method always exits


def _durable_table(app: Any, name: str, partitions: int, partition_of: Callable[[bytes], int]) -> DurableTable:
    """A :class:`DurableTable` registered with ``app`` as ``app.Table`` would (bytes keys/values)."""
    table = DurableTable(app, name=name, default=None, beacon=app.tables.beacon, partitions=partitions,
                         key_type=bytes, value_type=bytes, partition_of=partition_of)
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


class FaustConsumerPort:
    """The consumer as :class:`~stream_jobs.offset_guard.OffsetGuard` and the route see it: the
    only code that reaches into faust's (and its aiokafka driver's) private attributes."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def committed(self, tp: Any) -> int:
        consumer = self.app.consumer
        thread = consumer._thread  # faust's aiokafka driver: the client lives in its own thread
        offset = await thread.call_thread(thread._ensure_consumer().committed, tp)
        return int(offset) if offset is not None else await self.log_start(tp)

    def local_committed(self) -> dict[str, int]:
        """The offsets this consumer committed, ``topic:partition`` -> next offset (no broker call)."""
        committed = getattr(self.app.consumer, "_committed_offset", {}) or {}
        return {tp_key(tp.topic, tp.partition): int(off) for tp, off in list(committed.items()) if off is not None}

    async def log_start(self, tp: Any) -> int:
        return int((await self.app.consumer.earliest_offsets(tp))[tp])

    async def committed_many(self, tps: list[Any]) -> dict[Any, int]:
        out: dict[Any, int] = await self._group_commits([TP(tp.topic, tp.partition) for tp in tps])
        missing = [tp for tp in tps if tp not in out]
        if missing:
            starts = await self.app.consumer.earliest_offsets(*missing)
            out.update({tp: int(off) for tp, off in starts.items() if off is not None})
        return out

    async def log_ends(self, tps: list[Any]) -> dict[Any, int]:
        found = await self.app.consumer.highwaters(*tps)
        return {tp: int(offset) for tp, offset in found.items() if offset is not None}

    async def group_committed(self, keys: list[str]) -> dict[str, int]:
        """The group's committed offsets of ``topic:partition`` keys, owned by this consumer or not
        (keys with no commit are left out)."""
        tps = [TP(topic, int(partition)) for topic, partition in (key.rsplit(":", 1) for key in keys)]
        found = await self._group_commits(tps)
        return {tp_key(tp.topic, tp.partition): offset for tp, offset in found.items()}

    async def _group_commits(self, tps: list[Any]) -> dict[Any, int]:
        """The group's committed offsets of ``tps`` in one request to its coordinator (those with
        no commit are left out), keyed by :class:`TP`."""
        thread = self.app.consumer._thread
        coordinator = thread._ensure_consumer()._coordinator
        found = await thread.call_thread(coordinator.fetch_committed_offsets, tps)
        return {TP(tp.topic, tp.partition): int(meta.offset) for tp, meta in found.items() if meta.offset >= 0}

    def assignment(self) -> set[Any]:
        return set(self.app.consumer.assignment())

    def settled(self) -> bool:
        return not self.app.rebalancing and bool(self.app.consumer.flow_active)

    def unsettled_state(self) -> dict[str, Any]:
        app, consumer = self.app, self.app.consumer
        state: dict[str, Any] = {"rebalancing": bool(app.rebalancing), "flow_active": bool(consumer.flow_active)}
        recovery = app.tables.recovery
        if recovery.in_recovery:
            # what a restore that reads nothing looks like from here (a chaos run in CI hung so once)
            fetching, paused = consumer._get_active_partitions(), consumer._paused_partitions
            state["restoring"] = {
                tp_key(tp.topic, tp.partition): {
                    "offset": recovery.active_offsets.get(tp), "highwater": recovery.active_highwaters.get(tp),
                    "fetching": tp in fetching, "paused": tp in paused, "client": self._client_state(tp)}
                for tp, remaining in sorted(recovery.active_remaining().items()) if remaining > 0}
            # the fetch task marks its service shut down whenever it ends, stopped or not
            state["fetcher"] = {"state": app._fetcher.state, "loop_ended": app._fetcher._shutdown.is_set()}
            state["flow_control_active"] = bool(app.flow_control.is_active())
            state["full_inboxes"] = sorted({topic for topic, inbox in app.topics.direct.items() if inbox.full})
        return state

    def _client_state(self, tp: Any) -> str:
        """aiokafka's state of ``tp``, for the log only: it belongs to the consumer's thread."""
        try:
            client = self.app.consumer._thread._ensure_consumer()
            subscription = client._subscription.subscription
            state = subscription.assignment.state_value(tp) if subscription and subscription.assignment else None
            if state is None:
                return "not assigned"
            buffered = tp in list(client._fetcher._records)
            return (f"{state._status.name.lower()}, position {state._position}, paused {state._paused}, "
                    f"fetched and not taken {buffered}")
        except Exception as exc:  # a diagnostic never fails the check that logs it
            return f"unknown ({exc!r})"

    def recovery_idle_s(self) -> float | None:
        recovery = self.app.tables.recovery
        started = recovery._recovery_started_at
        if not recovery.in_recovery or started is None or not recovery.active_remaining_total():
            return None
        last = max(recovery._active_events_received_at.values(), default=started)
        return time.monotonic() - last

    async def seek(self, tp: Any, offset: int) -> None:
        consumer = self.app.consumer
        consumer._gap.pop(tp, None)  # else faust counts the skipped offsets as acknowledged
        await consumer.seek(tp, offset)

    def pause(self, tp: Any) -> None:
        self.app.consumer.pause_partitions({TP(tp.topic, tp.partition)})

    def resume(self, tp: Any) -> None:
        # faust's own TP: resume_partitions adds what it is given to a set it asserts holds only those
        self.app.consumer.resume_partitions({TP(tp.topic, tp.partition)})


@dataclass(frozen=True)
class DirectSender:
    """Sends records to one topic with the app's producer, without faust's ``Topic.send``.

    faust's path builds a pending message, a future message and a sensor state per record and
    resolves one future through another; the stream jobs need none of it (their records are bytes,
    their futures are awaited before inputs are acknowledged). What :class:`~stream_jobs.delivery.Delivery`
    calls: ``send`` (the record's delivery, a future to await) and ``get_topic_name``."""

    app: Any
    name: str

    async def send(self, *, key: bytes | None, value: bytes, partition: int | None = None,
                   headers: list[tuple[str, bytes]] | None = None) -> Awaitable[Any]:
        result: Awaitable[Any] = await self.app.producer.send(self.name, key, value, partition, None, headers)
        return result

    def get_topic_name(self) -> str:
        return self.name


def make_app(settings: WorkerSettings) -> Any:
    """The faust app of a worker, with its runtime: the broker settings, the at-least-once
    guarantee, bytes keys and values, :class:`DirectHandoffConsumer` and :class:`ExitingFetcher`.
    No topics or agents: :class:`StreamJobs` declares the stream jobs on it, and the stream
    benchmark a bare passthrough (the floor under a worker)."""
    kafka = settings.kafka
    credentials: Any = None
    if kafka.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        credentials = faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password.get_secret_value() if kafka.sasl_password else None,
            ssl_context=kafka.ssl_context() if kafka.security_protocol == "SASL_SSL" else None,
            mechanism=kafka.sasl_mechanism)
    elif kafka.security_protocol == "SSL":
        credentials = faust.SSLCredentials(kafka.ssl_context())
    datadir = settings.data_dir / "stream-jobs" / app_id(settings)
    datadir.mkdir(parents=True, exist_ok=True)
    app: Any = faust.App(
        app_id(settings),
        broker=kafka.faust_broker_url(),
        broker_credentials=credentials,
        broker_client_id=kafka.client_id,
        datadir=str(datadir),
        store="memory://",
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        broker_commit_interval=1.0,
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=1.0,
        consumer_group_instance_id=settings.group_instance_id,
        producer_acks=-1,
        producer_linger_ms=0,
        # as the agents' and the watcher's producers (GPULENS_PRODUCER__COMPRESSION): a worker's
        # outputs and checkpoints are JSON, and writing them uncompressed cost it more than lz4 does
        producer_compression_type=None if settings.producer.compression == "none" else settings.producer.compression,
        table_standby_replicas=0,
        topic_replication_factor=1,
        web_enabled=settings.web_port > 0,
        web_port=settings.web_port or 6066,
        web_bind=str(settings.web_bind),
        autodiscover=False,
        key_serializer="raw",  # every topic and changelog holds bytes we encode ourselves
        value_serializer="raw",
        Monitor=LeanMonitor,
        producer_partitioner=KeyHashCache(),
    )
    app.transport.Fetcher = ExitingFetcher
    app.transport.Consumer = DirectHandoffConsumer
    app.transport.Conductor = DirectConductor
    return app


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
        self.node_durable = _durable_table(app, NODE_TABLE, self.node_partitions, node_state_partition)
        self.cluster_durable = _durable_table(app, CLUSTER_TABLE, 1, lambda key: 0)
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


WORKER_GC_THRESHOLDS = (50_000, 20, 100)
"""The worker's cyclic garbage collector runs after 50,000 net allocations instead of 700, and a
full collection comes about 14x less often. A worker holds its stages' state (every pod, GPU and
buffered sample) and faust's buffers, and each collection scanned them: with the default
thresholds, collections took 3 of 25 s of a benchmark run (64 nodes), and throughput rose about 8 %
without them at the same peak memory. What the stream jobs free is freed by reference counting;
the collector is only for cycles (asyncio futures, exceptions)."""


def use_uvloop() -> None:
    """A worker's event loops (the main one, and that of faust's consumer thread, made later under
    the same policy) are uvloop's, not asyncio's. Both threads spend much of their time in the loop
    itself: buffering socket reads (``StreamReader.feed_data``), writes, the selector, scheduling
    callbacks; pure Python in asyncio, C in uvloop. In alternating runs of the stream benchmark's
    throughput phase (3 pairs) a worker did 680-789 samples/s against 597-693 without it, with
    about a seventh less CPU per sample. faust supports uvloop (its ``uvloop`` extra); the
    in-process tests and the simulated parts keep asyncio's loop."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run_worker(settings: WorkerSettings, metrics: WorkerMetrics | None = None,
               observer: OutputObserver | None = None) -> None:
    """Run a faust worker for ``settings`` until SIGTERM/SIGINT (blocks; exits the process)."""
    gc.set_threshold(*WORKER_GC_THRESHOLDS)
    use_uvloop()
    jobs = StreamJobs(settings, metrics, observer)
    for name in ("faust", "mode", "aiokafka", "kafka"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(settings.log_level)))
    worker = RestartingWorker(jobs.app, loglevel=settings.log_level.lower(), override_logging=False, quiet=True)
    log.info("stream jobs starting", app_id=app_id(settings), stage=settings.stage,
             watermark_source=settings.watermark_source, prefix=settings.topic_prefix)
    worker.execute_from_commandline()
