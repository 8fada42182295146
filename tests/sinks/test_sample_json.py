"""GPU samples the engine unpacks (``sinks.sample_json``) are stored exactly as the row path stores
them, column for column; samples it must not read (coerced values, XID events) take the row path;
a value beyond its column is refused by the schema, dead-lettered alone; a line the engine reads
differently (a duplicate key) makes it refuse the whole block before either view writes, and the
batch is written as rows (real chDB, no broker)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from common.metrics import MetricsRegistry
from schemas.codec import encode
from schemas.messages import GpuProcess, GpuReading, GpuSample, PodRef, XidEvent
from schemas.topics import GPU_SAMPLES
from sinks import migrations, sample_json
from sinks.batches import Batch, BatchWriter, ConsumedRecord, PreparedBatch, SinkMetrics, read_in_full
from sinks.clickhouse import ClickHouseStore
from sinks.ddl import TtlDays
from sinks.migration_additions import M10_SAMPLE_JSON
from sinks.migrations import migrate
from sinks.rows import sample_columns, tables_for

PREFIX = "gpulens"
TOPIC = GPU_SAMPLES.name(PREFIX)
START = datetime(2026, 11, 30, 8, 0, 0, 123456, tzinfo=UTC)
TABLES = {"gpu_samples": "kafka_offset, gpu_index, gpu_uuid", "gpu_processes": "kafka_offset, gpu_uuid, pid"}


@pytest.fixture
def migrated(store: ClickHouseStore) -> ClickHouseStore:
    migrate(store, TtlDays.keeping(START - timedelta(days=1)))
    return store


def _maybe(rng: random.Random, value: Any) -> Any:
    return value if rng.random() < 0.7 else None


def _float(rng: random.Random) -> float:
    return rng.choice([0.0, 0.1, 1 / 3, 99.99999, 1e-45, 1e-300, 3.4028234e38, 123456.789, float(rng.randint(0, 10**9)),
                       rng.uniform(0, 1e6), rng.random()])


def _reading(rng: random.Random, node: int, index: int) -> GpuReading:
    mig = rng.random() < 0.2
    pods = [PodRef(namespace=rng.choice(["research", "prod", "équipe-ü"]), pod=f"job-{node}-{k}",
                   container="main", pod_uid=_maybe(rng, f"uid-{node}-{k}")) for k in range(rng.randint(0, 2))]
    processes = [GpuProcess(pid=(2**32 - 1, 1, 4000)[k], container_id=_maybe(rng, f"cid-{k}"),
                            pod_uid=_maybe(rng, f"uid-{node}-{k}"), pod_namespace=_maybe(rng, "research"),
                            pod_name=_maybe(rng, f'job "{k}" \\ ✓'), container_name=_maybe(rng, "main"),
                            mem_used_bytes=_maybe(rng, rng.choice([0, 2**64 - 1, rng.randint(0, 2**40)])),
                            sm_util_pct=_maybe(rng, rng.uniform(0, 100)), process_name=_maybe(rng, "python3"))
                 for k in range(rng.choice([0, 0, 1, 3]))]
    return GpuReading(
        uuid=f"GPU-{node:03d}-{index}", index=index, model=rng.choice(["NVIDIA H100 80GB HBM3", "A100-SXM4-40GB"]),
        mig_parent_uuid=f"GPU-{node:03d}-parent" if mig else None, mig_profile="1g.10gb" if mig else None,
        gpu_util_pct=_maybe(rng, rng.uniform(0, 100)), mem_util_pct=_maybe(rng, float(rng.randint(0, 100))),
        mem_used_bytes=_maybe(rng, rng.randint(0, 2**64 - 1)), mem_total_bytes=_maybe(rng, 80 * 2**30),
        power_w=_maybe(rng, _float(rng)), temperature_c=_maybe(rng, rng.choice([-40.5, 0.0, 85.25, _float(rng)])),
        sm_clock_mhz=_maybe(rng, rng.choice([0, 1980, 2**32 - 1])), mem_clock_mhz=_maybe(rng, 2619),
        pcie_tx_bytes_per_s=_maybe(rng, _float(rng)), pcie_rx_bytes_per_s=_maybe(rng, _float(rng)),
        nvlink_tx_bytes_per_s=_maybe(rng, _float(rng)), nvlink_rx_bytes_per_s=_maybe(rng, _float(rng)),
        health=rng.choice(["ok", "ok", "degraded", "lost", "error"]),
        health_reason=_maybe(rng, "thermal\nslowdown ‼"), assigned_to=pods, processes=processes,
        shared=rng.random() < 0.2,
    )


def _sample(rng: random.Random, n: int) -> GpuSample:
    return GpuSample(
        cluster=rng.choice(["default", "eu-west-1", "a"]), node=f"node-{n:03d}-ñ",
        ts=START + timedelta(seconds=10 * n, microseconds=rng.choice([0, 1, 999, 999_999])),
        agent_boot_id=f"boot-{n % 3}", seq=rng.choice([0, n, 2**63]), sample_interval_s=rng.choice([10.0, 0.5, 1e-3]),
        driver_version=_maybe(rng, "550.54.15"), cuda_driver_version=_maybe(rng, "12.4"),
        gpus=[_reading(rng, n, i) for i in range(rng.choice([0, 1, 8]))],
    )


def _handmade() -> list[bytes]:
    """Canonical records no model encoder writes: a version-1 record (no cluster), a time with an
    offset, escapes (a surrogate pair among them), whitespace and pretty-printing, unknown fields."""
    gpu = {"uuid": "GPU-h-0", "index": 0, "model": "H100", "gpu_util_pct": 7, "power_w": 123,
           "assigned_to": [{"namespace": "ns", "pod": "p\u00e9", "container": "c"}],
           "processes": [{"pid": 7, "sm_util_pct": 50}], "future_field": {"nested": [1, 2]}}
    first = {"schema_version": 1, "node": "node-h1", "ts": "2026-11-30T10:00:00.5+05:30", "agent_boot_id": "b",
             "seq": 3, "sample_interval_s": 10, "gpus": [gpu]}
    return [
        orjson.dumps(first),
        b'{"cluster": "default", "node": "node-\\u00e9\\ud83d\\ude00", "ts": "2026-11-30T08:00:00Z",\n'
        b' "agent_boot_id": "b\\n\\"q\\"", "seq": 4, "sample_interval_s": 2.5,\n'
        b' "gpus": [{"uuid": "GPU-h-1", "index": 1, "model": "H100", "health": "lost", "shared": true}]}\n',
    ]


def _records(payloads: list[bytes]) -> list[ConsumedRecord]:
    return [ConsumedRecord(TOPIC, 0, offset, b"k", payload) for offset, payload in enumerate(payloads)]


def _prepare(store: ClickHouseStore, records: list[ConsumedRecord]) -> tuple[BatchWriter, PreparedBatch]:
    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, TtlDays.keeping(START - timedelta(days=1)))
    return writer, writer.prepare(Batch(TOPIC, 0, records, records[0].offset, records[-1].offset))


def _as_rows(prepared: PreparedBatch) -> PreparedBatch:
    """The same batch with every record on the row path (what the sink did before the engine path)."""
    decoded = prepared.all_decoded()
    tables = tables_for([(message, record.partition, record.offset) for record, message in decoded])
    return PreparedBatch(prepared.batch, decoded, tables, prepared.rejected)


def _stored(store: ClickHouseStore) -> dict[str, list[list[Any]]]:
    return {table: store.query(f"SELECT * FROM {table} ORDER BY {order}").rows for table, order in TABLES.items()}


def _truncate(store: ClickHouseStore) -> None:
    for table in (*TABLES, "gpu_xids", "sink_batches"):
        store.command(f"TRUNCATE TABLE {table}")


def test_the_views_write_every_column_the_row_path_writes() -> None:
    gpu = GpuReading(uuid="GPU-0", index=0, model="H100", processes=[GpuProcess(pid=1)])
    sample = GpuSample(node="n", ts=START, agent_boot_id="b", seq=0, sample_interval_s=1.0, gpus=[gpu])
    tables = sample_columns([(sample.model_dump(), 0, 0)])
    assert tuple(sample_json.SAMPLE_COLUMNS) == tuple(tables["gpu_samples"].names)
    assert tuple(sample_json.PROCESS_COLUMNS) == tuple(tables["gpu_processes"].names)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_engine_rows_equal_row_path_rows_column_for_column(migrated: ClickHouseStore, seed: int) -> None:
    rng = random.Random(seed)
    payloads = [encode(_sample(rng, n)) for n in range(150)] + _handmade()
    writer, prepared = _prepare(migrated, _records(payloads))
    assert len(prepared.engine) == len(payloads) and not prepared.decoded and not prepared.rejected

    outcome, rejected = writer.store_prepared(prepared)
    by_engine = _stored(migrated)
    _truncate(migrated)
    row_outcome, row_rejected = writer.store_prepared(_as_rows(prepared))
    by_rows = _stored(migrated)

    assert rejected == row_rejected == []
    assert outcome.rows_by_table == row_outcome.rows_by_table
    assert len(by_engine["gpu_samples"]) == outcome.rows_by_table["gpu_samples"] > 400
    assert len(by_engine["gpu_processes"]) == outcome.rows_by_table["gpu_processes"] > 100
    for table in TABLES:
        assert by_engine[table] == by_rows[table], table


def test_coerced_values_and_xid_events_take_the_row_path(migrated: ClickHouseStore) -> None:
    rng = random.Random(4)
    base = orjson.loads(encode(_sample(rng, 5)))
    base["gpus"] = [_reading(rng, 5, 0).model_dump(mode="json")]
    coerced = []
    for path, value in ((("seq",), "12"), (("sample_interval_s",), "10"), (("gpus", 0, "index"), 0.0),
                        (("gpus", 0, "shared"), 1), (("ts",), int(START.timestamp()))):
        record = orjson.loads(orjson.dumps(base))
        target = record
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        coerced.append(orjson.dumps(record))
    with_xid = _sample(rng, 6).model_copy(update={"gpus": [_reading(rng, 6, 0).model_copy(update={
        "xids": [XidEvent(xid=79, at=START, critical=True, message="fallen off the bus")]})]})
    payloads = [*coerced, encode(with_xid), encode(_sample(rng, 7))]
    writer, prepared = _prepare(migrated, _records(payloads))
    assert [sample.record.offset for sample in prepared.engine] == [6]
    assert [record.offset for record, _ in prepared.decoded] == [0, 1, 2, 3, 4, 5]

    writer.store_prepared(prepared)
    by_engine = _stored(migrated)
    xids = migrated.query("SELECT kafka_offset, xid FROM gpu_xids").rows
    _truncate(migrated)
    writer.store_prepared(_as_rows(prepared))
    assert by_engine == _stored(migrated)
    assert xids == [[5, 79]]


BEYOND_THEIR_COLUMNS = {
    "index beyond UInt16": ("gpus.1.index", 70_000),
    "negative index": ("gpus.1.index", -1),
    "finite temperature beyond Float32": ("gpus.1.temperature_c", 1e300),
    "negative temperature beyond Float32": ("gpus.1.temperature_c", -3.5e38),
    "power beyond Float32": ("gpus.1.power_w", 3.5e38),
    "PCIe rate beyond Float32": ("gpus.1.pcie_rx_bytes_per_s", 1e39),
    "clock beyond UInt32": ("gpus.1.sm_clock_mhz", 2**32),
    "memory beyond UInt64": ("gpus.1.mem_used_bytes", 2**64),
    "process memory beyond UInt64": ("gpus.1.processes", [{"pid": 1, "mem_used_bytes": 2**64}]),
    "more processes than UInt16 counts": ("gpus.1.processes", [{"pid": 1}] * 65_536),
    "XID beyond UInt32": ("gpus.1.xids", [{"xid": 2**32, "at": "2026-11-30T08:00:00Z", "critical": True}]),
    "sample interval beyond Float32": ("sample_interval_s", 1e39),
    "sequence number beyond UInt64": ("seq", 2**64),
}


def _set_path(record: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    target: Any = record
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value


@pytest.mark.parametrize("path, value", BEYOND_THEIR_COLUMNS.values(), ids=list(BEYOND_THEIR_COLUMNS))
def test_a_value_beyond_its_column_is_dead_lettered_alone_with_the_field_it_names(
    migrated: ClickHouseStore, path: str, value: Any,
) -> None:
    """The schema bounds what a column cannot hold, so the record is refused where it is read (the
    views convert without a check of their own, which would wrap an index or make a float infinite)."""
    rng = random.Random(5)
    good = [encode(_sample(rng, n).model_copy(update={"gpus": [_reading(rng, n, i) for i in range(2)]}))
            for n in range(5)]
    bad = orjson.loads(good[2])
    _set_path(bad, path, value)
    payloads = [*good[:2], json.dumps(bad).encode(), *good[3:]]  # json: orjson refuses integers beyond 64 bits
    writer, prepared = _prepare(migrated, _records(payloads))
    assert [record.offset for record, _ in prepared.rejected] == [2]
    reason = prepared.rejected[0][1]
    assert path.split(".")[-1] in reason, reason

    outcome, rejected = writer.store_prepared(prepared)

    assert [record.offset for record, _ in rejected] == [2]
    stored = migrated.query("SELECT kafka_offset, count() FROM gpu_samples GROUP BY kafka_offset ORDER BY 1").rows
    assert stored == [[0, 2], [1, 2], [3, 2], [4, 2]]
    assert outcome.rows_by_table["gpu_samples"] == 8


def test_a_duplicate_key_is_read_as_validation_reads_it(migrated: ClickHouseStore) -> None:
    rng = random.Random(6)
    payload = encode(_sample(rng, 8).model_copy(update={"gpus": [_reading(rng, 8, 0)]}))
    doubled = payload[:-1] + b',"node":"the-last-node"}'  # validation keeps the last of two keys
    writer, prepared = _prepare(migrated, _records([payload, doubled]))
    assert len(prepared.engine) == 2

    _, rejected = writer.store_prepared(prepared)

    assert rejected == []
    assert migrated.query("SELECT kafka_offset, node FROM gpu_samples ORDER BY 1").rows == [
        [0, "node-008-ñ"], [1, "the-last-node"]]


def test_a_block_sent_again_with_its_token_is_stored_once(migrated: ClickHouseStore) -> None:
    rng = random.Random(7)
    payloads = [encode(_sample(rng, n)) for n in range(20)]
    _, prepared = _prepare(migrated, _records(payloads))
    lines = b"\n".join(sample.line for sample in prepared.engine)
    for _ in range(3):
        migrated.insert_json(sample_json.TABLE, lines, dedup_token="a-batch:json")
    counts = {table: migrated.query(f"SELECT count() FROM {table}").rows[0][0] for table in TABLES}
    expected = sample_columns([(read_in_full(s.record).data, 0, s.record.offset) for s in prepared.engine])
    assert counts == {table: expected[table].n_rows for table in TABLES}


def test_migration_11_moves_a_store_off_the_check_view_and_each_line_is_unpacked_once(
    store: ClickHouseStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ttl = TtlDays.keeping(START - timedelta(days=1))
    with monkeypatch.context() as before:
        before.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:10])
        migrate(store, ttl)
    # migration 10 as released before 11: the lines went through a check view into a second Null table
    for view in ("to_samples", "to_processes"):
        store.command(f"DROP VIEW {sample_json.TABLE}_{view}")
    store.command(f"CREATE TABLE {sample_json.TABLE}_checked AS {sample_json.TABLE}")
    store.command(f"CREATE MATERIALIZED VIEW {sample_json.TABLE}_check TO {sample_json.TABLE}_checked AS "
                  f"SELECT * FROM {sample_json.TABLE} WHERE throwIf(s.seq > 2000000, 'beyond') = 0")
    for view in M10_SAMPLE_JSON[1:]:  # the views as released, on the checked lines
        store.command(view.replace(f"{sample_json.TABLE}_to_", f"{sample_json.TABLE}_", 1)
                      .replace(f"FROM {sample_json.TABLE} ", f"FROM {sample_json.TABLE}_checked "))

    assert migrate(store, ttl) == [m.version for m in migrations.MIGRATIONS[10:]]

    names = {row[0] for row in store.query("SELECT name FROM system.tables WHERE database = currentDatabase() "
                                           f"AND name LIKE '{sample_json.TABLE}%'").rows}
    assert names == {sample_json.TABLE, f"{sample_json.TABLE}_to_samples", f"{sample_json.TABLE}_to_processes"}
    rng = random.Random(8)
    writer, prepared = _prepare(store, _records([encode(_sample(rng, n)) for n in range(10)]))
    outcome, _ = writer.store_prepared(prepared)
    assert outcome.rows_by_table["gpu_samples"] > 0
    stored = {table: store.query(f"SELECT count() FROM {table}").rows[0][0] for table in TABLES}  # no FINAL
    assert stored == {table: outcome.rows_by_table.get(table, 0) for table in TABLES}
