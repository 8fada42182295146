"""One Kafka principal per component, on a real broker that enforces ACLs.

The local broker runs with SASL/SCRAM-SHA-256 (every principal's credentials formatted into the
KRaft storage) and the StandardAuthorizer (only the admin is a super user). The admin creates the
topics and the ACLs of :func:`gpulens.kafka_acls.component_access`, the table docs/operations.md
prints; then each component's principal does what its code does, through the same client code
(``ensure_topics`` at start-up, the idempotent producer, consumer groups, ``TopicFollower``), and
is refused everything else: the node agent can write ``gpu.samples.v1`` but gets
TOPIC_AUTHORIZATION_FAILED writing ``k8s.pods.v1`` and can read no topic.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from pydantic import SecretStr

from common.kafka import TopicFollower, _client_conf, create_acls, ensure_topics
from common.settings import (
    AlertForwardSettings,
    CommonSettings,
    KafkaSettings,
    SinkSettings,
    WorkerSettings,
    load_settings,
)
from gpulens.kafka_acls import (
    AGENT_WRITES,
    COMPONENTS,
    FORWARDER_READS,
    INTERNAL,
    SINK_READS,
    WATCHER_WRITES,
    WORKER_INPUTS,
    WORKER_OUTPUTS,
    acl_rows,
    component_access,
)
from gpulens.kafka_local import LocalKafka, LocalSasl
from schemas.topics import (
    ALERTS,
    ALL_TOPICS,
    DEADLETTER,
    GPU_SAMPLES,
    INTERNAL_CONTROL,
    INTERNAL_NODE_INPUTS,
    K8S_NODES,
    K8S_PODS,
    K8S_WORKLOADS,
    POD_WINDOWS,
    TopicSpec,
    node_stage_topics,
)

pytestmark = pytest.mark.kafka

PREFIX = "acl"
APP_ID = f"{PREFIX}-stream-jobs"
ACCESS = component_access(PREFIX, app_id=APP_ID)
DENIED = "TOPIC_AUTHORIZATION_FAILED"
GROUP_DENIED = "GROUP_AUTHORIZATION_FAILED"
ADMIN = "admin"


def _user(component: str) -> str:
    return ACCESS[component].principal.removeprefix("User:")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    users = ((ADMIN, "admin-secret"), *((_user(c), f"{c}-secret") for c in COMPONENTS))
    port, controller_port = _free_ports(2)
    kafka = LocalKafka(home=tmp_path_factory.mktemp("sasl") / "kafka",
                       cache=load_settings(CommonSettings).local_kafka.cache_dir,
                       port=port, controller_port=controller_port, heap_mb=384, sasl=LocalSasl(users=users))
    kafka.up(progress=False, timeout_s=120)
    try:
        created = sum(create_acls(kafka.client(), acl_rows(access)) for access in ACCESS.values())
        assert created == sum(len(acl_rows(access)) for access in ACCESS.values())
        yield kafka
    finally:
        kafka.down()


@pytest.fixture(scope="module")
def topics(broker: LocalKafka) -> LocalKafka:
    """The public topics, created by the topics Job's principal (not the admin), one record each."""
    report = ensure_topics(broker.client(_user("topics")), ALL_TOPICS, PREFIX)
    assert sorted(report.created) == sorted(spec.name(PREFIX) for spec in ALL_TOPICS)
    assert produce(broker.client(ADMIN), [spec.name(PREFIX) for spec in ALL_TOPICS]) == {
        spec.name(PREFIX): None for spec in ALL_TOPICS}
    return broker


# --------------------------------------------------------------------------- clients


def produce(kafka: KafkaSettings, topics: Iterable[str], timeout_s: float = 20.0) -> dict[str, str | None]:
    """One record to each topic, each through its own idempotent producer (as the components'):
    per topic None when delivered, else the error's name."""
    outcome: dict[str, str | None] = {}
    for topic in topics:
        producer = Producer(_client_conf(kafka) | {"enable.idempotence": True, "acks": "all",
                                                   "message.timeout.ms": int(timeout_s * 1000)})

        def report(err: KafkaError | None, _msg: object, topic: str = topic) -> None:
            outcome[topic] = None if err is None else err.name()

        try:
            producer.produce(topic, b"{}", b"key", on_delivery=report)
            producer.flush(timeout_s + 5)
        except KafkaException as exc:  # e.g. no write access anywhere: no producer id for idempotence
            outcome[topic] = exc.args[0].name()
        assert topic in outcome, f"no delivery report for {topic}"
    return outcome


