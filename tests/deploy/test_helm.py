"""The Helm chart deploy/helm/gpulens, with the real Helm and against the real kube-apiserver.

Offline: ``helm lint``; ``helm template`` with the default values and edge values (every component
off; everything on with SASL/TLS, extra env, a custom image) parsed, and the configuration each
container receives accepted by the settings model of the service it runs; bad values refused by
values.schema.json naming the field; the kustomize base deploy/k8s regenerated from the chart byte
for byte (deploy/helm/kustomize_base.py); every value documented in docs/install.md.

On the real control plane (``kube_cluster``: etcd, kube-apiserver with its default admission
plugins, PodSecurity among them, kube-controller-manager and kube-scheduler; no kubelet, so no pod
runs): ``helm install`` with the ServiceMonitor CRD present, every rendered pod template submitted
as a Pod with ``--dry-run=server`` in its namespace and admitted, the agent's template refused in
the ``restricted`` namespace, the controllers' own pods created (so admitted), RBAC as deployed
(``kubectl auth can-i --as system:serviceaccount:...``), a bad value refused at install naming the
field, ``helm upgrade`` changing objects, ``helm uninstall`` leaving none of the chart's objects;
``kubectl apply --dry-run=server`` of the kustomize base with every component.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from common.settings import ConfigError, Thresholds, load_settings
from simulation.kube_local import HelmTools, LocalKube
from tests.conftest import REPO_ROOT
from tests.deploy.helpers import (
    component_args,
    containers,
    is_setting,
    pod_template,
    settings_for,
    wait_for,
    workloads,
)

CHART = REPO_ROOT / "deploy" / "helm" / "gpulens"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
INSTALL_DOC = REPO_ROOT / "docs" / "install.md"
Obj = dict[str, Any]
Helm = Callable[..., subprocess.CompletedProcess[str]]

# The release the cluster tests install: its own namespaces and cluster-scoped names, so it never
# meets the objects other tests of the shared control plane make.
RELEASE = "gl-chart"
MAIN = "gl-chart"
AGENT = "gl-chart-agent"
PRIORITY_CLASS = "gl-chart-node-agent"
CLUSTER_VALUES: Obj = {
    "clusterName": "gl-test",
    "namespaces": {"main": MAIN, "agent": AGENT},
    "agent": {"priorityClass": {"name": PRIORITY_CLASS}},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "kafka": {"securityProtocol": "SASL_SSL", "saslMechanism": "SCRAM-SHA-512", "tls": {"caKey": "ca.crt"}},
}

EVERYTHING_ON: Obj = {
    "clusterName": "edge-1",
    "image": {"repository": "registry.internal/ml/gpulens", "agentRepository": "registry.internal/ml/gpulens-agent",
              "tag": "9.9.9-rc1", "pullPolicy": "Always", "pullSecrets": ["regcred"]},
    "kafka": {"bootstrapServers": "b-1.kafka.internal:9096,b-2.kafka.internal:9096", "securityProtocol": "SASL_SSL",
              "saslMechanism": "SCRAM-SHA-512", "topicPrefix": "fleet-a",
              "tls": {"secretName": "kafka-ca", "caKey": "ca.crt", "certificateKey": "tls.crt", "keyKey": "tls.key"}},
    "thresholds": {"idle_util_pct": 3, "idle_after_s": 900},
    # Helm merges maps with the defaults: null drops a default model
    "prices": {"NVIDIA H200": 6.5, "NVIDIA A100-SXM4-80GB": None, "NVIDIA H100 80GB HBM3": None, "NVIDIA L4": None},
    "extraEnv": [{"name": "GPULENS_LOG_FORMAT", "value": "text"}],
    "agent": {"source": "dcgm-exporter", "progressUdp": {"enabled": True},
              "extraEnv": [{"name": "GPULENS_SAMPLE_INTERVAL_S", "value": "5"}]},
    "watcher": {"namespaces": ["ml", "research"]},
    "workers": {"node": {"replicas": 6}, "extraEnv": [{"name": "GPULENS_NODE_INPUT_PARTITIONS", "value": "24"}]},
    "sink": {"replicas": 4},
    "serviceMonitor": {"enabled": True},
    "networkPolicies": {"inCluster": {"enabled": True}},
}
EVERYTHING_OFF: Obj = {component: {"enabled": False}
                       for component in ("agent", "watcher", "workers", "sink", "alertsForward", "topics")}
KAFKA_SECRET_OF = {"agent": "agent", "watch": "watcher", "worker": "workers", "sink": "sink",
                   "alerts": "alertsForward", "topics": "topics"}
"""The gpulens command a container runs -> the values section holding its Kafka principal's Secret."""


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def helm(helm_tools: HelmTools, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """Helm without a cluster (lint, template), its state in a scratch directory."""
    state = tmp_path_factory.mktemp("helm-offline")
    env = {**os.environ, "HELM_CACHE_HOME": str(state / "cache"), "HELM_CONFIG_HOME": str(state / "config"),
           "HELM_DATA_HOME": str(state / "data"), "KUBECONFIG": str(state / "no-kubeconfig")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(helm_tools.helm), *args], capture_output=True, text=True, env=env, timeout=120,
                              check=False)

    return run


