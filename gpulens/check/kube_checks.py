"""The Kubernetes checks (with API access: a kubeconfig or in the cluster): the APIs served, the
agent DaemonSet on every GPU node, the watcher ServiceAccount's RBAC by SubjectAccessReview.

The client configuration comes from the watcher's adapter (:func:`producers.watcher.kube.api_client`:
kubeconfig, in-cluster, ``$KUBECONFIG``); the few requests are plain JSON over its TLS settings."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpulens.check.core import Context, Result, State

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-", "amd.com/gpu")
KUEUE_GROUP = "kueue.x-k8s.io"
DRA_GROUP = "resource.k8s.io"
_NO_ACCESS_FIX = ("run where a kubeconfig reaches the cluster (--kubeconfig, $KUBECONFIG, --context) or in the "
                  "cluster with a ServiceAccount that may read nodes, pods, daemonsets and create subjectaccessreviews")


class KubeRequestError(RuntimeError):
    def __init__(self, path: str, status: int, text: str) -> None:
        super().__init__(f"{path}: {status} {text}")
        self.status = status


class Kube:
    """GET and POST JSON with the configuration of a kubernetes ``ApiClient``."""

    def __init__(self, api: Any, timeout_s: float) -> None:
        conf = api.configuration
        self.host = str(conf.host).rstrip("/")
        self.timeout_s = timeout_s
        self.headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if getattr(conf, "refresh_api_key_hook", None) is not None:
            conf.refresh_api_key_hook(conf)
        for auth in conf.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                self.headers[auth["key"]] = auth["value"]
        context = ssl.create_default_context(cafile=conf.ssl_ca_cert) if conf.ssl_ca_cert else \
            ssl.create_default_context()
        if conf.cert_file:
            context.load_cert_chain(conf.cert_file, conf.key_file)
        if not conf.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        self.context = context
        self._api = api

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.host + path, data=data, method=method, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.context) as response:
                return dict(json.loads(response.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            raise KubeRequestError(path, exc.code, exc.read()[:300].decode(errors="replace")) from None

    def get(self, path: str) -> dict[str, Any]:
        return self.request("GET", path)

    def close(self) -> None:
        self._api.close()


def _kube(ctx: Context) -> Kube | None:
    if "kube" not in ctx.cache and "kube_error" not in ctx.cache:
        from producers.watcher.kube import api_client

        try:
            kube = Kube(api_client(ctx.kubeconfig, context=ctx.kube_context), ctx.timeout_s)
            kube.get("/version")
            ctx.cache["kube"] = kube
        except Exception as exc:
            ctx.cache["kube_error"] = f"{type(exc).__name__}: {exc}"
    return ctx.cache.get("kube")


def _skipped(name: str, ctx: Context) -> list[Result]:
    return [Result(name, State.WARN, f"skipped: no Kubernetes API access ({ctx.cache.get('kube_error')})",
                   _NO_ACCESS_FIX)]


def _served(kube: Kube) -> dict[str, list[str]]:
    groups = kube.get("/apis").get("groups", [])
    return {g["name"]: [v["version"] for v in g.get("versions", [])] for g in groups}


def api_access(ctx: Context) -> list[Result]:
    kube = _kube(ctx)
    if kube is None:
        return _skipped("kubernetes", ctx)
    version = kube.get("/version").get("gitVersion", "?")
    served = _served(kube)
    ctx.cache["served"] = served
    kueue = ", ".join(served.get(KUEUE_GROUP, [])) or "not served"
    dra = ", ".join(served.get(DRA_GROUP, [])) or "not served"
    return [Result("kubernetes", State.OK, f"{kube.host} (Kubernetes {version}); Kueue ({KUEUE_GROUP}): {kueue}; "
                   f"DRA ({DRA_GROUP}): {dra}")]


def gpu_nodes(kube: Kube, served: dict[str, list[str]]) -> dict[str, str]:
    """GPU node -> why it counts (a device plugin's allocatable, or a GPU ResourceSlice)."""
    found: dict[str, str] = {}
    for node in kube.get("/api/v1/nodes").get("items", []):
        allocatable = node.get("status", {}).get("allocatable", {}) or {}
        gpus = {k: v for k, v in allocatable.items() if k.startswith(GPU_RESOURCE_PREFIXES) and str(v) != "0"}
        if gpus:
            found[node["metadata"]["name"]] = ", ".join(f"{k}={v}" for k, v in sorted(gpus.items()))
    if "v1" in served.get(DRA_GROUP, []):
        for piece in kube.get(f"/apis/{DRA_GROUP}/v1/resourceslices").get("items", []):
            spec = piece.get("spec", {})
            driver, node = str(spec.get("driver", "")), spec.get("nodeName")
            if node and ("gpu" in driver or "nvidia" in driver):
                found.setdefault(str(node), f"ResourceSlice of {driver}")
    return found


def agent_daemonset(ctx: Context) -> list[Result]:
    kube = _kube(ctx)
    if kube is None:
        return _skipped("agent-daemonset", ctx)
    ns, name = ctx.agent_namespace, ctx.agent_daemonset
    try:
        ds = kube.get(f"/apis/apps/v1/namespaces/{ns}/daemonsets/{name}")
    except KubeRequestError as exc:
        if exc.status != 404:
            raise
        return [Result("agent-daemonset", State.FAIL, f"no DaemonSet {ns}/{name}",
                       "kubectl apply -k deploy/k8s (or --agent-namespace / --agent-daemonset name yours)")]
    served = ctx.cache.get("served") or _served(kube)
    wanted = gpu_nodes(kube, served)
    labels = ds.get("spec", {}).get("selector", {}).get("matchLabels", {}) or {}
    selector = urllib.parse.quote(",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    uid = ds["metadata"]["uid"]
    covered = set()
    for pod in kube.get(f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}").get("items", []):
        owners = pod["metadata"].get("ownerReferences", []) or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in pod.get("status", {}).get("conditions", []) or [])
        if any(o.get("uid") == uid for o in owners) and pod.get("status", {}).get("phase") == "Running" and ready:
            covered.add(pod.get("spec", {}).get("nodeName"))
    missing = sorted(set(wanted) - covered)
    if missing:
        return [Result("agent-daemonset", State.FAIL, f"{len(missing)} of {len(wanted)} GPU node(s) without a ready "
                       f"agent pod of {ns}/{name}: " + ", ".join(f"{n} ({wanted[n]})" for n in missing[:20]),
                       f"`kubectl -n {ns} get pods -o wide` and `kubectl describe node NODE`: the DaemonSet's "
                       "nodeSelector, affinity and tolerations must admit the node's labels and taints (and the "
                       "nvidia RuntimeClass must exist there)")]
    if not wanted:
        return [Result("agent-daemonset", State.WARN, f"{ns}/{name} exists but no node has GPUs (no allocatable "
                       "nvidia.com/gpu, no GPU ResourceSlice)",
                       "is the NVIDIA device plugin or DRA driver installed? (kubectl get nodes -o yaml)")]
    return [Result("agent-daemonset", State.OK, f"a ready agent pod of {ns}/{name} on each of {len(wanted)} GPU "
                   "node(s)")]


WATCHER_NEEDS: tuple[tuple[str, str, str], ...] = (
    ("", "pods", "list"), ("", "pods", "watch"),
    ("", "nodes", "list"), ("", "nodes", "watch"),
)
EVENTS = (("events.k8s.io", "events"), ("", "events"))


def _allowed(kube: Kube, user: str, groups: list[str], group: str, resource: str, verb: str) -> bool:
    review = kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups,
                 "resourceAttributes": {"group": group, "resource": resource, "verb": verb}}})
    return bool(review.get("status", {}).get("allowed"))


