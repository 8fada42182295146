"""Offset bookkeeping without a broker: which consumed records a stage processes and what the
consumer may commit, with faust's own gap and commit arithmetic (``Consumer._add_gap`` /
``_new_offset``) run over a fake partition log. Each test fails on the old ``_admit`` (a position
that started at the first fetched record, compacted topics exempt)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Any, NamedTuple

import pytest
from faust.transport.consumer import Consumer as FaustConsumer
from intervaltree import IntervalTree

from stream_jobs.offset_guard import OffsetGuard
from stream_jobs.offsets import AckOrder, PartitionStalled, Positions


class TP(NamedTuple):
    topic: str
    partition: int


SAMPLES = TP("p.gpu.samples.v1", 0)
PODS = TP("p.k8s.pods.v1", 0)


class FaustLikeConsumer:
    """One partition's log and a consumer over it, with faust 0.15's bookkeeping: the records
    fetched go through faust's gap detection (``_drain_messages``) into a queue the agent reads;
    acks and commits use faust's own code. ``position`` is where the next fetch starts."""

    def __init__(self, tp: TP, offsets: list[int], committed: int, position: int | None = None,
                 written_at: float = 0.0) -> None:
        self.tp = tp
        self.log = sorted(offsets)
        self.written_at = written_at
        """The records' broker timestamp (epoch seconds; 0: 1970, older than any compaction lag)."""
        self.position = committed if position is None else position
        self.queue: list[int] = []
        self.seeks: list[int] = []
        self._gap: dict[Any, IntervalTree] = defaultdict(IntervalTree)
        self._acked: dict[Any, list[int]] = defaultdict(list)
        self._acked_index: dict[Any, set[int]] = defaultdict(set)
        self._committed_offset: dict[Any, int | None] = {tp: committed}
        self._read_offset: dict[Any, int | None] = {tp: committed}
        self.commits: list[int] = []
        self.assigned = {tp}
        self.many_requests: list[list[Any]] = []
        self.paused: set[Any] = set()

    async def fetch(self, count: int) -> None:
        """Fetch up to ``count`` records from ``position`` through faust's gap detection."""
        if self.tp in self.paused:
            return
        for offset in [o for o in self.log if o >= self.position][:count]:
            r_offset = self._read_offset[self.tp]
            if r_offset is None or offset >= r_offset:
                if offset - (r_offset or 0) > 1 and r_offset:
                    await FaustConsumer._add_gap(self, self.tp, r_offset + 1, offset)  # type: ignore[arg-type]
                self.queue.append(offset)
                self._read_offset[self.tp] = offset
            self.position = offset + 1

    def ack(self, offset: int) -> None:  # faust's Consumer.ack, minus the locking
        committed = self._committed_offset[self.tp]
        if (committed is None or offset >= committed) and offset not in self._acked_index[self.tp]:
            self._acked_index[self.tp].add(offset)
            self._acked[self.tp].append(offset)

    def commit(self) -> None:
        offset = FaustConsumer._new_offset(self, self.tp)  # type: ignore[arg-type]
        committed = self._committed_offset[self.tp]
        if offset is not None and (committed is None or offset > committed):
            self._committed_offset[self.tp] = offset
            self.commits.append(offset)

    # the ConsumerPort of OffsetGuard (as _FaustConsumerPort does it on the real consumer)
    async def committed(self, tp: Any) -> int:
        value = self._committed_offset[tp]
        return self.log[0] if value is None else value

    async def committed_many(self, tps: list[Any]) -> dict[Any, int]:
        self.many_requests.append(sorted(tps))
        return {tp: await self.committed(tp) for tp in tps}

    async def log_start(self, tp: Any) -> int:
        return self.log[0]

    async def log_ends(self, tps: list[Any]) -> dict[Any, int]:
        self.log_end_requests += 1
        return {tp: self.log[-1] + 1 for tp in tps}

    log_end_requests = 0

    def assignment(self) -> set[Any]:
        return set(self.assigned)

    def settled(self) -> bool:
        return not self.rebalancing

    def unsettled_state(self) -> dict[str, Any]:
        return {"rebalancing": self.rebalancing}

    def recovery_idle_s(self) -> float | None:
        return self.recovery_idle

    rebalancing = False
    recovery_idle: float | None = None

    def drain_stale(self, offsets: list[int]) -> None:
        """What faust's fetch loop does with the rest of a batch fetched before a seek: the records
        pass its read-offset filter (the seek lowered it), are queued, and move it past them."""
        for offset in offsets:
            self.queue.append(offset)
            self._read_offset[self.tp] = offset

    async def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append(offset)
        self._gap.pop(tp, None)
        self.position = offset
        self._read_offset[tp] = offset if offset else None

    def pause(self, tp: Any) -> None:
        self.paused.add(tp)

    def resume(self, tp: Any) -> None:
        self.paused.discard(tp)


