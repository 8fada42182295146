"""scripts/kube-build.sh and scripts/helm-build.sh: a machine without Go fails with a message that
says what is missing (the real-server tests are never skipped), and a built cache is found, with
every binary the tests run, without building again."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from simulation.kube_local import KUBE_BINARIES, SERVICEMONITOR_CRD
from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "kube-build.sh"
HELM_SCRIPT = REPO_ROOT / "scripts" / "helm-build.sh"


def _run(env: dict[str, str], script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**os.environ, **env},
                          timeout=60, check=False)


def test_without_go_the_build_fails_naming_the_toolchain_and_versions(tmp_path: Path) -> None:
    done = _run({"GO": str(tmp_path / "no-go"), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert done.returncode == 1 and done.stdout == ""
    assert "Go toolchain" in done.stderr and "kube-apiserver v1.37.2" in done.stderr and "etcd v3.7.0" in done.stderr
    assert "kube-controller-manager, kube-scheduler and kubectl" in done.stderr
    assert not (tmp_path / "cache" / "gpulens" / "kube").exists(), "nothing half-built is left behind"


def test_without_go_the_helm_build_fails_naming_the_toolchain_and_versions(tmp_path: Path) -> None:
    done = _run({"GO": str(tmp_path / "no-go"), "XDG_CACHE_HOME": str(tmp_path / "cache")}, HELM_SCRIPT)
    assert done.returncode == 1 and done.stdout == ""
    assert "Go toolchain" in done.stderr and "Helm v4.3.2" in done.stderr
    assert "prometheus-operator v0.85.0" in done.stderr
    assert not (tmp_path / "cache" / "gpulens" / "helm").exists(), "nothing half-built is left behind"


def test_a_cached_build_is_found_without_building_again() -> None:
    done = _run({"GO": "/nonexistent/go"})  # no toolchain needed once built
    assert done.returncode == 0, done.stderr
    found = Path(done.stdout.strip())
    assert sorted(path.name for path in found.iterdir()) == sorted(KUBE_BINARIES)
    assert all(os.access(found / name, os.X_OK) for name in KUBE_BINARIES)
    assert "building" not in done.stderr


def test_a_cache_missing_one_binary_is_not_taken_for_a_build(tmp_path: Path) -> None:
    """A cache directory without every binary (an interrupted copy, an older build that made fewer)
    is rebuilt: with no toolchain here, that is the toolchain error, not a directory printed."""
    built = Path(_run({"GO": "/nonexistent/go"}).stdout.strip())
    partial = tmp_path / "gpulens" / "kube" / built.name
    partial.mkdir(parents=True)
    for name in KUBE_BINARIES:
        if name != "kube-scheduler":
            (partial / name).symlink_to(built / name)
    done = _run({"GO": "/nonexistent/go", "XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 1 and done.stdout == "" and "Go toolchain" in done.stderr


def test_a_cached_helm_build_is_found_without_building_again() -> None:
    done = _run({"GO": "/nonexistent/go"}, HELM_SCRIPT)
    assert done.returncode == 0, done.stderr
    found = Path(done.stdout.strip())
    assert sorted(path.name for path in found.iterdir()) == sorted(["helm", SERVICEMONITOR_CRD])
    assert os.access(found / "helm", os.X_OK)
    assert "name: servicemonitors.monitoring.coreos.com" in (found / SERVICEMONITOR_CRD).read_text()
    assert "building" not in done.stderr
