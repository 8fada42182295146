"""The offset guard of the faust runtime: which consumed records to process, when to acknowledge
them, and seeking the consumer back when it skipped records (see :class:`OffsetGuard`).

Why a module of its own: it is the exactly-once core of the runtime and is tested without faust
(``tests/stream_jobs/test_offsets.py`` drives it with a fake consumer through :class:`ConsumerPort`);
the faust side of the port is :class:`stream_jobs.faust_port.FaustConsumerPort`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Protocol

from common.logs import get_logger
from common.metrics import Counter, MetricsRegistry
from stream_jobs.json_types import JsonValue
from stream_jobs.offsets import AckOrder, PartitionStalled, Positions, TopicPartition

log = get_logger(__name__)

UNSETTLED_SAY_S = 30.0
"""How often :meth:`OffsetGuard.watch` says that the consumer is still not settled."""


class WorkerMetrics:
    """The worker's ``/metrics``: records in/out per topic, dead letters, late samples, watermark
    lag, stage processing time."""

    def __init__(self, registry: MetricsRegistry | None = None) -> None:
        self.registry = registry or MetricsRegistry()
        r = self.registry
        self.records_in = r.counter("stream_records_in_total", "records consumed", ("topic",))
        self.records_out = r.counter("stream_records_out_total", "records produced", ("topic",))
        self.deadletters = r.counter("stream_deadletters_total", "input records dead-lettered", ("topic", "reason"))
        self.deadletters_suppressed = r.counter(
            "stream_deadletters_suppressed_total",
            "records rejected beyond the dead-letter rate (deadletter_rate_per_s): counted, not written",
            ("topic", "reason"))
        self.late_samples = r.counter("stream_late_samples_total", "samples older than the watermark, dropped")
        self.dra_unresolved = r.counter(
            "stream_dra_unresolved_total",
            "DRA allocations of samples not resolved to a GPU (the node's ResourceSlices not seen, or no device "
            "with a UUID): the GPU stays unattributed for that sample (docs/dra.md)")
        self.skips = r.counter("stream_consumer_skips_total", "forward jumps of the consumer, read again")
        self.duplicates = r.counter("stream_redelivered_total", "redelivered records and marks recognised",
                                    ("stage",))
        self.marks = r.counter("stream_marks_total", "watermark marks processed", ("stage",))
        self.watermark_lag = r.gauge("stream_watermark_lag_seconds",
                                     "wall clock minus the stage's event-time watermark", ("stage",))
        self.stage_seconds = r.histogram("stream_stage_seconds", "processing time of one mark", ("stage",))
        self.read_ahead = r.gauge("stream_read_ahead_bytes",
                                  "sample bytes a node partition holds read but not released by a mark", ("partition",))
        self.pauses = r.counter("stream_read_ahead_pauses_total",
                                "times a node partition stopped fetching its samples (read_ahead_bytes reached)")
        self._in: dict[str, Counter] = {}
        self._out: dict[str, Counter] = {}

    def record_in(self, topic: str) -> None:
        """Count a record consumed from ``topic``."""
        self._count(self.records_in, self._in, topic)

    def record_out(self, topic: str) -> None:
        """Count a record produced to ``topic``."""
        self._count(self.records_out, self._out, topic)

    @staticmethod
    def _count(counter: Counter, series_by_topic: dict[str, Counter], topic: str) -> None:
        """Increment ``counter``'s series for ``topic``, looked up once per topic: ``labels()``
        takes a lock and checks its values, once per record it was about 1 % of a worker's CPU."""
        series = series_by_topic.get(topic)
        if series is None:
            series = series_by_topic[topic] = counter.labels(topic)
        series.inc()


class ConsumedRecord(Protocol):
    """A consumed record as faust's ``Message`` describes it: where it was read, its key and its
    broker timestamp (epoch seconds)."""

    @property
    def tp(self) -> TopicPartition: ...

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def timestamp(self) -> float | None: ...


