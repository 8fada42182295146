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
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from simulation.store import PREFIX, replay_records
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from sinks.service import load_prices


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
        for topic, pairs in replay_records(scenario, result).items():
            by_topic.setdefault(topic, []).extend(pairs)
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
