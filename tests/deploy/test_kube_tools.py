"""The real Kubernetes tooling the chart and DRA tests stand on (``kube_cluster`` of
``tests/conftest.py``): kubectl and Helm from the Go module proxy against the real kube-apiserver,
PodSecurity admission as a cluster enforces it, prometheus-operator's ServiceMonitor CRD served,
and the real kube-controller-manager and kube-scheduler at work: controllers turn a Deployment into
Pods and the scheduler binds them to a registered Node, or says why it cannot."""

from __future__ import annotations

import json
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulation.kube_local import HELM_VERSION, KUBE_VERSION, WATCHER_USER, HelmTools, KubeApiError, LocalKube
from tests.deploy.helpers import wait_for

Obj = dict[str, Any]
TEST_TAINT = "gpulens.test/kube-tools"
"""The smoke test's Node carries this NoSchedule taint, so only its own pods (which tolerate it) go
there, never a pod another test's Deployment makes in the shared cluster."""




def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def get_json(kube: LocalKube, *args: str) -> Obj:
    result: Obj = json.loads(kube.kubectl("get", *args, "-o", "json").stdout)
    return result


def dry_run(kube: LocalKube, manifest: Obj) -> Any:
    return kube.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(manifest), check=False)


def test_kubectl_is_the_apiservers_own_release_and_reads_rbac_through_the_kubeconfigs(
        kube_cluster: LocalKube) -> None:
    versions = json.loads(kube_cluster.kubectl("version", "-o", "json").stdout)
    assert versions["clientVersion"]["gitVersion"] == f"v{KUBE_VERSION}"
    assert versions["serverVersion"]["gitVersion"] == f"v{KUBE_VERSION}"

    assert kube_cluster.kubectl("auth", "can-i", "create", "deployments", "-A").stdout.strip() == "yes"
    # the watcher's kubeconfig holds exactly the ClusterRole deploy/k8s/watcher.yaml ships
    assert kube_cluster.kubectl("auth", "can-i", "watch", "pods", "-A", user=WATCHER_USER).stdout.strip() == "yes"
    refused = kube_cluster.kubectl("auth", "can-i", "get", "secrets", "-A", user=WATCHER_USER, check=False)
    assert (refused.returncode, refused.stdout.strip()) == (1, "no")
    # the admin impersonates ServiceAccounts, as the chart's RBAC tests do
    nobody = kube_cluster.kubectl("auth", "can-i", "list", "pods", "--as=system:serviceaccount:default:nobody",
                                  check=False)
    assert (nobody.returncode, nobody.stdout.strip()) == (1, "no")


def test_helm_is_the_pinned_release_and_installs_upgrades_and_uninstalls_a_chart(
        kube_cluster: LocalKube, tmp_path: Path) -> None:
    assert kube_cluster.helm("version", "--template", "{{.Version}}").stdout == f"v{HELM_VERSION}"
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: smoke\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-greeting\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n")
    namespace, release = unique("helm-smoke"), "smoke"

    kube_cluster.helm("install", release, str(chart), "-n", namespace, "--create-namespace", "--wait",
                      "--timeout", "60s")
    assert get_json(kube_cluster, "configmap", f"{release}-greeting", "-n", namespace)["data"] == {"greeting": "hello"}
    kube_cluster.helm("upgrade", release, str(chart), "-n", namespace, "--set", "greeting=bonjour", "--wait")
    assert get_json(kube_cluster, "configmap", f"{release}-greeting", "-n", namespace)["data"] == {
        "greeting": "bonjour"}
    [listed] = json.loads(kube_cluster.helm("list", "-n", namespace, "-o", "json").stdout)
    assert (listed["name"], listed["status"], str(listed["revision"])) == (release, "deployed", "2")

    kube_cluster.helm("uninstall", release, "-n", namespace, "--wait")
    gone = kube_cluster.kubectl("get", "configmap", f"{release}-greeting", "-n", namespace, check=False)
    assert gone.returncode == 1 and "NotFound" in gone.stderr
    releases = get_json(kube_cluster, "secrets", "-n", namespace, "-l", "owner=helm")["items"]
    assert releases == [], "helm keeps no release record after uninstall"
    # the namespace controller finishes the namespace's deletion
    kube_cluster.kubectl("delete", "namespace", namespace, "--wait", "--timeout=60s", timeout_s=90)


def test_podsecurity_admission_judges_pods_as_a_cluster_does(kube_cluster: LocalKube) -> None:
    namespace = unique("pss")
    kube_cluster.ensure_namespace(namespace)
    kube_cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    container = {"name": "c", "image": "gpulens-test/pause:1"}
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged", "namespace": namespace},
                  "spec": {"containers": [{**container, "securityContext": {"privileged": True}}]}}
    restricted = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "restricted", "namespace": namespace},
                  "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                               "seccompProfile": {"type": "RuntimeDefault"}},
                           "containers": [{**container, "securityContext": {
                               "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}

    def refusal() -> Any:
        done = dry_run(kube_cluster, privileged)
        return done if done.returncode == 1 else None

    # admission reads namespace labels from a cache: the label takes effect a moment after it is set
    refused = wait_for("PodSecurity enforcing the new label", refusal, timeout_s=30)
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr and "privileged" in refused.stderr
    admitted = dry_run(kube_cluster, restricted)
    assert admitted.returncode == 0, admitted.stderr
    assert "created (server dry run)" in admitted.stdout
    kube_cluster.kubectl("delete", "namespace", namespace, "--wait", "--timeout=60s", timeout_s=90)


def test_the_servicemonitor_crd_of_prometheus_operator_is_served_and_validates(
        kube_cluster: LocalKube, helm_tools: HelmTools) -> None:
    assert kube_cluster.apply_crd(helm_tools.servicemonitor_crd) == ["servicemonitors.monitoring.coreos.com"]
    resources = kube_cluster.kubectl("api-resources", "--api-group=monitoring.coreos.com", "-o", "name").stdout
    assert resources.split() == ["servicemonitors.monitoring.coreos.com"]
    monitor: Obj = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
               "metadata": {"name": "gpulens", "namespace": "default"},
               "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "gpulens"}},
                        "endpoints": [{"port": "metrics", "interval": "15s"}]}}
    admitted = dry_run(kube_cluster, monitor)
    assert admitted.returncode == 0, admitted.stderr
    monitor["spec"]["endpoints"][0]["interval"] = "every 15 seconds"
    refused = dry_run(kube_cluster, monitor)
    assert refused.returncode == 1 and "spec.endpoints[0].interval" in refused.stderr


def healthz(kube: LocalKube, port: int) -> str:
    context = ssl.create_default_context(cafile=str(kube.ca_file))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=5, context=context) as response:
        return str(response.read().decode())


