"""``python -m producers.watcher``: the watcher's own entry point (like ``python -m producers.agent``)
takes the flags of ``gpulens watch`` and reports what the user must fix as one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


def test_a_missing_kubeconfig_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")} | {"GPULENS_DATA_DIR": str(tmp_path),
                                                                                    "GPULENS_CLUSTER": "test"}
    result = subprocess.run([sys.executable, "-m", "producers.watcher", "--kubeconfig", str(tmp_path / "none"),
                             "--stdout"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"gpulens watch: kubeconfig {tmp_path / 'none'} does not exist. Pass --kubeconfig, run in a cluster, "
        "or try --simulate.")
    assert "Traceback" not in result.stderr


def test_gpulens_watch_says_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from gpulens.cli import main

    monkeypatch.setenv("GPULENS_CLUSTER", "test")
    assert main(["watch", "--kubeconfig", str(tmp_path / "none"), "--stdout", "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gpulens: kubeconfig {tmp_path / 'none'} does not exist. Pass --kubeconfig, run in a cluster, "
        "or try --simulate.")
