"""A starting ``gpulens worker``, ``gpulens sink`` or ``gpulens watch`` waits for the Kafka broker
with backoff (a broker restart or a service started first must not kill it), then, past
``broker_wait_s``, exits 2 naming the broker. A worker exits 2 as well, naming the setting, when
the samples topic's partitions do not match its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.kafka import ensure_topics
from common.settings import KafkaSettings
from schemas.topics import GPU_SAMPLES


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("service", [["worker"], ["sink"], ["watch", "--simulate"]])
def test_a_service_retries_the_broker_with_backoff_then_exits_2(tmp_path: Path, service: list[str]) -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env |= {"GPULENS_KAFKA__BOOTSTRAP_SERVERS": bootstrap, "GPULENS_BROKER_WAIT_S": "8",
            "GPULENS_DATA_DIR": str(tmp_path), "GPULENS_LOG_FORMAT": "json"}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "gpulens", *service], env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert output.count("waiting for the Kafka broker") >= 2, output
    assert f"no Kafka broker at {bootstrap}" in output.splitlines()[-1]
    assert elapsed >= 8, "it gave up before broker_wait_s"


@pytest.mark.kafka
def test_worker_refuses_samples_with_another_partition_count_than_its_node_inputs(
        tmp_path: Path, kafka_settings: KafkaSettings, topic_prefix: str) -> None:
    """A node stage reads partition p of gpu.samples.v1 and of node-inputs together: with other
    counts a node's samples and its pod states would be on different partitions."""
    ensure_topics(kafka_settings, [GPU_SAMPLES], topic_prefix)  # 12 partitions, as `gpulens topics create` makes it
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env |= {"GPULENS_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers, "GPULENS_TOPIC_PREFIX": topic_prefix,
            "GPULENS_NODE_INPUT_PARTITIONS": "4", "GPULENS_DATA_DIR": str(tmp_path), "GPULENS_LOG_FORMAT": "json"}
    result = subprocess.run([sys.executable, "-m", "gpulens", "worker"], env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    last = output.strip().splitlines()[-1]
    assert "GPULENS_NODE_INPUT_PARTITIONS (4)" in last and f"{topic_prefix}.gpu.samples.v1 (partitions 12" in last
