"""Two clusters through one Kafka and one ClickHouse: every figure per cluster equals the
single-cluster replay of that cluster.

The two clusters run the same fleet layout (the same node names, pod names and so pod uids: the
simulator derives uids from the scenario's name) with different workloads, so anything keyed by
node or pod alone would mix them. Each cluster's figures are compared with a replay of that
cluster alone: the in-process pipeline, the faust worker on the broker, and the ClickHouse report
(``gpulens report --cluster``) over one store holding both.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from common.metrics import MetricsRegistry
from common.settings import CommonSettings, KafkaSettings, load_settings
from gpulens.cli import main
from reports.analyses import ClusterError, run_report
from schemas.codec import encode
from schemas.messages import Message, scoped_key
from schemas.outputs import Alert, ClusterCapacity, PodLifecycle, PodWindow
from schemas.topics import ALERTS, CLUSTER_CAPACITY, POD_LIFECYCLE, POD_WINDOWS, by_suffix
from simulation.fleet_state import Tick
from simulation.kafka_replay import KafkaReplay
from simulation.replay import build_report, engine_config, feed_tick, run_in_process
from simulation.scenario import Scenario, ScenarioError, parse_scenario
from simulation.simulator import FleetSimulator
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from sinks.service import load_prices
from stream_jobs.pipeline import LocalPipeline
from stream_jobs.timeutil import epoch
from tests.conftest import REPO_ROOT

FLEET = REPO_ROOT / "tests" / "report" / "scenarios" / "report-fleet.yaml"
PREFIX = "gpulens"
STREAM_STATS = ("deadletters", "late_samples_dropped", "sample_gaps")
"""Counters of the whole stream (one worker serves both clusters): compared as sums."""


def _scenarios() -> dict[str, Scenario]:
    east = yaml.safe_load(FLEET.read_text())
    west = copy.deepcopy(east)
    east["cluster"], west["cluster"] = "east", "west"
    for pod in west["pods"]:  # the same names, other work: idle where east computes, later, shorter
        pod["util"] = 3 if pod["name"] in ("llm-pretrain", "asr-finetune") else pod.get("util", 50)
        if pod["name"] == "llm-eval":
            pod["run_for"] = "20m"
    west["pods"] = [pod for pod in west["pods"] if pod["name"] != "tts-serve"]
    return {name: parse_scenario(data, str(FLEET), "report-fleet") for name, data in (("east", east), ("west", west))}


def _merged_ticks(scenarios: dict[str, Scenario]) -> list[Tick]:
    """Both clusters' records per instant, as their agents and watchers would produce them."""
    runs = [list(FleetSimulator(scenarios[name]).run()) for name in sorted(scenarios)]
    assert len({len(ticks) for ticks in runs}) == 1
    return [Tick(ticks[0].offset_s, ticks[0].ts, [r for tick in ticks for r in tick.records])
            for ticks in zip(*runs, strict=True)]


def _per_cluster(scenario: Scenario, outputs: list[Message], stream: dict[str, Any]) -> dict[str, Any]:
    mine = [m for m in outputs if m.cluster == scenario.cluster]
    stats = {k: v for k, v in stream.items() if k in STREAM_STATS}
    return build_report(scenario, mine, FleetSimulator(scenario).pod_uids(), stats)


def _without_stream_stats(report: dict[str, Any]) -> dict[str, Any]:
    return report | {"stream": {k: v for k, v in report["stream"].items() if k not in STREAM_STATS}}


def _json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str)


def test_the_two_clusters_collide_on_names_and_differ_in_figures() -> None:
    east, west = _scenarios().values()
    assert {n.name for n in east.nodes} == {n.name for n in west.nodes}
    west_uids = set(FleetSimulator(west).pod_uids().values())
    assert west_uids and west_uids <= set(FleetSimulator(east).pod_uids().values())
    assert run_in_process(east).report["cluster"] != run_in_process(west).report["cluster"]


def test_a_scenario_names_its_cluster_as_a_dns_label() -> None:
    data = yaml.safe_load(FLEET.read_text())
    assert parse_scenario(data).cluster == "default"
    with pytest.raises(ScenarioError, match="cluster"):
        parse_scenario(data | {"cluster": "Prod_EU"})