class Rec:
    """A consumed record as the stream hands it to an agent (the token acknowledged later): the
    event and its record (``message``) in one."""

    key: bytes | None = None
    timestamp: float | None = None

    def __init__(self, tp: TP, offset: int) -> None:
        self.tp, self.offset = tp, offset

    @property
    def message(self) -> Rec:
        return self

    @property
    def topic(self) -> str:
        return self.tp.topic

    @property
    def partition(self) -> int:
        return self.tp.partition


async def consume(consumer: FaustLikeConsumer, guard: OffsetGuard, compacted: bool = False, batch: int = 7,
                  hold: int = 0) -> list[int]:
    """The agent loop until the log is read: admit, process, acknowledge (``hold`` records wait
    and are then finished newest first: out of order), commit with faust's arithmetic. Returns
    the offsets processed, in order; after every commit, everything below it must be processed."""
    first = await consumer.committed(consumer.tp)
    processed: list[int] = []
    pending: list[Rec] = []
    while True:
        if not consumer.queue:
            before = consumer.position
            await consumer.fetch(batch)
            if not consumer.queue:
                if consumer.position == before:
                    return processed
                continue
        rec = Rec(consumer.tp, consumer.queue.pop(0))
        if not await guard.admit(rec.tp, rec.offset, compacted, rec, consumer.written_at):
            continue
        processed.append(rec.offset)
        pending.append(rec)
        if len(pending) > hold:
            for done in reversed(pending):
                for ready in guard.done(done.tp, done.offset, done):
                    consumer.ack(ready.message.offset)
            pending = []
        consumer.commit()
        unprocessed = [o for o in consumer.log if first <= o < consumer.commits[-1] and o not in processed] \
            if consumer.commits else []
        assert unprocessed == [], f"committed {consumer.commits[-1]} past unprocessed records {unprocessed}"


def guard_for(consumer: FaustLikeConsumer) -> OffsetGuard:
    return OffsetGuard(consumer)


def test_first_record_after_an_assignment_past_the_committed_offset_is_read_again() -> None:
    # committed 100, but the consumer's first fetch starts at 105 (the race seen after restarts)
    consumer = FaustLikeConsumer(SAMPLES, list(range(160)), committed=100, position=105)
    processed = asyncio.run(consume(consumer, guard_for(consumer)))
    assert processed == list(range(100, 160)), "every record from the committed offset, once, in order"
    assert consumer.seeks == [100]
    assert consumer.commits[-1] == 160


def test_compacted_topic_with_holes_is_read_without_loss_or_needless_seeks() -> None:
    holes = {3, 4, 7, 8, 12, 20, 21, 22, 40}
    log = [o for o in range(50) if o not in holes]
    # committed 3 points into a hole: the jump to 5 is verified once (one seek), then accepted;
    # the holes later in the run need no seek
    consumer = FaustLikeConsumer(PODS, log, committed=3)
    processed = asyncio.run(consume(consumer, guard_for(consumer), compacted=True))
    assert processed == [o for o in log if o >= 3]
    assert consumer.seeks == [3]
    assert consumer.commits[-1] == 50


