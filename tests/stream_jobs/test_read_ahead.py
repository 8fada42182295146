"""Bounded read-ahead on the real broker: every input of a fleet is in Kafka before its first mark
(as when the route lags far behind a backlog), so a node partition could read all of its samples
and park them. With ``read_ahead_bytes`` it stops fetching them instead; the marks, once they come,
resume it, and the report is the in-process one."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.settings import CommonSettings, KafkaSettings, load_settings
from schemas.topics import GPU_SAMPLES
from simulation.kafka_replay import KafkaFleetDriver, KafkaReplay
from simulation.replay import run_in_process
from simulation.scenario import Scenario, parse_scenario
from tests.child_process import free_port

pytestmark = pytest.mark.kafka

READ_AHEAD_BYTES = 64 * 1024


def _fleet(nodes: int, gpus: int, duration: str) -> Scenario:
    return parse_scenario({
        "name": "read-ahead", "start": "2026-01-05T09:00:00Z", "duration": duration, "sample_interval": "10s",
        "thresholds": {"idle_after": "5m"},
        "nodes": [{"name": f"gpu-{i:02d}", "gpus": gpus} for i in range(nodes)],
        "pods": [{"name": f"job-{i}", "gpus": gpus, "node": f"gpu-{i:02d}", "memory_gib": 40,
                  "util": [[0, 90], ["10m", 2 if i % 3 == 0 else 80]]} for i in range(nodes)],
    })


class HeldMarksDriver(KafkaFleetDriver):
    """Writes every record at once but holds the marks back (each with the offsets it had when its
    tick was written) until :meth:`release`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[bytes] = []
        self.releasing = False

    def _produce(self, topic: str, key: str | None, value: bytes | None, partition: int | None = None) -> None:
        if topic == self.control_topic and not self.releasing:
            assert value is not None
            self.held.append(value)
            return
        super()._produce(topic, key, value, partition)

    def release(self) -> None:
        self.releasing = True
        for value in self.held:
            self._produce(self.control_topic, None, value)
        self._flush()


def _metric(port: int, name: str) -> dict[str, float]:
    """The worker's ``/metrics`` series of ``name``: labels text -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {labels or "": float(value) for labels, value in
            re.findall(rf"^gpulens_{name}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)}


def _samples_read(port: int, topic: str) -> float:
    return sum(value for labels, value in _metric(port, "stream_records_in_total").items() if topic in labels)


def _settled(read: Any, timeout_s: float = 30.0) -> float:
    """``read()`` once two readings 2 s apart agree: what faust had fetched before the pauses
    took effect (its stream buffer, a fetch per partition) is handed over by then."""
    deadline = time.monotonic() + timeout_s
    last = read()
    while time.monotonic() < deadline:
        time.sleep(2.0)
        now = read()
        if now == last:
            return float(now)
        last = now
    raise AssertionError(f"samples still being read after {timeout_s:.0f}s of pauses")


def test_samples_stop_being_read_far_ahead_of_the_marks(kafka_settings: KafkaSettings, topic_prefix: str,
                                                        tmp_path: Path) -> None:
    scenario = _fleet(nodes=64, gpus=1, duration="2h")
    expected = run_in_process(scenario).report
    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump(), data_dir=tmp_path)
    replay = KafkaReplay(scenario, settings, topic_prefix=topic_prefix)
    port = free_port()
    replay.worker.env.update({"GPULENS_METRICS_PORT": str(port), "GPULENS_READ_AHEAD_BYTES": str(READ_AHEAD_BYTES)})
    samples_topic = GPU_SAMPLES.name(replay.prefix)
    try:
        replay.create_topics()
        replay.start_workers()
        driver = replay.driver = HeldMarksDriver(replay.kafka, replay.prefix, sample_partitions=replay.node_partitions)
        ticks = replay.ticks()
        total = sum(1 for tick in ticks for record in tick.records if record.topic == GPU_SAMPLES.suffix)
        replay.send(ticks)
        replay.finish()
        assert len(driver.held) == len(ticks) + 1, "every mark is held: nothing releases a sample yet"

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                paused = sum(_metric(port, "stream_read_ahead_pauses_total").values())
            except OSError:
                paused = 0
            if paused >= replay.node_partitions:
                break
            time.sleep(0.5)
        assert paused >= replay.node_partitions, "every node partition paused its samples"
        read = _settled(lambda: _samples_read(port, samples_topic))
        time.sleep(5.0)
        assert _samples_read(port, samples_topic) == read, "no sample is read while paused"
        assert read < total / 2, f"{read:.0f} of {total} samples read ahead of the marks"
        parked = _metric(port, "stream_read_ahead_bytes")
        assert len(parked) == replay.node_partitions
        assert all(value > READ_AHEAD_BYTES for value in parked.values()), parked

        driver.release()
        done = replay.wait_done(timeout_s=300)
        report = replay.report(replay.read_outputs(done))
        assert _samples_read(port, samples_topic) == total
    finally:
        replay.close()
    assert orjson.dumps(report, option=orjson.OPT_INDENT_2) == orjson.dumps(expected, option=orjson.OPT_INDENT_2)
    assert any(alert["type"] == "idle_gpu" for alert in report["alerts"]), "the fleet's idle jobs are seen"
