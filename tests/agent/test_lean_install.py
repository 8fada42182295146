"""``pip install "gpulens[agent]"`` alone: a fresh virtual environment without chDB, faust, pandas,
pyarrow (or the other components' clients), in which the node agent still runs, both simulated and
against the fake NVML library through the real pynvml."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from schemas.codec import decode
from schemas.messages import GpuSample
from tests.agent.fakenvml import VARIANTS, standard_node
from tests.conftest import REPO_ROOT

HEAVY = ("chdb", "faust", "pandas", "pyarrow", "clickhouse_connect", "kubernetes", "aiokafka", "mode")
SOURCES = ("pyproject.toml", "README.md", "schemas", "common", "producers", "stream_jobs", "sinks", "simulation",
           "reports", "gpulens")
SCHEMA = json.loads((REPO_ROOT / "schemas" / "json" / "gpu.samples.v1.schema.json").read_text())


@pytest.fixture(scope="module")
def lean_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lean")
    source = root / "src"
    for name in SOURCES:  # a copy, so the build leaves no build/ or egg-info in the checkout
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(path, source / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{source}[agent]"],
        capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return python


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GPULENS_") and k not in ("NODE_NAME", "PYTHONPATH", "VIRTUAL_ENV")}
    return env | (extra or {})


@pytest.mark.slow
def test_the_agent_extra_leaves_the_other_components_clients_out(lean_python: Path) -> None:
    probe = f"import importlib.util as u, json; print(json.dumps([m for m in {HEAVY!r} if u.find_spec(m)]))"
    result = subprocess.run([str(lean_python), "-c", probe], capture_output=True, text=True, check=True,
                            cwd=lean_python.parent, env=_clean_env())
    assert json.loads(result.stdout) == []
    for present in ("pynvml", "h2", "grpc", "confluent_kafka", "pydantic"):
        check = subprocess.run([str(lean_python), "-c", f"import {present}"], cwd=lean_python.parent,
                               env=_clean_env(), capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stderr


@pytest.mark.slow
def test_the_lean_agent_runs_simulated(lean_python: Path) -> None:
    result = subprocess.run(
        [str(lean_python), "-m", "producers.agent", "--simulate", "--once", "--stdout", "--node-name", "lean-1"],
        capture_output=True, text=True, timeout=120, cwd=lean_python.parent, env=_clean_env(), check=False)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    jsonschema.validate(json.loads(line), SCHEMA)
    sample = decode(line, GpuSample)
    assert sample.node == "lean-1" and len([g for g in sample.gpus if g.mig_parent_uuid is None]) == 8


@pytest.mark.slow
def test_the_lean_agent_reads_nvml_through_pynvml(lean_python: Path, tmp_path: Path) -> None:
    node = standard_node(VARIANTS["r580"])
    result = subprocess.run(
        [str(lean_python), "-m", "producers.agent", "--once", "--stdout", "--node-name", "lean-2"],
        capture_output=True, text=True, timeout=120, cwd=lean_python.parent, check=False,
        env=_clean_env(node.environment(tmp_path / "node.conf")
                       | {"GPULENS_KUBELET_SOCKET": str(tmp_path / "no-kubelet.sock"),
                          "GPULENS_CLUSTER": "gpu-farm"}))
    assert result.returncode == 0, result.stderr
    sample = decode(result.stdout.strip(), GpuSample)
    assert sample.driver_version == "580.65.06"
    assert {g.uuid for g in sample.gpus} == {g.uuid for g in node.gpus} | {m.uuid for m in node.migs}
    assert sorted(p.pid for g in sample.gpus for p in g.processes) == sorted(p.pid for p in node.processes)


@pytest.mark.slow
def test_the_lean_cli_names_the_extra_a_command_needs(lean_python: Path, tmp_path: Path) -> None:
    gpulens = str(lean_python.parent / "gpulens")
    shown = subprocess.run([gpulens, "--help"], capture_output=True, text=True, timeout=60, check=False,
                           cwd=lean_python.parent, env=_clean_env())
    assert shown.returncode == 0 and "agent" in shown.stdout
    refused = subprocess.run([gpulens, "sql", "SELECT 1"], capture_output=True, text=True, timeout=60, check=False,
                             cwd=lean_python.parent, env=_clean_env({"GPULENS_DATA_DIR": str(tmp_path)}))
    assert refused.returncode == 2 and 'pip install "gpulens[sink]"' in refused.stderr
    assert "Traceback" not in refused.stderr