def test_in_process_each_cluster_gets_its_single_cluster_figures() -> None:
    scenarios = _scenarios()
    pipeline = LocalPipeline(engine_config(scenarios["east"]))
    for tick in _merged_ticks(scenarios):
        feed_tick(pipeline, tick)
        pipeline.advance(epoch(tick.ts) - 30.0)
    pipeline.flush(epoch(scenarios["east"].start) + scenarios["east"].end_offset_s)
    for scenario in scenarios.values():
        alone = run_in_process(scenario)
        assert _json(_per_cluster(scenario, pipeline.outputs, alone.report["stream"])) == _json(alone.report)
        assert {m.cluster for m in alone.outputs} == {scenario.cluster}


@pytest.mark.kafka
def test_two_clusters_through_one_kafka_and_one_clickhouse_match_their_single_cluster_replays(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> None:
    scenarios = _scenarios()
    alone = {name: run_in_process(scenario) for name, scenario in scenarios.items()}
    ticks = _merged_ticks(scenarios)

    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump(), data_dir=tmp_path)
    replay = KafkaReplay(scenarios["east"], settings, topic_prefix=topic_prefix, work_dir=tmp_path / "replay")
    try:
        replay.create_topics()
        replay.start_workers()
        replay.send(ticks)
        replay.finish()
        done = replay.wait_done(timeout_s=600)
        outputs = replay.read_outputs(done)
    finally:
        replay.close()
    for name, scenario in scenarios.items():
        got = _per_cluster(scenario, outputs.outputs, alone[name].report["stream"])
        assert _json(_without_stream_stats(got)) == _json(_without_stream_stats(alone[name].report)), name
    for stat in ("late_samples_dropped", "sample_gaps"):
        assert int(done.get(stat, 0)) == sum(int(r.report["stream"][stat]) for r in alone.values())

    both = f"chdb://{tmp_path / 'both'}"
    _store(both, ticks, outputs.outputs, scenarios["east"])
    for name, scenario in scenarios.items():
        single = f"chdb://{tmp_path / name}"
        _store(single, list(FleetSimulator(scenario).run()), alone[name].outputs, scenario)
        expected = _report(single, None)
        assert expected["summary"][0]["pods"] > 0
        assert _json(_report(both, name)) == _json(expected), name
    with pytest.raises(ClusterError, match="east, west"):
        _report(both, None)
    html = tmp_path / "west.html"
    assert main(["report", "--cluster", "west", "--html", str(html), "--clickhouse-url", both,
                 "--data-dir", str(tmp_path)]) == 0
    assert "cluster west" in html.read_text()
    assert main(["report", "--clickhouse-url", both, "--data-dir", str(tmp_path)]) == 2


def _report(url: str, cluster: str | None) -> dict[str, Any]:
    store = open_store(url, read_only=True)
    try:
        return run_report(store, None, None, cluster)
    finally:
        store.close()


def _output_topic(message: Message) -> tuple[str, str]:
    if isinstance(message, PodWindow):
        return POD_WINDOWS.name(PREFIX), scoped_key(message.cluster, message.pod_uid)
    if isinstance(message, ClusterCapacity):
        return CLUSTER_CAPACITY.name(PREFIX), scoped_key(message.cluster, "cluster")
    if isinstance(message, PodLifecycle):
        return POD_LIFECYCLE.name(PREFIX), scoped_key(message.cluster, message.pod_uid)
    if isinstance(message, Alert):
        return ALERTS.name(PREFIX), message.id
    raise TypeError(type(message).__name__)


def _store(url: str, ticks: list[Tick], outputs: list[Message], scenario: Scenario) -> None:
    """Inputs and outputs into ``url`` through the sink's write path (as ``gpulens sink`` does)."""
    by_topic: dict[str, list[tuple[str | None, bytes | None]]] = {}
    for tick in ticks:
        for r in tick.records:
            by_topic.setdefault(by_suffix(r.topic).name(PREFIX), []).append((r.key, r.value))
    for message in outputs:
        topic, key = _output_topic(message)
        by_topic.setdefault(topic, []).append((key, encode(message)))
    ttl = TtlDays.keeping(scenario.start)
    store = open_store(url)
    try:
        migrate(store, ttl)
        store.forget_schema()
        load_prices(store, scenario.prices)
        writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, ttl)
        for topic in sorted(by_topic):
            records = [ConsumedRecord(topic, 0, offset, None if key is None else key.encode(), value)
                       for offset, (key, value) in enumerate(by_topic[topic])]
            _outcome, rejected = writer.write(Batch(topic, 0, records, 0, len(records) - 1))
            assert not rejected, rejected[:3]
    finally:
        store.close()