def test_a_skip_inside_a_run_of_recent_compacted_records_is_read_again() -> None:
    """The loss of a chaos run: faust dropped fetched records in the middle of a verified run on
    k8s.pods.v1 and the jump was taken for compaction, so two pods' states never reached a stage.
    Records younger than the compaction lag cannot have been compacted: such a jump is a skip."""
    log = list(range(40))

    async def scenario(written_at: float) -> tuple[list[int], list[int]]:
        consumer = FaustLikeConsumer(PODS, log, committed=0, written_at=written_at)
        guard = guard_for(consumer)
        for offset in range(10):
            assert await guard.admit(PODS, offset, True, Rec(PODS, offset), written_at)
        consumer.position = 10
        consumer.queue = [o for o in log if o >= 14]  # 10-13 dropped by the consumer
        return await consume(consumer, guard, compacted=True), consumer.seeks

    processed, seeks = asyncio.run(scenario(time.time() - 60))
    assert processed == list(range(10, 40)) and seeks == [10], "a minute old: read again, nothing lost"
    processed, seeks = asyncio.run(scenario(0.0))
    assert processed == list(range(14, 40)) and seeks == [], "older than the lag: a compaction hole"


def test_compacted_topic_is_not_exempt_from_skips() -> None:
    holes = {30, 31}
    log = [o for o in range(60) if o not in holes]
    # committed 10, the consumer starts at 14: records 10-13 exist and must be read
    consumer = FaustLikeConsumer(PODS, log, committed=10, position=14)
    processed = asyncio.run(consume(consumer, guard_for(consumer), compacted=True))
    assert processed == [o for o in log if o >= 10]
    assert consumer.seeks == [10]


def test_out_of_order_acknowledgements_never_commit_past_an_open_record() -> None:
    order: AckOrder[Rec] = AckOrder()
    r = {offset: Rec(SAMPLES, offset) for offset in range(10, 15)}
    for offset, rec in r.items():
        assert order.track(SAMPLES, offset, rec)
    assert not order.track(SAMPLES, 12, Rec(SAMPLES, 12)), "a redelivery of a record in flight"
    assert order.done(SAMPLES, 12, r[12]) == []
    assert order.done(SAMPLES, 11, r[11]) == []
    assert order.done(SAMPLES, 10, r[10]) == [r[10], r[11], r[12]]
    assert order.done(SAMPLES, 14, r[14]) == []
    assert order.done(SAMPLES, 13, r[13]) == [r[13], r[14]]
    # through faust's commit arithmetic: records finish newest first, in groups of four
    consumer = FaustLikeConsumer(SAMPLES, list(range(40)), committed=0, position=3)
    assert asyncio.run(consume(consumer, guard_for(consumer), hold=3)) == list(range(40))
    assert consumer.commits[-1] == 40


def test_revocation_in_the_middle_of_a_batch() -> None:
    consumer = FaustLikeConsumer(SAMPLES, list(range(50)), committed=20)
    guard = guard_for(consumer)

    async def scenario() -> None:
        first = [Rec(SAMPLES, o) for o in (20, 21, 22)]
        for rec in first:
            assert await guard.admit(SAMPLES, rec.offset, False, rec)
        assert guard.done(SAMPLES, 20, first[0]) == [first[0]]
        guard.revoke({SAMPLES})  # the consumer still lists the partition while the group rebalances
        # the rest of the batch, buffered before the revocation: not processed, not acknowledged
        assert not await guard.admit(SAMPLES, 23, False, Rec(SAMPLES, 23))
        assert guard.done(SAMPLES, 21, first[1]) == []
        # assigned again; 20 was never acknowledged to the consumer, so 20 is still committed
        guard.assign({SAMPLES})
        stale = Rec(SAMPLES, 24)
        assert not await guard.admit(SAMPLES, stale.offset, False, stale), "a record fetched before the revocation"
        assert consumer.seeks == [20]
        again = [Rec(SAMPLES, o) for o in (20, 21, 22)]
        for rec in again:
            assert await guard.admit(SAMPLES, rec.offset, False, rec)
        # a token of the old assignment releases nothing, though its offset is tracked again
        assert guard.done(SAMPLES, 22, first[2]) == []
        assert guard.done(SAMPLES, 21, again[1]) == []
        assert guard.done(SAMPLES, 20, again[0]) == [again[0], again[1]]

    asyncio.run(scenario())


