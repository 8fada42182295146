"""Shared fixtures. Kafka tests use the real local broker, started through the same code path as
``gpulens kafka up`` (idempotent: ``scripts/test.sh`` has usually started it already). If it
cannot start, the tests fail loudly — they are never skipped."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.settings import CommonSettings, KafkaSettings, load_settings
from gpulens.kafka_local import LocalKafka
from simulation.kube_local import HelmTools, LocalKube, build_binaries, build_helm, kueue_crds

os.environ.setdefault("GPULENS_CLUSTER", "default")  # the agent and watcher require it against real APIs
# report and advise count the period's dead letters on Kafka; tests that read their output turn it on
# themselves (tests/replay_store/test_reader_notes.py), so other tests' letters never reach a note
os.environ.setdefault("GPULENS_DEAD_LETTERS_TIMEOUT_S", "0")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_SCENARIOS = REPO_ROOT / "tests" / "data" / "scenarios"  # the shared examples, copied in (FORMAT.md)


@pytest.fixture(scope="session")
def local_kafka() -> LocalKafka:
    return LocalKafka.from_settings(load_settings(CommonSettings))


@pytest.fixture(scope="session")
def kafka_settings(local_kafka: LocalKafka) -> KafkaSettings:
    local_kafka.up(progress=False)
    return KafkaSettings(bootstrap_servers=local_kafka.bootstrap)


@pytest.fixture
def topic_prefix() -> Iterator[str]:
    """A fresh topic prefix per test, so tests sharing the broker never see each other's data."""
    yield f"test{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def prometheus_dir() -> Path:
    """The directory holding ``prometheus`` and ``promtool`` (scripts/prometheus-build.sh: cached
    after the first build, which scripts/test.sh does before the tests). A failed build fails the
    tests that need them."""
    build = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "prometheus-build.sh")], capture_output=True,
                           text=True, timeout=3600, check=False)
    assert build.returncode == 0, f"scripts/prometheus-build.sh failed:\n{build.stderr[-4000:]}"
    return Path(build.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def podresources_server_binary() -> Path:
    """A grpc-go PodResources v1 server built from k8s.io/kubelet's own podresources/v1 package
    (scripts/podresources-build.sh: cached after the first build, which scripts/test.sh does before
    the tests). A failed build fails the tests that need it."""
    build = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "podresources-build.sh")], capture_output=True,
                           text=True, timeout=3600, check=False)
    assert build.returncode == 0, f"scripts/podresources-build.sh failed:\n{build.stderr[-4000:]}"
    return Path(build.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def helm_tools() -> HelmTools:
    """Helm and prometheus-operator's ServiceMonitor CRD (scripts/helm-build.sh: cached after the
    first build, which scripts/test.sh does before the tests). A failed build fails the tests."""
    return build_helm(progress=False)


@pytest.fixture(scope="session")
def kueue_crd_dir() -> Path:
    """The CRDs Kueue v0.17.0 ships (scripts/kueue-crds.sh: fetched from the Go module proxy and cached
    on first use, which scripts/test.sh does before the tests). A failed fetch fails the tests."""
    return kueue_crds(progress=False)


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory, helm_tools: HelmTools) -> Iterator[LocalKube]:
    """A real control plane shared by the session: etcd, kube-apiserver, kube-controller-manager
    (without node lifecycle) and kube-scheduler, with ``kube.kubectl(...)`` and ``kube.helm(...)``
    (simulation/kube_local.py). No Node is registered: pods stay Pending unless a test registers
    one, and a test that does taints it for its own pods and deletes it at the end."""
    with LocalKube(tmp_path_factory.mktemp("kube-cluster"), build_binaries(), helm=helm_tools.helm,
                   controller_manager=True, scheduler=True) as plane:
        yield plane
