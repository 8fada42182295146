"""Live mode (``watermark_source=clock``) scaled out: the same inputs, produced at wall pace to two
topic prefixes, go through one ``gpulens worker`` and through a group of two; both write exactly
the pod windows the in-process pipeline computes (so no sample was lost, late or doubled because
two route instances forwarded it)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from common.kafka import BoundedProducer
from common.settings import CommonSettings, KafkaSettings, ProducerSettings, load_settings
from schemas.outputs import PodWindow
from simulation.kafka_replay import KafkaReplay
from simulation.replay import run_in_process
from simulation.scenario import Scenario, parse_scenario
from simulation.simulator import FleetSimulator
from tests.stream_jobs.live import live_ready, pod_windows, start_mid_window

pytestmark = pytest.mark.kafka

LATENESS_S = 10


def _fleet(start: datetime) -> Scenario:
    pods = [
        {"name": "a", "namespace": "ml", "gpus": 2, "create": "0s", "util": 80},
        {"name": "b", "namespace": "ml", "gpus": 4, "create": "0s", "run_for": "20s", "util": 50},
        {"name": "c", "namespace": "ml", "gpus": 1, "create": "6s", "util": [["0s", 60], ["10s", 1]]},
        {"name": "d", "namespace": "ml", "gpus": 3, "create": "10s", "util": 90},
    ]
    return parse_scenario({"name": "live", "start": start.isoformat(), "duration": "30s", "sample_interval": "2s",
                           "window": "10s", "nodes": [{"name": f"n{i}", "gpus": 4} for i in range(3)],
                           "pods": pods})


def test_two_live_workers_write_the_windows_one_writes(kafka_settings: KafkaSettings, topic_prefix: str,
                                                       tmp_path: Path) -> None:
    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump(), data_dir=tmp_path)
    config_only = _fleet(datetime.now(UTC))  # the workers' settings (window, interval) do not depend on the start
    groups = [KafkaReplay(config_only, settings, topic_prefix=f"{topic_prefix}w{n}", workers=n,
                          work_dir=tmp_path / f"w{n}") for n in (1, 2)]
    producer = BoundedProducer(kafka_settings, ProducerSettings(linger_ms=5))
    try:
        for group in groups:
            for worker in group.workers:
                worker.env.update({"GPULENS_WATERMARK_SOURCE": "clock", "GPULENS_CLOCK_INTERVAL_S": "1",
                                   "GPULENS_LATENESS_S": str(LATENESS_S)})
            group.create_topics()
            group.start_workers()
        deadline = time.monotonic() + 180
        while not all(live_ready(group) for group in groups):
            assert time.monotonic() < deadline, "\n".join(w.tail() for g in groups for w in g.workers)
            for group in groups:
                group.supervise(print)
            time.sleep(1)
        scenario = _fleet(start_mid_window(datetime.now(UTC) + timedelta(seconds=2)))
        expected = {w.window_id: w.model_dump() for w in run_in_process(scenario, lateness_s=LATENESS_S).outputs
                    if isinstance(w, PodWindow)}
        for tick in FleetSimulator(scenario).run():  # at wall pace: event time is now
            time.sleep(max(0.0, tick.ts.timestamp() - time.time()))
            for group in groups:
                for record in tick.records:
                    producer.produce(f"{group.prefix}.{record.topic}", key=record.key, value=record.value)
            assert producer.flush(10) == 0
        deadline = time.monotonic() + 120
        while any(len(pod_windows(kafka_settings, g.prefix)) < len(expected) for g in groups):
            assert time.monotonic() < deadline, [len(pod_windows(kafka_settings, g.prefix)) for g in groups]
            time.sleep(2)
        one, two = (pod_windows(kafka_settings, g.prefix) for g in groups)
    finally:
        producer.close(10)
        for group in groups:
            group.close()
    assert len(expected) == 32
    assert one == expected
    assert two == expected
    # the group of two really shared the inputs: each worker routed input partitions
    for worker in groups[1].workers:
        routed = [line for line in worker.log_path.read_text().splitlines()
                  if '"partition position"' in line and "internal." not in line]
        assert routed, f"{worker.log_path.name} routed no input partition"
