"""``gpulens watch`` end to end on the simulated server (the real one: test_real_apiserver.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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
