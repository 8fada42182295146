"""The watcher produces to the real local broker; every record validates against the committed
JSON Schemas, and a deleted pod leaves its final state followed by a tombstone."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from common.kafka import BoundedProducer, ensure_topics, make_consumer
from common.settings import KafkaSettings
from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.fake_cluster import make_event, set_finished
from producers.watcher.service import WatcherKafkaSink
from schemas.codec import decode
from schemas.control import STATE_TOPICS, DeliveredOffsets
from schemas.json_schema import COMMITTED_DIR
from schemas.messages import PodState
from schemas.topics import INTERNAL_CONTROL, K8S_EVENTS, K8S_NODES, K8S_PODS
from tests.watcher.conftest import Factory, populate

TOPICS = (K8S_PODS, K8S_NODES, K8S_EVENTS)


def consume_all(kafka: KafkaSettings, topics: list[str], expected: int, timeout_s: float = 90.0) -> list[Any]:
    consumer = make_consumer(kafka, f"watcher-test-{time.time_ns()}")
    consumer.subscribe(topics)
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(records) < expected:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            records.append(message)
        # a little longer, to catch any duplicates
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                records.append(message)
    finally:
        consumer.close()
    return records


@pytest.mark.kafka
def test_watcher_produces_schema_valid_records(
        kafka_settings: KafkaSettings, topic_prefix: str, server: FakeApiServer, make_service: Factory) -> None:
    uids = populate(server)
    pending = server.get("pods", "vision/train-3") or {}
    text = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    server.put("events", make_event(pending, "FailedScheduling", text, datetime(2024, 5, 6, 8, tzinfo=UTC)))
    ensure_topics(kafka_settings, TOPICS, topic_prefix)
    producer = BoundedProducer(kafka_settings)
    service, _, _ = make_service(sink=WatcherKafkaSink(producer, topic_prefix))
    stop = threading.Event()
    service.sync(stop)
    informer = service.pod_informers[0]
    server.patch("pods", "ml/train-0", lambda p: set_finished(p, datetime(2024, 5, 6, 9, tzinfo=UTC)))
    server.delete("pods", "ml/train-0")
    informer.watch_once()
    assert producer.flush(60) == 0 and producer.stats.failed == 0, producer.stats
    # 6 pods + 2 nodes + 1 event initially; then train-0: Succeeded, its deletion time (the real
    # server's MODIFIED with deletionTimestamp), deleted final state, tombstone
    expected = 6 + 2 + 1 + 4
    records = consume_all(kafka_settings, [t.name(topic_prefix) for t in TOPICS], expected)
    assert len(records) == expected, [(r.topic(), r.key(), r.value() is None) for r in records]

    validators = {t.name(topic_prefix): Draft202012Validator(json.loads(
        (COMMITTED_DIR / f"{t.suffix}.schema.json").read_text())) for t in TOPICS}
    tombstones = []
    for record in records:
        if record.value() is None:
            tombstones.append((record.topic(), record.key().decode()))
            continue
        errors = list(validators[record.topic()].iter_errors(json.loads(record.value())))
        assert errors == [], f"{record.topic()}: {errors[0].message}"
    assert tombstones == [(K8S_PODS.name(topic_prefix), uids["train-0"])]
    # read as a consumer does: the schema's defaults apply to fields the compact encoding left out
    train0 = [decode(r.value(), PodState) if r.value() else None for r in records
              if r.topic() == K8S_PODS.name(topic_prefix) and r.key().decode() == uids["train-0"]]
    assert [(v.phase, v.deleted) if v else None for v in train0] == [
        ("Running", False), ("Succeeded", False), ("Succeeded", False), ("Succeeded", True), None]
    deleted_at = [v.deleted_at for v in train0 if v is not None]
    assert deleted_at[1] is None and deleted_at[2] == deleted_at[3] is not None
    event = next(r for r in records if r.topic() == K8S_EVENTS.name(topic_prefix))
    assert event.key().decode() == uids["train-3"]
    service.shutdown(stop)


@pytest.mark.kafka
def test_the_watcher_writes_a_state_mark_covering_what_it_produced(
        kafka_settings: KafkaSettings, topic_prefix: str, server: FakeApiServer, make_service: Factory) -> None:
    """Live stream workers run a node's rules once pod state is complete up to its samples: the state
    mark must name, per pod and node partition, the last record the watcher delivered there, and
    a time no earlier than any change it emitted (schemas/control.py)."""
    populate(server)
    ensure_topics(kafka_settings, (*TOPICS, INTERNAL_CONTROL), topic_prefix)
    delivered = DeliveredOffsets({t.name(topic_prefix) for t in STATE_TOPICS})
    producer = BoundedProducer(kafka_settings, on_delivery_report=delivered)
    service, _, _ = make_service(sink=WatcherKafkaSink(producer, topic_prefix, delivered))
    service.sync(threading.Event())
    service.progress()
    producer.flush(60)
    written = consume_all(kafka_settings, [t.name(topic_prefix) for t in STATE_TOPICS], 6 + 2)
    [mark] = [json.loads(r.value()) for r in consume_all(kafka_settings, [INTERNAL_CONTROL.name(topic_prefix)], 1)]
    last: dict[str, int] = {}
    for record in written:
        key = f"{record.topic()}:{record.partition()}"
        last[key] = max(last.get(key, -1), record.offset())
    assert mark["k"] == "s" and mark["cluster"] == "default"
    assert mark["off"] == last
    latest_change = max(decode(r.value(), PodState).ts for r in written if r.topic() == K8S_PODS.name(topic_prefix))
    assert mark["ts"] >= latest_change.timestamp()
