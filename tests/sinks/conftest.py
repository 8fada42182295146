"""Fixtures of the sink tests: a private chDB directory, sink settings and a producer helper."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.kafka import BoundedProducer, ensure_topics, make_consumer
from common.settings import ClickHouseSettings, KafkaSettings, SinkSettings
from schemas.codec import encode
from schemas.messages import Message
from schemas.outputs import Alert, ClusterCapacity, PodLifecycle, PodWindow
from schemas.topics import (
    ALERTS,
    ALL_TOPICS,
    CLUSTER_CAPACITY,
    DEADLETTER,
    POD_LIFECYCLE,
    POD_WINDOWS,
    TopicSpec,
    by_suffix,
)
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from simulation.simulator import FleetSimulator
from sinks.clickhouse import ClickHouseStore, open_store

Item = tuple[TopicSpec, str, Message | bytes | None]
"""(topic, key, value): a message, raw bytes (to test rejects) or None (a tombstone)."""


def make_sink_settings(kafka: KafkaSettings, prefix: str, data_dir: Path, **extra: object) -> SinkSettings:
    base: dict[str, object] = {
        "kafka": kafka,
        "topic_prefix": prefix,
        "data_dir": data_dir,
        "clickhouse": ClickHouseSettings(url=f"chdb://{data_dir / 'clickhouse'}"),
        "group_id": f"sink-{uuid.uuid4().hex[:8]}",
        "batch_max_rows": 50,
        "batch_max_age_s": 0.1,
        "retry_initial_s": 0.05,
        "retry_max_s": 0.2,
        "session_timeout_ms": 6000,
        "log_format": "text",
    }
    base.update(extra)
    return SinkSettings(**base)  # type: ignore[arg-type]


def replayed_items(path: Path) -> tuple[dict[str, Any], list[Item]]:
    """A scenario file's in-process report, and every record it plays (inputs as the simulator wrote
    them, the stream jobs' outputs) as items for :func:`produce`."""
    scenario = load_scenario(path)
    result = run_in_process(scenario)
    items: list[Item] = [(by_suffix(r.topic), r.key or "", r.value)
                         for tick in FleetSimulator(scenario).run() for r in tick.records]
    for message in result.outputs:
        if isinstance(message, PodWindow):
            items.append((POD_WINDOWS, message.pod_uid, message))
        elif isinstance(message, ClusterCapacity):
            items.append((CLUSTER_CAPACITY, "cluster", message))
        elif isinstance(message, PodLifecycle):
            items.append((POD_LIFECYCLE, message.pod_uid, message))
        elif isinstance(message, Alert):
            items.append((ALERTS, message.id, message))
    return result.report, items


def dead_letters(settings: SinkSettings, expected: int) -> list[dict[str, Any]]:
    """The dead letters on the sink's topic, value and headers (at least ``expected`` of them, or
    what came in 30 s)."""
    consumer = make_consumer(settings.kafka, f"{settings.group_id}-dlq-reader")
    consumer.subscribe([DEADLETTER.name(settings.topic_prefix)])
    found: list[dict[str, Any]] = []
    try:
        for _ in range(60):
            for msg in consumer.consume(num_messages=100, timeout=0.5):
                if msg.error() is None:
                    raw_headers: Any = msg.headers() or []
                    headers = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in raw_headers}
                    found.append({"value": orjson.loads(msg.value() or b"null"), "headers": headers})
            if len(found) >= expected:
                break
    finally:
        consumer.close()
    return found


def produce(kafka: KafkaSettings, prefix: str, items: Iterable[Item]) -> int:
    ensure_topics(kafka, ALL_TOPICS, prefix)
    producer = BoundedProducer(kafka)
    n = 0
    for spec, key, value in items:
        payload = encode(value) if isinstance(value, Message) else value
        assert producer.produce(spec.name(prefix), key, payload)
        n += 1
    assert producer.flush(30.0) == 0
    assert producer.stats.failed == 0, producer.stats.last_error
    return n


@pytest.fixture
def sink_settings(kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> SinkSettings:
    return make_sink_settings(kafka_settings, topic_prefix, tmp_path)


@pytest.fixture
def producer(kafka_settings: KafkaSettings, topic_prefix: str) -> Callable[[Iterable[Item]], int]:
    return lambda items: produce(kafka_settings, topic_prefix, items)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ClickHouseStore]:
    """A store in a private chDB directory, not yet migrated (tests migrate it with the TTLs they
    need, or override this fixture to)."""
    store = open_store(f"chdb://{tmp_path / 'clickhouse'}")
    try:
        yield store
    finally:
        store.close()
