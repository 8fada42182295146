"""Fixtures of the sink tests: a private chDB directory, sink settings and a producer helper."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from common.kafka import BoundedProducer, ensure_topics
from common.settings import ClickHouseSettings, KafkaSettings, SinkSettings
from schemas.codec import encode
from schemas.messages import Message
from schemas.topics import ALL_TOPICS, TopicSpec
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
