"""Event time per node in live mode: a node's rules run as soon as its own samples and the pod state
(the watcher's state marks, ``schemas.control``) are both there, not a whole allowed lateness later,
and never on pod state older than its samples.

The unit tests pin the rule (``node_watermark``); the broker test plays a fleet at wall pace into a
live worker with the default lateness (30 s) and clock interval, writing a state mark after each
tick as the watcher does, except while one pod's records are held back for a few seconds: the
worker must write exactly the in-process pod windows (the held-back pod's first samples are
attributed to it, so its node waited for its state) and the idle alert must reach its topic within
a few seconds of the sample that completes it, where waiting out the lateness takes 30 s."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.kafka import read_to_end
from common.settings import CommonSettings, KafkaSettings, load_settings
from schemas.codec import decode, encode
from schemas.control import state_mark_value
from schemas.examples import all_examples
from schemas.outputs import Alert, PodWindow
from schemas.topics import ALERTS, K8S_PODS
from simulation.kafka_replay import KafkaFleetDriver, KafkaReplay
from simulation.replay import run_in_process
from simulation.scenario import Scenario, parse_scenario
from simulation.simulator import FleetSimulator
from stream_jobs.route_agent import RouteAgent, RouteTopics
from stream_jobs.watermark import Mark, decode_envelope, node_watermark
from tests.stream_jobs.fakes import Committed, Event, Offsets, Stream, Topic, fake_delivery
from tests.stream_jobs.live import live_ready, pod_windows, start_mid_window

PODS = "p.k8s.pods.v1"
CONTROL = "p.internal.control.v1"

LATENESS_S = 30.0  # the worker's default


def test_a_node_waits_for_the_allowed_lateness_without_state_marks() -> None:
    assert node_watermark(70.0, 100.0, sample_ts=99.0, state_ts=None) == 70.0
    assert node_watermark(70.0, 100.0, sample_ts=None, state_ts=99.0) == 70.0


def test_a_node_runs_as_far_as_its_own_samples_and_the_pod_state() -> None:
    assert node_watermark(70.0, 100.0, sample_ts=98.0, state_ts=99.5) == 98.0
    assert node_watermark(70.0, 100.0, sample_ts=98.0, state_ts=95.0) == 95.0  # pod state lags: wait for it


def test_a_node_never_runs_past_the_clock_nor_falls_behind_the_lateness() -> None:
    assert node_watermark(70.0, 100.0, sample_ts=400.0, state_ts=400.0) == 100.0  # a sample dated ahead
    assert node_watermark(70.0, 100.0, sample_ts=10.0, state_ts=99.0) == 70.0  # a silent node


def test_the_route_holds_a_state_mark_until_its_pod_records_are_forwarded_and_sends_it_to_node_stages_only(
) -> None:
    sent: list[tuple[str, int | None, bytes]] = []
    topics = RouteTopics(input_names={PODS: "k8s.pods.v1"}, control_name=CONTROL, node_topic=Topic("node", sent),
                         cluster_topic=Topic("cluster", sent), control_topic=Topic("control", sent),
                         node_partitions=2, node_partition=lambda key: 1)
    route = RouteAgent(fake_delivery(Offsets()), topics, Committed())
    state = state_mark_value(7, 100.0, "default", {f"{PODS}:0": 0})
    stream = Stream([Event(CONTROL, 0, 0, state), Event(PODS, 0, 0, encode(all_examples()["k8s.pods.v1"]))])

    async def play() -> None:
        await route.run(stream)  # the state mark arrives first: held, its pod record is not consumed yet
        assert not sent
        await route.refresh_and_release()

    asyncio.run(play())
    kinds = [(name, partition, orjson.loads(value)["k"]) for name, partition, value in sent]
    assert kinds == [("node", 1, "r"), ("cluster", None, "r"), ("node", 0, "s"), ("node", 1, "s")]
    assert decode_envelope(sent[-1][2]) == Mark(7, 100.0, {f"{PODS}:0": 0}, state=True,
                                                                cluster="default")


def _fleet(start: datetime) -> Scenario:
    pods = [
        {"name": "a", "namespace": "ml", "gpus": 2, "create": "0s", "util": 80},
        {"name": "b", "namespace": "ml", "gpus": 4, "create": "0s", "run_for": "20s", "util": 50},
        {"name": "c", "namespace": "ml", "gpus": 1, "create": "6s", "util": [["0s", 60], ["8s", 1]]},
        {"name": "d", "namespace": "ml", "gpus": 3, "create": "10s", "util": 90},
    ]
    return parse_scenario({"name": "live-per-node", "start": start.isoformat(), "duration": "30s",
                           "sample_interval": "2s", "window": "10s", "thresholds": {"idle_after": "6s"},
                           "nodes": [{"name": f"n{i}", "gpus": 4} for i in range(3)], "pods": pods})


def _is_pod(record: Any, name: str) -> bool:
    return record.topic == K8S_PODS.suffix and record.value is not None and orjson.loads(record.value)["name"] == name


@pytest.mark.kafka
def test_live_alerts_come_in_seconds_and_pod_state_is_waited_for(kafka_settings: KafkaSettings, topic_prefix: str,
                                                                  tmp_path: Path) -> None:
    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump(), data_dir=tmp_path)
    replay = KafkaReplay(_fleet(datetime.now(UTC)), settings, lateness_s=LATENESS_S, topic_prefix=topic_prefix,
                         work_dir=tmp_path / "live")
    driver = KafkaFleetDriver(kafka_settings, replay.prefix)
    produced_at: dict[float, float] = {}
    try:
        replay.worker.env.update({"GPULENS_WATERMARK_SOURCE": "clock"})
        replay.create_topics()
        replay.start_workers()
        deadline = time.monotonic() + 180
        while not live_ready(replay):
            assert time.monotonic() < deadline, replay.worker.tail()
            replay.supervise(print)
            time.sleep(1)
        scenario = _fleet(start_mid_window(datetime.now(UTC) + timedelta(seconds=2)))
        expected = {w.window_id: w.model_dump() for w in run_in_process(scenario, lateness_s=LATENESS_S).outputs
                    if isinstance(w, PodWindow)}
        held: list[Any] = []
        for tick in FleetSimulator(scenario).run():  # at wall pace: event time is now
            time.sleep(max(0.0, tick.ts.timestamp() - time.time()))
            holding = 10 <= tick.offset_s < 14  # pod d's state reaches Kafka 4 s late
            held += [r for r in tick.records if holding and _is_pod(r, "d")]
            driver.send_records([r for r in tick.records if not (holding and _is_pod(r, "d"))])
            produced_at[tick.ts.timestamp()] = time.time()
            if not holding:
                driver.send_records(held)
                held = []
                driver.state_mark(tick.ts + timedelta(milliseconds=1))
        deadline = time.monotonic() + 120
        while len(windows := pod_windows(kafka_settings, replay.prefix)) < len(expected):
            assert time.monotonic() < deadline, (len(windows), len(expected), replay.worker.tail())
            time.sleep(2)
        alerts = [(decode(r.value, Alert), r.timestamp_ms)
                  for r in read_to_end(kafka_settings, ALERTS.name(replay.prefix))]
    finally:
        driver.close()
        replay.close()
    assert windows == expected
    idle = [(alert, at_ms) for alert, at_ms in alerts if alert.type == "idle_gpu" and alert.state == "firing"]
    assert idle, [a.type for a, _ in alerts]
    for alert, at_ms in idle:
        assert at_ms is not None
        latency_s = at_ms / 1000 - produced_at[alert.at.timestamp()]
        assert latency_s < 5.0, f"{alert.subject} fired {latency_s:.1f}s after its sample (lateness {LATENESS_S}s)"