def values_file(directory: Path, values: Obj, name: str = "values.yaml") -> str:
    path = directory / name
    path.write_text(yaml.safe_dump(values))
    return str(path)


def template(helm: Helm, tmp_path: Path,
             values: Obj | None = None) -> list[Obj]:
    args = ["template", "gpulens", str(CHART), "--namespace", "default"]
    if values is not None:
        args += ["--values", values_file(tmp_path, values)]
    done = helm(*args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(docs: list[Obj], kind: str) -> list[Obj]:
    return [doc for doc in docs if doc["kind"] == kind]


def find(docs: list[Obj], kind: str, name: str) -> Obj:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container_env(docs: list[Obj], container: Obj, namespace: str, secrets: dict[str, str]) -> dict[str, str]:
    """What a container's process sees: its ConfigMaps, then its env (later wins, as in a pod);
    secretKeyRefs from ``secrets`` by key, downward-API fields as a kubelet fills them."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        (config_map,) = [d for d in by_kind(docs, "ConfigMap")
                         if d["metadata"]["name"] == name and d["metadata"]["namespace"] == namespace]
        env.update(config_map["data"])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
        elif "secretKeyRef" in item["valueFrom"]:
            env[item["name"]] = secrets[item["valueFrom"]["secretKeyRef"]["key"]]
        else:
            env[item["name"]] = {"spec.nodeName": "gpu-node-1",
                                 "status.hostIP": "10.0.3.7"}[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def load_installed_kustomize_base() -> ModuleType:
    """deploy/helm/kustomize_base.py, the generator of deploy/k8s (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("kustomize_base", CHART.parent / "kustomize_base.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def pod_from_template(workload: Obj, namespace: str | None = None) -> Obj:
    """The Pod a controller would make from the workload's template, named after the workload."""
    template = pod_template(workload)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{workload['metadata']['name']}-dry-run",
                         "namespace": namespace or workload["metadata"]["namespace"],
                         "labels": template["metadata"].get("labels", {}),
                         "annotations": template["metadata"].get("annotations", {})},
            "spec": template["spec"]}


def enforced(kube: LocalKube, namespace: str) -> None:
    """Wait until PodSecurity enforces ``restricted`` in ``namespace`` (admission reads namespace
    labels from a cache, which a new namespace reaches a moment after it is created)."""
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": namespace},
             "spec": {"containers": [{"name": "c", "image": "probe", "securityContext": {"privileged": True}}]}}

    def refused() -> bool:
        done = kube.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(probe), check=False)
        return "violates PodSecurity" in done.stderr

    wait_for(f"PodSecurity enforcing in {namespace}", refused, timeout_s=30)




# --------------------------------------------------------------------------- offline: lint, template, schema


