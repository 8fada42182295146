"""Groups (several partitions' GPU-sample batches in one insert) replayed by owners that split them,
on the real broker and the real engine: whether the group was stored before the crash or only
journalled, each member's owner replays the whole group from Kafka and every table holds one row
per fact, counted without ``FINAL``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from common.kafka import read_to_end
from common.settings import KafkaSettings, SinkSettings
from schemas.topics import GPU_SAMPLES
from sinks.batches import Batch, ConsumedRecord, Span
from sinks.clickhouse import ClickHouseStore
from sinks.migrations import migrate
from sinks.sink import ClickHouseSink
from tests.sinks import factories as f
from tests.sinks.conftest import Item

pytestmark = pytest.mark.kafka

NODES = [f"node-{i}" for i in range(12)]
SEQS = 10
GPUS = 8


def _records(kafka: KafkaSettings, topic: str) -> dict[int, list[ConsumedRecord]]:
    by_partition: dict[int, list[ConsumedRecord]] = {}
    for r in read_to_end(kafka, topic):
        by_partition.setdefault(r.partition, []).append(
            ConsumedRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp_ms))
    return by_partition


def _owner(settings: SinkSettings, store: ClickHouseStore) -> ClickHouseSink:
    """A sink without a consumer: the test hands it its partitions' records, as the group would."""
    sink = ClickHouseSink(settings, store)
    sink._store_thread = ThreadPoolExecutor(max_workers=1)
    return sink


def _replay(owner: ClickHouseSink, records: Iterable[ConsumedRecord]) -> None:
    for record in records:
        owner._buffer(record, time.monotonic())
    owner._flush_due(time.monotonic(), force=True)
    owner._settle()
    owner.close()


def _counts(store: ClickHouseStore) -> dict[str, tuple[int, int]]:
    """Rows and distinct natural keys per table, without FINAL."""
    return {
        "gpu_samples": tuple(store.query(
            "SELECT count(), uniqExact(node, agent_boot_id, seq, gpu_uuid) FROM gpu_samples").rows[0]),
        "gpu_processes": tuple(store.query(
            "SELECT count(), uniqExact(node, ts, gpu_uuid, pid) FROM gpu_processes").rows[0]),
    }


@pytest.mark.parametrize("stored", [True, False], ids=["group-stored", "group-only-journalled"])
def test_a_group_split_between_two_owners_is_replayed_as_one_block_and_every_row_stored_once(
    stored: bool, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path,
    producer: Callable[[Iterable[Item]], int], sink_settings: SinkSettings, store: ClickHouseStore,
) -> None:
    producer([(GPU_SAMPLES, node, f.sample(node, seq)) for seq in range(SEQS) for node in NODES])
    topic = GPU_SAMPLES.name(topic_prefix)
    by_partition = _records(kafka_settings, topic)
    assert len(by_partition) >= 3, "the nodes' keys spread over at least three partitions"
    a, b, c = sorted(by_partition)[:3]
    migrate(store)

    # The crashed owner cut a group of three partitions and journalled it; it stored the group
    # (or died before the insert) and committed nothing.
    crashed = _owner(sink_settings, store)
    group = Batch(topic, a, [*by_partition[a], *by_partition[b], *by_partition[c]],
                  by_partition[a][0].offset, by_partition[a][-1].offset,
                  joined=tuple(Span(p, by_partition[p][0].offset, by_partition[p][-1].offset) for p in (b, c)))
    if stored:
        crashed.writer.write(group)
    else:
        crashed.writer.plan(group)
    crashed.close()

    # A rebalance split the partitions: one owner replays a, another b and c.
    _replay(_owner(sink_settings, store), by_partition[a])
    _replay(_owner(sink_settings, store), [*by_partition[b], *by_partition[c]])

    samples = sum(len(by_partition[p]) for p in (a, b, c))
    gpu_rows, process_rows = samples * GPUS, samples * 4  # four busy GPUs with a process each
    assert _counts(store) == {"gpu_samples": (gpu_rows, gpu_rows), "gpu_processes": (process_rows, process_rows)}
