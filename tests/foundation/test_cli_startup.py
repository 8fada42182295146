"""``gpulens --help`` and ``gpulens <command> --help`` load no client library (the start-up time is
measured in benchmarks/bench_agent.py), and the command list shows every part's own help line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpulens.commands import PART_COMMANDS
from tests.conftest import REPO_ROOT

HEAVY = ("pydantic", "pydantic_settings", "confluent_kafka", "chdb", "clickhouse_connect", "faust", "aiokafka",
         "kubernetes", "grpc", "pynvml", "pandas", "pyarrow", "rich", "yaml")

PROBE = """
import contextlib, io, json, sys
from gpulens.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "help": out.getvalue(),
                  "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _help(*args: str) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", PROBE, *args, "--help"], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=60, check=True)
    return dict(json.loads(result.stdout))


@pytest.mark.parametrize("command", [[], ["kafka", "up"], ["topics", "create"], *([c] for c in PART_COMMANDS)],
                         ids=lambda c: " ".join(c) or "gpulens")
def test_help_imports_no_client_library(command: list[str]) -> None:
    result = _help(*command)
    assert result["code"] == 0 and "Usage:" in str(result["help"])
    loaded = set(result["loaded"])  # type: ignore[call-overload]
    assert loaded.isdisjoint(HEAVY), f"`gpulens {' '.join(command)} --help` imports {sorted(loaded & set(HEAVY))}"


def test_top_level_help_lists_every_command_with_its_own_help_line() -> None:
    from gpulens.cli import _register_part_commands, cli

    _register_part_commands()
    for name, (_module, line) in PART_COMMANDS.items():
        command = cli.commands[name]
        assert line == (command.help or "").strip().splitlines()[0], f"PART_COMMANDS[{name!r}] differs from its help"
    text = str(_help()["help"])
    for name in [*PART_COMMANDS, "kafka", "topics", "schemas", "config"]:
        assert f"\n  {name} " in text, name


def test_an_unknown_command_is_a_usage_error_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from gpulens.cli import main

    assert main(["no-such-command"]) == 2
    assert "No such command 'no-such-command'" in capsys.readouterr().err


@pytest.mark.parametrize(("blocked", "args", "extra"), [
    ("yaml", ["demo", "--print-scenario"], "cli"),
    ("clickhouse_connect", ["sql", "SELECT 1"], "sink"),
    ("kubernetes", ["watch", "--stdout"], "watcher"),
])
def test_a_command_whose_extra_is_not_installed_says_which_extra_in_one_line(
    blocked: str, args: list[str], extra: str
) -> None:
    probe = f"import sys; sys.modules[{blocked!r}] = None; from gpulens.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=REPO_ROOT,
                            timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert f'pip install "gpulens[{extra}]"' in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_every_command_module_is_registered() -> None:
    """A module of gpulens/commands whose command has no row in PART_COMMANDS would be missing from
    the CLI without an error: each module's COMMANDS are all registered, under that module."""
    import importlib

    import click

    registered = {(module, name) for name, (module, _line) in PART_COMMANDS.items()}
    found = set()
    for path in sorted((REPO_ROOT / "gpulens" / "commands").glob("*.py")):
        if path.stem in ("__init__", "base"):
            continue
        commands = getattr(importlib.import_module(f"gpulens.commands.{path.stem}"), "COMMANDS", None)
        assert commands, f"gpulens/commands/{path.name} defines no COMMANDS"
        assert all(isinstance(c, click.Command) for c in commands), path.name
        found |= {(path.stem, c.name) for c in commands}
    assert found - registered == set(), f"commands without a row in PART_COMMANDS: {sorted(found - registered)}"
    assert registered - found == set(), f"PART_COMMANDS rows without their command: {sorted(registered - found)}"