def test_records_deleted_before_they_were_read_are_reported_and_skipped() -> None:
    # retention removed 0-49 while 20 was the committed offset: the worker says so and goes on
    consumer = FaustLikeConsumer(SAMPLES, list(range(50, 70)), committed=20)
    clock = FakeClock()
    guard = OffsetGuard(consumer, clock=clock)

    async def scenario() -> list[int]:
        rec = Rec(SAMPLES, 50)
        assert not await guard.admit(SAMPLES, 50, False, rec)
        assert guard.positions.rewinding() == {SAMPLES: 20}
        assert not await guard.admit(SAMPLES, 50, False, Rec(SAMPLES, 50)), "still waiting for 20"
        clock.now += guard.stall_s
        await guard.watch()
        assert consumer.seeks == [20, 50]
        consumer.queue.clear()
        return await consume(consumer, guard)

    assert asyncio.run(scenario()) == list(range(50, 70))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_records_lost_at_the_tail_of_a_partition_are_read_again() -> None:
    """The hang of a chaos run (after several quick restarts): faust fetched a compacted
    partition's last records (2, 3; committed 2) and dropped them with its stream buffers when
    the flow resumed after recovery. No later record arrives to reveal the skip, so the mark that
    needs them was held for ever. The watch seeks back once the partition idles below its log end."""
    consumer = FaustLikeConsumer(PODS, list(range(4)), committed=2, position=4)
    consumer._read_offset[PODS] = 3
    clock = FakeClock()
    guard = OffsetGuard(consumer, clock=clock)
    guard.assign({PODS})

    async def scenario() -> list[int]:
        assert await consume(consumer, guard, compacted=True) == [], "nothing comes by itself"
        clock.now += guard.stall_s - 1
        await guard.watch()
        assert consumer.seeks == [], "not stalled yet"
        clock.now += 1
        await guard.watch()
        assert consumer.seeks == [2]
        return await consume(consumer, guard, compacted=True)

    assert asyncio.run(scenario()) == [2, 3]


def test_a_seek_back_undone_by_a_batch_fetched_before_it_is_repeated() -> None:
    """The sequence of the CI failure (idle-notebook, seed 20787): committed 0, the consumer
    delivers 0 and then 69; the guard seeks back to 1, but the rest of the batch fetched before
    the seek (70-80) drains after it and moves faust's read offset to 80, so faust drops the
    re-read 1-79. Before the watch, the guard waited for 1 for ever."""
    consumer = FaustLikeConsumer(SAMPLES, list(range(100)), committed=0)
    clock = FakeClock()
    guard = OffsetGuard(consumer, clock=clock)

    async def scenario() -> list[int]:
        assert await guard.admit(SAMPLES, 0, False, Rec(SAMPLES, 0))
        assert not await guard.admit(SAMPLES, 69, False, Rec(SAMPLES, 69))
        assert consumer.seeks == [1]
        consumer.drain_stale(list(range(70, 81)))
        processed = await consume(consumer, guard)
        assert processed == [], "the re-read was dropped by faust, the stale records by the guard"
        clock.now += guard.stall_s
        await guard.watch()
        assert consumer.seeks == [1, 1]
        return await consume(consumer, guard)

    assert asyncio.run(scenario()) == list(range(1, 100))


