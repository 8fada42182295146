"""How the sink cuts batches and hands them to its store thread, on a fake clock and a fake store
(no Kafka): a record waits at most the batch age from when it was read; a size trigger cuts only
full batches; a caught-up consumer writes buffers at least half full, and the rest of a backlog, at
once; a batch whose insert fails while in flight is written again, in order, before the next one,
also when the next one was already handed over; a batch a rebalance callback could not store is
read again when the sink keeps its partition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from common.settings import ClickHouseSettings, KafkaSettings, SinkSettings
from schemas.codec import encode
from schemas.topics import GPU_SAMPLES
from sinks.batches import ConsumedRecord
from sinks.clickhouse import QueryResult, StoreUnavailable
from sinks.sink import ClickHouseSink
from tests.sinks.factories import sample

PREFIX = "batching"
TOPIC = GPU_SAMPLES.name(PREFIX)


class FakeStore:
    """Records inserts; fails the first ``fail_inserts`` inserts of GPU samples (rows or engine
    lines), each once ``hold`` is set when one is given."""

    def __init__(self, fail_inserts: int = 0, hold: threading.Event | None = None) -> None:
        self.fail_inserts = fail_inserts
        self.hold = hold
        self.inserts: list[tuple[str, str | None, int]] = []

    def insert(self, table: str, columns: dict[str, list[Any]], dedup_token: str | None = None,
               repeated_timestamps: bool = False) -> int:
        n = len(next(iter(columns.values())))
        if table == "gpu_samples" and self.fail_inserts:
            self.fail_inserts -= 1
            raise StoreUnavailable("connection refused")
        self.inserts.append((table, dedup_token, n))
        return n

    def insert_json(self, table: str, lines: bytes, dedup_token: str) -> None:
        if self.fail_inserts:
            if self.hold is not None:
                self.hold.wait(10)
            self.fail_inserts -= 1
            raise StoreUnavailable("connection refused")
        self.inserts.append(("gpu_samples", dedup_token.removesuffix(":json"), lines.count(b"\n") + 1))

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        return QueryResult(["first_offset", "last_offset"], ["UInt64", "UInt64"], [])

    def command(self, sql: str) -> None:
        pass

    def samples_tokens(self) -> list[str | None]:
        return [token for table, token, _ in self.inserts if table == "gpu_samples"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _sink(tmp_path: Path, store: FakeStore, clock: Callable[[], float], max_rows: int = 10) -> ClickHouseSink:
    settings = SinkSettings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"), topic_prefix=PREFIX,
                            data_dir=tmp_path, group_id="g", batch_max_rows=max_rows, batch_max_age_s=2.0,
                            retry_initial_s=0.01, retry_max_s=0.02,
                            clickhouse=ClickHouseSettings(url=f"chdb://{tmp_path / 'ch'}"))
    sink = ClickHouseSink(settings, store, clock=clock)
    sink._store_thread = ThreadPoolExecutor(max_workers=1)
    return sink


def _read(sink: ClickHouseSink, first: int, count: int, now: float) -> None:
    for offset in range(first, first + count):
        sink._buffer(ConsumedRecord(TOPIC, 0, offset, b"n", encode(sample("n", offset, gpus=1))), now)


def _cuts(sink: ClickHouseSink, now: float, caught_up: bool = False) -> list[tuple[int, int]]:
    buffer = sink.buffers[(TOPIC, 0)]
    return [(b.first_offset, b.last_offset) for b in sink._due_batches((TOPIC, 0), buffer, now, False, caught_up)]


def test_a_size_trigger_cuts_full_batches_and_the_remainder_waits_its_own_age(tmp_path: Path) -> None:
    sink = _sink(tmp_path, FakeStore(), Clock())
    _read(sink, 0, 25, now=0.0)
    assert _cuts(sink, now=0.5) == [(0, 9), (10, 19)]
    _read(sink, 25, 3, now=1.5)
    assert _cuts(sink, now=1.9) == []  # 8 records, the oldest read 1.9 s ago
    assert _cuts(sink, now=2.0) == [(20, 27)]  # the oldest is due: everything buffered goes


def test_age_counts_from_when_a_record_was_read_not_from_the_last_cut(tmp_path: Path) -> None:
    sink = _sink(tmp_path, FakeStore(), Clock())
    _read(sink, 0, 10, now=0.0)
    assert _cuts(sink, now=5.0) == [(0, 9)]
    _read(sink, 10, 1, now=6.0)
    assert _cuts(sink, now=7.9) == []
    assert _cuts(sink, now=8.0) == [(10, 10)]


def test_a_caught_up_consumer_writes_buffers_at_least_half_full_at_once(tmp_path: Path) -> None:
    sink = _sink(tmp_path, FakeStore(), Clock())
    _read(sink, 0, 4, now=0.0)
    assert _cuts(sink, now=0.1, caught_up=True) == []  # under half: a trickle waits for its age
    _read(sink, 4, 1, now=0.1)
    assert _cuts(sink, now=0.2) == []  # more may come
    assert _cuts(sink, now=0.2, caught_up=True) == [(0, 4)]


def test_a_caught_up_consumer_writes_the_rest_of_a_backlog_at_once_and_a_trickle_after_it_waits(
        tmp_path: Path) -> None:
    sink = _sink(tmp_path, FakeStore(), Clock())
    _read(sink, 0, 23, now=0.0)
    assert _cuts(sink, now=0.1) == [(0, 9), (10, 19)]  # the broker had more: the rest may grow
    assert _cuts(sink, now=0.2, caught_up=True) == [(20, 22)]  # it did not: no reason to wait
    _read(sink, 23, 2, now=0.3)
    assert _cuts(sink, now=0.4, caught_up=True) == []  # a trickle waits for its age again
    assert _cuts(sink, now=2.4, caught_up=True) == [(23, 24)]


def test_a_batch_that_fails_in_flight_is_written_again_before_the_next(tmp_path: Path) -> None:
    store = FakeStore(fail_inserts=2)
    sink = _sink(tmp_path, store, time.monotonic)  # the retry's backoff runs on the real clock
    _read(sink, 0, 20, now=0.0)
    for batch in sink._due_batches((TOPIC, 0), sink.buffers[(TOPIC, 0)], 0.0, False):
        sink._flush(batch)
    sink._settle()
    assert not sink._in_flight
    # the first batch failed twice (in the store thread, then its first retry), the second was
    # inserted only after the first was stored: one block each, in offset order
    assert store.samples_tokens() == [f"{TOPIC}:0:0-9", f"{TOPIC}:0:10-19"]
    assert sink.totals.rows_by_table["gpu_samples"] == 20
    assert [t for t, _, _ in store.inserts].count("sink_batches") >= 2
    sink.close()


def test_a_batch_handed_over_behind_a_failing_one_is_not_stored_before_it(tmp_path: Path) -> None:
    hold = threading.Event()
    store = FakeStore(fail_inserts=1, hold=hold)
    sink = _sink(tmp_path, store, time.monotonic)
    _read(sink, 0, 20, now=0.0)
    first, second = sink._due_batches((TOPIC, 0), sink.buffers[(TOPIC, 0)], 0.0, False)
    sink._flush(first)  # its insert waits for `hold`, then fails
    sink._flush(second)  # queued behind it in the store thread
    assert len(sink._in_flight) == 2
    hold.set()
    sink._settle()
    # the second batch did not take the store thread's turn after the first failed: the first
    # was written again, then the second
    assert store.samples_tokens() == [f"{TOPIC}:0:0-9", f"{TOPIC}:0:10-19"]
    assert sink.totals.rows_by_table["gpu_samples"] == 20
    sink.close()


class FakeConsumer:
    """What a rebalance callback is handed: records where partitions were sought to."""

    def __init__(self) -> None:
        self.seeks: list[tuple[str, int, int]] = []

    def seek(self, partition: Any) -> None:
        self.seeks.append((partition.topic, partition.partition, partition.offset))


def _rebalance_with_a_batch_failing(tmp_path: Path, revoked_partition: int) -> tuple[ClickHouseSink, FakeStore,
                                                                                      FakeConsumer]:
    store = FakeStore(fail_inserts=1)
    sink = _sink(tmp_path, store, time.monotonic)
    _read(sink, 0, 15, now=0.0)
    (batch,) = sink._due_batches((TOPIC, 0), sink.buffers[(TOPIC, 0)], 0.0, False)  # 0-9; 10-14 stay buffered
    sink._flush(batch)
    consumer = FakeConsumer()
    sink._on_revoke(consumer, [SimpleNamespace(topic=TOPIC, partition=revoked_partition)])
    return sink, store, consumer


def test_a_batch_not_stored_in_a_rebalance_is_read_again_when_the_sink_keeps_its_partition(tmp_path: Path) -> None:
    sink, store, consumer = _rebalance_with_a_batch_failing(tmp_path, revoked_partition=1)
    # partition 0 stays with this sink: it reads the batch again, and what it had buffered after it
    assert consumer.seeks == [(TOPIC, 0, 0)]
    assert (TOPIC, 0) not in sink.buffers
    assert store.samples_tokens() == [] and not sink._in_flight
    sink.close()


def test_a_batch_not_stored_in_a_rebalance_is_left_to_the_next_owner(tmp_path: Path) -> None:
    sink, store, consumer = _rebalance_with_a_batch_failing(tmp_path, revoked_partition=0)
    assert consumer.seeks == []
    assert (TOPIC, 0) not in sink.buffers
    assert store.samples_tokens() == [] and not sink._in_flight
    sink.close()


class CommittingConsumer(FakeConsumer):
    """Records the offsets committed, per (topic, partition)."""

    def __init__(self) -> None:
        super().__init__()
        self.committed: dict[tuple[str, int], int] = {}

    def commit(self, offsets: list[Any], asynchronous: bool = True) -> None:
        for tp in offsets:
            self.committed[(tp.topic, tp.partition)] = tp.offset


def _read_partition(sink: ClickHouseSink, partition: int, first: int, count: int) -> None:
    for offset in range(first, first + count):
        sink._buffer(ConsumedRecord(TOPIC, partition, offset, b"n", encode(sample(f"n{partition}", offset, gpus=1))),
                     0.0)


def test_due_batches_of_several_partitions_are_one_insert_and_a_partitions_batches_stay_in_order(
        tmp_path: Path) -> None:
    store = FakeStore()
    sink = _sink(tmp_path, store, time.monotonic)
    sink.settings.batch_group_max_rows = 25
    consumer = CommittingConsumer()
    sink._consumer = consumer
    _read_partition(sink, 0, 0, 20)  # two full batches of partition 0
    _read_partition(sink, 1, 100, 10)
    _read_partition(sink, 2, 50, 10)
    sink._flush_due(0.0)
    sink._settle()
    # a group takes at most the next batch of each partition, up to 25 records: partition 0's
    # second batch waits for the next group, behind its first
    assert store.samples_tokens() == [f"{TOPIC}:0:0-9+1:100-109", f"{TOPIC}:0:10-19+2:50-59"]
    assert consumer.committed == {(TOPIC, 0): 20, (TOPIC, 1): 110, (TOPIC, 2): 60}
    journal = [n for table, token, n in store.inserts if table == "sink_batches"]
    assert journal == [2, 2]  # one journal row per member
    assert sink.totals.rows_by_table["gpu_samples"] == 40
    sink._consumer = None
    sink.close()


def test_a_batch_larger_than_a_group_is_stored_alone(tmp_path: Path) -> None:
    store = FakeStore()
    sink = _sink(tmp_path, store, time.monotonic)
    sink.settings.batch_group_max_rows = 5
    _read_partition(sink, 0, 0, 10)
    _read_partition(sink, 1, 0, 10)
    sink._flush_due(0.0)
    sink._settle()
    assert store.samples_tokens() == [f"{TOPIC}:0:0-9", f"{TOPIC}:1:0-9"]
    sink.close()


def test_a_group_cut_before_a_rebalance_took_one_member_is_read_again_for_the_members_kept(
        tmp_path: Path) -> None:
    store = FakeStore()
    sink = _sink(tmp_path, store, time.monotonic)
    consumer = CommittingConsumer()
    sink._consumer = consumer
    _read_partition(sink, 0, 0, 20)
    _read_partition(sink, 1, 0, 20)
    flush = sink._flush

    def flush_then_lose_partition_1(batch: Any) -> None:
        # the rebalance comes while the first group is handed over (the store thread's queue is
        # settled then), after both groups were cut
        flush(batch)
        if len(sink._in_flight) == 1 and (TOPIC, 1) in sink.buffers:
            sink._on_revoke(consumer, [SimpleNamespace(topic=TOPIC, partition=1)])

    sink._flush = flush_then_lose_partition_1  # type: ignore[method-assign]
    sink._flush_due(0.0)
    sink._settle()
    # the second group (0:10-19 with 1:10-19) is not stored: partition 1 is another owner's now,
    # and partition 0, still this sink's, is read again from that group's range on
    assert store.samples_tokens() == [f"{TOPIC}:0:0-9+1:0-9"]
    assert consumer.committed == {(TOPIC, 0): 10, (TOPIC, 1): 10}
    assert consumer.seeks == [(TOPIC, 0, 10)] and (TOPIC, 0) not in sink.buffers
    sink._consumer = None
    sink.close()