def watcher_rbac(ctx: Context) -> list[Result]:
    kube = _kube(ctx)
    if kube is None:
        return _skipped("watcher-rbac", ctx)
    ns, sa = ctx.watcher_namespace, ctx.watcher_service_account
    user = f"system:serviceaccount:{ns}:{sa}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
    denied = [f"{verb} {resource}" for group, resource, verb in WATCHER_NEEDS
              if not _allowed(kube, user, groups, group, resource, verb)]
    if not any(all(_allowed(kube, user, groups, g, r, v) for v in ("list", "watch")) for g, r in EVENTS):
        denied.append("list+watch events (events.k8s.io or core)")
    served = ctx.cache.get("served") or _served(kube)
    warn = []
    if KUEUE_GROUP in served and not all(_allowed(kube, user, groups, KUEUE_GROUP, "workloads", v)
                                         for v in ("list", "watch")):
        warn.append("list+watch workloads.kueue.x-k8s.io (Kueue is served: its queued jobs stay unseen)")
    fix = (f"kubectl apply -f deploy/k8s/watcher.yaml: the ClusterRole gpulens-watcher bound to the ServiceAccount "
           f"{ns}/{sa} (or --watcher-namespace / --watcher-service-account name yours)")
    if denied:
        return [Result("watcher-rbac", State.FAIL, f"{user} may not " + "; ".join(denied + warn), fix)]
    if warn:
        return [Result("watcher-rbac", State.WARN, f"{user} may not " + "; ".join(warn), fix)]
    return [Result("watcher-rbac", State.OK, f"{user} may list and watch pods, nodes and events")]