def _partitions(name: str) -> int:
    specs = [*ALL_TOPICS, *node_stage_topics(12)]
    return next((spec.partitions for spec in specs if spec.name(PREFIX) == name), 1)


def read(kafka: KafkaSettings, topics: Iterable[str], timeout_s: float = 20.0) -> dict[str, str]:
    """Per topic, "ok" when a record could be fetched (its partitions assigned, no group joined),
    else the error that refused it: in the metadata (not even allowed to describe it) or the fetch."""
    return {topic: _read_one(kafka, topic, timeout_s) for topic in topics}


def _read_one(kafka: KafkaSettings, topic: str, timeout_s: float) -> str:
    consumer = Consumer(_client_conf(kafka) | {"group.id": "acl-reader", "enable.auto.commit": False,
                                               "auto.offset.reset": "earliest"})
    deadline = time.monotonic() + timeout_s
    try:
        # a topic the principal may not even describe is refused in the metadata already
        found = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        error = found.error if found is not None else None
        if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            return str(error.name())
        consumer.assign([TopicPartition(topic, p, -2) for p in range(_partitions(topic))])
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is None:
                return "ok"
            if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                return str(error.name())
        return "nothing within the deadline"
    finally:
        consumer.close()


def join_group(kafka: KafkaSettings, topic: str, group: str, timeout_s: float = 20.0) -> str:
    """Subscribe as a member of ``group`` and read one record: "ok" or the error's name."""
    consumer = Consumer(_client_conf(kafka) | {"group.id": group, "enable.auto.commit": False,
                                               "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is None:
                return "ok"
            if error.code() in (KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED):
                return str(error.name())
        return "nothing within the deadline"
    finally:
        consumer.close()


def names(specs: Iterable[TopicSpec]) -> list[str]:
    return [spec.name(PREFIX) for spec in specs]


def others(allowed: Iterable[TopicSpec]) -> list[str]:
    return [name for name in names(ALL_TOPICS) if name not in set(names(allowed))]


# --------------------------------------------------------------------------- per component


def test_the_agent_writes_its_topics_and_reads_none(topics: LocalKafka) -> None:
    agent = topics.client(_user("agent"))
    assert produce(agent, names(AGENT_WRITES)) == dict.fromkeys(names(AGENT_WRITES))
    refused = names((K8S_PODS, K8S_NODES, K8S_WORKLOADS, INTERNAL_CONTROL, POD_WINDOWS, ALERTS, DEADLETTER))
    assert produce(agent, refused) == dict.fromkeys(refused, DENIED), "a GPU node must not write cluster state"
    everything = names(ALL_TOPICS)
    assert read(agent, everything) == dict.fromkeys(everything, DENIED)


def test_the_watcher_writes_the_cluster_state_and_reads_none(topics: LocalKafka) -> None:
    watcher = topics.client(_user("watcher"))
    # its start-up check (producers/watcher/main.py) passes: its topics exist and it may describe them
    report = ensure_topics(watcher, WATCHER_WRITES, PREFIX)
    assert report.created == [INTERNAL_CONTROL.name(PREFIX)] and not report.mismatched  # the rest: the Job's
    assert produce(watcher, names(WATCHER_WRITES)) == dict.fromkeys(names(WATCHER_WRITES))
    refused = others(WATCHER_WRITES)
    assert GPU_SAMPLES.name(PREFIX) in refused
    assert produce(watcher, refused) == dict.fromkeys(refused, DENIED)
    everything = names(ALL_TOPICS)
    assert read(watcher, everything) == dict.fromkeys(everything, DENIED)


def test_the_workers_read_inputs_write_outputs_and_create_their_topics(topics: LocalKafka) -> None:
    from stream_jobs.faust_app import app_id, changelog_topics

    worker = topics.client(_user("worker"))
    settings = WorkerSettings(topic_prefix=PREFIX)
    assert app_id(settings) == APP_ID
    # the worker's start-up (gpulens/commands/worker.py): internal and changelog topics created
    report = ensure_topics(worker, node_stage_topics(settings.node_input_partitions), PREFIX)
    assert set(report.created) == set(names(INTERNAL)) - {INTERNAL_CONTROL.name(PREFIX)}  # control: the watcher
    assert not report.mismatched
    assert len(ensure_topics(worker, changelog_topics(settings), APP_ID).created) == 2
    # ... but no topic outside its own
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        ensure_topics(worker, [TopicSpec("not.mine.v1", "-", GPU_SAMPLES.message, 1, "delete", -1, "")], PREFIX)

    writes = names((*INTERNAL, *WORKER_OUTPUTS, DEADLETTER))
    assert produce(worker, writes) == dict.fromkeys(writes)
    assert produce(worker, [f"{APP_ID}-node-changelog"]) == {f"{APP_ID}-node-changelog": None}
    refused = names((K8S_PODS, K8S_NODES, GPU_SAMPLES))
    assert produce(worker, refused) == dict.fromkeys(refused, DENIED), "a worker must not forge inputs"

    readable = names((*WORKER_INPUTS, *INTERNAL))
    assert read(worker, readable) == dict.fromkeys(readable, "ok")
    unread = names((*WORKER_OUTPUTS, DEADLETTER))
    assert read(worker, unread) == dict.fromkeys(unread, DENIED)
    assert join_group(worker, GPU_SAMPLES.name(PREFIX), APP_ID) == "ok"
    assert join_group(worker, GPU_SAMPLES.name(PREFIX), "gpulens-sink") == GROUP_DENIED


def test_the_sink_reads_what_it_stores_and_writes_only_dead_letters(topics: LocalKafka) -> None:
    from sinks.rows import SINK_TOPICS

    sink = topics.client(_user("sink"))
    report = ensure_topics(sink, (*SINK_TOPICS, DEADLETTER), PREFIX)  # its start-up (sinks/service.py)
    assert not report.created and not report.mismatched
    assert read(sink, names(SINK_READS)) == dict.fromkeys(names(SINK_READS), "ok")
    unread = [*others(SINK_READS), INTERNAL_NODE_INPUTS.name(PREFIX)]
    assert read(sink, unread) == dict.fromkeys(unread, DENIED)
    assert produce(sink, [DEADLETTER.name(PREFIX)]) == {DEADLETTER.name(PREFIX): None}
    refused = others((DEADLETTER,))
    assert produce(sink, refused) == dict.fromkeys(refused, DENIED)
    group = str(SinkSettings.model_fields["group_id"].default)
    assert join_group(sink, POD_WINDOWS.name(PREFIX), group) == "ok"
    assert join_group(sink, POD_WINDOWS.name(PREFIX), APP_ID) == GROUP_DENIED


def test_the_alert_forwarder_reads_alerts_and_pod_teams(topics: LocalKafka) -> None:
    forwarder = topics.client(_user("alerts-forward"))
    group = str(AlertForwardSettings.model_fields["group_id"].default)
    assert join_group(forwarder, ALERTS.name(PREFIX), group) == "ok"
    follower = TopicFollower(forwarder, K8S_PODS.name(PREFIX))  # the team labels (sinks/alerts_forward.py)
    try:
        values = [r.value for r in follower.catch_up(20.0)]
        assert values and set(values) == {b"{}"}
    finally:
        follower.close()
    unread = others(FORWARDER_READS)
    assert read(forwarder, unread) == dict.fromkeys(unread, DENIED)
    assert produce(forwarder, [DEADLETTER.name(PREFIX)]) == {DEADLETTER.name(PREFIX): None}
    refused = others((DEADLETTER,))
    assert produce(forwarder, refused) == dict.fromkeys(refused, DENIED)


def test_the_topics_job_creates_topics_and_reads_and_writes_none(topics: LocalKafka) -> None:
    """What no ACL allows is refused (allow.everyone.if.no.acl.found=false): the topics Job's
    principal created the topics (the fixture) but reads and writes none."""
    job = topics.client(_user("topics"))
    # allowed to write nowhere, it does not even get an idempotent producer id
    assert produce(job, [GPU_SAMPLES.name(PREFIX)]) == {GPU_SAMPLES.name(PREFIX): "CLUSTER_AUTHORIZATION_FAILED"}
    assert read(job, [K8S_PODS.name(PREFIX)]) == {K8S_PODS.name(PREFIX): DENIED}


def test_the_local_broker_refuses_a_wrong_password(broker: LocalKafka) -> None:
    from common.kafka import broker_reachable

    wrong = broker.client(_user("agent")).model_copy(update={"sasl_password": SecretStr("not-the-password")})
    assert not broker_reachable(wrong, timeout_s=3.0)
    assert broker_reachable(broker.client(_user("agent")), timeout_s=10.0)