async def _stalled_for_a_minute(guard: OffsetGuard, consumer: FaustLikeConsumer, clock: FakeClock,
                                match: str) -> None:
    """Watch rounds every ``stall_s`` (5 s) of a partition stalled at offset 3: a seek back in each
    for a minute, then the give-up."""
    for _ in range(11):
        clock.now += 5
        await guard.watch()
    assert consumer.seeks == [3] * 11
    clock.now += 5
    with pytest.raises(PartitionStalled, match=match):
        await guard.watch()


class LosingConsumer(FaustLikeConsumer):
    """A consumer whose seeks never take effect (the records keep getting lost)."""

    async def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append(offset)


def test_a_partition_that_stays_stalled_ends_the_worker_instead_of_hanging() -> None:
    consumer = LosingConsumer(SAMPLES, list(range(10)), committed=3, position=10)
    clock = FakeClock()
    guard = OffsetGuard(consumer, stall_s=5.0, give_up_s=60.0, clock=clock)
    guard.assign({SAMPLES})

    async def scenario() -> None:
        consumer.rebalancing = True  # no records come while the group rebalances: not a stall
        clock.now += 300
        await guard.watch()
        assert consumer.seeks == []
        consumer.rebalancing = False
        await _stalled_for_a_minute(guard, consumer, clock, "expected offset 3, log end 10")

    asyncio.run(scenario())


class SilentConsumer(FaustLikeConsumer):
    """A consumer whose seeks never answer (a client wedged on its broker connection)."""

    async def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append(offset)
        await asyncio.Event().wait()


def test_a_stall_check_that_never_answers_ends_the_worker_instead_of_hanging_the_watch() -> None:
    consumer = SilentConsumer(SAMPLES, list(range(10)), committed=3, position=10)
    clock = FakeClock()
    guard = OffsetGuard(consumer, stall_s=5.0, give_up_s=60.0, clock=clock, call_timeout_s=0.01)
    guard.assign({SAMPLES})

    # every round's seek hangs: each round ends, counted as stalled
    scenario = _stalled_for_a_minute(guard, consumer, clock, "admitted nothing for 60s")
    asyncio.run(asyncio.wait_for(scenario, 10))  # a watch that hangs fails here rather than hang the tests


def test_a_consumer_that_stays_unsettled_is_said_in_the_log_and_not_cut_short(
        caplog: pytest.LogCaptureFixture) -> None:
    """A long rebalance or recovery of faust's tables must not restart the worker (it would start
    over), but it must not be silent either."""
    consumer = LosingConsumer(SAMPLES, list(range(10)), committed=3, position=10)
    consumer.rebalancing = True
    clock = FakeClock()
    guard = OffsetGuard(consumer, clock=clock)
    guard.assign({SAMPLES})

    async def scenario() -> None:
        for _ in range(600):  # ten minutes, a round a second
            clock.now += 1
            await guard.watch()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    said = [r for r in caplog.records if r.getMessage().startswith("consumer not settled")]
    assert len(said) == 19  # every 30 s from the first unsettled round on
    assert consumer.seeks == []


def test_a_restore_that_reads_nothing_ends_the_worker() -> None:
    """faust restores the stage tables while the group settles; a restore whose changelog records
    stop coming although some remain (seen once in a chaos run: five minutes, no record) ends the
    worker so that it restarts, as a stalled partition does. A restore that reads goes on."""
    consumer = LosingConsumer(SAMPLES, list(range(10)), committed=3, position=10)
    consumer.rebalancing = True
    clock = FakeClock()
    guard = OffsetGuard(consumer, give_up_s=60.0, clock=clock)
    guard.assign({SAMPLES})

    async def rounds(idle: list[float | None]) -> None:
        for value in idle:
            consumer.recovery_idle = value
            clock.now += 1
            await guard.watch()

    asyncio.run(rounds([None] * 100 + [float(s % 50) for s in range(600)]))  # reading, if slowly: on
    with pytest.raises(PartitionStalled, match="read no record for 60s"):
        asyncio.run(rounds([float(s) for s in range(0, 61)]))