@pytest.fixture
def schedulable_node(kube_cluster: LocalKube) -> Iterator[str]:
    """A Node with allocatable CPU, memory and pods, Ready, tainted for this test's pods only,
    without the not-ready taint; deleted at the end, with every pod still bound to it."""
    name = unique("node")
    kube_cluster.create_node({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "spec": {"taints": [{"key": TEST_TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": {"capacity": {"cpu": "4", "memory": "16Gi", "pods": "20"},
                   "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "20"},
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "kubelet is posting ready status",
                                   "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    }, schedulable=True)
    try:
        yield name
    finally:
        for pod in get_json(kube_cluster, "pods", "-A", "--field-selector", f"spec.nodeName={name}")["items"]:
            try:
                kube_cluster.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
        kube_cluster.delete_node(name)


def test_the_controller_manager_and_scheduler_run_a_deployment_onto_a_registered_node(
        kube_cluster: LocalKube, schedulable_node: str) -> None:
    assert healthz(kube_cluster, kube_cluster.controller_manager_port) == "ok"
    assert healthz(kube_cluster, kube_cluster.scheduler_port) == "ok"
    node = get_json(kube_cluster, "node", schedulable_node)
    assert [taint["key"] for taint in node["spec"]["taints"]] == [TEST_TAINT], "only the test's own taint"

    namespace = unique("sched")
    kube_cluster.kubectl("create", "namespace", namespace)
    # the serviceaccount and root-CA publisher controllers fill a new namespace
    wait_for("the default ServiceAccount", lambda: kube_cluster.kubectl(
        "get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0)
    wait_for("kube-root-ca.crt", lambda: kube_cluster.kubectl(
        "get", "configmap", "kube-root-ca.crt", "-n", namespace, check=False).returncode == 0)

    pod_spec = {"nodeSelector": {"kubernetes.io/hostname": schedulable_node},
                "tolerations": [{"key": TEST_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "c", "image": "gpulens-test/pause:1",
                                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": namespace},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                           "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec}}}
    kube_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(deployment))

    def bound() -> list[Obj]:
        pods = get_json(kube_cluster, "pods", "-n", namespace, "-l", "app=web")["items"]
        return pods if len(pods) == 2 and all(pod["spec"].get("nodeName") for pod in pods) else []

    pods = wait_for("the deployment's two pods bound by the scheduler", bound)
    assert {pod["spec"]["nodeName"] for pod in pods} == {schedulable_node}
    for pod in pods:
        assert {"type": "PodScheduled", "status": "True"}.items() <= next(
            c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled").items()
    events = get_json(kube_cluster, "events.v1.events.k8s.io", "-n", namespace)["items"]
    scheduled = {e["regarding"]["name"]: e for e in events if e["reason"] == "Scheduled"}
    for pod in pods:
        event = scheduled[pod["metadata"]["name"]]
        assert event["reportingController"] == "default-scheduler"
        assert event["note"] == f"Successfully assigned {namespace}/{pod['metadata']['name']} to {schedulable_node}"

    # a pod that fits nowhere stays Pending, with the scheduler's own reason
    too_big = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "too-big", "namespace": namespace},
               "spec": {**pod_spec, "containers": [{"name": "c", "image": "gpulens-test/pause:1",
                                                    "resources": {"requests": {"cpu": "3"}}}]}}
    kube_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(too_big))

    def failed_scheduling() -> str:
        for event in get_json(kube_cluster, "events.v1.events.k8s.io", "-n", namespace)["items"]:
            if event["reason"] == "FailedScheduling" and event["regarding"]["name"] == "too-big":
                return str(event["note"])
        return ""

    note = wait_for("FailedScheduling for the pod that does not fit", failed_scheduling)
    assert "Insufficient cpu" in note and note.startswith("0/"), note
    pending = get_json(kube_cluster, "pod", "too-big", "-n", namespace)
    assert pending["status"]["phase"] == "Pending" and not pending["spec"].get("nodeName")

    # the garbage collector removes the deployment's ReplicaSet; a bound pod's deletion waits for a
    # kubelet to confirm, so the test confirms it (deletes at once) until the controllers are done
    kube_cluster.kubectl("delete", "deployment", "web", "-n", namespace, "--wait=false")

    def drained() -> bool:
        kube_cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force",
                             "--ignore-not-found")
        return not get_json(kube_cluster, "replicasets,pods", "-n", namespace)["items"]

    wait_for("the ReplicaSet and its pods gone", drained)
    kube_cluster.kubectl("delete", "namespace", namespace, "--wait", "--timeout=60s", timeout_s=90)
