"""The real control plane (etcd + kube-apiserver, built once and cached) for the API checks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from simulation.kube_local import LocalKube, build_binaries


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    """Never skipped: a missing Go toolchain or a failed build fails."""
    with LocalKube(tmp_path_factory.mktemp("kube-check"), build_binaries()) as plane:
        yield plane
