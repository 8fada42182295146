"""The images: the default one every component but the agent runs (python:3.11-slim,
``pip install ".[all]"``, the ``gpulens`` entrypoint) and the slim agent target the DaemonSet runs
(``pip install ".[agent]"``, entrypoint ``python -m producers.agent``); every package of the
project copied in, and the unprivileged user the Kubernetes manifests expect (runAsNonRoot checks
the numeric id)."""

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
    stages: list[str] = []
    for keyword, rest in instructions:
        if keyword == "FROM":
            # every stage starts from python:3.11-slim or from a stage above it, so each image does
            base, *alias = rest.split()
            assert base == "python:3.11-slim" or base in stages, f"FROM {base}: not python:3.11-slim nor a stage above"
            stages.append(alias[-1] if alias else "")
    assert stages
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert re.search(r'pip install "\.\[all\]"(\s|$)', runs), 'the image installs `pip install ".[all]"`'
    assert ("ENTRYPOINT", '["gpulens"]') in instructions


def _stage(name: str) -> list[tuple[str, str]]:
    """The instructions of one build stage (``FROM ... AS name`` up to the next ``FROM``)."""
    stage: list[tuple[str, str]] = []
    current = None
    for keyword, rest in _instructions():
        if keyword == "FROM":
            current = rest.split()[-1] if " AS " in rest.upper() else None
        elif current == name:
            stage.append((keyword, rest))
    return stage


def test_the_agent_target_is_the_lean_install_the_daemonset_runs() -> None:
    build = " ".join(rest for keyword, rest in _stage("build-agent") if keyword == "RUN")
    assert 'pip install ".[agent]"' in build, "the agent image installs only gpulens[agent]"
    agent = _stage("agent")
    assert ("ENTRYPOINT", '["python", "-m", "producers.agent"]') in agent
    assert any(k == "COPY" and rest.startswith("--from=build-agent") for k, rest in agent)
    (daemonset,) = [w for w in workloads(manifests()) if w["kind"] == "DaemonSet"]
    (container,) = pod_template(daemonset)["spec"]["containers"]
    assert container["image"].startswith("gpulens-agent:")
    assert container["command"] == ["python", "-m", "producers.agent"]


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
