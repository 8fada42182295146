"""A real Kubernetes control plane on 127.0.0.1 for the tests: etcd, kube-apiserver and, on request,
kube-controller-manager and kube-scheduler, with kubectl and Helm pointed at it.

The watcher's simulated API server only shows what its authors believed; this runs the real
thing. ``scripts/kube-build.sh`` builds (or finds cached under ``~/.cache/gpulens/kube/``) etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (one ``k8s.io/kubernetes``
build) from the Go module proxy; ``scripts/helm-build.sh`` builds Helm and fetches the
ServiceMonitor CRD (:func:`build_helm`); ``scripts/kueue-crds.sh`` fetches the CRDs Kueue ships
(:func:`kueue_crds`). :class:`LocalKube` makes a self-signed CA, a serving
certificate and a service-account key pair with ``openssl``, a static token file with two users
(an admin in ``system:masters`` and ``gpulens-watcher``, bound to exactly the ClusterRole that
``deploy/k8s/watcher.yaml`` ships), starts the servers in their own process sessions, waits for
``/readyz`` (``/healthz`` for the controller-manager and scheduler) and stops them by pid.
:class:`KubeApi` is a small JSON-over-HTTPS client for the admin's writes (it needs no Kubernetes
library; the watcher itself goes through its adapter). The apiserver runs its default admission
plugins, PodSecurity among them, and allows privileged containers as kubeadm and managed clusters
do (``--allow-privileged``), so PodSecurity alone judges them.

No kubelet runs. Without the controller-manager, callers create each namespace's ``default``
ServiceAccount (:meth:`LocalKube.ensure_namespace`); without the scheduler they bind pods through
``pods/binding`` (:meth:`LocalKube.bind`). Either way they write pod status themselves and delete
pods with ``gracePeriodSeconds=0``. The controller-manager runs every default controller except
node lifecycle and node IPAM (no node sends heartbeats, so those would evict or taint every Node);
a Node a test registers keeps the ``node.kubernetes.io/not-ready`` taint the apiserver gives it
until the test removes it (:meth:`LocalKube.create_node` with ``schedulable=True``).

Usage (the session fixture ``kube_cluster`` of ``tests/conftest.py`` is this)::

    tools = build_helm()
    with LocalKube(home, build_binaries(), helm=tools.helm,
                   controller_manager=True, scheduler=True) as kube:
        kube.apply_crd(tools.servicemonitor_crd)              # server-side apply, waits Established
        kube.kubectl("apply", "--dry-run=server", "-f", "pod.yaml")      # the admin's kubeconfig
        kube.kubectl("auth", "can-i", "list", "pods", user=WATCHER_USER)
        kube.helm("install", "gpulens", "deploy/helm/gpulens", "-n", "gpulens", "--create-namespace")
        done = kube.helm("lint", "deploy/helm/gpulens", check=False)      # CompletedProcess
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.errors import PermanentError
from common.processes import pid_alive

KUBE_VERSION = "1.37.2"
ETCD_VERSION = "3.7.0"
HELM_VERSION = "4.3.2"
PROMETHEUS_OPERATOR_VERSION = "0.85.0"
KUEUE_VERSION = "0.17.0"
REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "kube-build.sh"
HELM_BUILD_SCRIPT = REPO_ROOT / "scripts" / "helm-build.sh"
KUEUE_CRDS_SCRIPT = REPO_ROOT / "scripts" / "kueue-crds.sh"
KUEUE_WORKLOAD_CRD = "kueue.x-k8s.io_workloads.yaml"
KUBE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
SERVICEMONITOR_CRD = "monitoring.coreos.com_servicemonitors.yaml"
WATCHER_MANIFEST = REPO_ROOT / "deploy" / "k8s" / "watcher.yaml"
WATCHER_USER = "gpulens-watcher"
ADMIN_USER = "gpulens-admin"

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# kube-controller-manager's controllers: every default one except those that act on kubelet
# heartbeats or node CIDRs, which no node here sends or needs
CONTROLLERS = "*,-node-lifecycle-controller,-node-ipam-controller"

Obj = dict[str, Any]


class ControlPlaneError(PermanentError):
    """The control plane could not be built, started or reached."""


class KubeApiError(PermanentError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:500]}")
        self.status = status
        self.body = body


class KubeToolError(PermanentError):
    """kubectl or helm exited non-zero where the caller asked it to succeed."""

    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        command = " ".join(str(arg) for arg in done.args)
        super().__init__(f"{command}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-1500:]}")
        self.done = done


def _run_build(script: Path, env: dict[str, str], required: tuple[str, ...], progress: bool) -> Path:
    """Run a build script, which prints its output directory last; that directory must hold ``required``."""
    result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE,
                            stderr=None if progress else subprocess.PIPE, text=True,
                            env={**os.environ, **env}, check=False)
    if result.returncode != 0:
        detail = (result.stderr or "").strip().splitlines()[-5:] if not progress else []
        raise ControlPlaneError(f"{script.name} failed (exit {result.returncode})"
                                + (": " + " | ".join(detail) if detail else "; see its output above"))
    lines = result.stdout.strip().splitlines()
    directory = Path(lines[-1]) if lines else Path()
    missing = [name for name in required if not (directory / name).is_file()]
    if missing:
        raise ControlPlaneError(f"{script.name} printed {directory}, which lacks {', '.join(missing)}")
    return directory


def build_binaries(progress: bool = True) -> Path:
    """The directory holding etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
    kubectl (:data:`KUBE_BINARIES`), built on first use (15-40 min on 2 cores)."""
    return _run_build(BUILD_SCRIPT, {"GPULENS_KUBE_VERSION": KUBE_VERSION, "GPULENS_ETCD_VERSION": ETCD_VERSION},
                      KUBE_BINARIES, progress)


@dataclass(frozen=True)
class HelmTools:
    """What ``scripts/helm-build.sh`` leaves in its directory."""

    directory: Path

    @property
    def helm(self) -> Path:
        return self.directory / "helm"

    @property
    def servicemonitor_crd(self) -> Path:
        """prometheus-operator's ServiceMonitor CustomResourceDefinition, as the module ships it."""
        return self.directory / SERVICEMONITOR_CRD


