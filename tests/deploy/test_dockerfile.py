"""The one image every component runs: built from python:3.11-slim with ``pip install .``, the
``gpulens`` entrypoint, every package of the project copied in, and the unprivileged user the
Kubernetes manifests expect (runAsNonRoot checks the numeric id)."""

from __future__ import annotations

import re
import tomllib

from tests.deploy.helpers import DOCKERFILE, REPO_ROOT, manifests, pod_template, workloads


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def test_base_image_install_and_entrypoint() -> None:
    instructions = _instructions()
    bases = [rest.split()[0] for keyword, rest in instructions if keyword == "FROM"]
    assert bases and all(base == "python:3.11-slim" for base in bases)
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert re.search(r"pip install \.(\s|$)", runs), "the image installs the project with `pip install .`"
    assert ("ENTRYPOINT", '["gpulens"]') in instructions


def test_every_package_and_build_file_is_copied() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    packages = {pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {rest.split()[0] for keyword, rest in _instructions() if keyword == "COPY" and "--from" not in rest}
    assert packages <= copied, f"packages not copied into the image: {sorted(packages - copied)}"
    assert "pyproject.toml" in copied
    readme = project["project"].get("readme")
    if readme:
        assert any(item.startswith(readme) for keyword, rest in _instructions() if keyword == "COPY"
                   for item in rest.split()[:-1]), f"{readme} (named in pyproject) must be copied"


def test_dockerignore_keeps_local_state_out_but_not_the_sources() -> None:
    ignored = {line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".gpulens", ".gpulens-test"} <= ignored
    copied = {rest.split()[0] for keyword, rest in _instructions() if keyword == "COPY" and "--from" not in rest}
    assert not copied & ignored, f"copied but ignored: {copied & ignored}"


def test_image_user_matches_the_manifests() -> None:
    users = [rest for keyword, rest in _instructions() if keyword == "USER"]
    assert users, "the image must not run as root by default"
    uid = int(users[-1].split(":")[0])
    assert uid != 0
    for workload in workloads(manifests()):
        context = pod_template(workload)["spec"]["securityContext"]
        if context.get("runAsNonRoot"):
            assert context.get("runAsUser") == uid, f"{workload['metadata']['name']}: runAsUser != image user {uid}"
