"""``gpulens watch`` end to end, and a real-cluster test that runs only when KUBECONFIG is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from producers.watcher.kube import api_client
from producers.watcher.service import MemorySink, WatcherConfig, WatcherService, kube_sources
from schemas.messages import NodeState
from schemas.topics import K8S_NODES
from tests.conftest import REPO_ROOT


def test_watch_simulate_stdout_prints_records() -> None:
    process = subprocess.Popen([sys.executable, "-m", "gpulens.cli", "watch", "--simulate", "--stdout"],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[dict[str, Any]] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(lines) < 10:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(json.loads(line))
    finally:
        process.terminate()
        process.wait(10)
    topics = {record["topic"] for record in lines}
    assert {"gpulens.k8s.nodes.v1", "gpulens.k8s.pods.v1"} <= topics
    nodes = [r for r in lines if r["topic"] == "gpulens.k8s.nodes.v1"]
    assert all(r["value"]["gpu_capacity"].get("nvidia.com/gpu") == 8 for r in nodes)  # cpu-0 not reported
    assert process.returncode is not None


def test_watch_without_cluster_config_is_a_user_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gpulens.cli", "watch", "--stdout", "--kubeconfig",
                             str(tmp_path / "missing")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set: no real cluster to watch")
def test_real_cluster_lists_and_watches() -> None:
    api = api_client(kubeconfig=Path(os.environ["KUBECONFIG"]))
    sink = MemorySink()
    service = WatcherService(kube_sources(api), sink, WatcherConfig(watch_timeout_s=5))
    stop = threading.Event()
    try:
        service.start(stop)
        time.sleep(6)  # one full watch round-trip, bookmarks included
    finally:
        service.shutdown(stop)
    assert all(inf.synced and inf.resource_version for inf in service.informers)
    for record in sink.of(K8S_NODES):
        assert isinstance(record.message, NodeState)
        assert record.message.gpu_capacity or record.message.labels