class Consumed(Protocol):
    """What an agent acknowledges: a consumed event (faust's ``Event``), or a token standing for one
    (:class:`stream_jobs.delivery.SharedAck`). :class:`OffsetGuard` keeps it until it may be
    acknowledged (:class:`~stream_jobs.offsets.AckOrder`)."""

    @property
    def message(self) -> ConsumedRecord: ...


class ConsumerPort(Protocol):
    """What :class:`OffsetGuard` needs from the consumer."""

    async def committed(self, tp: TopicPartition) -> int:
        """The group's committed offset of ``tp`` (the log start when nothing is committed)."""

    async def committed_many(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """:meth:`committed` of several partitions, in one request to the group coordinator and one
        for the log starts of those with no commit."""

    async def log_start(self, tp: TopicPartition) -> int: ...

    async def log_ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Per partition, the offset the next record written to it will get (the high watermark):
        one request for all of them."""

    def assignment(self) -> set[TopicPartition]:
        """The partitions the consumer owns now."""

    def settled(self) -> bool:
        """False while the group rebalances or the consumer's flow is stopped (no records come
        then, by design: not a stall)."""

    def unsettled_state(self) -> Mapping[str, JsonValue]:
        """What keeps the consumer unsettled, for the log (e.g. ``rebalancing``, ``flow_active``)."""

    def recovery_idle_s(self) -> float | None:
        """While the worker restores its tables and records remain to be read: seconds since the
        last record of them came (since the restore began if none has); None otherwise."""

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` again, forgetting any gap the consumer recorded beyond it."""

    def pause(self, tp: TopicPartition) -> None:
        """Stop fetching ``tp`` (records already fetched may still come, or be dropped)."""

    def resume(self, tp: TopicPartition) -> None:
        """Fetch ``tp`` again."""


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
    :class:`PartitionStalled` (the worker exits and restarts) — never a silent hang. A check whose
    broker call does not answer within ``call_timeout_s`` counts as a stalled round (the watch
    itself must not hang on it), and a consumer that stays unsettled (a rebalance, or faust's
    recovery of its tables, which may take long and must not be cut short) is said in the log
    every ``UNSETTLED_SAY_S``.
    """

    def __init__(self, port: ConsumerPort, metrics: WorkerMetrics | None = None,
                 watched: Iterable[str] | None = None, stall_s: float = 5.0, give_up_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 call_timeout_s: float = 30.0) -> None:
        self.port = port
        self.call_timeout_s = call_timeout_s
        self._unsettled_since: float | None = None
        self._unsettled_said = 0.0
        self.metrics = metrics or WorkerMetrics()
        self.positions = Positions(wall_clock=wall_clock)
        self.acks: AckOrder[Consumed] = AckOrder()
        self._revoked: set[TopicPartition] = set()
        self.watched: set[str] | None = None if watched is None else set(watched)
        """Topics whose partitions :meth:`watch` checks (None: all owned)."""
        self.stall_s, self.give_up_s, self.clock = stall_s, give_up_s, clock
        self._progress: dict[TopicPartition, float] = {}
        """Per owned partition: when it last admitted a record (or was assigned, or checked)."""
        self._stalled: dict[TopicPartition, float] = {}
        """Per stalled partition: since when it has admitted nothing though the log has more."""
        self.state_positions: dict[str, Callable[[int], int | None]] = {}
        """Per topic read by a stage that keeps state: the offset of a partition's first record
        its saved state does not hold (None: no state saved). A partition starts there when that
        is below the committed offset (see :meth:`_start`)."""
        self._committed: dict[TopicPartition, int] = {}
        """Committed offsets of owned partitions with no position yet, read at their assignment
        (:meth:`read_committed`)."""
        self._paused: set[TopicPartition] = set()
        """Partitions a stage paused (:meth:`pause`): not fetched by design, so not watched."""

    def assign(self, assignment: AbstractSet[TopicPartition]) -> None:
        """The assignment signal (the worker's whole assignment)."""
        for tp in self.positions.owned - set(assignment):
            self.acks.forget(tp)
        self.positions.assign(assignment)
        self._revoked.clear()
        self._reset_watch()

    def revoke(self, revoked: AbstractSet[TopicPartition]) -> None:
        self.positions.revoke(revoked)
        self._revoked |= set(revoked)
        for tp in revoked:
            self.acks.forget(tp)
        self._reset_watch()

    def _reset_watch(self) -> None:
        """After an assignment or revocation: forget what belongs to partitions no longer owned."""
        self._committed = {tp: off for tp, off in self._committed.items() if tp in self.positions.owned}
        now = self.clock()
        self._progress = {tp: self._progress.get(tp, now) for tp in self.positions.owned}
        self._stalled = {tp: t for tp, t in self._stalled.items() if tp in self.positions.owned}
        self._paused &= self.positions.owned

    def pause(self, tp: TopicPartition) -> None:
        """Stop fetching ``tp`` because a stage holds enough of it (back-pressure). Asked again
        while it still holds enough: the consumer resumes every partition after a rebalance."""
        if tp in self.positions.owned:
            self._paused.add(tp)
            self.port.pause(tp)

    async def resume(self, tp: TopicPartition) -> None:
        """Fetch ``tp`` again, from the next offset to admit: faust drops the rest of a fetched
        batch of a partition paused while the batch was handed over, and its fetch position is past
        them (the offset guard would catch the jump, but with a seek and a warning of its own)."""
        if tp not in self._paused:
            return
        self._paused.discard(tp)
        self._progress[tp] = self.clock()
        self.port.resume(tp)
        target = self.positions.next_offset(tp)
        if target is not None and tp in self.positions.owned:
            await self.port.seek(tp, target)

    async def admit(self, tp: TopicPartition, offset: int, compacted: bool, token: Consumed,
                    timestamp: float | None = None) -> bool:
        """``timestamp``: the record's broker timestamp, epoch seconds (see :meth:`Positions.admit`)."""
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
        verdict = self.positions.admit(tp, offset, compacted, timestamp)
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

    async def read_committed(self) -> None:
        """Read the committed offsets of every owned partition with no position yet, in one request
        (the assignment signal calls this). A partition's first record otherwise asked for its own
        commit, and for its log start where nothing was committed, each a round trip through the
        consumer's thread that waits behind its fetch: a fresh worker took 15 s to start reading
        its 40 partitions, and the liveness check took the slow ones for stalled. Not read (the
        broker away): each partition asks for its own, as before."""
        wanted = [tp for tp in self.positions.owned if self.positions.needs_start(tp) and tp not in self._committed]
        if not wanted:
            return
        try:
            found = await asyncio.wait_for(self.port.committed_many(wanted), self.call_timeout_s)
        except Exception as exc:
            log.warning("committed offsets not read at assignment", partitions=len(wanted), error=str(exc) or repr(exc))
            return
        self._committed.update((tp, off) for tp, off in found.items() if tp in self.positions.owned)

    async def _start(self, tp: TopicPartition) -> int:
        """A partition's first position: its committed offset, or, for a stage's input, the first
        record the stage's restored state does not hold when that is lower. A state older than the
        committed offsets means a late write of a former owner landed after the last owner's
        checkpoints (not fenced: see docs/stream_jobs.md); reading from the state's own position
        applies the records in between again instead of losing them."""
        committed = self._committed.pop(tp, None)
        if committed is None:
            committed = await self.port.committed(tp)
        start = committed
        position = self.state_positions.get(tp.topic)
        saved = position(tp.partition) if position is not None else None
        if saved is not None and saved < committed:
            log.warning("restored state is older than the committed offset; reading from the state's position",
                        topic=tp.topic, partition=tp.partition, committed=committed, state_position=saved)
            start = saved
        self.positions.start(tp, start)
        log.info("partition position", topic=tp.topic, partition=tp.partition, committed=committed, start=start)
        return start

    def done(self, tp: TopicPartition, offset: int, token: Consumed) -> list[Consumed]:
        return self.acks.done(tp, offset, token)

    async def _seek_back(self, tp: TopicPartition, target: int) -> None:
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
            self._say_unsettled(now)
            idle_s = self.port.recovery_idle_s()
            if idle_s is not None and idle_s >= self.give_up_s:
                # a long restore goes on (restarting would start it over), one that reads nothing does not
                log.error("restore read nothing; giving up", exc_info=False, idle_s=round(idle_s),
                          **self.port.unsettled_state())
                raise PartitionStalled(f"restoring the stage tables read no record for {idle_s:.0f}s although "
                                       f"records remain: restarting from the checkpoints")
            return
        self._unsettled_since = None
        for tp in self._paused:
            self._progress[tp] = now  # paused by a stage: waiting by design
        idle = [tp for tp, at in self._progress.items() if now - at >= self.stall_s
                and (self.watched is None or tp.topic in self.watched)]
        if not idle:
            return
        # one request for every idle partition: one per partition, through the consumer's thread
        # that also fetches, took a loaded worker 10 s per round while a partition crawled
        try:
            ends = await asyncio.wait_for(self.port.log_ends(idle), self.call_timeout_s)
        except Exception as exc:  # the broker may be away: the next round asks again
            log.warning("stall check failed; retrying", partitions=len(idle), error=str(exc) or repr(exc))
            return
        for tp in idle:
            if tp not in ends:
                continue
            try:
                await asyncio.wait_for(self._check_stall(tp, now, ends[tp]), self.call_timeout_s)
            except PartitionStalled:
                raise
            except TimeoutError:
                self._stalled_round(tp, now, ends[tp], f"no answer within {self.call_timeout_s:.0f}s")
            except Exception as exc:  # a rebalance can take the partition away: the next round decides
                log.warning("stall check failed; retrying", topic=tp.topic, partition=tp.partition, error=str(exc))

    def _say_unsettled(self, now: float) -> None:
        """Log, every ``UNSETTLED_SAY_S``, that the consumer has not settled and why."""
        if self._unsettled_since is None:
            self._unsettled_since = self._unsettled_said = now
        elif now - self._unsettled_said >= UNSETTLED_SAY_S:
            self._unsettled_said = now
            log.warning("consumer not settled: partitions are not watched meanwhile",
                        unsettled_s=round(now - self._unsettled_since), **self.port.unsettled_state())

    def _stalled_round(self, tp: TopicPartition, now: float, end: int, why: str) -> None:
        """A check of ``tp`` that could not finish counts towards its give-up like a stalled round."""
        since = self._stalled.setdefault(tp, now - self.stall_s)
        self._progress[tp] = now
        self._give_up_if_due(tp, now, since, f"log end {end}; its checks did not finish: {why}", log_end=end,
                             reason=why)
        log.warning("stall check did not finish; retrying", topic=tp.topic, partition=tp.partition, reason=why,
                    stalled_s=round(now - since, 1))

    def _give_up_if_due(self, tp: TopicPartition, now: float, since: float, detail: str, **fields: int | str) -> None:
        """Raise :class:`PartitionStalled` once ``tp`` has been stalled since ``since`` for
        ``give_up_s`` (``fields``: for the log line)."""
        if now - since >= self.give_up_s:
            log.error("partition stalled: its records do not come although the log holds them; restarting",
                      exc_info=False, topic=tp.topic, partition=tp.partition, **fields,
                      stalled_s=round(now - since, 1))
            raise PartitionStalled(f"{tp.topic}:{tp.partition} admitted nothing for {now - since:.0f}s ({detail})")

    async def _check_stall(self, tp: TopicPartition, now: float, end: int) -> None:
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
        self._give_up_if_due(tp, now, since, f"expected offset {wanted}, log end {end}", expected=wanted, log_end=end)
        log.warning("partition stalled; reading it again", topic=tp.topic, partition=tp.partition,
                    expected=wanted, log_end=end, stalled_s=round(now - since, 1))
        self.metrics.skips.inc()
        self.positions.reverify(tp)
        await self._seek_back(tp, wanted)
