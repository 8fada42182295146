"""The Kubernetes manifests under deploy/k8s: kinds and required fields, least privilege for the
node agent and the watcher's RBAC, and configuration names that the services really read.

No cluster runs here, so these checks are what stands between a typo (a selector that matches
nothing, an env name that is silently ignored, a capability left in) and an operator's cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.settings import ConfigError, load_settings
from tests.deploy.helpers import (
    AGENT_NAMESPACE,
    K8S_DIR,
    NAMESPACE,
    SECRETS_DIR,
    by_name,
    component_args,
    containers,
    is_setting,
    manifest_files,
    manifests,
    of_kind,
    pod_template,
    secret_setting_names,
    secret_templates,
    settings_for,
    workloads,
)

API_VERSIONS = {
    "Namespace": "v1",
    "ConfigMap": "v1",
    "Secret": "v1",
    "Service": "v1",
    "ServiceAccount": "v1",
    "Deployment": "apps/v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "PriorityClass": "scheduling.k8s.io/v1",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
AGENT = ("DaemonSet", "gpulens-agent")
WATCHER = ("Deployment", "gpulens-watcher")
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
PROGRESS_DIR = "/var/run/gpulens"

# What the watcher may do, and nothing else: read pods, nodes and events (both event APIs), and
# Kueue's workloads (queued demand).
ALLOWED_RBAC = {"": {"pods", "nodes", "events"}, "events.k8s.io": {"events"}, "kueue.x-k8s.io": {"workloads"}}
ALLOWED_VERBS = {"get", "list", "watch"}


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return manifests()


@pytest.fixture(scope="module")
def agent(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_name(docs, *AGENT)


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = pod_template(workload)["spec"]
    return spec


def _name(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


# --------------------------------------------------------------------------- structure


def test_every_manifest_parses_with_known_kind_api_version_and_name(docs: list[dict[str, Any]]) -> None:
    assert docs, "deploy/k8s holds no manifests"
    for doc in docs + secret_templates():
        kind = doc.get("kind")
        assert kind in API_VERSIONS, f"unexpected kind {kind!r}"
        assert doc.get("apiVersion") == API_VERSIONS[kind], f"{kind}: apiVersion {doc.get('apiVersion')!r}"
        assert doc.get("metadata", {}).get("name"), f"{kind} without metadata.name"
        if kind not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") in (NAMESPACE, AGENT_NAMESPACE), f"{_name(doc)}: namespace"
    names = [(doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace")) for doc in docs]
    assert len(names) == len(set(names)), "duplicate kind/name in one namespace of deploy/k8s"


def test_pod_security_is_restricted_except_in_the_agents_own_namespace(docs: list[dict[str, Any]]) -> None:
    """Only the node agent needs more than "restricted" (hostPID, hostPath): it runs alone in a
    namespace enforcing "privileged"; the rest runs where "restricted" is enforced."""
    namespaces = {ns["metadata"]["name"]: ns["metadata"]["labels"] for ns in of_kind(docs, "Namespace")}
    assert namespaces[NAMESPACE]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert namespaces[AGENT_NAMESPACE]["pod-security.kubernetes.io/enforce"] == "privileged"
    placed = {(w["kind"], w["metadata"]["name"]): w["metadata"]["namespace"] for w in workloads(docs)}
    assert [name for name, ns in placed.items() if ns == AGENT_NAMESPACE] == [AGENT]
    # what the agent reads exists in its namespace, the same as the rest's copy
    for name in ("gpulens-common",):
        assert by_name(docs, "ConfigMap", name, AGENT_NAMESPACE)["data"] == \
            by_name(docs, "ConfigMap", name, NAMESPACE)["data"], f"the two {name} copies differ"
    agent_secrets = {t["metadata"]["name"] for t in secret_templates() if t["metadata"]["namespace"] == AGENT_NAMESPACE}
    assert {"gpulens-kafka-agent", "gpulens-kafka-tls"} <= agent_secrets
    for policy in ("gpulens-default-deny", "gpulens-allow-dns"):
        assert {p["metadata"]["namespace"] for p in of_kind(docs, "NetworkPolicy")
                if p["metadata"]["name"] == policy} == {NAMESPACE, AGENT_NAMESPACE}


def test_kustomization_applies_every_manifest_and_no_secret_template() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    resources = kustomization["resources"]
    assert sorted(resources) == sorted(path.name for path in manifest_files()), (
        "kustomization.yaml must list exactly the manifests in deploy/k8s"
    )
    assert not any(str(resource).startswith("secrets") for resource in resources), (
        "secret templates must not be applied by kustomize (it would overwrite real credentials)"
    )
    assert "namespace" not in kustomization, "a global namespace would move the agent out of its own namespace"
    assert {"namespace.yaml", "agent-daemonset.yaml", "watcher.yaml"} <= set(resources)


def test_every_component_has_a_workload(docs: list[dict[str, Any]]) -> None:
    commands = {
        component_args(pod_template(w)["spec"]["containers"][0])[0] for w in workloads(docs)
    }
    assert {"agent", "watch", "worker", "sink", "topics", "alerts"} <= commands
    assert by_name(docs, *WATCHER)["spec"]["replicas"] == 1, "two watchers would emit every change twice"


def test_selectors_match_template_labels_and_containers_are_complete(docs: list[dict[str, Any]]) -> None:
    for workload in workloads(docs):
        template = pod_template(workload)
        labels = template["metadata"]["labels"]
        if workload["kind"] != "Job":
            selector = workload["spec"]["selector"]["matchLabels"]
            assert selector, f"{_name(workload)}: empty selector"
            assert selector.items() <= labels.items(), f"{_name(workload)}: selector does not match template labels"
        for container in containers(template["spec"]):
            where = f"{_name(workload)}/{container.get('name')}"
            assert container.get("name") and container.get("image"), f"{where}: name and image required"
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(part, {})), f"{where}: {part} for cpu and memory"


def test_services_select_a_workload_and_target_a_named_port(docs: list[dict[str, Any]]) -> None:
    services = of_kind(docs, "Service")
    assert services
    for service in services:
        selector = service["spec"]["selector"]
        matches = [w for w in workloads(docs) if selector.items() <= pod_template(w)["metadata"]["labels"].items()]
        assert matches, f"{_name(service)} selects no pod"
        for port in service["spec"]["ports"]:
            for workload in matches:
                port_names = {p.get("name") for c in containers(_pod_spec(workload)) for p in c.get("ports", [])}
                assert port["targetPort"] in port_names, f"{_name(service)} targets an unknown port"


# --------------------------------------------------------------------------- least privilege


def test_no_container_is_privileged_or_keeps_capabilities(docs: list[dict[str, Any]]) -> None:
    for workload in workloads(docs):
        spec = _pod_spec(workload)
        assert not spec.get("hostNetwork"), f"{_name(workload)} uses the host network"
        assert not spec.get("hostIPC"), f"{_name(workload)} uses the host IPC namespace"
        pod_security = spec.get("securityContext", {})
        assert pod_security.get("seccompProfile", {}).get("type") == "RuntimeDefault", _name(workload)
        for container in containers(spec):
            where = f"{_name(workload)}/{container['name']}"
            security = container.get("securityContext", {})
            assert security.get("privileged") is not True, f"{where} is privileged"
            assert security.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation"
            assert security.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem"
            capabilities = security.get("capabilities", {})
            assert capabilities.get("drop") == ["ALL"], f"{where} must drop ALL capabilities"
            assert not capabilities.get("add"), f"{where} adds capabilities {capabilities.get('add')}"
            assert "SYS_ADMIN" not in str(container), f"{where} mentions SYS_ADMIN"


def test_pods_run_as_non_root_except_the_agent_with_its_reason(
    docs: list[dict[str, Any]], agent: dict[str, Any]
) -> None:
    for workload in workloads(docs):
        if workload is agent:
            continue
        spec = _pod_spec(workload)
        assert spec["securityContext"].get("runAsNonRoot") is True, f"{_name(workload)} must run as non-root"
        assert spec["securityContext"].get("runAsUser", 0) != 0
    agent_spec = _pod_spec(agent)
    if agent_spec["securityContext"].get("runAsNonRoot") is not True:
        reason = pod_template(agent)["metadata"]["annotations"].get("gpulens.io/run-as-root-reason", "")
        assert "socket" in reason, "the agent runs as root: document why (gpulens.io/run-as-root-reason)"


def test_service_account_tokens_only_where_the_api_is_used(docs: list[dict[str, Any]]) -> None:
    for workload in workloads(docs):
        spec = _pod_spec(workload)
        if (workload["kind"], workload["metadata"]["name"]) == WATCHER:
            assert spec["serviceAccountName"] == "gpulens-watcher"
            continue
        assert spec.get("automountServiceAccountToken") is False, f"{_name(workload)} mounts an API token"
        assert spec.get("serviceAccountName", "default") == "default", f"{_name(workload)} uses the watcher's account"


def test_agent_daemonset_least_privilege(agent: dict[str, Any]) -> None:
    template = pod_template(agent)
    spec = template["spec"]
    (container,) = spec["containers"]

    # host PID, with the reason documented next to it
    assert spec["hostPID"] is True
    reason = template["metadata"]["annotations"]["gpulens.io/host-pid-reason"]
    assert "/proc/<pid>/cgroup" in reason and "pod" in reason

    # GPU access through the NVIDIA runtime, not privileged mode
    assert spec.get("runtimeClassName") == "nvidia"
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"

    # the pod-resources directory, read-only; the progress socket's directory; no other host path
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert sorted(host_paths.values()) == sorted([POD_RESOURCES, PROGRESS_DIR]), f"unexpected host paths {host_paths}"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"] if m["name"] in host_paths}
    assert mounts[POD_RESOURCES].get("readOnly") is True, "pod-resources must be mounted read-only"
    assert not mounts[PROGRESS_DIR].get("readOnly"), "the agent creates its progress socket there"
    from common.settings import AgentSettings
    assert Path(AgentSettings.model_fields["progress_socket"].default).parent == Path(PROGRESS_DIR)

    # node name from the downward API, under both names the agent reads
    for name in ("NODE_NAME", "GPULENS_NODE_NAME"):
        assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", name

    # GPU nodes only, tolerating their taints
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    toleration_keys = {t.get("key") for t in spec["tolerations"]}
    assert "nvidia.com/gpu" in toleration_keys
    assert all(t.get("operator") == "Exists" for t in spec["tolerations"] if t.get("key") == "nvidia.com/gpu")

    assert spec["automountServiceAccountToken"] is False
    limits = container["resources"]["limits"]
    assert limits["cpu"] and limits["memory"]

    # metrics endpoint announced for scraping
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"


# --------------------------------------------------------------------------- RBAC


def test_rbac_is_read_only_on_pods_nodes_and_events(docs: list[dict[str, Any]]) -> None:
    assert not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding")
    (role,) = of_kind(docs, "ClusterRole")
    granted: set[tuple[str, str]] = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule fields {sorted(rule)}"
        assert set(rule["verbs"]) <= ALLOWED_VERBS, f"verbs beyond get/list/watch: {rule['verbs']}"
        for group in rule["apiGroups"]:
            assert group in ALLOWED_RBAC, f"API group {group!r} not allowed"
            for resource in rule["resources"]:
                assert resource in ALLOWED_RBAC[group], f"{group or 'core'}/{resource} not allowed"
                granted.add((group, resource))
    wanted = {(group, resource) for group, resources in ALLOWED_RBAC.items() for resource in resources}
    assert granted == wanted, f"the watcher needs exactly {sorted(wanted)}, got {sorted(granted)}"

    (binding,) = of_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"],
    }
    (subject,) = binding["subjects"]
    account = by_name(docs, "ServiceAccount", subject["name"])
    assert subject["kind"] == "ServiceAccount" and subject["namespace"] == account["metadata"]["namespace"]
    assert _pod_spec(by_name(docs, *WATCHER))["serviceAccountName"] == subject["name"]


# --------------------------------------------------------------------------- configuration


def _container_env(docs: list[dict[str, Any]], container: dict[str, Any], namespace: str) -> dict[str, str]:
    """The container's effective environment as the service would see it in its namespace (secrets from
    templates)."""
    templates = {t["metadata"]["name"]: t["stringData"] for t in secret_templates()
                 if t["metadata"]["namespace"] == namespace}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        env.update(by_name(docs, "ConfigMap", name, namespace)["data"])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            assert ref["name"] in templates, f"Secret {ref['name']} has no template in {SECRETS_DIR}"
            assert ref["key"] in templates[ref["name"]], f"Secret {ref['name']} has no key {ref['key']}"
            env[item["name"]] = templates[ref["name"]][ref["key"]]
        elif "fieldRef" in item["valueFrom"]:
            env[item["name"]] = "gpu-node-1"
    return env


def test_every_gpulens_env_name_is_a_setting_of_its_service(docs: list[dict[str, Any]]) -> None:
    checked = 0
    for workload in workloads(docs):
        for container in containers(_pod_spec(workload)):
            settings_type = settings_for(component_args(container))
            for name in _container_env(docs, container, workload["metadata"]["namespace"]):
                if name.startswith("GPULENS_"):
                    checked += 1
                    assert is_setting(settings_type, name), (
                        f"{_name(workload)}: {name} is not a setting of {settings_type.__name__} "
                        "(pydantic-settings would silently ignore it)"
                    )
    assert checked > 20


def test_every_service_accepts_its_configuration(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for workload in workloads(docs):
        for container in containers(_pod_spec(workload)):
            settings_type = settings_for(component_args(container))
            with monkeypatch.context() as patch:
                for name in list(os.environ):
                    if name.startswith("GPULENS_") or name == "NODE_NAME":
                        patch.delenv(name)
                for name, value in _container_env(docs, container, workload["metadata"]["namespace"]).items():
                    patch.setenv(name, value)
                try:
                    settings = load_settings(settings_type)
                except ConfigError as exc:
                    pytest.fail(f"{_name(workload)}: {exc}")
            assert settings.metrics_port > 0, f"{_name(workload)}: metrics endpoint disabled"
            if settings_type.__name__ == "AgentSettings":
                assert getattr(settings, "node_name", None) == "gpu-node-1"
            if settings_type.__name__ == "SinkSettings":
                assert settings.clickhouse.url.startswith("http"), "the sink must write to a ClickHouse server"


def test_credentials_only_from_secrets(docs: list[dict[str, Any]]) -> None:
    from common.settings import SinkSettings

    secret_names = secret_setting_names(SinkSettings)
    assert "GPULENS_KAFKA__SASL_PASSWORD" in secret_names
    for config_map in of_kind(docs, "ConfigMap"):
        leaked = secret_names & set(config_map["data"])
        assert not leaked, f"{_name(config_map)} holds credentials {leaked}; use a Secret"
    for workload in workloads(docs):
        for container in containers(_pod_spec(workload)):
            for item in container.get("env", []):
                if item["name"] in secret_names:
                    assert "secretKeyRef" in item.get("valueFrom", {}), f"{_name(workload)}: {item['name']} inline"
    for template in secret_templates():
        for key, value in template["stringData"].items():
            assert "CHANGE_ME" in value, f"secret template {template['metadata']['name']}/{key} holds a real value"
    assert not of_kind(docs, "Secret"), "Secrets belong in deploy/k8s/secrets/ templates, not in the applied set"


def test_metrics_port_agrees_everywhere(docs: list[dict[str, Any]]) -> None:
    common = by_name(docs, "ConfigMap", "gpulens-common", NAMESPACE)
    port = int(common["data"]["GPULENS_METRICS_PORT"])
    for workload in workloads(docs):
        if workload["kind"] == "Job":
            continue
        template = pod_template(workload)
        assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port), _name(workload)
        for container in containers(template["spec"]):
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            assert ports.get("metrics") == port, f"{_name(workload)}: containerPort metrics != {port}"
            env = _container_env(docs, container, workload["metadata"]["namespace"])
            if "GPULENS_WEB_PORT" in env:
                assert ports.get("web") == int(env["GPULENS_WEB_PORT"]), f"{_name(workload)}: web port"
    for service in of_kind(docs, "Service"):
        assert [p["port"] for p in service["spec"]["ports"] if p["name"] == "metrics"] == [port]


def test_worker_stages_and_scaling(docs: list[dict[str, Any]]) -> None:
    stages: dict[str, int] = {}
    for workload in workloads(docs):
        for container in containers(_pod_spec(workload)):
            if component_args(container)[:1] == ["worker"]:
                env = _container_env(docs, container, workload["metadata"]["namespace"])
                stages[env.get("GPULENS_STAGE", "all")] = workload["spec"]["replicas"]
    assert set(stages) == {"node", "cluster"}, f"worker stages deployed: {stages}"
    assert stages["cluster"] == 1, "the cluster stage has one key: one replica"
    from schemas.topics import GPU_SAMPLES

    assert 1 <= stages["node"] <= GPU_SAMPLES.partitions, "node-stage replicas beyond the partitions sit idle"


# --------------------------------------------------------------------------- network and scheduling


def _selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = policy["spec"]["podSelector"].get("matchLabels", {})
    return bool(wanted.items() <= labels.items())


def test_network_is_default_deny_and_each_pod_opens_only_its_metrics_port(docs: list[dict[str, Any]]) -> None:
    policies = of_kind(docs, "NetworkPolicy")
    deny = [p for p in policies if p["spec"]["podSelector"] == {}
            and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"} and not p["spec"].get("ingress")
            and not p["spec"].get("egress")]
    assert deny, "no default-deny NetworkPolicy for the namespace"
    for workload in workloads(docs):
        template = pod_template(workload)
        labels = template["metadata"]["labels"]
        own = [p for p in policies if p["spec"]["podSelector"].get("matchLabels") and _selects(p, labels)]
        assert len(own) == 1, f"{_name(workload)}: {len(own)} component NetworkPolicies select it (want 1)"
        port_names = {port["name"] for c in containers(template["spec"]) for port in c.get("ports", [])}
        for rule in own[0]["spec"].get("ingress", []):
            opened = {port["port"] for port in rule["ports"]}
            assert opened == {"metrics"} and "metrics" in port_names, f"{_name(workload)} opens {opened}"
        egress_ports = {port["port"] for rule in own[0]["spec"]["egress"] for port in rule["ports"]}
        assert 9092 in egress_ports, f"{_name(workload)} cannot reach Kafka"
        command = component_args(pod_template(workload)["spec"]["containers"][0])[0]
        assert (443 in egress_ports) == (command in ("watch", "alerts")), f"{_name(workload)}: HTTPS egress"
        assert (8123 in egress_ports) == (command == "sink"), f"{_name(workload)}: ClickHouse egress"


def test_agent_has_its_priority_class_and_optional_extra_tolerations(
    docs: list[dict[str, Any]], agent: dict[str, Any]
) -> None:
    spec = _pod_spec(agent)
    priority = by_name(docs, "PriorityClass", spec["priorityClassName"])
    assert 0 < priority["value"] < 1_000_000_000 and not priority["globalDefault"], "must stay below system-*"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    component_dir = K8S_DIR / "components" / "agent-tolerations"
    component = yaml.safe_load((component_dir / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    (patch,) = component["patches"]
    assert patch["target"] == {"kind": "DaemonSet", "name": agent["metadata"]["name"]}
    operations = yaml.safe_load((component_dir / patch["path"]).read_text())
    assert operations == [{"op": "add", "path": "/spec/template/spec/tolerations/-", "value": {"operator": "Exists"}}]


def _json_patch_add(doc: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply kustomize's JSON-patch ``add`` operations (the only ones the components use)."""
    import copy

    doc = copy.deepcopy(doc)
    for operation in operations:
        assert operation["op"] in ("add", "replace")
        *parents, last = operation["path"].strip("/").split("/")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if last == "-":
            assert operation["op"] == "add"
            node.append(operation["value"])
        else:
            if operation["op"] == "replace":
                assert last in node, f"replace of a missing {operation['path']}"
            node[last] = operation["value"]
    return doc


