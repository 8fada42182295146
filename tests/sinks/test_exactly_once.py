"""Every topic lands in ClickHouse exactly once: real broker, real engine (chDB), no mocks.

N known messages give exactly the expected rows per table; producer redeliveries collapse; bad
records go to the dead-letter topic with the reason; a ClickHouse outage in the middle of the
stream (the client failing for several batches, including acknowledgements lost after the engine
stored the block) still ends with every row present once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from common.settings import SinkSettings
from schemas.topics import (
    ALERTS,
    CLUSTER_CAPACITY,
    GPU_SAMPLES,
    K8S_EVENTS,
    K8S_NODES,
    K8S_PODS,
    POD_LIFECYCLE,
    POD_WINDOWS,
    WORKLOAD_PROGRESS,
)
from sinks.clickhouse import ClickHouseStore, StoreUnavailable, open_store
from sinks.migrations import MIGRATIONS
from sinks.service import prepare_store, run_sink
from sinks.sink import ClickHouseSink
from tests.sinks import factories as f
from tests.sinks.conftest import Item, dead_letters

pytestmark = pytest.mark.kafka


def _count(store: ClickHouseStore, table: str, final: bool = False) -> int:
    return int(store.query(f"SELECT count() FROM {table}{' FINAL' if final else ''}").rows[0][0])


def _dataset() -> list[Item]:
    items: list[Item] = []
    items += [(GPU_SAMPLES, "gpu-a", f.sample("gpu-a", seq, with_xid=seq == 7)) for seq in range(20)]
    items += [(K8S_PODS, "u1", f.pod("u1", "Pending", 0)), (K8S_PODS, "u1", f.pod("u1", "Running", 1)),
              (K8S_PODS, "u1", f.pod("u1", "Succeeded", 30)), (K8S_PODS, "u2", f.pod("u2", "Running", 2)),
              (K8S_PODS, "u2", None)]
    items += [(K8S_NODES, "gpu-a", f.node_state("gpu-a", 0)), (K8S_NODES, "gpu-b", f.node_state("gpu-b", 0)),
              (K8S_NODES, "gpu-a", f.node_state("gpu-a", 5, ready=False))]
    items += [(K8S_EVENTS, "uid-p", f.event(f"ev-{i}", i)) for i in range(5)]
    items += [(WORKLOAD_PROGRESS, "u1", f.progress("u1", m, steps=100.0 * m)) for m in range(10)]
    windows = [f.window("u1", gpu, m) for m in range(10) for gpu in range(4)]
    items += [(POD_WINDOWS, "u1", w) for w in windows]
    items += [(CLUSTER_CAPACITY, "cluster", f.capacity(m)) for m in range(10)]
    items += [(POD_LIFECYCLE, f"l{i}", f.lifecycle(f"l{i}")) for i in range(3)]
    items += [(ALERTS, "alert-1", f.alert(1)), (ALERTS, "alert-2", f.alert(2)),
              (ALERTS, "alert-1", f.alert(1, "resolved")), (ALERTS, "alert-2", f.alert(2, "resolved"))]
    # a producer redelivering windows (same deterministic ids, new offsets) after the originals
    items += [(POD_WINDOWS, "u1", w) for w in windows[:5]]
    # rejects: not JSON, missing a required field, a tombstone on a topic without tombstones
    items += [(POD_WINDOWS, "u1", b"{not json"), (ALERTS, "x", b'{"id": "x"}'), (K8S_EVENTS, "uid-p", None)]
    return items


EXPECTED_ROWS = {
    "gpu_samples": 160, "gpu_processes": 80, "gpu_xids": 1, "pod_states": 2, "state_tombstones": 1,
    "node_states": 2, "k8s_events": 5, "workload_progress": 10, "pod_windows": 40, "cluster_capacity": 10,
    "pod_lifecycle": 3, "alerts": 4,
}


def _assert_expected_rows(store: ClickHouseStore) -> None:
    got = {table: _count(store, table, final=table not in ("gpu_samples", "gpu_processes")) for table in EXPECTED_ROWS}
    assert got == EXPECTED_ROWS
    # append-only tables and redelivered windows are exact even before merges
    assert _count(store, "gpu_samples") == 160 and _count(store, "pod_windows") == 40
    for table in EXPECTED_ROWS:  # no row stored twice from the same Kafka record, merged or not
        within = {"gpu_samples": "gpu_uuid", "gpu_processes": "gpu_uuid, pid", "gpu_xids": "gpu_uuid, xid"}
        key = f"kafka_partition, kafka_offset, {within.get(table, '0')}"
        dups = store.query(f"SELECT count() - uniqExact({key}) FROM {table}")
        assert dups.rows == [[0]], table
    hourly = store.query("SELECT sum(allocated_gpu_hours), sum(busy_gpu_hours) FROM rollup_hourly").rows[0]
    assert hourly == [pytest.approx(40 / 60), pytest.approx(40 / 60)], "rollups counted a window twice"
    pod = store.query("SELECT phase FROM pod_states FINAL WHERE uid = 'u1'").rows
    assert pod == [["Succeeded"]], "the newest pod state wins"
    assert store.query("SELECT ready FROM node_states FINAL WHERE node = 'gpu-a'").rows == [[False]]
    assert store.query("SELECT count() FROM v_pods").rows == [[1]], "a deleted pod (tombstone) leaves v_pods"


def test_n_known_messages_give_exactly_the_expected_rows(
    sink_settings: SinkSettings, producer: Callable[[Iterable[Item]], int]
) -> None:
    producer(_dataset())
    totals = run_sink(sink_settings, exit_when_idle_s=1.5)
    assert totals.dead_letters == 3
    store = open_store(sink_settings.clickhouse_url())
    try:
        _assert_expected_rows(store)
        applied = store.query("SELECT version FROM schema_migrations FINAL ORDER BY version").rows
        assert [r[0] for r in applied] == [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    finally:
        store.close()

    letters = dead_letters(sink_settings, 3)
    reasons = sorted(letter["headers"]["error"] for letter in letters)
    assert len(letters) == 3
    assert any("not valid JSON" in r for r in reasons)
    assert any("alerts.v1" in r and "type" in r for r in reasons), reasons
    assert any("tombstone" in r for r in reasons)
    for letter in letters:
        assert letter["headers"]["source_topic"].startswith(sink_settings.topic_prefix)
        assert int(letter["headers"]["source_offset"]) >= 0
        assert letter["value"]["error"] == letter["headers"]["error"]

    # a second sink in the same group finds everything committed: no new rows
    again = run_sink(sink_settings, exit_when_idle_s=1.0)
    assert again.rows_by_table == {}
    store = open_store(sink_settings.clickhouse_url())
    try:
        _assert_expected_rows(store)
    finally:
        store.close()


class FlakyStore:
    """The real store behind a client that fails for a while, as during a ClickHouse outage.

    ``down`` inserts raise before reaching the engine; then ``lost_acks`` inserts into the raw
    samples (rows or the engine's lines) and the windows (which feed the rollups) reach the engine
    and store their block, but the acknowledgement is lost (the client raises afterwards).
    """

    LOST_ACK_TABLES = ("gpu_samples", "pod_windows")

    def __init__(self, store: ClickHouseStore, down: int, lost_acks: int, start_after: int = 3) -> None:
        self.store = store
        self.down = down
        self.lost_acks = lost_acks
        self.start_after = start_after
        self.calls = 0
        self.failures = 0

    def insert(self, table: str, columns: dict[str, list[Any]], dedup_token: str | None = None,
               repeated_timestamps: bool = False) -> int:
        self.calls += 1
        if self.calls > self.start_after and self.down > 0:
            self.down -= 1
            self.failures += 1
            raise StoreUnavailable("HTTPConnectionPool(host='clickhouse', port=8123): connection refused")
        n = self.store.insert(table, columns, dedup_token, repeated_timestamps)
        if self.calls > self.start_after and self.lost_acks > 0 and table in self.LOST_ACK_TABLES:
            self.lost_acks -= 1
            self.failures += 1
            raise StoreUnavailable("read timed out after the server stored the block")
        return n

    def insert_json(self, table: str, lines: bytes, dedup_token: str) -> None:
        self.calls += 1
        if self.calls > self.start_after and self.down > 0:
            self.down -= 1
            self.failures += 1
            raise StoreUnavailable("HTTPConnectionPool(host='clickhouse', port=8123): connection refused")
        self.store.insert_json(table, lines, dedup_token)
        if self.calls > self.start_after and self.lost_acks > 0:
            self.lost_acks -= 1
            self.failures += 1
            raise StoreUnavailable("read timed out after the server stored the block")

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        return self.store.query(sql, parameters)

    def command(self, sql: str) -> None:
        self.store.command(sql)


def test_clickhouse_outage_mid_stream_ends_with_every_row_once(
    sink_settings: SinkSettings, producer: Callable[[Iterable[Item]], int]
) -> None:
    producer(_dataset())
    settings = sink_settings.model_copy(update={"batch_max_rows": 7})
    store = prepare_store(settings)
    flaky = FlakyStore(store, down=6, lost_acks=4)
    sink = ClickHouseSink(settings, flaky)
    try:
        totals = sink.run(exit_when_idle_s=1.5)
        assert flaky.failures == 10 and flaky.lost_acks == 0
        assert totals.dead_letters == 3
        errors = sink.registry.registry.get_sample_value(
            "gpulens_sink_errors_total", {"kind": "clickhouse_unavailable"})
        assert errors == 10
        rows = sink.registry.registry.get_sample_value("gpulens_sink_rows_written_total", {"table": "gpu_samples"})
        assert rows is not None and rows >= 160
        assert "gpulens_sink_batch_latency_seconds_count" in sink.registry.render()
        _assert_expected_rows(store)
    finally:
        store.close()