def build_helm(progress: bool = True) -> HelmTools:
    """Helm (:data:`HELM_VERSION`) and the ServiceMonitor CRD, built or fetched on first use."""
    directory = _run_build(HELM_BUILD_SCRIPT, {"GPULENS_HELM_VERSION": HELM_VERSION,
                                               "GPULENS_PROMETHEUS_OPERATOR_VERSION": PROMETHEUS_OPERATOR_VERSION},
                           ("helm", SERVICEMONITOR_CRD), progress)
    return HelmTools(directory)


def kueue_crds(progress: bool = True) -> Path:
    """The directory of the CustomResourceDefinitions Kueue :data:`KUEUE_VERSION` ships
    (``config/components/crd/bases`` of the ``sigs.k8s.io/kueue`` module, unchanged; the Workload's is
    :data:`KUEUE_WORKLOAD_CRD`), fetched from the Go module proxy on first use."""
    return _run_build(KUEUE_CRDS_SCRIPT, {"GPULENS_KUEUE_VERSION": KUEUE_VERSION}, (KUEUE_WORKLOAD_CRD,), progress)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class KubeApi:
    """JSON over HTTPS with a bearer token, checked against the test CA."""

    def __init__(self, url: str, token: str, ca_file: Path, timeout_s: float = 30.0) -> None:
        self.url = url
        self.token = token
        self.timeout_s = timeout_s
        self._tls = ssl.create_default_context(cafile=str(ca_file))

    def request(self, method: str, path: str, body: Obj | None = None,
                content_type: str = "application/json") -> Obj:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._tls) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise KubeApiError(method, path, exc.code, exc.read().decode(errors="replace")) from None
        return json.loads(text) if text.startswith("{") else {"text": text}

    def create(self, path: str, obj: Obj) -> Obj:
        return self.request("POST", path, obj)

    def get(self, path: str) -> Obj:
        return self.request("GET", path)

    def merge_patch(self, path: str, patch: Obj) -> Obj:
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path: str, grace_period_s: int | None = None) -> Obj:
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace_period_s} \
            if grace_period_s is not None else None
        return self.request("DELETE", path, options)

    def apply_manifest(self, obj: Obj) -> Obj:
        """Create a cluster-scoped RBAC object from a manifest (``kind`` ClusterRole/ClusterRoleBinding)."""
        plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}[obj["kind"]]
        return self.create(f"/apis/rbac.authorization.k8s.io/v1/{plural}", obj)


