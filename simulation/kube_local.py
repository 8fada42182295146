"""A real Kubernetes control plane (etcd + kube-apiserver) on 127.0.0.1 for the watcher's tests.

The watcher's simulated API server only shows what its authors believed; this runs the real
thing. ``scripts/kube-build.sh`` builds (or finds cached under ``~/.cache/gpulens/kube/``) etcd and
kube-apiserver from the Go module proxy. :class:`LocalKube` makes a self-signed CA, a serving
certificate and a service-account key pair with ``openssl``, a static token file with two users
(an admin in ``system:masters`` and ``gpulens-watcher``, bound to exactly the ClusterRole that
``deploy/k8s/watcher.yaml`` ships), starts both servers in their own process sessions, waits for
``/readyz`` and stops them by pid. :class:`KubeApi` is a small JSON-over-HTTPS client for the
admin's writes (it needs no Kubernetes library; the watcher itself goes through its adapter).

There is no controller-manager, scheduler or kubelet: callers create each namespace's ``default``
ServiceAccount (:meth:`LocalKube.ensure_namespace`), bind pods through ``pods/binding``, write pod
status themselves and delete with ``gracePeriodSeconds=0``.
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
REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "kube-build.sh"
WATCHER_MANIFEST = REPO_ROOT / "deploy" / "k8s" / "watcher.yaml"
WATCHER_USER = "gpulens-watcher"
ADMIN_USER = "gpulens-admin"

Obj = dict[str, Any]


class ControlPlaneError(PermanentError):
    """The control plane could not be built, started or reached."""


class KubeApiError(PermanentError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:500]}")
        self.status = status
        self.body = body


def build_binaries(progress: bool = True) -> Path:
    """The directory holding ``etcd`` and ``kube-apiserver``, built on first use (10-30 min)."""
    env = {**os.environ, "GPULENS_KUBE_VERSION": KUBE_VERSION, "GPULENS_ETCD_VERSION": ETCD_VERSION}
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE,
                            stderr=None if progress else subprocess.PIPE, text=True, env=env, check=False)
    if result.returncode != 0:
        detail = (result.stderr or "").strip().splitlines()[-5:] if not progress else []
        raise ControlPlaneError(f"{BUILD_SCRIPT.name} failed (exit {result.returncode})"
                                + (": " + " | ".join(detail) if detail else "; see its output above"))
    lines = result.stdout.strip().splitlines()
    directory = Path(lines[-1]) if lines else Path()
    if not (directory / "kube-apiserver").is_file() or not (directory / "etcd").is_file():
        raise ControlPlaneError(f"{BUILD_SCRIPT.name} printed {directory}, which lacks etcd or kube-apiserver")
    return directory


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
    """etcd and kube-apiserver under ``home`` (certificates, tokens, data, logs, pid files)."""

    def __init__(self, home: Path, binaries: Path, start_timeout_s: float = 120.0) -> None:
        self.home = home
        self.binaries = binaries
        self.start_timeout_s = start_timeout_s
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.admin_token = secrets.token_hex(16)
        self.watcher_token = secrets.token_hex(16)
        self._etcd = _Server("etcd", home / "etcd.pid", home / "etcd.log")
        self._apiserver = _Server("kube-apiserver", home / "kube-apiserver.pid", home / "kube-apiserver.log")

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

    def admin(self) -> KubeApi:
        return KubeApi(self.url, self.admin_token, self.ca_file)

    def as_watcher(self) -> KubeApi:
        return KubeApi(self.url, self.watcher_token, self.ca_file)

    def kubeconfig(self, user: str = WATCHER_USER) -> Path:
        """A kubeconfig file for ``user`` (``gpulens-watcher`` or ``gpulens-admin``)."""
        token = self.watcher_token if user == WATCHER_USER else self.admin_token
        path = self.home / f"kubeconfig-{user}"
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "gpulens-test",
            "clusters": [{"name": "gpulens-test", "cluster": {
                "server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "gpulens-test", "context": {"cluster": "gpulens-test", "user": user}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LocalKube:
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_credentials()
        self._spawn(self._etcd, self._etcd_command())
        self._wait(self._etcd, self._etcd_ready)
        self.start_apiserver()
        self._grant_watcher_role()
        return self

    def start_apiserver(self) -> None:
        self._spawn(self._apiserver, self._apiserver_command())
        self._wait(self._apiserver, self._apiserver_ready)

    def stop_apiserver(self) -> None:
        self._terminate(self._apiserver)

    def restart_apiserver(self) -> None:
        self.stop_apiserver()
        self.start_apiserver()

    def stop(self) -> None:
        self._terminate(self._apiserver)
        self._terminate(self._etcd)

    def __enter__(self) -> LocalKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pids(self) -> list[int]:
        return [pid for server in (self._etcd, self._apiserver) if (pid := self._pid(server)) is not None]

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

    def create_node(self, node: Obj) -> Obj:
        """Create a node and write its status (capacity, conditions) as a kubelet would."""
        api = self.admin()
        body = _for_create(node, "Node")
        created = api.create("/api/v1/nodes", body)
        if node.get("status"):
            created = api.merge_patch(f"/api/v1/nodes/{created['metadata']['name']}/status",
                                      {"status": node["status"]})
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
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={home / 'sa.pub'}",
            f"--service-account-signing-key-file={home / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/24",
            f"--cert-dir={home / 'apiserver-certs'}", "--profiling=false", "--v=1",
        ]

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