def test_helm_lint_passes_strict_with_default_and_edge_values(
        helm: Helm, tmp_path: Path) -> None:
    for values in (None, EVERYTHING_ON, EVERYTHING_OFF):
        args = ["lint", "--strict", str(CHART)]
        if values is not None:
            args += ["--values", values_file(tmp_path, values)]
        done = helm(*args)
        assert done.returncode == 0, f"{values}: {done.stdout}{done.stderr}"
        assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_the_kustomize_base_is_the_chart_rendered_with_its_defaults(helm_tools: HelmTools) -> None:
    """One source of truth: deploy/k8s is generated from the chart; a hand edit there, or a chart
    change without regenerating, fails here with the files that differ."""
    generator = load_installed_kustomize_base()
    problems = generator.differences(helm_tools.helm)
    assert not problems, ("deploy/k8s differs from the chart; run `python deploy/helm/kustomize_base.py`:\n"
                          + "\n".join(problems))


def test_default_rendering_has_every_component_no_hook_and_pod_security_labels(
        helm: Helm, tmp_path: Path) -> None:
    docs = template(helm, tmp_path)
    commands = sorted(component_args(pod_template(w)["spec"]["containers"][0])[0] for w in workloads(docs))
    assert commands == ["agent", "alerts", "sink", "topics", "watch", "worker", "worker"]
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpulens", doc["metadata"]["name"]
        # nothing an install waits for: no hook (a pre/post-install Job would hang `--wait` without Kafka)
        assert not any(key.startswith("helm.sh/hook") for key in doc["metadata"].get("annotations", {}))
    namespaces = {ns["metadata"]["name"]: ns["metadata"]["labels"] for ns in by_kind(docs, "Namespace")}
    assert namespaces["gpulens"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert namespaces["gpulens-agent"]["pod-security.kubernetes.io/enforce"] == "privileged"
    (job,) = by_kind(docs, "Job")
    assert re.fullmatch(r"gpulens-topics-[0-9a-f]{10}", job["metadata"]["name"])
    assert not by_kind(docs, "ServiceMonitor"), "the ServiceMonitor needs the operator's CRD: off by default"


def test_every_component_off_leaves_only_the_namespace_and_its_network_baseline(
        helm: Helm, tmp_path: Path) -> None:
    docs = template(helm, tmp_path, EVERYTHING_OFF)
    assert not workloads(docs)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ConfigMap", "gpulens-common"), ("Namespace", "gpulens"),
        ("NetworkPolicy", "gpulens-allow-dns"), ("NetworkPolicy", "gpulens-default-deny")]


