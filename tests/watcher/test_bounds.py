"""No object hides itself by its size (issue 49, finding 6) and no quantity leaves the contract.

A pod with ~9,000 long labels (1.15 MB of them) used to make a state the codec refused inside
``WatcherKafkaSink.emit``: the informer logged "handler failed" and the pod was never published.
Now it is published trimmed: labels cut to a budget with the keys gpulens reads kept,
``truncated`` set, counted and logged once. The same holds for a node's labels, an event's text,
and a pod whose fields are each within their bounds but together too large. ``100E`` GPUs (10^20)
is clamped to the contract's GPU bound: the pod is still published, as the pending pod it is.

Run against the simulated API server through the real ``kubernetes`` client (the watcher's usual
harness), with the Kafka sink's own encoding, and once through the real broker.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from common.kafka import BoundedProducer, ensure_topics
from common.settings import KafkaSettings
from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.fake_cluster import make_event, make_node, make_pod, make_workload, set_running
from producers.watcher.kube_json import parse_quantity
from producers.watcher.service import WatcherConfig, WatcherKafkaSink, WatcherService
from producers.watcher.translate import pod_to_state
from producers.watcher.workloads import workload_to_state
from schemas import messages
from schemas.codec import MAX_MESSAGE_BYTES, decode
from schemas.messages import K8sEvent, NodeState, PodState
from schemas.topics import K8S_EVENTS, K8S_NODES, K8S_PODS
from tests.watcher.conftest import Factory
from tests.watcher.test_kafka import consume_all

# the contract's bounds (read so, this file also runs against a tree without them, where it must fail)
INT64_MAX = 2**63 - 1
MAX_GPU_COUNT: int = getattr(messages, "MAX_GPU_COUNT", 2**24)
MAX_LABELS: int = getattr(messages, "MAX_LABELS", 256)
TS = datetime(2024, 5, 6, 8, tzinfo=UTC)
GANG_KEY = "scheduling.x-k8s.io/pod-group"


class RecordingProducer:
    """Stands in for :class:`BoundedProducer`: keeps what the Kafka sink encoded."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, bytes | None]] = []

    def produce(self, topic: str, key: str, value: bytes | None, *args: Any, **kwargs: Any) -> bool:
        self.records.append((topic, key, value))
        return True

    def of(self, topic: str) -> list[tuple[str, bytes | None]]:
        return [(key, value) for t, key, value in self.records if t == topic]


def many_labels(count: int = 9000) -> dict[str, str]:
    """``count`` labels as long as Kubernetes allows (key ~60, value 63 characters): ~1.15 MB."""
    return {f"tenant.example.com/annotation-number-{i:05d}-{'k' * 16}": f"{i:05d}-" + "v" * 57 for i in range(count)}


def hiding_pod(gpus: str = "2") -> dict[str, Any]:
    labels = many_labels() | {"team": "vision", "project": "detector", GANG_KEY: "g7", "pod-template-hash": "abc"}
    pod = make_pod("hide-0", namespace="vision", gpus=1, labels=labels)
    set_gpus(pod, gpus)
    return pod


def set_gpus(pod: dict[str, Any], gpus: str) -> None:
    resources = pod["spec"]["containers"][0]["resources"]
    resources["limits"]["nvidia.com/gpu"] = resources["requests"]["nvidia.com/gpu"] = gpus


def trimmed(service: WatcherService, topic: str, what: str) -> float:
    return service.metrics.registry.registry.get_sample_value(
        "gpulens_watcher_trimmed_total", {"topic": topic, "what": what}) or 0.0


def test_a_pod_with_9000_long_labels_is_published_trimmed(
        server: FakeApiServer, make_service: Factory, caplog: pytest.LogCaptureFixture) -> None:
    pod = hiding_pod()
    assert sum(len(k) + len(v) for k, v in pod["metadata"]["labels"].items()) > MAX_MESSAGE_BYTES
    uid = server.put("pods", pod)["metadata"]["uid"]
    producer = RecordingProducer()
    service, _, _ = make_service(sink=WatcherKafkaSink(producer, "t"))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        assert service.sync(threading.Event())
        server.patch("pods", "vision/hide-0", lambda p: set_running(p, "gpu-0", TS))
        service.pod_informers[0].watch_once()

    records = producer.of(K8S_PODS.name("t"))
    assert [key for key, _ in records] == [uid, uid]  # pending, then running: every change published
    for _, value in records:
        assert value is not None and len(value) <= MAX_MESSAGE_BYTES
        state = decode(value, PodState)
        assert state.truncated
        assert (state.team, state.project, state.gang_id) == ("vision", "detector", "vision/g7")
        assert {k: state.labels[k] for k in ("team", "project", GANG_KEY, "pod-template-hash")} == {
            "team": "vision", "project": "detector", GANG_KEY: "g7", "pod-template-hash": "abc"}
        assert 4 < len(state.labels) <= MAX_LABELS
        others = [k for k in state.labels if k.startswith("tenant.example.com/")]
        tenant_keys = sorted(k for k in pod["metadata"]["labels"] if k.startswith("tenant.example.com/"))
        assert others == tenant_keys[:len(others)]  # then the others in key order
        assert state.gpu_requests == {"nvidia.com/gpu": 2}
    assert decode(records[-1][1], PodState).phase == "Running"
    assert trimmed(service, "k8s.pods.v1", "labels") == 2
    assert "handler failed" not in caplog.text
    warnings = [r for r in caplog.records if r.getMessage() == "published trimmed to the message bounds"]
    assert len(warnings) == 1  # once per pod (and set of cuts), not per change


