"""`gpulens agent` as a user runs it: one simulated sample on stdout that validates against the
committed JSON Schema, and clear one-line errors without NVML or a node name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from schemas.codec import decode
from schemas.messages import GpuSample
from tests.conftest import REPO_ROOT

GPULENS = str(Path(sys.executable).parent / "gpulens")
SCHEMA = REPO_ROOT / "schemas" / "json" / "gpu.samples.v1.schema.json"


ENTRY_POINTS = {
    "gpulens agent": [GPULENS, "agent"],
    "python -m producers.agent": [sys.executable, "-m", "producers.agent"],
}


def run_agent(
    *args: str, env: dict[str, str] | None = None, entry: str = "gpulens agent"
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "GPULENS_NODE_NAME")}
    return subprocess.run([*ENTRY_POINTS[entry], *args], capture_output=True, text=True, timeout=60,
                          env=clean | (env or {}), cwd=REPO_ROOT, check=False)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_simulate_once_stdout_prints_one_valid_sample_with_every_gpu_process_and_pod(entry: str) -> None:
    result = run_agent("--simulate", "--once", "--stdout", "--node-name", "gpu-node-7", entry=entry)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    document = json.loads(lines[0])
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    sample = decode(lines[0], GpuSample)
    assert sample.node == "gpu-node-7" and sample.seq == 0 and sample.driver_version
    physical = [g for g in sample.gpus if g.mig_parent_uuid is None]
    mig = [g for g in sample.gpus if g.mig_parent_uuid is not None]
    assert [g.index for g in physical] == list(range(8))
    assert sorted(g.mig_profile or "" for g in mig) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    processes = [p for g in sample.gpus for p in g.processes]
    assert len(processes) == 10
    assert all(p.pod_uid and p.container_id and p.mem_used_bytes for p in processes)
    assigned = {r.pod for g in sample.gpus for r in g.assigned_to}
    assert assigned == {"llm-finetune-0", "embedder-6d9f7", "alice-nb", "bob-nb", "idle-jupyter", "whisper-0", "ocr-1"}
    shared = [g for g in sample.gpus if g.shared]
    assert len(shared) == 1 and len({p.pod_uid for p in shared[0].processes}) == 2
    named = {p.pod_name for p in processes if p.pod_name}
    assert {"llm-finetune-0", "embedder-6d9f7", "idle-jupyter", "whisper-0", "ocr-1"} <= named


def test_node_name_comes_from_the_downward_api_variable() -> None:
    result = run_agent("--simulate", "--once", "--stdout", env={"NODE_NAME": "from-downward-api"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["node"] == "from-downward-api"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_without_nvml_the_agent_says_so_in_one_line(entry: str) -> None:
    result = run_agent("--once", "--stdout", "--node-name", "n1", entry=entry)
    assert result.returncode == 2
    assert "NVML library (libnvidia-ml.so.1) not found" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_without_a_node_name_the_agent_says_how_to_set_it() -> None:
    result = run_agent("--once", "--stdout")
    assert result.returncode == 2 and "NODE_NAME" in result.stderr and "Traceback" not in result.stderr