def test_everything_on_with_sasl_tls_extra_env_and_a_custom_image(
        helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every container gets its own component's Kafka principal (required, not optional, under
    SASL), the TLS files, the custom image and pull secret, the extra env last; and the service it
    runs accepts the whole environment (a GPULENS_* name no setting reads would be ignored)."""
    docs = template(helm, tmp_path, EVERYTHING_ON)
    secrets = {"sasl-username": "u", "sasl-password": "p", "url": "https://gpulens:pw@clickhouse.internal:8443/gpulens"}
    seen = set()
    for workload in workloads(docs):
        namespace = workload["metadata"]["namespace"]
        spec = pod_template(workload)["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert {"name": "kafka-tls", "secret": {"secretName": "kafka-ca", "optional": True}} in spec["volumes"]
        for container in containers(spec):
            command = component_args(container)[0]
            seen.add(command)
            repository = "gpulens-agent" if command == "agent" else "gpulens"
            assert container["image"] == f"registry.internal/ml/{repository}:9.9.9-rc1"
            assert container["imagePullPolicy"] == "Always"
            refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]
                    if e["name"].startswith("GPULENS_KAFKA__SASL_")}
            section = KAFKA_SECRET_OF[command]
            default_secret = yaml.safe_load((CHART / "values.yaml").read_text())[section]["kafkaSecret"]
            assert {ref["name"] for ref in refs.values()} == {default_secret}
            assert all(ref["optional"] is False for ref in refs.values()), f"{command}: SASL credentials optional"
            extra = ["GPULENS_LOG_FORMAT", *(e["name"] for e in EVERYTHING_ON.get(section, {}).get("extraEnv", []))]
            assert [e["name"] for e in container["env"]][-len(extra):] == extra, "extra env: chart-wide, then own, last"
            env = container_env(docs, container, namespace, secrets)
            assert env["GPULENS_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL"
            assert env["GPULENS_KAFKA__SSL_CA_LOCATION"] == "/etc/gpulens/kafka-tls/ca.crt"
            assert env["GPULENS_LOG_FORMAT"] == "text"
            settings_type = settings_for(component_args(container))
            for name in env:
                if name.startswith("GPULENS_"):
                    assert is_setting(settings_type, name), f"{command}: {name} is not a setting"
            with monkeypatch.context() as patch:
                for name in list(os.environ):
                    if name.startswith("GPULENS_"):
                        patch.delenv(name)
                for name, value in env.items():
                    patch.setenv(name, value)
                try:
                    settings: Any = load_settings(settings_type)
                except ConfigError as exc:
                    pytest.fail(f"{command}: {exc}")
            assert settings.kafka.sasl_mechanism == "SCRAM-SHA-512"
            assert str(settings.kafka.ssl_key_location) == "/etc/gpulens/kafka-tls/tls.key"
            assert settings.topic_prefix == "fleet-a"
            if command == "agent":
                assert (settings.source, settings.dcgm_url) == ("dcgm-exporter", "http://10.0.3.7:9400/metrics")
                assert settings.progress_udp_port == 9477 and settings.sample_interval_s == 5
            if command == "worker":
                assert settings.thresholds.idle_util_pct == 3 and settings.thresholds.idle_after == 900
                assert settings.node_input_partitions == 24
                assert settings.prices_usd_per_gpu_hour == {"NVIDIA H200": 6.5}
    assert seen == {"agent", "watch", "worker", "sink", "alerts", "topics"}
    assert find(docs, "Deployment", "gpulens-worker-node")["spec"]["replicas"] == 6
    assert find(docs, "Deployment", "gpulens-sink")["spec"]["replicas"] == 4
    assert by_kind(docs, "ServiceMonitor")
    for policy in by_kind(docs, "NetworkPolicy"):
        for rule in policy["spec"].get("egress", []):
            if {p["port"] for p in rule["ports"]} & {9092, 8123}:
                assert rule["to"][0]["podSelector"]["matchLabels"], policy["metadata"]["name"]


BAD_VALUES = [
    pytest.param({"workers": {"node": {"replicas": "x"}}}, "/workers/node/replicas", id="replicas-not-a-number"),
    pytest.param({"sink": {"replica": 3}}, "replica", id="unknown-key"),
    pytest.param({"kafka": {"securityProtocol": "TLS"}}, "/kafka/securityProtocol", id="wrong-enum"),
    pytest.param({"watcher": {"replicas": 2}}, "/watcher/replicas", id="two-watchers"),
    pytest.param({"clusterName": "Prod_1"}, "/clusterName", id="cluster-not-a-dns-label"),
    pytest.param({"thresholds": {"idle_pct": 3}}, "idle_pct", id="unknown-threshold"),
    pytest.param({"thresholds": {"idle_util_pct": 150}}, "/thresholds/idle_util_pct", id="threshold-out-of-bounds"),
    pytest.param({"kafka": {"bootstrapServers": "kafka.internal"}}, "/kafka/bootstrapServers",
                 id="server-without-port"),
    pytest.param({"extraEnv": [{"value": "x"}]}, "/extraEnv/0", id="env-without-name"),
]


@pytest.mark.parametrize(("values", "field"), BAD_VALUES)
def test_a_bad_value_fails_naming_the_field(helm: Helm, tmp_path: Path,
                                            values: Obj, field: str) -> None:
    done = helm("template", "gpulens", str(CHART), "--values", values_file(tmp_path, values))
    assert done.returncode != 0, f"{values} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert field in done.stderr, done.stderr


def test_installing_into_a_namespace_the_chart_creates_is_refused_with_the_way_out(
        helm: Helm) -> None:
    done = helm("template", "gpulens", str(CHART), "--namespace", "gpulens")
    assert done.returncode != 0
    assert "namespaces.create" in done.stderr and "helm install -n default" in done.stderr


def test_the_schema_thresholds_are_the_settings_thresholds() -> None:
    """values.schema.json repeats the thresholds' names and bounds of common/settings.py (Thresholds)
    so that a typo fails at install; this keeps the two equal."""
    expected: Obj = {}
    for name in Thresholds.names():
        bounds = Thresholds.bounds(name)
        rule: Obj = {"type": "number", "minimum": bounds.low, "description": f"({bounds.unit})"}
        if bounds.high is not None:
            rule["maximum"] = bounds.high
        expected[name] = rule
        if name in Thresholds.durations():
            expected[f"{name}_s"] = dict(rule)
    schema = SCHEMA["properties"]["thresholds"]
    assert schema["additionalProperties"] is False
    assert schema["properties"] == expected, json.dumps(expected, indent=2)


def _value_paths(schema: Obj, prefix: str = "", depth: int = 2) -> Iterator[str]:
    for key, sub in schema.get("properties", {}).items():
        if key == "global":
            continue
        path = f"{prefix}{key}"
        yield path
        if depth > 1 and sub.get("type") == "object" and key not in ("thresholds", "prices"):
            yield from _value_paths(sub, f"{path}.", depth - 1)


def test_every_value_is_documented_in_install_md() -> None:
    """Every top-level value and each of its keys has a row in docs/install.md, "Values"."""
    text = INSTALL_DOC.read_text()
    section = text[text.index("## Values"):]
    section = section[:section.index("\n## ", 3)]
    missing = [path for path in _value_paths(SCHEMA) if f"`{path}`" not in section]
    assert not missing, f"values not documented in docs/install.md: {missing}"
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) == set(SCHEMA["properties"]) - {"global"}, "values.yaml and the schema name other keys"


# --------------------------------------------------------------------------- the real control plane


def kubectl_json(kube: LocalKube, *args: str) -> Obj:
    result: Obj = json.loads(kube.kubectl(*args, "-o", "json").stdout)
    return result


def manifest_objects(kube: LocalKube) -> list[Obj]:
    done = kube.helm("get", "manifest", RELEASE, "-n", "default")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def object_ref(doc: Obj) -> list[str]:
    """``kubectl get`` arguments naming exactly this object: kind.group, name, namespace."""
    group, _, _version = doc["apiVersion"].rpartition("/")
    ref = [f"{doc['kind'].lower()}.{group}" if group else doc["kind"].lower(), doc["metadata"]["name"]]
    if doc["metadata"].get("namespace"):
        ref += ["-n", doc["metadata"]["namespace"]]
    return ref


def remaining(kube: LocalKube, docs: list[Obj]) -> list[str]:
    """The objects of ``docs`` still there (a Namespace being deleted counts as gone: only the
    controller-manager's namespace controller finishes it)."""
    left = []
    for doc in docs:
        done = kube.kubectl("get", *object_ref(doc), "-o", "json", check=False)
        if done.returncode != 0:
            assert "NotFound" in done.stderr, done.stderr
            continue
        if doc["kind"] == "Namespace" and json.loads(done.stdout)["metadata"].get("deletionTimestamp"):
            continue
        left.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return left


@pytest.fixture(scope="module")
def cluster(kube_cluster: LocalKube, helm_tools: HelmTools) -> LocalKube:
    """The shared control plane with what a GPU cluster with the Prometheus Operator has: the
    ServiceMonitor CRD and the ``nvidia`` RuntimeClass (the GPU Operator makes it)."""
    kube_cluster.apply_crd(helm_tools.servicemonitor_crd)
    kube_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}))
    return kube_cluster


