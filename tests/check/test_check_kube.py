"""The API checks of ``gpulens check`` against a real kube-apiserver: the agent DaemonSet (the
shipped manifest) must have a ready pod on every GPU node — device-plugin nodes and nodes with a GPU
ResourceSlice — and the watcher's ServiceAccount (not the caller) must hold the shipped RBAC."""

from __future__ import annotations

import contextlib
import copy
import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml

from gpulens.cli import main
from producers.watcher.fake_cluster import make_node
from simulation.kube_local import ADMIN_USER, WATCHER_MANIFEST, LocalKube

REPO = Path(__file__).resolve().parents[2]
AGENT_MANIFEST = REPO / "deploy" / "k8s" / "agent-daemonset.yaml"


def _check(kube: LocalKube, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["check", "--json", "--kubeconfig", str(kube.kubeconfig(ADMIN_USER)),
                       "--only", "kubernetes,agent-daemonset,watcher-rbac", *args])
    assert out.getvalue(), err.getvalue()
    return status, {r["name"]: r for r in orjson.loads(out.getvalue())["results"]}


def _agent_pod(kube: LocalKube, ds: dict[str, Any], node: str) -> None:
    """What the DaemonSet controller and the kubelet would make: its pod on ``node``, running and ready."""
    namespace, name = ds["metadata"]["namespace"], f"{ds['metadata']['name']}-{node}"
    template = ds["spec"]["template"]
    kube.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": namespace, "labels": template["metadata"]["labels"],
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds["metadata"]["name"],
                             "uid": ds["metadata"]["uid"], "controller": True}]},
        "spec": {"containers": [{"name": "agent", "image": "gpulens:test"}]}})
    kube.bind(namespace, name, node)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.set_pod_status(namespace, name, {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now}]})


def test_the_agent_daemonset_must_cover_every_gpu_node(kube: LocalKube) -> None:
    admin = kube.admin()
    for node in (make_node("gpu-0", gpus=8), make_node("gpu-1", gpus=4), make_node("cpu-0", gpus=0),
                 make_node("dra-0", gpus=0)):
        kube.create_node(node)
    status, found = _check(kube)
    assert found["kubernetes"]["state"] == "ok" and "resource.k8s.io" in found["kubernetes"]["detail"]
    assert found["agent-daemonset"]["state"] == "fail" and "no DaemonSet gpulens-agent/gpulens-agent" in \
        found["agent-daemonset"]["detail"] and status == 1
    # the shipped DaemonSet, with an agent pod on gpu-0 only
    doc = next(d for d in yaml.safe_load_all(AGENT_MANIFEST.read_text()) if d and d["kind"] == "DaemonSet")
    kube.ensure_namespace("gpulens-agent")
    ds = admin.create("/apis/apps/v1/namespaces/gpulens-agent/daemonsets", copy.deepcopy(doc))
    _agent_pod(kube, ds, "gpu-0")
    # a DRA node: a GPU ResourceSlice, no device-plugin resource
    admin.create("/apis/resource.k8s.io/v1/resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "dra-0-gpu"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "dra-0",
                 "pool": {"name": "dra-0", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]}})
    status, found = _check(kube)
    line = found["agent-daemonset"]
    assert status == 1 and line["state"] == "fail", found
    assert "2 of 3 GPU node(s) without a ready agent pod" in line["detail"], line
    assert "gpu-1 (nvidia.com/gpu=4)" in line["detail"] and "dra-0 (ResourceSlice of gpu.nvidia.com)" in line["detail"]
    assert "cpu-0" not in line["detail"] and "tolerations" in line["fix"]
    _agent_pod(kube, ds, "gpu-1")
    _agent_pod(kube, ds, "dra-0")
    status, found = _check(kube)
    assert found["agent-daemonset"]["state"] == "ok", found["agent-daemonset"]
    assert "each of 3 GPU node(s)" in found["agent-daemonset"]["detail"]


def test_the_watcher_service_accounts_rbac_is_checked_not_the_callers(kube: LocalKube) -> None:
    # the caller is an admin and may do everything; the ServiceAccount holds nothing yet
    status, found = _check(kube, "--watcher-namespace", "gpulens", "--agent-daemonset", "absent")
    line = found["watcher-rbac"]
    assert status == 1 and line["state"] == "fail", found
    assert "system:serviceaccount:gpulens:gpulens-watcher may not list pods" in line["detail"]
    assert "deploy/k8s/watcher.yaml" in line["fix"]
    # the shipped ServiceAccount, ClusterRole and binding
    admin = kube.admin()
    kube.ensure_namespace("gpulens")
    for doc in yaml.safe_load_all(WATCHER_MANIFEST.read_text()):
        if doc and doc["kind"] == "ServiceAccount":
            admin.create("/api/v1/namespaces/gpulens/serviceaccounts", doc)
        elif doc and doc["kind"] == "ClusterRoleBinding":
            doc["metadata"]["name"] = "gpulens-watcher-sa"  # the plane binds the shipped name to its test user
            admin.apply_manifest(doc)
    _status, found = _check(kube)
    assert found["watcher-rbac"]["state"] == "ok", found["watcher-rbac"]
    # another account is still refused
    _status, found = _check(kube, "--watcher-service-account", "someone-else")
    assert found["watcher-rbac"]["state"] == "fail"
