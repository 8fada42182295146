"""The faust runtime of a worker: the one place, with :mod:`stream_jobs.faust_port`, that imports
faust, mode and aiokafka and reaches into their internals.

faust supplies agents, partition assignment and changelog-backed tables; the stream jobs use its
subscription, fetching and committing, and none of its per-record event path. This module makes
the app (:func:`make_app`) with a transport of its own:

- the agents read their records from an :class:`Inbox` each, which faust's conductor fills
  (:class:`DirectConductor`, :func:`direct_agent`), not from faust's streams;
- faust's fetcher ends the process when it crashes or its loop ends unstopped
  (:class:`ExitingFetcher`), and so does an error that ends the worker (:class:`RestartingWorker`):
  the restarted worker resumes from its checkpoints;
- the consumer hands a record over without four asyncio tasks (:class:`DirectHandoffConsumer`)
  and fetches in batches (:data:`FETCH_MIN_BYTES`); the monitor keeps no per-record figures
  (:class:`LeanMonitor`); the producer's partitioner caches key hashes (:class:`KeyHashCache`).

The private attributes of faust, mode and aiokafka relied on here and in the port are listed in
``tests/stream_jobs/test_faust_internals.py``, which checks them against the pinned versions.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn

import faust
import uvloop
from aiokafka.partitioner import DefaultPartitioner, murmur2
from faust.sensors import Monitor
from faust.transport.conductor import Conductor
from faust.transport.consumer import Fetcher
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaDriverConsumer
from faust.transport.drivers.aiokafka import Producer as AIOKafkaDriverProducer
from faust.types import TP
from mode.services import WaitResults
from mode.worker import EX_FAILURE

from common.settings import WorkerSettings
from stream_jobs.config import WORKER_GC_THRESHOLDS
from stream_jobs.delivery import exit_for_restart

__all__ = ["FETCH_MAX_WAIT_MS", "FETCH_MIN_BYTES", "SESSION_TIMEOUT_S", "WORKER_GC_THRESHOLDS", "DirectConductor",
           "DirectEvent", "DirectHandoffConsumer", "ExitingFetcher", "Inbox", "KeyHashCache", "LeanMonitor",
           "RestartingWorker", "app_id", "direct_agent", "make_app", "raw_topic", "use_uvloop"]


def app_id(settings: WorkerSettings) -> str:
    """The faust app id, which is also the consumer group and the prefix of the changelogs."""
    return settings.app_id or f"{settings.topic_prefix}-stream-jobs"


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


class IdempotentProducer(AIOKafkaDriverProducer):  # type: ignore[misc]
    """The worker's producer: ``acks=all`` with idempotence, like every gpulens producer
    (``common.kafka``). faust asks the broker for idempotence only inside transactions; without it
    a send retried after a partition leader moved could write its batch twice, and a stage's
    output or a changelog record would be duplicated on the topic."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}


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

    async def events(self) -> AsyncIterator[DirectEvent]:
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

    async def ack(self, event: DirectEvent) -> None:
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
        # for the one topic faust creates itself (its leader topic): the factor stream_jobs.service
        # resolved for the cluster when it created the others (1 where none was resolved)
        topic_replication_factor=settings.topics.resolve(brokers=1)[0],
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
    app.transport.Producer = IdempotentProducer
    app.transport.Consumer = DirectHandoffConsumer
    app.transport.Conductor = DirectConductor
    return app


def use_uvloop() -> None:
    """A worker's event loops (the main one, and that of faust's consumer thread, made later under
    the same policy) are uvloop's, not asyncio's. Both threads spend much of their time in the loop
    itself: buffering socket reads (``StreamReader.feed_data``), writes, the selector, scheduling
    callbacks; pure Python in asyncio, C in uvloop. In alternating runs of the stream benchmark's
    throughput phase (3 pairs) a worker did 680-789 samples/s against 597-693 without it, with
    about a seventh less CPU per sample. faust supports uvloop (its ``uvloop`` extra); the
    in-process tests and the simulated parts keep asyncio's loop."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
