"""The operator docs stay true to the code: every configuration name they mention is a real
setting, the alert catalogue covers every alert type the pipeline can emit (with what to do) and
every threshold the engine accepts, and the commands they show exist."""

from __future__ import annotations

import re
import typing

import pytest

from gpulens.commands import _MODULES
from schemas.outputs import AlertType
from tests.deploy.helpers import REPO_ROOT, SETTINGS_BY_COMMAND, is_setting

DOCS = REPO_ROOT / "docs"
OPERATOR_DOCS = ("quickstart.md", "operations.md", "alerts.md", "prometheus.md")


@pytest.mark.parametrize("name", OPERATOR_DOCS)
def test_every_gpulens_variable_in_the_docs_is_a_setting(name: str) -> None:
    text = (DOCS / name).read_text()
    mentioned = set(re.findall(r"\bGPULENS_[A-Z0-9_]*[A-Z0-9]\b", text))
    unknown = {v for v in mentioned if not any(is_setting(s, v) for s in SETTINGS_BY_COMMAND.values())}
    assert not unknown, f"docs/{name} names settings that do not exist: {sorted(unknown)}"


def test_alert_catalogue_covers_every_alert_type_with_actions() -> None:
    text = (DOCS / "alerts.md").read_text()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S))
    types = set(typing.get_args(AlertType))
    assert set(sections) == types, f"sections {sorted(sections)} != alert types {sorted(types)}"
    for alert_type, body in sections.items():
        for part in ("**What it means.**", "**Details.**", "**What to do.**"):
            assert part in body, f"alerts.md/{alert_type} lacks {part}"


def test_alert_catalogue_lists_every_threshold_with_its_default() -> None:
    from stream_jobs.config import Thresholds

    text = (DOCS / "alerts.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([0-9.]+)", text, flags=re.M))
    defaults = Thresholds().to_dict()
    assert set(rows) == set(defaults), f"documented {sorted(rows)} != engine {sorted(defaults)}"
    for name, value in defaults.items():
        assert float(rows[name]) == value, f"alerts.md gives {name} = {rows[name]}, the engine uses {value}"


def test_commands_in_the_docs_exist() -> None:
    from gpulens.cli import _register_part_commands, cli

    _register_part_commands()
    # registered commands, plus those of parts not in the tree yet (`sql`, `report` and `top`
    # come with the analysis and demo parts)
    known = set(cli.commands) | set(_MODULES) | {"sql", "report", "top"}
    for name in OPERATOR_DOCS:
        text = (DOCS / name).read_text()
        code = re.findall(r"```.*?```", text, flags=re.S) + re.findall(r"`[^`\n]+`", text)
        used = {m for chunk in code for m in re.findall(r"(?:^|[\s`/])(?<!-n )gpulens (\w[\w-]*)", chunk, flags=re.M)}
        assert used or name == "alerts.md", f"docs/{name}: no gpulens command found"
        unknown = {u for u in used if u not in known}
        assert not unknown, f"docs/{name} uses commands the CLI does not have: {sorted(unknown)}"
