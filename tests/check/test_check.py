"""``gpulens check`` against the real local broker and the embedded engine: a healthy installation
(data produced through the broker and stored by the real sink, its groups with members) is green
and exits 0; each fault injected alone — a topic deleted, a group stopped, a node's agent silent, a
TTL dead letter, a migration missing — is red with the fix that repairs it."""

from __future__ import annotations

import contextlib
import io
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.kafka import Consumer, delete_prefixed, make_consumer
from common.settings import KafkaSettings
from gpulens.cli import main
from schemas import examples
from schemas.messages import NodeState, PodState
from schemas.topics import CLUSTER_CAPACITY, GPU_SAMPLES, K8S_NODES, K8S_PODS
from sinks.clickhouse import open_store
from sinks.service import run_sink
from tests.sinks import factories as f
from tests.sinks.conftest import Item, make_sink_settings, produce

pytestmark = pytest.mark.kafka

NODES = ("gpu-a", "gpu-b")


def _node(name: str, at: datetime) -> NodeState:
    node = examples.all_examples()["k8s.nodes.v1"]
    assert isinstance(node, NodeState)
    return node.model_copy(update={"node": name, "ts": at})


def _sample(name: str, at: datetime) -> Item:
    return (GPU_SAMPLES, name, examples.gpu_sample(gpus=2, node=name).model_copy(update={"ts": at}))


@dataclass
class Installation:
    kafka: KafkaSettings
    prefix: str
    data_dir: Path
    worker_group: str
    sink_group: str
    members: list[Consumer] = field(default_factory=list)

    def check(self, *args: str) -> tuple[int, dict[str, Any]]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["check", "--json", "--topic-prefix", self.prefix, "--data-dir", str(self.data_dir),
                           "--bootstrap-servers", self.kafka.bootstrap_servers,
                           "--clickhouse-url", f"chdb://{self.data_dir / 'clickhouse'}",
                           "--worker-group", self.worker_group, "--sink-group", self.sink_group,
                           "--timeout", "5", *args])
        assert out.getvalue(), err.getvalue()
        report = orjson.loads(out.getvalue())
        assert report["status"] == status
        return status, report

    def join(self, group: str) -> None:
        """A member of ``group`` (a process of the worker or the sink holding its partitions)."""
        consumer = make_consumer(self.kafka, group, {"session.timeout.ms": 6000})
        consumer.subscribe([GPU_SAMPLES.name(self.prefix)])
        deadline = time.monotonic() + 30
        while not consumer.assignment():
            assert time.monotonic() < deadline, f"{group}: no assignment"
            consumer.consume(1, 0.2)
        self.members.append(consumer)


def states(report: dict[str, Any]) -> dict[str, str]:
    return {r["name"]: r["state"] for r in report["results"]}


def result(report: dict[str, Any], name: str) -> dict[str, Any]:
    found = [r for r in report["results"] if r["name"] == name]
    assert len(found) == 1, (name, report["results"])
    return dict(found[0])


