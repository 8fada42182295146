"""One row per fact: redeliveries at new offsets, a worker replay, a journal replay and a record
ClickHouse rejects mid-batch leave every table with exactly one row per fact; records the TTL would
drop are dead-lettered; two simulator runs into one store keep both runs (real chDB, no broker)."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

from common.metrics import MetricsRegistry
from schemas.codec import decode, encode
from schemas.messages import GpuSample, Message, XidEvent
from schemas.outputs import Alert, ClusterCapacity, PodLifecycle, PodWindow
from schemas.topics import ALERTS, CLUSTER_CAPACITY, GPU_SAMPLES, POD_LIFECYCLE, POD_WINDOWS, by_suffix
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from simulation.simulator import FleetSimulator
from sinks.batches import Batch, BatchWriter, ConsumedRecord, Plan, SinkMetrics
from sinks.clickhouse import ClickHouseStore, StoreRejected, StoreUnavailable, _classify
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from sinks.rows import TableColumns, rows_for
from tests.sinks import factories as f

PREFIX = "gpulens"
SCENARIO = Path(__file__).parent / "scenarios" / "sink-costs.yaml"

NATURAL_KEYS: dict[str, tuple[str, ...]] = {
    "gpu_samples": ("node", "agent_boot_id", "seq", "gpu_uuid"),
    "gpu_processes": ("node", "gpu_uuid", "ts", "pid"),
    "gpu_xids": ("node", "gpu_uuid", "at", "xid"),
    "pod_states": ("uid",),
    "node_states": ("node",),
    "k8s_events": ("uid",),
    "workload_progress": ("pod_uid", "ts"),
    "pod_windows": ("window_id",),
    "cluster_capacity": ("window_id",),
    "pod_lifecycle": ("pod_uid",),
    "alerts": ("type", "id", "state"),
}


def _topic_of(message: Message) -> str:
    spec = {PodWindow: POD_WINDOWS, ClusterCapacity: CLUSTER_CAPACITY, PodLifecycle: POD_LIFECYCLE,
            Alert: ALERTS}[type(message)]
    return spec.name(PREFIX)


def _scenario_records() -> dict[str, list[tuple[bytes | None, bytes | None]]]:
    """Every topic of one replayed scenario: the simulator's inputs and the workers' outputs."""
    scenario = load_scenario(SCENARIO)
    by_topic: dict[str, list[tuple[bytes | None, bytes | None]]] = {}
    for tick in FleetSimulator(scenario).run():
        for r in tick.records:
            by_topic.setdefault(by_suffix(r.topic).name(PREFIX), []).append(
                (None if r.key is None else r.key.encode(), r.value))
    for message in run_in_process(scenario).outputs:
        by_topic.setdefault(_topic_of(message), []).append((None, encode(message)))
    return by_topic


def _facts(store: ClickHouseStore) -> dict[str, tuple[int, int]]:
    """table -> (rows under FINAL, distinct natural keys over all stored rows)."""
    out = {}
    for table, key in NATURAL_KEYS.items():
        rows = store.query(f"SELECT count() FROM {table} FINAL").rows[0][0]
        keys = store.query(f"SELECT uniqExact({', '.join(key)}) FROM {table}").rows[0][0]
        out[table] = (int(rows), int(keys))
    return out


def _bad_sample() -> bytes:
    sample = f.sample("node-bad", 1, gpus=1)
    gpu = sample.gpus[0].model_copy(update={"xids": [XidEvent(xid=4242, at=sample.ts, critical=False, message="odd")]})
    return encode(sample.model_copy(update={"gpus": [gpu]}))


def test_redelivery_replays_and_a_rejected_record_leave_one_row_per_fact(store: ClickHouseStore) -> None:
    by_topic = _scenario_records()
    earliest = load_scenario(SCENARIO).start
    ttl = TtlDays.keeping(earliest)
    migrate(store, ttl)
    # a value the column's constraint refuses: ClickHouse itself rejects the gpu_xids block
    store.command("ALTER TABLE gpu_xids ADD CONSTRAINT xid_known CHECK xid < 1000")
    samples = GPU_SAMPLES.name(PREFIX)
    clean = {topic: list(records) for topic, records in by_topic.items()}
    middle = len(by_topic[samples]) // 2
    by_topic[samples].insert(middle, (b"node-bad", _bad_sample()))

    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, ttl)
    rejected_offsets: dict[str, list[int]] = {}
    reasons: list[str] = []
    for topic in sorted(by_topic):
        records = by_topic[topic]
        n = len(records)
        # every record twice, the second time at new offsets (a producer retry / a worker replay)
        doubled = [ConsumedRecord(topic, 0, offset, key, value)
                   for offset, (key, value) in enumerate(records + records)]
        size = max(1, n // 3)
        batches = [Batch(topic, 0, doubled[i:i + size], doubled[i].offset, doubled[min(i + size, 2 * n) - 1].offset)
                   for i in range(0, 2 * n, size)]
        for batch in [*batches, batches[0], batches[len(batches) // 2]]:  # journal replays: same tokens again
            _outcome, rejected = writer.write(batch)
            rejected_offsets.setdefault(topic, []).extend(r.offset for r, _ in rejected)
            reasons += [reason for _, reason in rejected]
        if topic == samples:
            assert sorted(set(rejected_offsets[topic])) == [middle, n + middle]
            assert reasons and all("xid_known" in r for r in reasons)
        else:
            assert rejected_offsets[topic] == [], topic

    # the batch inserts wrote gpu_samples before gpu_xids refused the bad record: never again
    assert store.query("SELECT count() - uniqExact(kafka_offset, gpu_uuid) FROM gpu_samples").rows == [[0]]
    assert store.query("SELECT count() - uniqExact(kafka_offset, gpu_uuid, pid) FROM gpu_processes").rows == [[0]]

    expected = _expected_facts(clean)
    facts = _facts(store)
    for table, (rows, keys) in facts.items():
        assert rows == keys == expected[table], (table, rows, keys, expected[table])
    for table in ("gpu_samples", "gpu_processes", "gpu_xids"):  # the rejected record left nothing behind
        assert store.query(f"SELECT count() FROM {table} WHERE node = 'node-bad'").rows == [[0]], table

    windows = [PodWindow.model_validate_json(v) for _, v in clean[POD_WINDOWS.name(PREFIX)] if v]
    want_hours = sum(w.allocated_s for w in windows) / 3600
    got_hours = store.query("SELECT sum(allocated_gpu_hours) FROM rollup_daily").rows[0][0]
    assert got_hours == pytest.approx(want_hours, rel=1e-6)


def _expected_facts(by_topic: dict[str, list[tuple[bytes | None, bytes | None]]]) -> dict[str, int]:
    """Distinct natural keys of every table, computed from the records themselves."""
    keys: dict[str, set[tuple[Any, ...]]] = {table: set() for table in NATURAL_KEYS}
    for topic, records in by_topic.items():
        spec = by_suffix(topic.removeprefix(PREFIX + "."))
        for offset, (_key, value) in enumerate(records):
            if value is None:
                continue
            for table, row in rows_for(decode(value, spec.message), 0, offset):
                if table in keys:
                    keys[table].add(tuple(row[c] for c in NATURAL_KEYS[table]))
    return {table: len(found) for table, found in keys.items()}


def test_two_simulator_runs_into_one_store_keep_both(store: ClickHouseStore) -> None:
    scenario = load_scenario(SCENARIO)
    ttl = TtlDays.keeping(scenario.start)
    migrate(store, ttl)
    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, ttl)
    topic = GPU_SAMPLES.name(PREFIX)
    per_run = []
    for run in range(2):
        values = [r.value for tick in FleetSimulator(scenario).run() for r in tick.records
                  if by_suffix(r.topic) is GPU_SAMPLES]
        per_run.append(sum(len(GpuSample.model_validate_json(v).gpus) for v in values if v))
        records = [ConsumedRecord(topic, run, offset, None, value) for offset, value in enumerate(values)]
        assert writer.write(Batch(topic, run, records, 0, len(records) - 1))[1] == []
    assert per_run[0] == per_run[1] > 0
    assert store.query("SELECT count() FROM gpu_samples FINAL").rows == [[per_run[0] * 2]]
    assert store.query("SELECT uniqExact(agent_boot_id) FROM gpu_samples").rows[0][0] == 2 * len(scenario.nodes)


def test_records_the_ttl_would_drop_are_dead_lettered(store: ClickHouseStore) -> None:
    migrate(store)
    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays())
    topic = GPU_SAMPLES.name(PREFIX)
    old = f.sample("node-old", 1, gpus=1).model_copy(update={"ts": datetime(1970, 1, 2, tzinfo=UTC)})
    edge = f.sample("node-edge", 1, gpus=1).model_copy(update={"ts": datetime.now(UTC) - timedelta(days=14)})
    fresh = f.sample("node-new", 1, gpus=1)
    records = [ConsumedRecord(topic, 0, i, None, encode(m)) for i, m in enumerate([old, edge, fresh])]
    outcome, rejected = writer.write(Batch(topic, 0, records, 0, 2))
    assert [(r.offset, "14-day TTL" in reason) for r, reason in rejected] == [(0, True), (1, True)]
    assert store.query("SELECT node FROM gpu_samples").rows == [["node-new"]]
    assert outcome.dead_letters == 2


def test_the_ttl_check_sees_an_old_value_among_nulls(store: ClickHouseStore) -> None:
    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays())
    now = datetime.now(UTC)
    old, recent = datetime(1970, 1, 2, tzinfo=UTC), now - timedelta(days=1)
    for values, expired in (([None, old, recent], True), ([recent, None], False), ([None], False),
                            ([recent, old], True)):
        assert writer._any_expired({"pod_states": TableColumns.of({"created_at": values})}, now) is expired


def test_a_pid_the_column_cannot_hold_is_refused_by_the_schema(store: ClickHouseStore) -> None:
    migrate(store)
    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays())
    topic = GPU_SAMPLES.name(PREFIX)
    payload = encode(f.sample("node-a", 1, gpus=1)).replace(b'"pid":1000', b'"pid":4294967296')
    assert b"4294967296" in payload
    _outcome, rejected = writer.write(Batch(topic, 0, [ConsumedRecord(topic, 0, 0, None, payload)], 0, 0))
    assert len(rejected) == 1 and "invalid gpu.samples" in rejected[0][1] and "pid" in rejected[0][1]
    assert store.query("SELECT count() FROM gpu_samples").rows == [[0]]


def test_the_store_classifies_what_clickhouse_refuses(store: ClickHouseStore) -> None:
    migrate(store)
    with pytest.raises(StoreRejected) as refused:
        store.insert("gpu_processes", {"ts": [datetime.now(UTC)], "node": ["n"], "gpu_uuid": ["g"], "pid": [-1]})
    assert "gpu_processes" in str(refused.value)
    store.command("ALTER TABLE gpu_prices ADD CONSTRAINT positive CHECK usd_per_gpu_hour > 0")
    with pytest.raises(StoreRejected) as violated:
        store.insert("gpu_prices", {"gpu_model": ["x"], "usd_per_gpu_hour": [-1.0], "updated_at": [datetime.now(UTC)]})
    assert violated.value.code == 469
    with pytest.raises(StoreRejected, match="has no column"):
        store.insert("gpu_prices", {"nope": [1]})


@pytest.mark.parametrize(("exc", "kind"), [
    (OperationalError("connection refused"), StoreUnavailable),
    (DataError("cannot parse"), StoreRejected),
    (ValueError("bad value"), StoreRejected),
    (OverflowError("int too large"), StoreRejected),
    (OSError("network unreachable"), StoreUnavailable),
])
def test_classify_by_driver_error(exc: BaseException, kind: type) -> None:
    assert isinstance(_classify(exc, "insert into t failed"), kind)


@pytest.mark.parametrize(("code", "kind"), [(53, StoreRejected), (321, StoreRejected), (469, StoreRejected),
                                            (252, StoreUnavailable), (241, StoreUnavailable), (None, StoreUnavailable)])
def test_classify_by_clickhouse_code(code: int | None, kind: type) -> None:
    error = DatabaseError(f"Code: {code}. DB::Exception: something")
    error.code = code  # type: ignore[attr-defined]
    classified = _classify(error, "insert into t failed")
    assert isinstance(classified, kind) and classified.code == code
    assert str(classified).startswith("insert into t failed: Code")


def test_writing_a_batch_leaves_garbage_collection_on(store: ClickHouseStore) -> None:
    migrate(store)
    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays())
    topic = GPU_SAMPLES.name(PREFIX)
    records = [ConsumedRecord(topic, 0, 0, None, encode(f.sample("node-a", 1, gpus=1))),
               ConsumedRecord(topic, 0, 1, None, b"{")]
    assert gc.isenabled()
    _outcome, rejected = writer.write(Batch(topic, 0, records, 0, 1))
    assert [r.offset for r, _ in rejected] == [1]
    assert gc.isenabled()


def test_timestamps_converted_once_per_object_store_what_the_driver_stores(store: ClickHouseStore) -> None:
    store.command("CREATE TABLE by_driver (i UInt32, at DateTime64(3, 'UTC'), maybe Nullable(DateTime64(6, 'UTC')), "
                  "name String) ENGINE = MergeTree ORDER BY i")
    store.command("CREATE TABLE once AS by_driver")
    shared = datetime(2026, 1, 5, 9, 0, 0, 123456, tzinfo=UTC)
    at = [shared, shared, datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
          datetime(2026, 1, 5, 11, 0, 0, 999, tzinfo=timezone(timedelta(hours=2))), shared]
    maybe = [None, shared, at[2], None, at[3]]
    columns: dict[str, list[Any]] = {"i": list(range(5)), "at": at, "maybe": maybe, "name": ["a"] * 5}
    store.insert("by_driver", columns)
    store.insert("once", columns, repeated_timestamps=True)
    assert store.query("SELECT count() FROM (SELECT * FROM by_driver EXCEPT SELECT * FROM once)").rows == [[0]]
    assert store.query("SELECT count() FROM once WHERE maybe IS NULL").rows == [[2]]
    naive = {**columns, "at": [datetime(2026, 1, 5, 9)] * 5}  # left to the driver as it is
    store.insert("by_driver", naive)
    store.insert("once", naive, repeated_timestamps=True)
    assert store.query("SELECT count() FROM (SELECT * FROM by_driver EXCEPT SELECT * FROM once)").rows == [[0]]


def test_the_journal_lookup_answers_every_partition_in_one_query(store: ClickHouseStore) -> None:
    migrate(store)
    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays())
    samples, pods = GPU_SAMPLES.name(PREFIX), by_suffix("k8s.pods.v1").name(PREFIX)
    for topic, partition, first, last in [(samples, 0, 0, 9), (samples, 0, 10, 19), (samples, 1, 0, 4),
                                          (samples, 1, 5, 9), (pods, 0, 3, 7), (samples, 2, 0, 99)]:
        writer.plan(Batch(topic, partition, [], first, last))
    writer.plan(Batch(samples, 0, [], 10, 19))  # journalled twice (a retried batch): one range
    queries: list[str] = []
    counting = _CountingStore(store, queries)
    plans = BatchWriter(counting, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays()).pending_plans(
        {(samples, 0): 12, (samples, 1): 0, (pods, 0): 8, (samples, 3): 0})
    assert len(queries) == 1
    assert plans == {(samples, 0): [Plan(10, 19)], (samples, 1): [Plan(0, 4), Plan(5, 9)], (pods, 0): [],
                     (samples, 3): []}


class _CountingStore:
    def __init__(self, store: ClickHouseStore, queries: list[str]) -> None:
        self.store, self.queries = store, queries

    def insert(self, table: str, columns: dict[str, list[Any]], dedup_token: str | None = None,
               repeated_timestamps: bool = False) -> int:
        return self.store.insert(table, columns, dedup_token, repeated_timestamps)

    def insert_json(self, table: str, lines: bytes, dedup_token: str) -> None:
        self.store.insert_json(table, lines, dedup_token)

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        self.queries.append(sql)
        return self.store.query(sql, parameters)

    def command(self, sql: str) -> None:
        self.store.command(sql)