@pytest.fixture(scope="module")
def installed(cluster: LocalKube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Obj]:
    """The chart installed as release gl-chart (its record in namespace default), SASL/TLS and the
    ServiceMonitor on; uninstalled at the end if a test left it."""
    kube = cluster
    directory = tmp_path_factory.mktemp("chart-values")
    values = values_file(directory, CLUSTER_VALUES)
    started = time.monotonic()
    done = kube.helm("install", RELEASE, str(CHART), "-n", "default", "--values", values)
    enforced(kube, MAIN)
    state: Obj = {"values": values, "directory": directory, "install_output": done.stdout,
                  "install_s": time.monotonic() - started, "manifest": manifest_objects(kube)}
    yield state
    if kube.helm("status", RELEASE, "-n", "default", check=False).returncode == 0:
        kube.helm("uninstall", RELEASE, "-n", "default")


def test_install_creates_every_object_and_says_what_to_run_next(kube_cluster: LocalKube, installed: Obj) -> None:
    docs = installed["manifest"]
    missing = [f"{d['kind']}/{d['metadata']['name']}" for d in docs
               if kube_cluster.kubectl("get", *object_ref(d), check=False).returncode != 0]
    assert not missing
    monitor = kubectl_json(kube_cluster, "get", "servicemonitor", "gpulens-workers", "-n", MAIN)
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    labels = kubectl_json(kube_cluster, "get", "namespace", MAIN)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    labels = kubectl_json(kube_cluster, "get", "namespace", AGENT)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    notes = installed["install_output"]
    for command in ("gpulens check --cluster gl-test", "gpulens report --cluster gl-test", "Grafana"):
        assert command in notes, notes


