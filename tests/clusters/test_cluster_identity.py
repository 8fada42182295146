"""Cluster identity piece by piece: the setting, the message field and its compatibility, the
watcher's stamping and keys, the stream jobs' old checkpoints, and the store's upgrade (rows from
before migration 7 read as cluster ``default``, and the key includes the cluster)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from common.settings import AgentSettings, ConfigError, WatcherSettings, load_settings
from producers.watcher.informer import SystemClock
from producers.watcher.service import Pipeline, WatcherConfig, WatcherMemorySink, WatcherMetrics
from schemas import codec
from schemas.examples import all_examples
from schemas.messages import NodeState, scoped_key
from schemas.outputs import PodWindow
from schemas.topics import ALL_TOPICS, K8S_NODES
from sinks import migration_rebuilds, migrations
from sinks.clickhouse import open_store
from stream_jobs.cluster_stage import ClusterStage
from stream_jobs.clusters import ClusterStages
from stream_jobs.config import EngineConfig
from stream_jobs.scoping import stamped

TS = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def test_the_cluster_setting_is_a_dns_label_required_against_a_real_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULENS_CLUSTER", raising=False)
    for settings_type in (AgentSettings, WatcherSettings):
        settings = load_settings(settings_type)
        assert settings.cluster_name(real=False) == "default"
        with pytest.raises(ConfigError, match="GPULENS_CLUSTER is required"):
            settings.cluster_name(real=True)
        monkeypatch.setenv("GPULENS_CLUSTER", "prod-eu-1")
        assert load_settings(settings_type).cluster_name(real=True) == "prod-eu-1"
        for bad in ("Prod", "prod_eu", "-prod", "a" * 64, "prod/eu"):
            monkeypatch.setenv("GPULENS_CLUSTER", bad)
            with pytest.raises(ConfigError, match=r"GPULENS_CLUSTER: .*DNS label"):
                load_settings(settings_type)
        monkeypatch.delenv("GPULENS_CLUSTER")


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.suffix)
def test_a_version_1_message_without_cluster_reads_as_cluster_default(spec) -> None:  # type: ignore[no-untyped-def]
    data = orjson.loads(codec.encode(all_examples()[spec.suffix]))
    del data["cluster"]
    data["schema_version"] = 1
    assert codec.decode(orjson.dumps(data), spec.message).cluster == "default"
    assert codec.decode_plain(orjson.dumps(data), spec.message)["cluster"] == "default"
    with pytest.raises(codec.MessageError, match="cluster"):
        codec.decode(orjson.dumps(data | {"cluster": "Not A Label"}), spec.message)


def test_the_watcher_stamps_its_cluster_and_scopes_its_keys() -> None:
    sink = WatcherMemorySink()
    state = NodeState(node="gpu-a", ts=TS, ready=True)
    for cluster in ("default", "east"):
        pipeline = Pipeline(sink, WatcherConfig(cluster=cluster), SystemClock(), WatcherMetrics())
        pipeline.emit(K8S_NODES, "gpu-a", state)
        pipeline.emit(K8S_NODES, "gpu-a", None)
    assert [(r.key, None if r.message is None else r.message.cluster) for r in sink.records] == [
        ("gpu-a", "default"), ("gpu-a", None), ("east/gpu-a", "east"), ("east/gpu-a", None)]


def test_stage_outputs_carry_their_cluster_and_cluster_scoped_ids() -> None:
    window = all_examples()["pod.windows.v1"]
    assert isinstance(window, PodWindow)
    (same,) = stamped("default", [window])
    assert same is window
    (east,) = stamped("east", [window])
    assert isinstance(east, PodWindow)
    assert (east.cluster, east.window_id) == ("east", scoped_key("east", window.window_id)) == ("east", "east/w-1")
    assert stamped("east", [east]) == [east]  # idempotent


def test_a_cluster_stage_checkpoint_from_before_clusters_restores_as_cluster_default() -> None:
    config = EngineConfig()
    old = ClusterStage(config).to_dict()
    stages = ClusterStages.from_dict(old, config)
    assert list(stages.stages) == ["default"]
    assert ClusterStages.from_dict(stages.to_dict(), config).to_dict() == stages.to_dict()


def test_migration_7_upgrades_existing_rows_to_cluster_default_and_keys_them_by_cluster(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'ch'}")
    try:
        with monkeypatch.context() as before:
            before.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:6])
            migrations.migrate(store)
        store.command("INSERT INTO node_states (node, ts, uid, ready, kafka_partition, kafka_offset) "
                      "VALUES ('gpu-a', '2026-01-05 09:00:00', 'n1', true, 0, 1)")
        assert migrations.migrate(store) == [m.version for m in migrations.MIGRATIONS[6:]]  # 7 and later
        assert migrations.migrate(store) == []
        store.forget_schema()
        store.command("INSERT INTO node_states (cluster, node, ts, uid, ready, kafka_partition, kafka_offset) "
                      "VALUES ('east', 'gpu-a', '2026-01-05 09:00:00', 'n2', true, 0, 2)")
        rows = store.query("SELECT cluster, node, uid FROM node_states FINAL ORDER BY cluster").rows
        assert rows == [["default", "gpu-a", "n1"], ["east", "gpu-a", "n2"]]
        engines = dict(store.query("SELECT name, sorting_key FROM system.tables "
                                   "WHERE database = currentDatabase()").rows)
        for table in migration_rebuilds.CLUSTER_TABLES:
            assert str(engines[table]).startswith("cluster, "), (table, engines[table])
    finally:
        store.close()
