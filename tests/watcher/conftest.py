"""Fixtures: a simulated API server with a small GPU cluster, watched through the real client, and a
real control plane (etcd + kube-apiserver, built once and cached) shared by the session."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from common.backoff import Backoff
from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.fake_cluster import make_node, make_pod, set_running
from producers.watcher.kube import api_client
from producers.watcher.service import WatcherConfig, WatcherMemorySink, WatcherService, WatcherSink, kube_sources
from simulation.kube_local import LocalKube, build_binaries


class FakeClock:
    """Event time advances by hand; sleeping is recorded and returns at once."""

    def __init__(self) -> None:
        self.at = datetime(2024, 5, 6, 8, 0, tzinfo=UTC)
        self.sleeps: list[float] = []

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, stop: threading.Event) -> bool:
        self.sleeps.append(seconds)
        self.at += timedelta(seconds=seconds)
        return stop.is_set()


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    """The real control plane: never skipped; a missing Go toolchain or a failed build fails."""
    with LocalKube(tmp_path_factory.mktemp("kube"), build_binaries()) as plane:
        yield plane


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval_s=0.2) as srv:
        yield srv


def populate(server: FakeApiServer) -> dict[str, str]:
    """Two GPU nodes, a CPU node, five GPU pods, a CPU pod on a GPU node, a CPU pod elsewhere.
    Returns pod name -> uid."""
    server.put("nodes", make_node("gpu-0", gpus=8))
    server.put("nodes", make_node("gpu-1", gpus=4, product="NVIDIA-H100-80GB-HBM3"))
    server.put("nodes", make_node("cpu-0", gpus=0))
    uids = {}
    for index in range(5):
        pod = make_pod(f"train-{index}", namespace="ml" if index < 3 else "vision", gpus=1 + index % 2,
                       labels={"team": "ml"})
        if index < 3:
            set_running(pod, "gpu-0", datetime(2024, 5, 6, 7, tzinfo=UTC))
        uids[f"train-{index}"] = server.put("pods", pod)["metadata"]["uid"]
    sidecar = make_pod("log-shipper", namespace="kube-system", gpus=0)
    set_running(sidecar, "gpu-1", datetime(2024, 5, 6, 7, tzinfo=UTC))
    uids["log-shipper"] = server.put("pods", sidecar)["metadata"]["uid"]
    web = make_pod("web", namespace="web", gpus=0)
    set_running(web, "cpu-0", datetime(2024, 5, 6, 7, tzinfo=UTC))
    uids["web"] = server.put("pods", web)["metadata"]["uid"]
    return uids


Factory = Callable[..., tuple[WatcherService, WatcherMemorySink, FakeClock]]


@pytest.fixture
def make_service(server: FakeApiServer) -> Factory:
    def build(namespaces: tuple[str, ...] = (), page_size: int = 500, events_api: str = "events.k8s.io",
              sink: WatcherSink | None = None) -> tuple[WatcherService, WatcherMemorySink, FakeClock]:
        clock = FakeClock()
        memory = WatcherMemorySink()
        api = api_client(host=server.url)
        sources = kube_sources(api, namespaces, events_api)
        for source in sources.all():
            source.page_size = page_size  # type: ignore[attr-defined]
        service = WatcherService(sources, sink or memory, WatcherConfig(namespaces=namespaces, watch_timeout_s=1,
                                                                        events_api=events_api),
                                 clock=clock, backoff_factory=lambda: Backoff(base_s=0.5, cap_s=30.0))
        return service, memory, clock

    return build