def test_an_idle_partition_that_is_caught_up_is_not_stalled() -> None:
    consumer = FaustLikeConsumer(SAMPLES, list(range(10)), committed=0)
    clock = FakeClock()
    guard = OffsetGuard(consumer, clock=clock)

    async def scenario() -> None:
        assert await consume(consumer, guard) == list(range(10))
        for _ in range(30):
            clock.now += 5
            await guard.watch()
        assert consumer.seeks == []

    asyncio.run(scenario())


def test_records_before_the_first_assignment_signal_follow_the_consumers_assignment() -> None:
    consumer = FaustLikeConsumer(SAMPLES, list(range(10)), committed=4)
    guard = OffsetGuard(consumer)
    assert asyncio.run(guard.admit(SAMPLES, 4, False, Rec(SAMPLES, 4)))
    consumer.assigned = set()
    assert not asyncio.run(guard.admit(PODS, 0, True, Rec(PODS, 0))), "not the consumer's"


def test_positions_drop_redeliveries_and_partitions_not_owned() -> None:
    positions = Positions()
    assert not positions.admit(SAMPLES, 0, False).accept, "not owned"
    positions.assign({SAMPLES})
    assert positions.needs_start(SAMPLES)
    positions.start(SAMPLES, 5)
    assert positions.admit(SAMPLES, 5, False).accept
    assert positions.admit(SAMPLES, 5, False).reason == "already admitted"
    assert positions.admit(SAMPLES, 7, False).seek == 6
    positions.assign(set())
    assert not positions.needs_start(SAMPLES)
    positions.start(SAMPLES, 0)
    assert positions.rewinding() == {}


def test_the_liveness_check_asks_the_broker_once_per_round_for_every_idle_partition() -> None:
    """A worker's watch asked for each idle partition's log end in turn, through the consumer's
    one thread: on a loaded machine a round took 10 s and the fetches it starved let a partition
    crawl (8 records per 10 s) without ever counting as stalled."""

    class Port(FaustLikeConsumer):
        asked: list[list[Any]] = []

        async def log_ends(self, tps: list[Any]) -> dict[Any, int]:
            self.asked.append(sorted(tps))
            return {tp: 0 for tp in tps}  # caught up: nothing to seek

        async def committed(self, tp: Any) -> int:
            return 0

    partitions = {TP("p.gpu.samples.v1", n) for n in range(12)}
    port = Port(SAMPLES, [0], committed=0)
    port.assigned = partitions
    clock = FakeClock()
    guard = OffsetGuard(port, clock=clock)
    guard.assign(partitions)
    clock.now += guard.stall_s
    asyncio.run(guard.watch())
    assert port.asked == [sorted(partitions)]
    assert port.seeks == []


def test_a_partition_starts_where_its_restored_state_ends_when_that_is_below_the_committed_offset() -> None:
    """A late state write of a former owner (not fenced) can land after the last owner's
    checkpoints: the restored state then holds less than the committed offset says. The stage's
    input is read again from the state's own position, so nothing in between is lost."""
    consumer = FaustLikeConsumer(SAMPLES, list(range(160)), committed=100)
    guard = guard_for(consumer)
    guard.state_positions = {SAMPLES.topic: lambda partition: 90}
    assert asyncio.run(consume(consumer, guard)) == list(range(90, 160))
    assert consumer.seeks == [90]
    # a state that holds more than the committed offset (acknowledgements not committed yet):
    # the committed offset decides, and what the state already holds is recognised downstream
    consumer = FaustLikeConsumer(SAMPLES, list(range(160)), committed=100)
    guard = guard_for(consumer)
    guard.state_positions = {SAMPLES.topic: lambda partition: 120}
    assert asyncio.run(consume(consumer, guard)) == list(range(100, 160))
    assert consumer.seeks == []


