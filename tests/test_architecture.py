"""The layering rules of DESIGN.md, checked: one-way dependencies (also enforced by import-linter
in ``scripts/test.sh``) and each third-party client used from exactly one adapter module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGES = ("gpulens", "simulation", "reports", "common", "schemas", "producers", "stream_jobs", "sinks")

# third-party client -> the only modules allowed to import it
ADAPTERS: dict[str, set[str]] = {
    "confluent_kafka": {"common/kafka.py"},
    "faust": {"stream_jobs/faust_app.py"},
    "mode": {"stream_jobs/faust_app.py"},
    "aiokafka": {"stream_jobs/faust_app.py"},  # faust's transport: the route must place records as its producer does
    "clickhouse_connect": {"sinks/clickhouse.py"},
    "chdb": {"sinks/clickhouse.py"},
    "pynvml": {"producers/agent/nvml.py"},
    "grpc": {"producers/agent/fake_kubelet.py"},
    "h2": {"producers/agent/podresources.py"},
    "kubernetes": {"producers/watcher/kube.py"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _source_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in (REPO_ROOT / pkg).rglob("*.py") if "_pb2" not in p.name]


def test_each_third_party_client_lives_in_its_adapter() -> None:
    offenders = []
    for path in _source_files():
        rel = path.relative_to(REPO_ROOT).as_posix()
        for module in _imports(path) & ADAPTERS.keys():
            if rel not in ADAPTERS[module]:
                offenders.append(f"{rel} imports {module}")
    assert offenders == [], "third-party clients outside their adapter modules:\n" + "\n".join(offenders)


def test_parts_never_import_each_other() -> None:
    """The parts import no other part and nothing above them; simulation and reports import
    neither each other nor the CLI (import-linter checks the same, this names the offender)."""
    forbidden = {
        "producers": {"stream_jobs", "sinks", "simulation", "reports", "gpulens"},
        "stream_jobs": {"producers", "sinks", "simulation", "reports", "gpulens"},
        "sinks": {"producers", "stream_jobs", "simulation", "reports", "gpulens"},
        "simulation": {"reports", "gpulens"},
        "reports": {"simulation", "gpulens"},
    }
    offenders = []
    for path in _source_files():
        own = path.relative_to(REPO_ROOT).parts[0]
        for module in _imports(path) & forbidden.get(own, set()):
            offenders.append(f"{path.relative_to(REPO_ROOT)} imports {module}")
    assert offenders == [], "\n".join(offenders)


def test_import_linter_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint)], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_command_modules_never_import_the_cli() -> None:
    """``gpulens.cli`` loads the command modules; importing it back from one would be a cycle."""
    offenders = []
    for path in (REPO_ROOT / "gpulens" / "commands").glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name == "gpulens.cli" for name in names):
                offenders.append(path.relative_to(REPO_ROOT).as_posix())
    assert offenders == [], "command modules importing gpulens.cli: " + ", ".join(offenders)


def test_every_registered_command_loads() -> None:
    from gpulens.commands import PART_COMMANDS, load_part_command

    for name in PART_COMMANDS:
        assert load_part_command(name).name == name


def test_a_registered_command_its_module_lacks_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulens import commands

    monkeypatch.setitem(commands.PART_COMMANDS, "nosuch", ("sink", "not there"))
    with pytest.raises(ImportError, match="does not define the command 'nosuch'"):
        commands.load_part_command("nosuch")
    monkeypatch.setitem(commands.PART_COMMANDS, "gone", ("no_such_module", "not there"))
    with pytest.raises(ImportError):
        commands.load_part_command("gone")
