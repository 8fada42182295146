"""Replayed scenarios stored in an embedded ClickHouse through the sink's own write path.

The replay runs in-process (simulator + stream stages). Its inputs (samples, pods, nodes, events,
progress, as the simulator produces them) and its outputs (windows, capacity, lifecycle, alerts)
become Kafka-shaped records that the sink's Kafka-free half (:class:`sinks.batches.BatchWriter`)
decodes and inserts, one batch per topic, exactly as ``gpulens sink`` would. No broker is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.metrics import MetricsRegistry
from schemas.codec import encode
from schemas.messages import Message
from schemas.outputs import Alert, ClusterCapacity, PodLifecycle, PodWindow
from schemas.topics import ALERTS, CLUSTER_CAPACITY, POD_LIFECYCLE, POD_WINDOWS, by_suffix
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from simulation.simulator import FleetSimulator
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from sinks.rows import SINK_TOPICS
from sinks.service import load_prices

PREFIX = "gpulens"


def _output_record(message: Message) -> tuple[str, str]:
    if isinstance(message, PodWindow):
        return POD_WINDOWS.name(PREFIX), message.pod_uid
    if isinstance(message, ClusterCapacity):
        return CLUSTER_CAPACITY.name(PREFIX), "cluster"
    if isinstance(message, PodLifecycle):
        return POD_LIFECYCLE.name(PREFIX), message.pod_uid
    if isinstance(message, Alert):
        return ALERTS.name(PREFIX), message.id
    raise TypeError(f"unexpected replay output {type(message).__name__}")


def store_scenarios(paths: list[Path], url: str) -> list[dict[str, Any]]:
    """Replay each scenario, write all its topics into ``url`` (migrated first); the replay reports."""
    by_topic: dict[str, list[tuple[str | None, bytes | None]]] = {}
    reports: list[dict[str, Any]] = []
    prices: dict[str, float] = {}
    starts = []
    for path in paths:
        scenario = load_scenario(path)
        starts.append(scenario.start)
        prices.update(scenario.prices)
        result = run_in_process(scenario)
        reports.append(result.report)
        for tick in FleetSimulator(scenario).run():
            for r in tick.records:
                if by_suffix(r.topic) in SINK_TOPICS:  # what `gpulens sink` subscribes to
                    by_topic.setdefault(by_suffix(r.topic).name(PREFIX), []).append((r.key, r.value))
        for message in result.outputs:
            topic, key = _output_record(message)
            by_topic.setdefault(topic, []).append((key, encode(message)))
    ttl = TtlDays.keeping(min(starts))  # the scenarios are past-dated: keep them, as a replay must
    store = open_store(url)
    try:
        migrate(store, ttl)
        store.forget_schema()
        load_prices(store, prices)
        writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, ttl)
        for topic in sorted(by_topic):
            records = [ConsumedRecord(topic, 0, offset, None if key is None else key.encode(), value)
                       for offset, (key, value) in enumerate(by_topic[topic])]
            _outcome, rejected = writer.write(Batch(topic, 0, records, 0, len(records) - 1))
            assert not rejected, rejected[:3]
    finally:
        store.close()
    return reports