def test_100e_gpus_is_clamped_and_the_pod_still_published(server: FakeApiServer, make_service: Factory) -> None:
    assert parse_quantity("100E") <= INT64_MAX
    assert parse_quantity("100Ei") <= INT64_MAX
    assert parse_quantity(10**30) <= INT64_MAX
    assert parse_quantity("\u0661\u0662") == 0  # Arabic-Indic digits are no Kubernetes quantity
    pod = make_pod("greedy-0", namespace="ml", gpus=1)
    set_gpus(pod, "100E")
    uid = server.put("pods", pod)["metadata"]["uid"]
    producer = RecordingProducer()
    service, _, _ = make_service(sink=WatcherKafkaSink(producer, "t"))  # type: ignore[arg-type]
    assert service.sync(threading.Event())
    [(key, value)] = producer.of(K8S_PODS.name("t"))
    assert key == uid and value is not None
    state = decode(value, PodState)
    assert state.gpu_requests == {"nvidia.com/gpu": MAX_GPU_COUNT}
    assert state.truncated and state.phase == "Pending"
    assert trimmed(service, "k8s.pods.v1", "quantity") == 1


def test_a_workload_asking_too_much_is_clamped() -> None:
    workload = make_workload("huge", count=1_000_000, gpus=1)
    workload["metadata"]["uid"] = str(uuid.uuid4())
    workload["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] = "100E"
    state = workload_to_state(workload, TS)
    assert state is not None and state.truncated
    assert state.gpu_requests == {"nvidia.com/gpu": MAX_GPU_COUNT}
    assert state.pod_sets[0].gpu_requests_per_pod == {"nvidia.com/gpu": MAX_GPU_COUNT}


def test_nodes_and_events_are_published_trimmed_too(server: FakeApiServer, make_service: Factory) -> None:
    node = make_node("gpu-9", gpus=8)
    node["metadata"]["labels"] |= many_labels()
    server.put("nodes", node)
    pod = make_pod("train-0", namespace="ml", gpus=1)
    server.put("pods", pod)
    huge = "0/3 nodes are available: " + "x" * 1_200_000
    server.put("events", make_event(pod, "FailedScheduling", huge, TS))
    producer = RecordingProducer()
    service, _, _ = make_service(sink=WatcherKafkaSink(producer, "t"))  # type: ignore[arg-type]
    assert service.sync(threading.Event())

    [(_, node_value)] = producer.of(K8S_NODES.name("t"))
    assert node_value is not None and len(node_value) <= MAX_MESSAGE_BYTES
    node_state = decode(node_value, NodeState)
    assert node_state.truncated and node_state.gpu_capacity == {"nvidia.com/gpu": 8}
    assert node_state.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"  # GPU facts kept first
    [(_, event_value)] = producer.of(K8S_EVENTS.name("t"))
    assert event_value is not None and len(event_value) <= MAX_MESSAGE_BYTES
    event = decode(event_value, K8sEvent)
    assert event.truncated and event.category == "scheduling_failed" and event.message.startswith("0/3 nodes")
    assert trimmed(service, "k8s.nodes.v1", "labels") == 1
    assert trimmed(service, "k8s.events.v1", "text") == 1


def test_fields_within_their_bounds_but_too_many_together_are_shrunk(
        server: FakeApiServer, make_service: Factory) -> None:
    pod = make_pod("wide-0", namespace="ml", gpus=1, labels={"team": "ml"})
    pod["status"]["conditions"] = [{"type": f"example.com/c{i}", "status": "False", "reason": "R" * 4000,
                                    "message": "M" * 4000} for i in range(300)]
    server.put("pods", pod)
    state = pod_to_state(pod, TS, WatcherConfig().translate)
    assert state is not None and state.truncated and len(state.conditions) == 256  # each list at its cap
    producer = RecordingProducer()
    service, _, _ = make_service(sink=WatcherKafkaSink(producer, "t"))  # type: ignore[arg-type]
    assert service.sync(threading.Event())
    [(_, value)] = producer.of(K8S_PODS.name("t"))
    assert value is not None and len(value) <= MAX_MESSAGE_BYTES
    published = decode(value, PodState)
    assert published.truncated and published.team == "ml" and published.labels == {"team": "ml"}
    assert 0 < len(published.conditions) < 256
    assert trimmed(service, "k8s.pods.v1", "size") == 1


@pytest.mark.kafka
def test_the_trimmed_pod_reaches_the_broker(
        kafka_settings: KafkaSettings, topic_prefix: str, server: FakeApiServer, make_service: Factory) -> None:
    pod = hiding_pod(gpus="100E")
    pod["metadata"]["uid"] = str(uuid.uuid4())
    uid = server.put("pods", pod)["metadata"]["uid"]
    ensure_topics(kafka_settings, (K8S_PODS,), topic_prefix)
    producer = BoundedProducer(kafka_settings)
    service, _, _ = make_service(sink=WatcherKafkaSink(producer, topic_prefix))
    assert service.sync(threading.Event())
    assert producer.flush(60) == 0 and producer.stats.failed == 0, producer.stats
    [record] = consume_all(kafka_settings, [K8S_PODS.name(topic_prefix)], 1)
    assert record.key().decode() == uid
    state = decode(record.value(), PodState)
    assert state.truncated and state.labels["team"] == "vision"
    assert state.gpu_requests == {"nvidia.com/gpu": MAX_GPU_COUNT}
