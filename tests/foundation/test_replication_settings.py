"""The replicated local Kafka and topic replication, without a broker: the settings and their
errors (``GPULENS_LOCAL_KAFKA__BROKERS``, the port layout, ``GPULENS_TOPICS__*``), the nodes' layout
and configs ``gpulens kafka up --brokers 3`` writes, and what ``gpulens check`` expects of a
topic's replicas on clusters of each size."""

from __future__ import annotations

import re
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource
from pytest import MonkeyPatch

import common.kafka as kafka_module
from common.errors import UserError
from common.settings import CommonSettings, ConfigError, TopicSettings, load_settings
from gpulens.check.core import State
from gpulens.check.kafka_checks import _replication
from gpulens.cli import main
from gpulens.kafka_local import LocalKafka


def _load(monkeypatch: pytest.MonkeyPatch, **env: str) -> CommonSettings:
    for name, value in env.items():
        monkeypatch.setenv(f"GPULENS_{name}", value)
    return load_settings(CommonSettings)


def test_the_cluster_size_is_1_or_3(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load(monkeypatch).local_kafka.brokers == 1
    assert _load(monkeypatch, LOCAL_KAFKA__BROKERS="3").local_kafka.brokers == 3
    with pytest.raises(ConfigError, match=r"GPULENS_LOCAL_KAFKA__BROKERS: .*expected 1 .* or 3 .*\(got '2'\)"):
        _load(monkeypatch, LOCAL_KAFKA__BROKERS="2")


def test_the_nodes_ports_must_not_clash(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = _load(monkeypatch, LOCAL_KAFKA__BROKERS="3", LOCAL_KAFKA__PORT="19230",
                   LOCAL_KAFKA__CONTROLLER_PORT="19231").local_kafka
    assert (layout.port, layout.controller_port) == (19230, 19231)
    # one broker may have its controller two ports up; three may not (node 2's client port)
    assert _load(monkeypatch, LOCAL_KAFKA__BROKERS="1", LOCAL_KAFKA__PORT="9092",
                 LOCAL_KAFKA__CONTROLLER_PORT="9094").local_kafka
    with pytest.raises(ConfigError, match=r"GPULENS_LOCAL_KAFKA__CONTROLLER_PORT: .*9092, 9094, 9096.*distinct"):
        _load(monkeypatch, LOCAL_KAFKA__BROKERS="3", LOCAL_KAFKA__PORT="9092", LOCAL_KAFKA__CONTROLLER_PORT="9094")
    with pytest.raises(ConfigError, match="up to 65535"):
        _load(monkeypatch, LOCAL_KAFKA__BROKERS="3", LOCAL_KAFKA__PORT="65532", LOCAL_KAFKA__CONTROLLER_PORT="65533")


def test_the_cli_flag_overrides_the_setting_and_is_validated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPULENS_LOCAL_KAFKA__BROKERS", "3")
    assert main(["kafka", "status", "--brokers", "1", "--port", "29300", "--controller-port", "29301",
                 "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "Kafka: not running"
    assert main(["kafka", "status", "--port", "29300", "--controller-port", "29301", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Kafka 3.9.1 (3 brokers) on 127.0.0.1:29300,127.0.0.1:29302,127.0.0.1:29304" in out
    assert out.count("not running") == 3
    assert main(["kafka", "up", "--brokers", "2", "--data-dir", str(tmp_path)]) == 2
    assert "GPULENS_LOCAL_KAFKA__BROKERS" in capsys.readouterr().err


def test_replication_resolves_per_cluster_size(monkeypatch: pytest.MonkeyPatch) -> None:
    auto = _load(monkeypatch).topics
    assert [auto.resolve(n) for n in (1, 2, 3, 5)] == [(1, None), (2, 2), (3, 2), (3, 2)]
    fixed = TopicSettings(replication_factor=2, min_insync_replicas=1)
    assert [fixed.resolve(n) for n in (1, 3)] == [(2, 1), (2, 1)]
    three = _load(monkeypatch, TOPICS__REPLICATION_FACTOR="3", TOPICS__MIN_INSYNC_REPLICAS="3").topics
    assert three.resolve(3) == (3, 3)
    assert TopicSettings(min_insync_replicas=3).resolve(2) == (2, 2), "auto never asks more than its replicas"


@pytest.mark.parametrize(("env", "message"), [
    ({"TOPICS__REPLICATION_FACTOR": "zero"}, "GPULENS_TOPICS__REPLICATION_FACTOR: .*auto or a number .* 1 to 16"),
    ({"TOPICS__REPLICATION_FACTOR": "17"}, "GPULENS_TOPICS__REPLICATION_FACTOR: .*1 to 16"),
    ({"TOPICS__MIN_INSYNC_REPLICAS": "0"}, "GPULENS_TOPICS__MIN_INSYNC_REPLICAS: "),
    ({"TOPICS__REPLICATION_FACTOR": "2", "TOPICS__MIN_INSYNC_REPLICAS": "3"},
     r"GPULENS_TOPICS__MIN_INSYNC_REPLICAS: .*at most GPULENS_TOPICS__REPLICATION_FACTOR \(2\)"),
])
def test_bad_replication_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(monkeypatch, **env)


def test_three_nodes_one_quorum_and_replicated_internal_topics(tmp_path: Path) -> None:
    cluster = LocalKafka(home=tmp_path / "kafka", cache=tmp_path / "cache", port=29400, controller_port=29401,
                         brokers=3)
    assert cluster.bootstrap == "127.0.0.1:29400,127.0.0.1:29402,127.0.0.1:29404"
    assert [(n.node_id, n.home.name, n.port, n.controller_port) for n in cluster.nodes] == [
        (1, "node-1", 29400, 29401), (2, "node-2", 29402, 29403), (3, "node-3", 29404, 29405)]
    for node in cluster.nodes:
        cluster._write_config(node)
        config = dict(line.split("=", 1) for line in (node.home / "server.properties").read_text().splitlines()
                      if "=" in line and not line.startswith("listener.name"))
        assert config["node.id"] == str(node.node_id)
        assert config["controller.quorum.voters"] == "1@127.0.0.1:29401,2@127.0.0.1:29403,3@127.0.0.1:29405"
        assert config["listeners"] == f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
        assert config["log.dirs"] == str(node.home / "data")
        assert (config["offsets.topic.replication.factor"], config["transaction.state.log.replication.factor"],
                config["default.replication.factor"], config["min.insync.replicas"]) == ("3", "3", "3", "2")
    assert cluster._cluster_id() == cluster._cluster_id(), "every node is formatted with one cluster id"

    single = LocalKafka(home=tmp_path / "kafka", cache=tmp_path / "cache", port=29400, controller_port=29401)
    assert single.bootstrap == "127.0.0.1:29400" and single.nodes[0].home == tmp_path / "kafka"
    assert single.pid_file == tmp_path / "kafka" / "kafka.pid"
    single._write_config(single.nodes[0])
    text = (tmp_path / "kafka" / "server.properties").read_text()
    assert "offsets.topic.replication.factor=1" in text and "min.insync.replicas" not in text
    with pytest.raises(UserError, match="1 or 3 brokers"):
        LocalKafka(home=tmp_path, cache=tmp_path, brokers=2)
    with pytest.raises(UserError, match="CONTROLLER_PORT"):
        LocalKafka(home=tmp_path, cache=tmp_path, port=9092, controller_port=9094, brokers=3)
    with pytest.raises(UserError, match="node 2 of the local Kafka does not run"):
        cluster.kill_node(1)


@pytest.mark.parametrize(("brokers", "replication", "state", "detail"), [
    (1, {"a": (1, 1), "b": (1, 1)}, State.OK, r"replication factor 1, min.insync.replicas 1, 1 broker\(s\)$"),
    (3, {"a": (3, 2), "b": (3, 2)}, State.OK, r"replication factor 3, min.insync.replicas 2, 3 broker\(s\)$"),
    (3, {"a": (3, 2), "b": (1, 1)}, State.WARN, r"1 topic\(s\) with fewer than 3 .* lose data with their broker"),
    (3, {"a": (2, 2)}, State.WARN, "fewer than 3 replicas .* stop taking writes sooner"),
    (3, {"a": (3, 1)}, State.WARN, "min.insync.replicas below 2"),
    (2, {"a": (2, 2)}, State.OK, "2 broker"),
    (3, {"a": (3, 4)}, State.FAIL, "min.insync.replicas above the replication factor of a"),
])
def test_check_expects_what_topics_create_gives(brokers: int, replication: dict[str, tuple[int, int]],
                                                state: State, detail: str) -> None:
    result = _replication(replication, brokers, TopicSettings())
    assert result.state == state, result
    assert re.search(detail, result.detail), result.detail


class _Listing:
    """What ``AdminClient.list_topics`` returns, as far as ``auto`` replication reads it."""

    def __init__(self, brokers: set[int], replicas: list[list[int]] | None = None) -> None:
        self.brokers = {broker: object() for broker in brokers}
        partitions = {i: SimpleNamespace(replicas=r) for i, r in enumerate(replicas or [])}
        self.topics = {"__consumer_offsets": SimpleNamespace(partitions=partitions)} if replicas else {}


class _Admin:
    def __init__(self, *listings: _Listing) -> None:
        self.listings = list(listings)

    def list_topics(self, timeout: float) -> _Listing:
        return self.listings.pop(0) if len(self.listings) > 1 else self.listings[0]


def test_auto_replication_counts_a_broker_that_is_down_or_fenced_for_a_moment(monkeypatch: MonkeyPatch) -> None:
    """``auto`` counts the brokers the cluster has, not only those answering at that instant: a
    broker down still holds replicas of existing partitions, and one fenced under load answers
    again a moment later; a single broker (the demo's) is taken at once."""
    monkeypatch.setattr(kafka_module, "CLUSTER_SIZE_SETTLE_S", 3.0)
    monkeypatch.setattr(kafka_module.time, "sleep", lambda _s: None)
    down = _Listing({1, 2}, [[1, 2, 3], [2, 3, 1]])
    assert kafka_module._cluster_size(_Admin(down), down, 1.0) == 3
    fenced = _Listing({1, 3})
    assert kafka_module._cluster_size(_Admin(_Listing({1, 3}), _Listing({1, 2, 3})), fenced, 1.0) == 3
    single = _Listing({1})
    assert kafka_module._cluster_size(_Admin(), single, 1.0) == 1


class _ConfigsAdmin:
    """``AdminClient.describe_configs`` of a broker that answers ``error`` (by default: it does not know
the topic yet) to the first ``unknown`` asks."""

    def __init__(self, unknown: int, error: int = KafkaError.UNKNOWN_TOPIC_OR_PART) -> None:
        self.unknown = unknown
        self.error = error
        self.asked = 0

    def describe_configs(self, resources: list[ConfigResource], request_timeout: float) -> dict[object, Future[object]]:
        self.asked += 1
        answer: Future[object] = Future()
        if self.asked <= self.unknown:
            answer.set_exception(KafkaException(KafkaError(self.error)))
        else:
            answer.set_result({"cleanup.policy": SimpleNamespace(value="compact")})
        return {resources[0]: answer}


def test_a_topic_just_created_by_another_client_is_asked_about_again(monkeypatch: MonkeyPatch) -> None:
    """Workers starting together each create the topics; one lists a topic another has just created
    before the broker it asks knows it. That is a moment, not a fault: asked again, not an exit."""
    monkeypatch.setattr(kafka_module.time, "sleep", lambda _s: None)
    admin = _ConfigsAdmin(unknown=3)
    assert kafka_module._cleanup_policy(admin, "gpulens.k8s.pods.v1", 5.0) == "compact"  # type: ignore[arg-type]
    assert admin.asked == 4
    with pytest.raises(KafkaException):  # a topic that stays unknown past the timeout is an error
        kafka_module._cleanup_policy(_ConfigsAdmin(unknown=10**9), "gone", 0.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("error", [KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError.NOT_CONTROLLER])
def test_a_broker_away_while_a_worker_starts_is_asked_again_then_waited_for(monkeypatch: MonkeyPatch,
                                                                           error: int) -> None:
    """A worker restarting while a broker of a replicated cluster is killed asks that broker about its
    topics: a moment of the cluster, not the worker's fault. Asked again; still away past the
    timeout, :class:`BrokerUnavailable` (the retriable error the worker, sink and watcher wait out
    with backoff), never a crash on a raw Kafka error."""
    monkeypatch.setattr(kafka_module.time, "sleep", lambda _s: None)
    admin = _ConfigsAdmin(unknown=2, error=error)
    assert kafka_module._cleanup_policy(admin, "gpulens.gpu.samples.v1", 5.0) == "compact"  # type: ignore[arg-type]
    assert admin.asked == 3
    with pytest.raises(kafka_module.BrokerUnavailable, match=r"gpulens\.gpu\.samples\.v1"):
        kafka_module._cleanup_policy(_ConfigsAdmin(unknown=10**9, error=error),  # type: ignore[arg-type]
                                     "gpulens.gpu.samples.v1", 0.0)
    with pytest.raises(KafkaException):  # a refusal is not a broker away: raised at once
        kafka_module._cleanup_policy(_ConfigsAdmin(unknown=1, error=KafkaError.TOPIC_AUTHORIZATION_FAILED),  # type: ignore[arg-type]
                                     "gpulens.gpu.samples.v1", 5.0)


class _GoneAdmin:
    """``AdminClient.list_topics`` of a cluster whose brokers went away after creating the topics."""

    def list_topics(self, timeout: float) -> object:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))


def test_brokers_gone_after_creating_the_topics_are_waited_for_not_a_crash() -> None:
    with pytest.raises(kafka_module.BrokerUnavailable, match="created topics"):
        kafka_module._await_metadata(_GoneAdmin(), ["gpulens.gpu.samples.v1"], 1.0)  # type: ignore[arg-type]


def test_a_failed_topic_creation_says_whose_it_is_to_fix() -> None:
    """A broker away while creating is waited for; too few brokers for the replicas is the user's to
    fix, naming the setting; any other refusal is raised as the broker said it."""
    def failed(code: int) -> Exception:
        return kafka_module._creation_error("t", KafkaException(KafkaError(code)), 3, 2, "127.0.0.1:9092")

    assert isinstance(failed(KafkaError._TRANSPORT), kafka_module.BrokerUnavailable)
    refused = failed(KafkaError.INVALID_REPLICATION_FACTOR)
    assert isinstance(refused, UserError) and "GPULENS_TOPICS__REPLICATION_FACTOR" in str(refused)
    assert "3 replicas on 2 broker(s)" in str(refused)
    other = failed(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert type(other) is KafkaException and other.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
