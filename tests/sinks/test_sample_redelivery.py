"""A GPU sample delivered again at a new Kafka offset is stored once, not only once under FINAL: a
materialized view over ``gpu_samples`` (the rollups) sees every inserted row, so the sink leaves the
sample out as a whole (its GPUs, processes and XIDs), on the engine path and the row path, also
after a restart, while a batch stored again with its own offsets keeps exactly what it kept before
(real chDB; the last test with the real broker and the sink's own loop)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from common.metrics import MetricsRegistry, parse_exposition
from common.settings import SinkSettings
from schemas.codec import encode
from schemas.messages import GpuSample, XidEvent
from schemas.topics import GPU_SAMPLES
from sinks.batches import Batch, BatchWriter, ConsumedRecord, FlushOutcome, SinkMetrics, Span
from sinks.clickhouse import ClickHouseStore, StoreRejected, open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from sinks.service import run_sink
from tests.sinks import factories as f
from tests.sinks.conftest import Item

PREFIX = "gpulens"
TOPIC = GPU_SAMPLES.name(PREFIX)
GPUS, BUSY = 8, 4
"""GPUs per sample, and those with a process (``factories.sample``'s defaults)."""


@pytest.fixture
def migrated(store: ClickHouseStore) -> ClickHouseStore:
    migrate(store, TtlDays())
    return store


def _writer(store: ClickHouseStore) -> tuple[BatchWriter, MetricsRegistry]:
    registry = MetricsRegistry()
    return BatchWriter(store, SinkMetrics(registry), PREFIX, TtlDays()), registry


def _samples(node: str, seqs: range | list[int], boot: str | None = None) -> list[GpuSample]:
    """``node``'s samples, one with an XID (it takes the row path) at seq 7."""
    out = []
    for seq in seqs:
        sample = f.sample(node, seq, with_xid=seq == 7)
        out.append(sample if boot is None else sample.model_copy(update={"agent_boot_id": boot}))
    return out


def _batch(samples: list[GpuSample], first_offset: int, partition: int = 0) -> Batch:
    records = [ConsumedRecord(TOPIC, partition, first_offset + i, s.node.encode(), encode(s))
               for i, s in enumerate(samples)]
    return Batch(TOPIC, partition, records, first_offset, first_offset + len(records) - 1)


def _write(writer: BatchWriter, batch: Batch) -> FlushOutcome:
    outcome, rejected = writer.write(batch)
    assert rejected == []
    return outcome


def _stored(store: ClickHouseStore) -> dict[str, tuple[int, int]]:
    """table -> (rows without FINAL, distinct natural keys)."""
    keys = {"gpu_samples": "node, agent_boot_id, seq, gpu_uuid", "gpu_processes": "node, gpu_uuid, ts, pid",
            "gpu_xids": "node, gpu_uuid, at, xid"}
    counts = {table: store.query(f"SELECT count(), uniqExact({key}) FROM {table}").rows[0]
              for table, key in keys.items()}
    return {table: (int(rows), int(facts)) for table, (rows, facts) in counts.items()}


def _once(store: ClickHouseStore, samples: int, xids: int = 1) -> None:
    """Every table holds each fact of ``samples`` samples exactly once, without FINAL, and the hourly
    rollup (a materialized view over every row inserted into ``gpu_samples``) counted each once."""
    assert _stored(store) == {"gpu_samples": (samples * GPUS, samples * GPUS),
                              "gpu_processes": (samples * BUSY, samples * BUSY), "gpu_xids": (xids, xids)}
    counted, seconds = store.query("SELECT sum(samples), sum(sampled_s) FROM gpu_hourly").rows[0]
    assert (int(counted), seconds) == (samples * GPUS, pytest.approx(samples * GPUS * 10.0))


def _skipped(registry: MetricsRegistry) -> float:
    return sum(s.value for s in parse_exposition(registry.render())
               if s.name == "gpulens_sink_duplicates_skipped_total" and s.labels == {"table": "gpu_samples"})


def test_a_sample_delivered_again_at_a_new_offset_is_stored_once(migrated: ClickHouseStore) -> None:
    writer, registry = _writer(migrated)
    first = _write(writer, _batch(_samples("gpu-a", range(10)), 0))
    assert first.skipped_duplicates == 0
    assert first.rows_by_table["gpu_samples"] == 10 * GPUS
    # a producer's resend: seq 5-9 again (the XID sample, on the row path, among them) at offsets 10-14
    again = _write(writer, _batch(_samples("gpu-a", range(5, 10)), 10))
    assert again.skipped_duplicates == 5
    assert again.rows_by_table.get("gpu_samples", 0) == 0
    assert again.rows_by_table.get("gpu_processes", 0) == 0
    assert _skipped(registry) == 5
    _once(migrated, 10)
    # the stored copy is the first one
    assert migrated.query("SELECT max(kafka_offset) FROM gpu_samples").rows == [[9]]


def test_a_redelivery_after_a_restart_is_dropped_from_what_the_store_holds(migrated: ClickHouseStore) -> None:
    writer, _ = _writer(migrated)
    _write(writer, _batch(_samples("gpu-a", range(10)), 0))
    _write(writer, _batch(_samples("gpu-b", range(10)), 0, partition=1))
    restarted, registry = _writer(migrated)  # nothing in memory: the store is asked
    outcome = _write(restarted, _batch(_samples("gpu-a", [2, 7, 9]), 10))
    assert outcome.skipped_duplicates == 3 and _skipped(registry) == 3
    assert _stored(migrated)["gpu_samples"] == (20 * GPUS, 20 * GPUS)
    # the same node's samples in another partition are other deliveries: gpu-b's partition is 1,
    # and gpu-a moved there (a topic given more partitions) is compared only with what is stored there
    moved = _write(restarted, _batch(_samples("gpu-a", [10, 11]), 10, partition=1))
    assert moved.skipped_duplicates == 0
    assert _stored(migrated)["gpu_samples"] == (22 * GPUS, 22 * GPUS)


@pytest.mark.parametrize("restart", [False, True], ids=["same-writer", "after-restart"])
def test_a_batch_stored_again_with_its_own_offsets_keeps_what_it_kept(migrated: ClickHouseStore,
                                                                      restart: bool) -> None:
    writer, _ = _writer(migrated)
    batches = [_batch(_samples("gpu-a", range(0, 10)), 0),
               # seq 8-9 again, then new ones: the re-delivered two are left out, the rest kept
               _batch(_samples("gpu-a", [8, 9, *range(10, 18)]), 10),
               _batch(_samples("gpu-a", range(18, 28)), 20)]
    outcomes = [_write(writer, batch) for batch in batches]
    assert [o.skipped_duplicates for o in outcomes] == [0, 2, 0]
    before = _stored(migrated)
    _once(migrated, 28)
    # the sink crashed after the inserts of the last two batches, before their commits: both are
    # stored again from the journal, rows of the later one already in the store
    again = _writer(migrated)[0] if restart else writer
    replayed = [_write(again, batch) for batch in batches[1:]]
    assert [(o.skipped_duplicates, o.rows_by_table) for o in replayed] == \
        [(o.skipped_duplicates, o.rows_by_table) for o in outcomes[1:]]
    assert _stored(migrated) == before  # the same blocks: their deduplication tokens matched
    _once(migrated, 28)
    # and the sink goes on after them
    last = _write(again, _batch(_samples("gpu-a", [27, 28]), 30))
    assert (last.skipped_duplicates, last.rows_by_table["gpu_samples"]) == (1, GPUS)


def test_a_new_agent_boot_starts_its_seq_again_and_is_kept(migrated: ClickHouseStore) -> None:
    writer, _ = _writer(migrated)
    _write(writer, _batch(_samples("gpu-a", range(20, 30)), 0))
    rebooted = _write(writer, _batch(_samples("gpu-a", range(0, 5), boot="boot-gpu-a-2"), 10))
    assert rebooted.skipped_duplicates == 0
    fresh = _write(_writer(migrated)[0], _batch(_samples("gpu-a", range(5, 10), boot="boot-gpu-a-2"), 15))
    assert fresh.skipped_duplicates == 0
    _once(migrated, 20, xids=1)
    assert migrated.query("SELECT uniqExact(agent_boot_id) FROM gpu_samples").rows == [[2]]


def test_a_batch_mixing_new_and_redelivered_samples_keeps_the_new_ones(migrated: ClickHouseStore) -> None:
    writer, registry = _writer(migrated)
    _write(writer, _batch(_samples("gpu-a", range(10)), 0))
    _write(writer, _batch(_samples("gpu-b", range(10)), 0, partition=1))
    # a group of both partitions: new samples interleaved with re-deliveries, one repeated in the batch
    a = _batch(_samples("gpu-a", [10, 3, 11, 7, 12, 12, 13]), 10)
    b = _batch(_samples("gpu-b", [9, 10, 11]), 10, partition=1)
    group = Batch(TOPIC, 0, a.records + b.records, a.first_offset, a.last_offset, joined=b.spans)
    outcome = _write(writer, group)
    assert outcome.skipped_duplicates == 4 and _skipped(registry) == 4
    assert outcome.rows_by_table["gpu_samples"] == 6 * GPUS
    _once(migrated, 26, xids=2)
    kept = migrated.query("SELECT node, groupArray(seq) FROM (SELECT DISTINCT node, seq, kafka_offset FROM gpu_samples "
                          "WHERE kafka_offset >= 10 ORDER BY seq) GROUP BY node ORDER BY node").rows
    assert kept == [["gpu-a", [10, 11, 12, 13]], ["gpu-b", [10, 11]]]
    # the repeated seq 12 is stored at its first offset
    assert migrated.query("SELECT DISTINCT kafka_offset FROM gpu_samples WHERE node = 'gpu-a' AND seq = 12").rows \
        == [[14]]


def test_a_redelivery_on_the_row_path_leaves_out_every_row_of_its_sample(migrated: ClickHouseStore) -> None:
    writer, registry = _writer(migrated)
    _write(writer, _batch(_samples("gpu-a", range(5, 10)), 0))
    # every sample of this batch has an XID, so all take the row path (none is given to the engine)
    xids = [s.model_copy(update={"gpus": [
        g.model_copy(update={"xids": [XidEvent(xid=79, at=s.ts, critical=True, message="fell off the bus")]})
        if i == 0 else g for i, g in enumerate(s.gpus)]}) for s in _samples("gpu-a", [6, 7, 10])]
    prepared = writer.prepare(_batch(xids, 5))
    assert prepared.engine == [] and prepared.tables["gpu_samples"].n_rows == 3 * GPUS
    outcome = _write(writer, _batch(xids, 5))
    assert outcome.skipped_duplicates == 2 and _skipped(registry) == 2
    assert outcome.rows_by_table == {"gpu_samples": GPUS, "gpu_processes": BUSY, "gpu_xids": 1}
    _once(migrated, 6, xids=2)


def test_the_memory_forgets_a_partition_that_did_not_continue_where_it_ended(migrated: ClickHouseStore) -> None:
    writer, _ = _writer(migrated)
    _write(writer, _batch(_samples("gpu-a", range(10)), 0))
    source = ("default", "gpu-a", "boot-gpu-a")
    assert writer.stored_seqs.known(TOPIC, 0, 10, [source]) == {source: 9}
    # another sink stored offsets 10-19 meanwhile (the partition was assigned elsewhere and back)
    _write(_writer(migrated)[0], _batch(_samples("gpu-a", range(10, 20)), 10))
    assert writer.stored_seqs.known(TOPIC, 0, 20, [source]) == {}
    outcome = _write(writer, _batch(_samples("gpu-a", [15, 19, 20]), 20))
    assert outcome.skipped_duplicates == 2
    writer.stored_seqs.stored(TOPIC, Span(0, 23, 23), {})
    assert writer.stored_seqs.known(TOPIC, 0, 24, [source]) == {source: 20}


class _RefusingEngine:
    """The store, but the engine path's table refuses every block (as it does a line it cannot read)."""

    def __init__(self, store: ClickHouseStore) -> None:
        self.store = store

    def insert_json(self, table: str, lines: bytes, dedup_token: str) -> None:
        raise StoreRejected(f"{table} refused the block")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_samples_the_engine_refused_are_written_as_rows_without_the_redelivered(migrated: ClickHouseStore) -> None:
    writer, _ = _writer(migrated)
    _write(writer, _batch(_samples("gpu-a", range(10)), 0))
    refusing = BatchWriter(_RefusingEngine(migrated), SinkMetrics(MetricsRegistry()), PREFIX, TtlDays())
    outcome = _write(refusing, _batch(_samples("gpu-a", [8, 9, 10, 11]), 10))
    assert outcome.skipped_duplicates == 2
    assert outcome.rows_by_table == {"gpu_samples": 2 * GPUS, "gpu_processes": 2 * BUSY}
    _once(migrated, 12)


@pytest.mark.kafka
def test_the_sink_stores_a_resent_sample_once_across_a_restart(
    sink_settings: SinkSettings, producer: Callable[[Iterable[Item]], int]
) -> None:
    sent: list[Item] = [(GPU_SAMPLES, node, s) for node in ("gpu-a", "gpu-b") for s in _samples(node, range(10))]
    producer(sent)
    first = run_sink(sink_settings, exit_when_idle_s=1.5)
    assert first.skipped_duplicates == 0
    # a producer resends half of what it sent (new offsets), with new samples, to a restarted sink
    producer([(GPU_SAMPLES, node, s) for node in ("gpu-a", "gpu-b") for s in _samples(node, range(5, 15))])
    second = run_sink(sink_settings, exit_when_idle_s=1.5)
    assert second.skipped_duplicates == 10
    assert second.rows_by_table["gpu_samples"] == 10 * GPUS
    store = open_store(sink_settings.clickhouse_url())
    try:
        _once(store, 30, xids=2)
    finally:
        store.close()