def test_every_pod_template_is_admitted_by_pod_security_in_its_namespace(
        kube_cluster: LocalKube, installed: Obj) -> None:
    templates = workloads(installed["manifest"])
    assert sorted(w["kind"] for w in templates) == ["DaemonSet", "Deployment", "Deployment", "Deployment",
                                                    "Deployment", "Deployment", "Job"]
    for workload in templates:
        pod = pod_from_template(workload)
        done = kube_cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod), check=False)
        assert done.returncode == 0, f"{workload['metadata']['name']}: {done.stderr}"
        assert "created (server dry run)" in done.stdout
        assert "PodSecurity" not in done.stderr, f"{workload['metadata']['name']}: {done.stderr}"


def test_the_agents_template_is_refused_where_restricted_is_enforced(kube_cluster: LocalKube, installed: Obj) -> None:
    (agent,) = by_kind(installed["manifest"], "DaemonSet")
    pod = pod_from_template(agent, namespace=MAIN)
    # its ServiceAccount exists in its own namespace only; the namespace's default stands in, so
    # that the ServiceAccount admission passes and PodSecurity judges the pod
    del pod["spec"]["serviceAccountName"]
    done = kube_cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod), check=False)
    assert done.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in done.stderr, done.stderr
    for reason in ("host namespaces (hostPID=true)", "restricted volume type \"hostPath\"", "runAsUser=0"):
        assert reason in done.stderr, done.stderr


def test_the_controllers_make_the_pods_so_admission_let_them_in(kube_cluster: LocalKube, installed: Obj) -> None:
    """kube-controller-manager turns each Deployment and the Job into Pods (Pending: no kubelet),
    which PodSecurity judges as a cluster's would; a refused pod would leave its ReplicaSet short."""
    wanted = {w["metadata"]["name"]: w["spec"].get("replicas", 1) for w in workloads(installed["manifest"])
              if w["kind"] in ("Deployment", "Job")}

    def counted() -> dict[str, int] | None:
        pods = kubectl_json(kube_cluster, "get", "pods", "-n", MAIN)["items"]
        have = {name: sum(1 for p in pods if p["metadata"]["name"].startswith(name + "-")) for name in wanted}
        return have if have == wanted else None

    wait_for(f"pods {wanted}", counted)