def _apply_component(docs: list[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    """The documents a kustomize Component under deploy/k8s/components patches, by kind, patched."""
    component_dir = K8S_DIR / "components" / name
    component = yaml.safe_load((component_dir / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    patched: dict[str, dict[str, Any]] = {}
    for patch in component["patches"]:
        target = patch["target"]
        doc = by_name(docs, target["kind"], target["name"], target.get("namespace"))
        patched[target["kind"]] = _json_patch_add(doc, yaml.safe_load((component_dir / patch["path"]).read_text()))
    return patched


def _patched_by_name(docs: list[dict[str, Any]], name: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Like :func:`_apply_component`, keyed by (kind, name) for components that patch several
    objects of one kind."""
    component_dir = K8S_DIR / "components" / name
    component = yaml.safe_load((component_dir / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    patched: dict[tuple[str, str], dict[str, Any]] = {}
    for patch in component["patches"]:
        target = patch["target"]
        doc = by_name(docs, target["kind"], target["name"], target.get("namespace"))
        patched[(target["kind"], target["name"])] = _json_patch_add(
            doc, yaml.safe_load((component_dir / patch["path"]).read_text()))
    return patched


def test_the_dcgm_exporter_component_switches_the_agents_source(
    docs: list[dict[str, Any]], agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from common.settings import AgentSettings

    patched = _apply_component(docs, "agent-dcgm-exporter")
    container = _pod_spec(patched["DaemonSet"])["containers"][0]
    assert container["name"] == "agent"
    env = {e["name"]: e for e in container["env"]}
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    for name in list(os.environ):
        if name.startswith("GPULENS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GPULENS_SOURCE", env["GPULENS_SOURCE"]["value"])
    monkeypatch.setenv("GPULENS_DCGM_URL", env["GPULENS_DCGM_URL"]["value"].replace("$(HOST_IP)", "10.0.3.7"))
    settings = load_settings(AgentSettings)
    assert (settings.source, settings.dcgm_url) == ("dcgm-exporter", "http://10.0.3.7:9400/metrics")
    ports = {p["port"] for rule in patched["NetworkPolicy"]["spec"]["egress"] for p in rule["ports"]}
    assert {9092, 9400} <= ports


def test_the_progress_udp_component_opens_the_port_on_the_nodes_ip(
    docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from common.settings import AgentSettings

    patched = _apply_component(docs, "agent-progress-udp")
    container = _pod_spec(patched["DaemonSet"])["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    for name in list(os.environ):
        if name.startswith("GPULENS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GPULENS_PROGRESS_UDP_PORT", env["GPULENS_PROGRESS_UDP_PORT"]["value"])
    port = load_settings(AgentSettings).progress_udp_port
    (udp,) = [p for p in container["ports"] if p["name"] == "progress"]
    assert (udp["containerPort"], udp["hostPort"], udp["protocol"]) == (port, port, "UDP")
    opened = [(p["protocol"], p["port"]) for rule in patched["NetworkPolicy"]["spec"]["ingress"] for p in rule["ports"]]
    assert ("UDP", port) in opened


# --------------------------------------------------------------------------- least privilege: network, metrics, Kafka


def test_the_in_cluster_egress_component_narrows_kafka_and_clickhouse_to_their_pods(
    docs: list[dict[str, Any]]
) -> None:
    """components/egress-in-cluster: every component policy's Kafka (and the sink's ClickHouse)
    egress goes to a namespace and pod selector, not to any address; the ports stay those of the
    port-only fallback in networkpolicy.yaml, which stays as it is."""
    patched = _patched_by_name(docs, "egress-in-cluster")
    component_policies = [p for p in of_kind(docs, "NetworkPolicy") if p["spec"]["podSelector"].get("matchLabels")]
    assert {("NetworkPolicy", p["metadata"]["name"]) for p in component_policies} == set(patched), (
        "the component must narrow every component policy")
    kafka_ports = {9092, 9093, 9094}
    clickhouse_ports = {8123, 8443, 9000, 9440}
    for (_kind, name), policy in patched.items():
        original = by_name(docs, "NetworkPolicy", name, policy["metadata"]["namespace"])
        before = {p["port"] for rule in original["spec"]["egress"] for p in rule["ports"]}
        after = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
        assert after == before, f"{name}: the component changes ports ({sorted(before)} -> {sorted(after)})"
        for rule in policy["spec"]["egress"]:
            ports = {p["port"] for p in rule["ports"]}
            if ports & (kafka_ports | clickhouse_ports):
                assert ports <= kafka_ports or ports <= clickhouse_ports, f"{name}: Kafka/ClickHouse ports mixed"
                peers = rule.get("to") or []
                assert peers, f"{name}: egress to {sorted(ports)} open to any destination"
                for peer in peers:
                    assert "ipBlock" not in peer
                    assert peer["namespaceSelector"]["matchLabels"] and peer["podSelector"]["matchLabels"], name
            else:
                # what cannot be selected by pod: the API server, external HTTPS webhooks
                assert ports <= {443, 6443} or rule.get("to"), f"{name}: port-only egress to {sorted(ports)}"
    # the fallback keeps working without the component: still port-only in networkpolicy.yaml
    assert all(not rule.get("to") for p in component_policies for rule in p["spec"]["egress"])


def test_metrics_listen_on_the_pod_address_in_the_cluster(docs: list[dict[str, Any]]) -> None:
    """The setting defaults to loopback; the manifests open it to the pod's addresses for Prometheus."""
    from common.settings import CommonSettings

    assert str(CommonSettings.model_fields["metrics_addr"].default) == "127.0.0.1"
    for namespace in (NAMESPACE, AGENT_NAMESPACE):
        data = by_name(docs, "ConfigMap", "gpulens-common", namespace)["data"]
        assert data["GPULENS_METRICS_ADDR"] == "0.0.0.0"
    for workload in workloads(docs):
        if workload["kind"] == "Job":
            continue
        for container in containers(_pod_spec(workload)):
            env = _container_env(docs, container, workload["metadata"]["namespace"])
            assert env.get("GPULENS_METRICS_ADDR") == "0.0.0.0", f"{_name(workload)}: Prometheus cannot scrape it"


def test_each_component_has_its_own_kafka_principal(docs: list[dict[str, Any]]) -> None:
    """One Secret, so one principal, per component: the node agent's credentials (on every GPU
    node) are not the watcher's or the workers' (docs/operations.md, "Kafka principals and ACLs")."""
    from gpulens.kafka_acls import COMPONENTS

    by_command = {"agent": "agent", "watch": "watcher", "worker": "worker", "sink": "sink", "topics": "topics",
                  "alerts": "alerts-forward"}
    templates = {(t["metadata"]["namespace"], t["metadata"]["name"]): t for t in secret_templates()}
    used: dict[str, set[str]] = {}
    for workload in workloads(docs):
        for container in containers(_pod_spec(workload)):
            component = by_command[component_args(container)[0]]
            refs = {item["name"]: item["valueFrom"]["secretKeyRef"]["name"] for item in container.get("env", [])
                    if "secretKeyRef" in item.get("valueFrom", {})
                    and item["name"].startswith("GPULENS_KAFKA__SASL_")}
            assert set(refs) == {"GPULENS_KAFKA__SASL_USERNAME", "GPULENS_KAFKA__SASL_PASSWORD"}, _name(workload)
            (secret,) = set(refs.values())
            assert secret == f"gpulens-kafka-{component}", f"{_name(workload)} reads {secret}"
            template = templates[(workload["metadata"]["namespace"], secret)]
            assert f"gpulens-{component}" in template["stringData"]["sasl-username"]
            used.setdefault(secret, set()).add(workload["metadata"]["namespace"])
    assert set(used) == {f"gpulens-kafka-{c}" for c in COMPONENTS}
    assert not any(name == "gpulens-kafka" for _ns, name in templates), "a Kafka Secret shared by every component"