@pytest.fixture
def installation(kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> Iterator[Installation]:
    """What a running install has: the watcher's nodes and a pod, every node's agent samples (now),
    a capacity window, all through the broker and stored by the real sink; the groups with members."""
    now = datetime.now(UTC)
    pod = examples.all_examples()["k8s.pods.v1"]
    assert isinstance(pod, PodState)
    items: list[Item] = [(K8S_NODES, n, _node(n, now - timedelta(minutes=5))) for n in NODES]
    items.append((K8S_PODS, pod.uid, pod.model_copy(update={"ts": now - timedelta(minutes=1)})))
    for back in (60, 30, 0):
        items += [_sample(n, now - timedelta(seconds=back + 5)) for n in NODES]
    items.append((CLUSTER_CAPACITY, "default", f.capacity(0).model_copy(
        update={"window_start": now - timedelta(minutes=2), "window_end": now - timedelta(minutes=1)})))
    produce(kafka_settings, topic_prefix, items)
    sink_group = f"sink-{uuid.uuid4().hex[:8]}"
    settings = make_sink_settings(kafka_settings, topic_prefix, tmp_path, group_id=sink_group)
    run_sink(settings, exit_when_idle_s=1.0)
    setup = Installation(kafka_settings, topic_prefix, tmp_path, f"{topic_prefix}-stream-jobs", sink_group)
    try:
        yield setup
    finally:
        for consumer in setup.members:
            consumer.close()
        delete_prefixed(kafka_settings, [topic_prefix])


def _sink_more(setup: Installation, items: list[Item]) -> None:
    produce(setup.kafka, setup.prefix, items)
    run_sink(make_sink_settings(setup.kafka, setup.prefix, setup.data_dir, group_id=setup.sink_group),
             exit_when_idle_s=1.0)


NO_KUBE = ("--only", "kafka,topics,groups,deadletters,clickhouse,migrations,readonly,freshness")


def test_a_healthy_installation_is_green_and_exits_0(installation: Installation) -> None:
    installation.join(installation.worker_group)
    installation.join(installation.sink_group)
    status, report = installation.check(*NO_KUBE, "--strict")
    assert status == 0, report
    assert set(states(report).values()) == {"ok"}, report
    assert set(states(report)) == {"kafka", "topics", "replication", "worker-group", "sink-group", "deadletters",
                                   "clickhouse", "migrations", "readonly", "agents default", "watcher default"}
    assert "2 node(s) with a sample" in result(report, "agents default")["detail"]
    assert "1 broker" in result(report, "kafka")["detail"]


def test_without_api_access_the_kubernetes_checks_warn_and_do_not_fail(installation: Installation,
                                                                      tmp_path: Path) -> None:
    installation.join(installation.worker_group)
    installation.join(installation.sink_group)
    status, report = installation.check("--kubeconfig", str(tmp_path / "no-such-kubeconfig"))
    assert status == 0, report
    for name in ("kubernetes", "agent-daemonset", "watcher-rbac"):
        line = result(report, name)
        assert line["state"] == "warn" and line["detail"].startswith("skipped: no Kubernetes API access"), line
    assert installation.check("--kubeconfig", str(tmp_path / "no-such-kubeconfig"), "--strict")[0] == 1


def test_a_deleted_topic_fails_with_topics_create(installation: Installation) -> None:
    events = f"{installation.prefix}.k8s.events.v1"
    assert delete_prefixed(installation.kafka, [events]) == [events]
    status, report = installation.check("--only", "topics")
    line = result(report, "topics")
    assert status == 1 and line["state"] == "fail", report
    assert events in line["detail"] and "1 of 12 topics missing" in line["detail"]
    assert f"gpulens topics create --topic-prefix {installation.prefix}" in line["fix"]


def test_a_stopped_worker_group_fails(installation: Installation) -> None:
    installation.join(installation.sink_group)  # the sink runs, no worker does
    status, report = installation.check("--only", "groups")
    assert status == 1
    worker = result(report, "worker-group")
    assert worker["state"] == "fail" and "no member" in worker["detail"], worker
    assert "gpulens worker" in worker["fix"]
    assert result(report, "sink-group")["state"] == "ok"


def test_a_silent_agent_fails_naming_its_node(installation: Installation) -> None:
    now = datetime.now(UTC)
    _sink_more(installation, [(K8S_NODES, "gpu-c", _node("gpu-c", now - timedelta(hours=3))),
                              _sample("gpu-c", now - timedelta(hours=2)),
                              (K8S_NODES, "gpu-d", _node("gpu-d", now - timedelta(minutes=3)))])
    status, report = installation.check("--only", "freshness", "--cluster", "default")
    line = result(report, "agents default")
    assert status == 1 and line["state"] == "fail", report
    assert "2 GPU node(s) without agent data in the last 5m" in line["detail"], line
    assert "gpu-c (last sample 2h 0m ago)" in line["detail"] and "gpu-d (never)" in line["detail"], line
    assert "gpu-a" not in line["detail"] and "kubectl -n gpulens-agent get pods" in line["fix"]
    # a freshness window that covers the silence makes gpu-c fresh; gpu-d has never sent anything
    relaxed = result(installation.check("--only", "freshness", "--freshness", "3h")[1], "agents default")
    assert "1 GPU node(s)" in relaxed["detail"] and "gpu-d (never)" in relaxed["detail"], relaxed
    # a cluster with no data at all is red too
    _status, other = installation.check("--only", "freshness", "--cluster", "prod-eu-1")
    assert result(other, "freshness prod-eu-1")["state"] == "fail"


def test_a_ttl_dead_letter_is_reported_by_its_code_with_what_to_change(installation: Installation) -> None:
    old = f.capacity(0).model_copy(update={"window_id": "cap-too-old",
                                           "window_start": datetime.now(UTC) - timedelta(days=500)})
    _sink_more(installation, [(CLUSTER_CAPACITY, "default", old)])  # the state TTL is 400 days: the sink refuses it
    installation.join(installation.worker_group)
    installation.join(installation.sink_group)
    status, report = installation.check("--only", "deadletters")
    line = result(report, "deadletters too_old")
    assert line["state"] == "warn" and "1 dead letter(s) 'too_old'" in line["detail"], report
    assert "GPULENS_STATE_TTL_DAYS" in line["fix"] and "clocks" in line["fix"]
    assert status == 0
    assert installation.check("--only", "deadletters", "--strict")[0] == 1
    assert installation.check("--only", "deadletters", "--deadletters-fail", "0")[0] == 1
    assert states(installation.check("--only", "deadletters", "--deadletters-warn", "1")[1]) == {"deadletters": "ok"}


def test_a_missing_migration_fails_with_restart_the_sink(installation: Installation) -> None:
    store = open_store(f"chdb://{installation.data_dir / 'clickhouse'}")
    try:
        store.command("DELETE FROM schema_migrations WHERE version = 12")
    finally:
        store.close()
    status, report = installation.check("--only", "clickhouse,migrations,readonly")
    line = result(report, "migrations")
    assert status == 1 and line["state"] == "fail", report
    assert "1 migration(s) not applied: 12 (sink_batches" in line["detail"], line
    assert "restart `gpulens sink`" in line["fix"]
    assert result(report, "readonly")["state"] == "ok"
    # the fix works: the sink applies it at start
    _sink_more(installation, [])
    assert states(installation.check("--only", "migrations")[1]) == {"migrations": "ok"}


def test_usage_errors_exit_2(installation: Installation) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["check", "--only", "nonsense"]) == 2
        assert main(["check", "--cluster", "Not_A_Label"]) == 2
        assert main(["check", "--freshness", "soon"]) == 2
    assert "unknown check" in err.getvalue()
