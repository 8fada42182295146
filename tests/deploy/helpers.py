"""Shared readers for the deployment tests: the Kubernetes manifests, the compose file, and the
environment-variable names every gpulens service accepts (walked from ``common/settings.py``).

The deployment files are plain YAML that no machine here can apply (no cluster, no Docker
engine), so these helpers let the tests check them against the code: kinds and fields,
least-privilege settings, and that every ``GPULENS_*`` name is a real setting of the service
that receives it.
"""

from __future__ import annotations

import re
import time
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, BaseModel

from common.settings import (
    ENV_PREFIX,
    AgentSettings,
    AlertForwardSettings,
    CommonSettings,
    SinkSettings,
    WatcherSettings,
    WorkerSettings,
)
from tests.conftest import REPO_ROOT

K8S_DIR = REPO_ROOT / "deploy" / "k8s"
SECRETS_DIR = K8S_DIR / "secrets"
GRAFANA_DIR = REPO_ROOT / "deploy" / "grafana"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
NAMESPACE = "gpulens"
AGENT_NAMESPACE = "gpulens-agent"
"""The node agent's own namespace (Pod Security "privileged"); everything else runs in NAMESPACE."""

# The gpulens sub-command a container runs decides which settings model reads its environment.
SETTINGS_BY_COMMAND: dict[str, type[CommonSettings]] = {
    "agent": AgentSettings,
    "watch": WatcherSettings,
    "worker": WorkerSettings,
    "sink": SinkSettings,
    "topics": CommonSettings,
    "alerts": AlertForwardSettings,
}

WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob"}


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    """Every non-empty document of a (multi-document) YAML file."""
    with path.open() as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def manifest_files() -> list[Path]:
    """The manifests kustomization.yaml applies (top-level YAML except the kustomization)."""
    return sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def secret_template_files() -> list[Path]:
    return sorted(SECRETS_DIR.glob("*.yaml"))


def manifests() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in load_yaml_docs(path)]


def secret_templates() -> list[dict[str, Any]]:
    return [doc for path in secret_template_files() for doc in load_yaml_docs(path)]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc.get("kind") == kind]


def by_name(docs: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """The object of that kind and name (in ``namespace`` when given; else the first one)."""
    for doc in of_kind(docs, kind):
        if doc["metadata"]["name"] == name and namespace in (None, doc["metadata"].get("namespace")):
            return doc
    raise AssertionError(f"no {kind} named {name!r}{f' in {namespace}' if namespace else ''} in deploy/k8s")


def pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a workload (CronJob nests it one level deeper)."""
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return typing.cast(dict[str, Any], spec["template"])


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc.get("kind") in WORKLOAD_KINDS]


def containers(pod_spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from pod_spec.get("initContainers", []) or []
    yield from pod_spec.get("containers", []) or []


LEAN_AGENT = ["python", "-m", "producers.agent"]
"""The node agent's own entry point (the slim agent image): ``gpulens agent`` without the CLI."""


def component_args(container: dict[str, Any]) -> list[str]:
    """The gpulens command line a container runs: its ``args`` under the image's ``gpulens``
    entrypoint, or ``agent`` and its args for the lean agent entry point."""
    command = [str(part) for part in container.get("command") or []]
    args = [str(part) for part in container.get("args") or []]
    if command == LEAN_AGENT:
        return ["agent", *args]
    assert not command, f"{container.get('name')}: unexpected command {command} (the entrypoint is gpulens)"
    return args


def gpulens_command(args: list[str] | None) -> str:
    """The gpulens sub-command of a container's args / a compose service's command."""
    assert args, "a gpulens container must name its sub-command (args/command)"
    return str(args[0])


def settings_for(args: list[str] | None) -> type[CommonSettings]:
    command = gpulens_command(args)
    assert command in SETTINGS_BY_COMMAND, (
        f"unknown gpulens sub-command {command!r}; known: {sorted(SETTINGS_BY_COMMAND)}"
    )
    return SETTINGS_BY_COMMAND[command]


# --------------------------------------------------------------------------- settings names


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _nested_model(arg)
            if found:
                return found
    return None


def _is_dict(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_dict(arg) for arg in typing.get_args(annotation))
    return typing.get_origin(annotation) is dict or annotation is dict


def env_names(settings_type: type[BaseModel]) -> tuple[set[str], set[str]]:
    """(exact names, prefixes of dict settings) that ``settings_type`` reads from the environment.

    Mirrors pydantic-settings: ``GPULENS_<FIELD>``, nested models with ``__``, a field with a
    validation alias read under each alias (without the prefix), and dict fields also accepting
    ``GPULENS_<FIELD>__<KEY>``.
    """
    exact: set[str] = set()
    prefixes: set[str] = set()

    def walk(model: type[BaseModel], prefix: str, top: bool) -> None:
        for name, field in model.model_fields.items():
            alias = field.validation_alias
            if top and alias is not None:
                choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
                exact.update(choice.upper() for choice in choices if isinstance(choice, str))
                continue
            env = prefix + name.upper()
            exact.add(env)
            nested = _nested_model(field.annotation)
            if nested is not None:
                walk(nested, env + "__", top=False)
            elif _is_dict(field.annotation):
                prefixes.add(env + "__")

    walk(settings_type, ENV_PREFIX, top=True)
    return exact, prefixes


def is_setting(settings_type: type[BaseModel], env_name: str) -> bool:
    exact, prefixes = env_names(settings_type)
    name = env_name.upper()
    return name in exact or any(name.startswith(prefix) and len(name) > len(prefix) for prefix in prefixes)


def secret_setting_names(settings_type: type[BaseModel]) -> set[str]:
    """Env names of settings that carry credentials (SecretStr fields, and the ClickHouse URL,
    whose user:password part is a credential)."""
    from pydantic import SecretStr

    names = {ENV_PREFIX + "CLICKHOUSE__URL"}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            env = prefix + name.upper()
            nested = _nested_model(field.annotation)
            if nested is not None:
                walk(nested, env + "__")
            elif SecretStr in typing.get_args(field.annotation) or field.annotation is SecretStr:
                names.add(env)

    walk(settings_type, ENV_PREFIX)
    return names


# --------------------------------------------------------------------------- compose


_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: Any) -> str:
    """Compose variable interpolation with the defaults (``${VAR:-default}``), as with an empty .env."""
    return _INTERPOLATION.sub(lambda m: m.group(2) or "", str(value))


def compose() -> dict[str, Any]:
    with COMPOSE_FILE.open() as handle:
        return typing.cast(dict[str, Any], yaml.safe_load(handle))


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(key): interpolate(value) for key, value in env.items()}


def compose_command(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def gpulens_services(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Compose services that run the gpulens image."""
    return {name: svc for name, svc in spec["services"].items() if str(svc.get("image", "")).startswith("gpulens")}


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = 90.0) -> Any:
    """The first truthy value of ``probe``, polled until ``timeout_s``; else fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