@dataclass
class _Server:
    name: str
    pid_file: Path
    log_file: Path


class LocalKube:
    """etcd and kube-apiserver under ``home`` (certificates, tokens, data, logs, pid files); with
    ``controller_manager``/``scheduler`` also those, started after the apiserver (or later through
    :meth:`start_controller_manager` and :meth:`start_scheduler`). ``helm`` is the Helm binary
    :meth:`helm` runs (:func:`build_helm`); kubectl comes from ``binaries``."""

    def __init__(self, home: Path, binaries: Path, start_timeout_s: float = 120.0, *,
                 helm: Path | None = None, controller_manager: bool = False, scheduler: bool = False) -> None:
        self.home = home
        self.binaries = binaries
        self.start_timeout_s = start_timeout_s
        self.helm_path = helm
        self.with_controller_manager = controller_manager
        self.with_scheduler = scheduler
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.controller_manager_port = free_port()
        self.scheduler_port = free_port()
        self.admin_token = secrets.token_hex(16)
        self.watcher_token = secrets.token_hex(16)
        self._etcd = _Server("etcd", home / "etcd.pid", home / "etcd.log")
        self._apiserver = _Server("kube-apiserver", home / "kube-apiserver.pid", home / "kube-apiserver.log")
        self._controller_manager = _Server("kube-controller-manager", home / "kube-controller-manager.pid",
                                           home / "kube-controller-manager.log")
        self._scheduler = _Server("kube-scheduler", home / "kube-scheduler.pid", home / "kube-scheduler.log")

    # ------------------------------------------------------------------ addresses and credentials

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def ca_file(self) -> Path:
        return self.home / "ca.crt"

    @property
    def kubectl_path(self) -> Path:
        return self.binaries / "kubectl"

    def admin(self) -> KubeApi:
        return KubeApi(self.url, self.admin_token, self.ca_file)

    def as_watcher(self) -> KubeApi:
        return KubeApi(self.url, self.watcher_token, self.ca_file)

    def kubeconfig(self, user: str = WATCHER_USER) -> Path:
        """A kubeconfig file for ``user`` (``gpulens-watcher`` or ``gpulens-admin``; anyone else is
        reached by impersonation, ``kubectl --as``), written whole (tools read it concurrently)."""
        token = self.watcher_token if user == WATCHER_USER else self.admin_token
        path = self.home / f"kubeconfig-{user}"
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "gpulens-test",
            "clusters": [{"name": "gpulens-test", "cluster": {
                "server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "gpulens-test", "context": {"cluster": "gpulens-test", "user": user}}],
        }
        partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        partial.write_text(yaml.safe_dump(config))
        partial.replace(path)
        return path

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LocalKube:
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_credentials()
        self._spawn(self._etcd, self._etcd_command())
        self._wait(self._etcd, self._etcd_ready)
        self.start_apiserver()
        self._grant_watcher_role()
        if self.with_controller_manager:
            self.start_controller_manager()
        if self.with_scheduler:
            self.start_scheduler()
        return self

    def start_apiserver(self) -> None:
        self._spawn(self._apiserver, self._apiserver_command())
        self._wait(self._apiserver, self._apiserver_ready)

    def stop_apiserver(self) -> None:
        self._terminate(self._apiserver)

    def restart_apiserver(self) -> None:
        self.stop_apiserver()
        self.start_apiserver()

    def start_controller_manager(self) -> None:
        self._spawn(self._controller_manager, self._controller_manager_command())
        self._wait(self._controller_manager, lambda: self._healthy(self.controller_manager_port))

    def stop_controller_manager(self) -> None:
        self._terminate(self._controller_manager)

    def start_scheduler(self) -> None:
        self._spawn(self._scheduler, self._scheduler_command())
        self._wait(self._scheduler, lambda: self._healthy(self.scheduler_port))

    def stop_scheduler(self) -> None:
        self._terminate(self._scheduler)

    def stop(self) -> None:
        self._terminate(self._scheduler)
        self._terminate(self._controller_manager)
        self._terminate(self._apiserver)
        self._terminate(self._etcd)

    def __enter__(self) -> LocalKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pids(self) -> list[int]:
        return [pid for server in (self._etcd, self._apiserver, self._controller_manager, self._scheduler)
                if (pid := self._pid(server)) is not None]

    # ------------------------------------------------------------------ kubectl and helm

    def kubectl(self, *args: str, user: str = ADMIN_USER, stdin: str | None = None, check: bool = True,
                timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """``kubectl --kubeconfig <user's> ARGS``; ``check`` raises :class:`KubeToolError` on a non-zero exit."""
        return self._tool([str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig(user)), *args],
                          user, stdin, check, timeout_s)

    def helm(self, *args: str, user: str = ADMIN_USER, stdin: str | None = None, check: bool = True,
             timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
        """``helm --kubeconfig <user's> ARGS``, with Helm's cache, config and data under ``home``."""
        if self.helm_path is None:
            raise ControlPlaneError("LocalKube was made without helm= (build_helm().helm)")
        return self._tool([str(self.helm_path), "--kubeconfig", str(self.kubeconfig(user)), *args],
                          user, stdin, check, timeout_s)

    def apply_crd(self, path: Path, timeout_s: float = 60.0) -> list[str]:
        """Server-side apply of the CustomResourceDefinitions in ``path`` (large CRDs do not fit the
        annotation client-side apply writes), then wait until each is Established. Returns their names."""
        names = [doc["metadata"]["name"] for doc in yaml.safe_load_all(path.read_text())
                 if doc and doc.get("kind") == "CustomResourceDefinition"]
        self.kubectl("apply", "--server-side", "--field-manager=gpulens-tests", "-f", str(path))
        self.kubectl("wait", "--for=condition=Established", f"--timeout={timeout_s:.0f}s",
                     *(f"customresourcedefinition/{name}" for name in names), timeout_s=timeout_s + 30)
        return names

    def _tool(self, command: list[str], user: str, stdin: str | None, check: bool,
              timeout_s: float) -> subprocess.CompletedProcess[str]:
        state = self.home / "tools"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig(user)), "KUBERC": "off",
               "KUBECACHEDIR": str(state / "kube-cache"), "HELM_CACHE_HOME": str(state / "helm-cache"),
               "HELM_CONFIG_HOME": str(state / "helm-config"), "HELM_DATA_HOME": str(state / "helm-data")}
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, env=env,
                              timeout=timeout_s, check=False)
        if check and done.returncode != 0:
            raise KubeToolError(done)
        return done

    # ------------------------------------------------------------------ cluster helpers

    def ensure_namespace(self, namespace: str) -> None:
        """The namespace and its ``default`` ServiceAccount (no controller-manager creates it)."""
        api = self.admin()
        for path, obj in (
            ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
            (f"/api/v1/namespaces/{namespace}/serviceaccounts",
             {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        ):
            try:
                api.create(path, obj)
            except KubeApiError as exc:
                if exc.status != 409:
                    raise

    def create_node(self, node: Obj, schedulable: bool = False) -> Obj:
        """Create a node and write its status (capacity, conditions) as a kubelet would. The
        apiserver gives every new Node the ``node.kubernetes.io/not-ready`` NoSchedule taint;
        ``schedulable`` removes it, as the node lifecycle controller does once a kubelet reports
        Ready (that controller does not run here), so the scheduler may bind pods to the node."""
        api = self.admin()
        body = _for_create(node, "Node")
        created = api.create("/api/v1/nodes", body)
        name = created["metadata"]["name"]
        if node.get("status"):
            created = api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": node["status"]})
        if schedulable:
            taints = [taint for taint in created["spec"].get("taints", []) if taint["key"] != NOT_READY_TAINT]
            created = api.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"taints": taints or None}})
        return created

    def create_pod(self, pod: Obj) -> Obj:
        """Create a pod (the server sets uid, creation time and a Pending status)."""
        namespace = pod["metadata"]["namespace"]
        self.ensure_namespace(namespace)
        return self.admin().create(f"/api/v1/namespaces/{namespace}/pods", _for_create(pod, "Pod"))

    def bind(self, namespace: str, name: str, node: str) -> None:
        """Bind through ``pods/binding``, as kube-scheduler does (the server sets PodScheduled)."""
        self.admin().create(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})

    def set_pod_status(self, namespace: str, name: str, status: Obj) -> Obj:
        """Write pod status as a kubelet would (``pods/status``, merge patch: lists are replaced)."""
        return self.admin().merge_patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status})

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete at once: no kubelet confirms a graceful deletion here."""
        self.admin().delete(f"/api/v1/namespaces/{namespace}/pods/{name}", grace_period_s=0)

    def delete_node(self, name: str) -> None:
        self.admin().delete(f"/api/v1/nodes/{name}")

    def post_event(self, event: Obj) -> Obj:
        """Create an events.k8s.io/v1 Event (``regarding`` names the object)."""
        namespace = event["metadata"]["namespace"]
        return self.admin().create(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
                                   {"apiVersion": "events.k8s.io/v1", "kind": "Event", **event})

    def compact(self) -> int:
        """Compact etcd's history up to its current revision (through etcd's v3 HTTP gateway); a
        restarted apiserver then answers a watch from an older resourceVersion with 410 Expired."""
        key = base64.b64encode(b"/registry/").decode()
        header = _post_json(f"{self.etcd_url}/v3/kv/range", {"key": key, "limit": 1})["header"]
        revision = int(header["revision"])
        _post_json(f"{self.etcd_url}/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # ------------------------------------------------------------------ internals

    def _write_credentials(self) -> None:
        if shutil.which("openssl") is None:
            raise ControlPlaneError("openssl is not on PATH: it makes the test control plane's certificates")
        home = self.home

        def openssl(*args: str) -> None:
            result = subprocess.run(["openssl", *args], cwd=home, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise ControlPlaneError(f"openssl {args[0]} failed: {result.stderr.strip()[-300:]}")

        if not (home / "ca.crt").exists():
            openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                    "-days", "7", "-subj", "/CN=gpulens-test-ca")
            (home / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                          "extendedKeyUsage=serverAuth\n")
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                    "-subj", "/CN=kube-apiserver")
            openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                    "-out", "server.crt", "-days", "7", "-extfile", "san.ext")
            openssl("genrsa", "-out", "sa.key", "2048")
            openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        (home / "tokens.csv").write_text(
            f'{self.admin_token},{ADMIN_USER},1000,"system:masters"\n'
            f"{self.watcher_token},{WATCHER_USER},1001\n")

    def _etcd_command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [str(self.binaries / "etcd"), "--name", "gpulens", "--data-dir", str(self.home / "etcd-data"),
                "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"gpulens={peer}", "--log-level", "warn"]

    def _apiserver_command(self) -> list[str]:
        home = self.home
        return [
            str(self.binaries / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}", "--etcd-compaction-interval=0",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--tls-cert-file={home / 'server.crt'}", f"--tls-private-key-file={home / 'server.key'}",
            f"--client-ca-file={home / 'ca.crt'}", f"--token-auth-file={home / 'tokens.csv'}",
            # the front-proxy settings kubeadm writes: the apiserver publishes them in
            # kube-system/extension-apiserver-authentication, which the controller-manager's and
            # scheduler's delegated authentication read (without them, each logs an error a second)
            f"--requestheader-client-ca-file={home / 'ca.crt'}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--authorization-mode=RBAC",
            # as kubeadm and managed clusters run it: privileged containers are PodSecurity's to judge
            "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={home / 'sa.pub'}",
            f"--service-account-signing-key-file={home / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/24",
            f"--cert-dir={home / 'apiserver-certs'}", "--profiling=false", "--v=1",
        ]

    def _component_flags(self, port: int) -> list[str]:
        """What kube-controller-manager and kube-scheduler share: the admin's kubeconfig for their
        API calls and for delegated authentication and authorization, and a secure port serving
        the apiserver's certificate (valid for 127.0.0.1, signed by the test CA)."""
        kubeconfig = self.kubeconfig(ADMIN_USER)
        return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--tls-cert-file={self.home / 'server.crt'}", f"--tls-private-key-file={self.home / 'server.key'}",
                "--leader-elect=false", "--v=1"]

    def _controller_manager_command(self) -> list[str]:
        home = self.home
        return [str(self.binaries / "kube-controller-manager"), *self._component_flags(self.controller_manager_port),
                f"--controllers={CONTROLLERS}",
                f"--root-ca-file={home / 'ca.crt'}", f"--service-account-private-key-file={home / 'sa.key'}",
                f"--cluster-signing-cert-file={home / 'ca.crt'}", f"--cluster-signing-key-file={home / 'ca.key'}"]

    def _scheduler_command(self) -> list[str]:
        return [str(self.binaries / "kube-scheduler"), *self._component_flags(self.scheduler_port)]

    def _healthy(self, port: int) -> bool:
        """``/healthz`` on a component's secure port (always allowed, even anonymously)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=2, context=context) as response:
                return bool(response.read().decode().strip() == "ok")
        except (OSError, ValueError):
            return False

    def _spawn(self, server: _Server, command: list[str]) -> None:
        if (pid := self._pid(server)) is not None:
            raise ControlPlaneError(f"{server.name} already runs (pid {pid})")
        with server.log_file.open("ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        server.pid_file.write_text(str(process.pid))

    def _pid(self, server: _Server) -> int | None:
        try:
            pid = int(server.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def _wait(self, server: _Server, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._pid(server) is None:
                raise ControlPlaneError(f"{server.name} exited at start-up:\n{self._log_tail(server)}")
            if ready():
                return
            time.sleep(0.3)
        raise ControlPlaneError(f"{server.name} not ready after {self.start_timeout_s:.0f} s:\n"
                                f"{self._log_tail(server)}")

    def _terminate(self, server: _Server, timeout_s: float = 30.0) -> None:
        pid = self._pid(server)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
                while pid_alive(pid):
                    time.sleep(0.1)
        server.pid_file.unlink(missing_ok=True)

    @staticmethod
    def _log_tail(server: _Server, lines: int = 15) -> str:
        try:
            return "\n".join(server.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _etcd_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _apiserver_ready(self) -> bool:
        try:
            return self.admin().request("GET", "/readyz").get("text") == "ok"
        except (OSError, KubeApiError):
            return False

    def _grant_watcher_role(self) -> None:
        """The watcher's ClusterRole exactly as deployed, bound to the test user instead of the
        deployment's ServiceAccount."""
        api = self.admin()
        documents = [doc for doc in yaml.safe_load_all(WATCHER_MANIFEST.read_text()) if doc]
        for doc in documents:
            if doc["kind"] == "ClusterRole":
                api.apply_manifest(doc)
            elif doc["kind"] == "ClusterRoleBinding":
                doc["subjects"] = [{"kind": "User", "name": WATCHER_USER, "apiGroup": "rbac.authorization.k8s.io"}]
                api.apply_manifest(doc)


def _post_json(url: str, body: Obj) -> Obj:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        result: Obj = json.loads(response.read())
    return result



def _for_create(obj: Obj, kind: str) -> Obj:
    """A copy without the fields the server owns (uid, versions, times, pod status)."""
    body = json.loads(json.dumps(obj))
    meta = body.setdefault("metadata", {})
    for field in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
        meta.pop(field, None)
    body.pop("status", None)
    return {"apiVersion": "v1", "kind": kind, **body}