def test_rbac_as_deployed(kube_cluster: LocalKube, installed: Obj) -> None:
    def can(verb: str, resource: str, account: str, namespace: str, *scope: str) -> str:
        done = kube_cluster.kubectl("auth", "can-i", verb, resource, *scope,
                                    f"--as=system:serviceaccount:{namespace}:{account}", check=False)
        return done.stdout.strip()

    assert can("list", "pods", "gpulens-watcher", MAIN, "-A") == "yes"
    assert can("watch", "nodes", "gpulens-watcher", MAIN) == "yes"
    assert can("get", "secrets", "gpulens-watcher", MAIN, "-A") == "no"
    assert can("get", "secrets", "gpulens-watcher", MAIN, "-n", MAIN) == "no"
    assert can("create", "pods", "gpulens-watcher", MAIN, "-A") == "no"
    # DRA (docs/dra.md): read, never write, the objects that say which GPUs nodes publish and pods hold
    for kind in ("resourceslices", "resourceclaims", "deviceclasses"):
        resource = f"{kind}.resource.k8s.io"
        assert can("list", resource, "gpulens-watcher", MAIN, "-A") == "yes"
        assert can("watch", resource, "gpulens-watcher", MAIN, "-A") == "yes"
    assert can("update", "resourceclaims.resource.k8s.io/status", "gpulens-watcher", MAIN, "-A") == "no"
    assert can("create", "resourceslices.resource.k8s.io", "gpulens-watcher", MAIN) == "no"

    def rules(*impersonate: str, namespace: str) -> str:
        return kube_cluster.kubectl("auth", "can-i", "--list", "-n", namespace, *impersonate).stdout

    # what any service account of the namespace may do through the groups every account is in
    # (system:authenticated, system:serviceaccounts[:<namespace>]): one that does not exist
    bindings = kubectl_json(kube_cluster, "get", "clusterrolebindings,rolebindings", "-A")["items"]
    for account, namespace in (("gpulens-agent", AGENT), ("gpulens-alerts-forward", MAIN), ("gpulens-sink", MAIN),
                               ("gpulens-worker", MAIN), ("gpulens-topics", MAIN)):
        kube_cluster.kubectl("get", "serviceaccount", account, "-n", namespace)
        anybody = rules(f"--as=system:serviceaccount:{namespace}:gl-chart-nobody", namespace=namespace)
        assert rules(f"--as=system:serviceaccount:{namespace}:{account}", namespace=namespace) == anybody, (
            f"{namespace}/{account} may do more than every authenticated user")
        named = [b["metadata"]["name"] for b in bindings for subject in b.get("subjects") or []
                 if subject["kind"] == "ServiceAccount" and subject["name"] == account
                 and subject.get("namespace") == namespace]
        assert not named, f"{namespace}/{account} is bound by {named}"
    for workload in workloads(installed["manifest"]):
        spec = pod_template(workload)["spec"]
        if workload["metadata"]["name"] != "gpulens-watcher":
            assert spec["automountServiceAccountToken"] is False, workload["metadata"]["name"]


def test_a_bad_value_fails_at_install_naming_the_field(kube_cluster: LocalKube, installed: Obj) -> None:
    bad = values_file(installed["directory"], {"sink": {"replicas": "two"}}, "bad.yaml")
    done = kube_cluster.helm("upgrade", RELEASE, str(CHART), "-n", "default", "--values", installed["values"],
                             "--values", bad, check=False)
    assert done.returncode != 0 and "/sink/replicas" in done.stderr, done.stderr
    done = kube_cluster.helm("install", "gl-chart-bad", str(CHART), "-n", "default", "--values", bad, check=False)
    assert done.returncode != 0 and "/sink/replicas" in done.stderr, done.stderr
    assert kube_cluster.helm("status", "gl-chart-bad", "-n", "default", check=False).returncode != 0
    history = json.loads(kube_cluster.helm("history", RELEASE, "-n", "default", "-o", "json").stdout)
    assert [entry["revision"] for entry in history] == [1], "a refused upgrade made a revision"