def test_an_assignment_reads_every_partitions_committed_offset_in_one_request() -> None:
    """A partition's first record asked for its own commit (and log start), each a round trip
    through the consumer's thread behind its fetch: a fresh worker took 15 s to start reading its
    40 partitions. The assignment now reads them all at once; a partition whose commit could not
    be read then still asks for its own."""

    class Port(FaustLikeConsumer):
        single: list[Any] = []
        fail_many = False

        async def committed(self, tp: Any) -> int:
            self.single.append(tp)
            return 3

        async def committed_many(self, tps: list[Any]) -> dict[Any, int]:
            self.many_requests.append(sorted(tps))
            if self.fail_many:
                raise ConnectionError("the coordinator is away")
            return {tp: 3 for tp in tps}

    partitions = {TP("p.gpu.samples.v1", n) for n in range(12)}
    for fail in (False, True):
        port = Port(SAMPLES, list(range(10)), committed=3)
        port.single, port.fail_many = [], fail
        port.assigned = partitions
        guard = OffsetGuard(port)
        guard.assign(partitions)
        asyncio.run(guard.read_committed())
        assert port.many_requests == [sorted(partitions)]
        assert asyncio.run(consume(port, guard)) == list(range(3, 10))
        # the test's consume() reads the commit once for its own check; the guard asks only when the bulk read failed
        assert port.single == [SAMPLES] * (2 if fail else 1)


def test_a_paused_partition_is_not_taken_for_stalled_and_resumes_where_it_left_off() -> None:
    """A node partition pauses its samples while it holds enough of them (``read_ahead_bytes``):
    nothing comes by design, for as long as the marks lag. The watch must neither seek it back nor
    end the worker; resuming reads on from the next record to admit, also when faust dropped the
    rest of a batch fetched before the pause (its fetch position is past those records)."""
    consumer = FaustLikeConsumer(SAMPLES, list(range(20)), committed=0)
    clock = FakeClock()
    guard = OffsetGuard(consumer, stall_s=5.0, give_up_s=60.0, clock=clock)
    guard.assign({SAMPLES})

    async def scenario() -> list[int]:
        await consumer.fetch(5)
        for offset in consumer.queue[:3]:
            rec = Rec(SAMPLES, offset)
            assert await guard.admit(SAMPLES, offset, False, rec)
            for ready in guard.done(SAMPLES, offset, rec):
                consumer.ack(ready.message.offset)
        consumer.commit()
        consumer.queue.clear()  # 3 and 4: fetched, then dropped by faust when the partition paused
        guard.pause(SAMPLES)
        assert consumer.paused == {SAMPLES}
        for _ in range(120):  # ten minutes of watch rounds
            clock.now += 5
            await guard.watch()
        assert consumer.seeks == [], "paused by a stage: not a stall, and no give-up"
        assert await consume(consumer, guard) == [], "nothing is fetched while paused"
        await guard.resume(SAMPLES)
        assert consumer.paused == set() and consumer.seeks == [3], "read on from the next record to admit"
        return await consume(consumer, guard)

    assert asyncio.run(scenario()) == list(range(3, 20))
    assert consumer.commits[-1] == 20


def test_a_revoked_partition_is_no_longer_paused_by_the_guard() -> None:
    consumer = FaustLikeConsumer(SAMPLES, list(range(5)), committed=0)
    guard = OffsetGuard(consumer)
    guard.assign({SAMPLES})
    guard.pause(SAMPLES)
    guard.revoke({SAMPLES})
    consumer.paused.clear()  # faust forgets the pauses of revoked partitions
    guard.assign({SAMPLES})
    asyncio.run(guard.resume(SAMPLES))
    assert consumer.seeks == [], "a new assignment starts unpaused: nothing to resume"
