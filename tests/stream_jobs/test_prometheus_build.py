"""scripts/prometheus-build.sh: a machine without Go fails with a message that says what is missing
(the Prometheus tests are never skipped), and a built cache is found without building again."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "prometheus-build.sh"


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env={**os.environ, **env},
                          timeout=60, check=False)


def test_without_go_the_build_fails_naming_the_toolchain_and_version(tmp_path: Path) -> None:
    done = _run({"GO": str(tmp_path / "no-go"), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert done.returncode == 1 and done.stdout == ""
    assert "Go toolchain" in done.stderr and "promtool v0.316.0" in done.stderr
    assert not (tmp_path / "cache" / "gpulens" / "prometheus").exists(), "nothing half-built is left behind"


def test_a_cached_build_is_found_without_building_again(prometheus_dir: Path) -> None:
    done = _run({"GO": "/nonexistent/go"})  # no toolchain needed once built
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == prometheus_dir
    version = subprocess.run([str(prometheus_dir / "prometheus"), "--version"], capture_output=True, text=True,
                             timeout=30, check=True)
    assert "version 0.316.0" in version.stdout and "remove_all_sd" in version.stdout
    lint = subprocess.run([str(prometheus_dir / "promtool"), "--version"], capture_output=True, text=True,
                          timeout=30, check=True)
    assert "version 0.316.0" in lint.stdout
