"""The agent produces to the real local broker and a consumer reads valid, keyed samples."""

from __future__ import annotations

import time

import pytest

from common.kafka import ensure_topics, make_consumer
from common.settings import AgentSettings, KafkaSettings, load_settings
from producers.agent.sampler import NodeSampler
from producers.agent.service import AgentKafkaSink, AgentMetrics, AgentService
from producers.agent.simulate import build_simulated_node
from schemas.codec import decode
from schemas.messages import GpuSample
from schemas.topics import GPU_SAMPLES
from tests.agent.test_cli import run_agent

pytestmark = pytest.mark.kafka


def read(kafka: KafkaSettings, topic: str, expected: int, timeout_s: float = 30.0) -> list[tuple[bytes, bytes]]:
    consumer = make_consumer(kafka, group_id=f"agent-test-{topic}")
    consumer.subscribe([topic])
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got.append((msg.key() or b"", msg.value() or b""))
    finally:
        consumer.close()
    return got


def test_agent_service_produces_samples_a_consumer_reads(kafka_settings: KafkaSettings, topic_prefix: str) -> None:
    ensure_topics(kafka_settings, [GPU_SAMPLES], topic_prefix)
    settings = load_settings(AgentSettings, topic_prefix=topic_prefix, kafka=kafka_settings)
    metrics = AgentMetrics()
    with build_simulated_node("kafka-node-1") as node:
        sampler = NodeSampler(node.node_name, node.nvml, node.pod_resources, node.resolver, "boot-k", 1.0)
        service = AgentService(sampler, AgentKafkaSink(settings, metrics), metrics, before_sample=node.advance)
        for _ in range(3):
            assert service.step() is not None
        assert service.sink.close(15.0) == 0
    records = read(kafka_settings, GPU_SAMPLES.name(topic_prefix), 3)
    assert [key for key, _ in records] == [b"kafka-node-1"] * 3
    samples = [decode(value, GpuSample) for _, value in records]
    assert [s.seq for s in samples] == [0, 1, 2]  # one key -> one partition -> in order
    assert all(len(s.gpus) == 12 and s.agent_boot_id == "boot-k" for s in samples)
    assert metrics.registry.registry.get_sample_value("gpulens_agent_samples_produced_total") == 3
    assert metrics.registry.registry.get_sample_value("gpulens_agent_delivery_failures_total") == 0


def test_gpulens_agent_command_produces_to_the_broker(kafka_settings: KafkaSettings, topic_prefix: str) -> None:
    ensure_topics(kafka_settings, [GPU_SAMPLES], topic_prefix)
    result = run_agent("--simulate", "--once", "--node-name", "cli-node", env={
        "GPULENS_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPULENS_TOPIC_PREFIX": topic_prefix,
        "GPULENS_LOG_FORMAT": "text",
    })
    assert result.returncode == 0, result.stderr
    records = read(kafka_settings, GPU_SAMPLES.name(topic_prefix), 1)
    assert len(records) == 1 and records[0][0] == b"cli-node"
    sample = decode(records[0][1], GpuSample)
    assert sample.node == "cli-node" and any(g.assigned_to for g in sample.gpus)
