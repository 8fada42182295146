"""The demo's "where to look next" lines name ``gpulens`` as the user can type it."""

from __future__ import annotations

import os
from pathlib import Path

from gpulens.demo import gpulens_command, where_to_look


def venv(root: Path) -> Path:
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "gpulens", "activate"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        os.chmod(bin_dir / name, 0o755)
    return bin_dir


def test_gpulens_on_path_is_typed_bare(tmp_path: Path) -> None:
    bin_dir = venv(tmp_path)
    command = gpulens_command(which=lambda name: str(bin_dir / name), executable=str(bin_dir / "python"),
                              cwd=tmp_path)
    assert command == ("gpulens", None)
    lines = where_to_look("demo1", command)
    assert lines[0].startswith("  gpulens report") and not any("activate" in line for line in lines)


def test_without_gpulens_on_path_the_venv_entry_point_is_printed(tmp_path: Path) -> None:
    bin_dir = venv(tmp_path)
    command = gpulens_command(which=lambda name: None, executable=str(bin_dir / "python"), cwd=tmp_path)
    assert command == (".venv/bin/gpulens", "(or run `source .venv/bin/activate` first, then type `gpulens ...`)")
    lines = where_to_look("demo1", command)
    assert "  .venv/bin/gpulens report " in lines[0]
    assert all(line.startswith("  .venv/bin/gpulens ") for line in lines[:5]) and "activate" in lines[-1]
    # run from elsewhere: the absolute path
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    shown, note = gpulens_command(which=lambda name: None, executable=str(bin_dir / "python"), cwd=elsewhere)
    assert shown == str(bin_dir / "gpulens") and note is not None and str(bin_dir / "activate") in note


def test_another_gpulens_on_path_is_not_this_installation(tmp_path: Path) -> None:
    bin_dir = venv(tmp_path)
    other = tmp_path / "usr" / "bin"
    other.mkdir(parents=True)
    (other / "gpulens").write_text("#!/bin/sh\n")
    shown, _ = gpulens_command(which=lambda name: str(other / name), executable=str(bin_dir / "python"),
                               cwd=tmp_path)
    assert shown == ".venv/bin/gpulens"


def test_no_entry_point_falls_back_to_the_module(tmp_path: Path) -> None:
    python = tmp_path / "python3"
    assert gpulens_command(which=lambda name: None, executable=str(python), cwd=tmp_path) == \
        (f"{python} -m gpulens", None)