def test_upgrade_changes_objects_then_uninstall_leaves_none(kube_cluster: LocalKube, installed: Obj) -> None:
    before = installed["manifest"]
    (old_job,) = by_kind(before, "Job")
    changes = values_file(installed["directory"], {
        "image": {"tag": "0.2.0"}, "workers": {"node": {"replicas": 5}}, "prices": {"NVIDIA H200": 7.0},
        "serviceMonitor": {"enabled": False}, "alertsForward": {"enabled": False}}, "upgrade.yaml")
    kube_cluster.helm("upgrade", RELEASE, str(CHART), "-n", "default", "--values", installed["values"],
                      "--values", changes)
    after = manifest_objects(kube_cluster)
    node = kubectl_json(kube_cluster, "get", "deployment", "gpulens-worker-node", "-n", MAIN)
    assert node["spec"]["replicas"] == 5
    assert node["spec"]["template"]["spec"]["containers"][0]["image"] == "gpulens:0.2.0"
    prices = kubectl_json(kube_cluster, "get", "configmap", "gpulens-prices", "-n", MAIN)["data"]
    assert json.loads(prices["GPULENS_PRICES_USD_PER_GPU_HOUR"])["NVIDIA H200"] == 7.0
    (new_job,) = by_kind(after, "Job")
    assert new_job["metadata"]["name"] != old_job["metadata"]["name"], "a changed Job template keeps its name"
    dropped = [doc for doc in before if (doc["kind"], doc["metadata"]["name"]) not in
               {(d["kind"], d["metadata"]["name"]) for d in after}]
    assert {(d["kind"], d["metadata"]["name"]) for d in dropped} >= {
        ("ServiceMonitor", "gpulens-workers"), ("Deployment", "gpulens-alerts-forward"),
        ("Job", old_job["metadata"]["name"])}
    assert not remaining(kube_cluster, dropped), "an upgrade left objects the new values no longer render"

    kube_cluster.helm("uninstall", RELEASE, "-n", "default")
    left = remaining(kube_cluster, after)
    assert not left, f"helm uninstall left {left}"
    assert kube_cluster.helm("status", RELEASE, "-n", "default", check=False).returncode != 0


def test_the_kustomize_base_with_every_component_is_admitted_by_the_server(
        cluster: LocalKube, tmp_path: Path) -> None:
    """``kubectl apply --dry-run=server`` of deploy/k8s with all its components (after the
    namespaces, which a dry run cannot create for the objects inside them), and its pod templates
    as Pods: the kustomize users' path meets the same admission as the chart's."""
    k8s = REPO_ROOT / "deploy" / "k8s"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    components = sorted(p.name for p in (k8s / "components").iterdir() if p.is_dir())
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(k8s, overlay)],
        "components": [os.path.relpath(k8s / "components" / c, overlay) for c in components]}))
    rendered = cluster.kubectl("kustomize", str(overlay)).stdout
    docs = [doc for doc in yaml.safe_load_all(rendered) if doc]
    assert by_kind(docs, "ServiceMonitor") and len(components) == 5
    namespaces = by_kind(docs, "Namespace")
    # what a dry run cannot make for the others: their namespaces, the agent's PriorityClass, the
    # pods' ServiceAccounts (the watcher's RBAC stays a dry run: the control plane has its own)
    prerequisites = [*namespaces, *by_kind(docs, "PriorityClass"), *by_kind(docs, "ServiceAccount")]
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(prerequisites))
    try:
        enforced(cluster, "gpulens")
        done = cluster.kubectl("apply", "--dry-run=server", "-k", str(overlay), check=False)
        assert done.returncode == 0, done.stderr
        assert "PodSecurity" not in done.stderr, done.stderr
        for workload in workloads(docs):
            pod = pod_from_template(workload)
            done = cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod), check=False)
            assert done.returncode == 0 and "PodSecurity" not in done.stderr, done.stderr
    finally:
        for doc in [*namespaces, *by_kind(docs, "PriorityClass")]:
            cluster.kubectl("delete", *object_ref(doc), "--wait=false")
