"""What the alert-forwarding tests run for real: Alertmanager (built by
scripts/alertmanager-build.sh, started on 127.0.0.1), an HTTP receiver (Alertmanager's webhook
receiver, or the forwarder's own webhook), and ``gpulens alerts forward`` as a child process."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from common.settings import KafkaSettings
from tests.child_process import GpulensChild, free_port
from tests.conftest import REPO_ROOT


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


@dataclass
class Received:
    path: str
    body: Any
    at: float


class Receiver:
    """A tiny HTTP server that records every POSTed JSON body and answers ``status``.

    ``before_answer(received)`` runs before the answer is written (tests use it to kill a client
    whose request has arrived but not been answered)."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.received: list[Received] = []
        self.before_answer: Callable[[Received], None] | None = None
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                item = Received(self.path, json.loads(raw or b"null"), time.time())
                with receiver._lock:
                    receiver.received.append(item)
                if receiver.before_answer is not None:
                    receiver.before_answer(item)
                self.send_response(receiver.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.received]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def alertmanager_binary() -> Path:
    """Build (once, then cached) and return Alertmanager; a failed build fails the test loudly."""
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "alertmanager-build.sh")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"scripts/alertmanager-build.sh failed:\n{result.stderr[-3000:]}"
    return Path(result.stdout.strip().splitlines()[-1])


class Alertmanager:
    """A real Alertmanager on 127.0.0.1 with short group timings and one webhook receiver that
    gets resolved notifications too; each alert is its own group (``group_by: ['...']``)."""

    def __init__(self, binary: Path, receiver_url: str, port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="gpulens-am-"))
        (self.dir / "alertmanager.yml").write_text(
            "route:\n"
            "  receiver: test\n"
            "  group_by: ['...']\n"
            "  group_wait: 1s\n"
            "  group_interval: 1s\n"
            "  repeat_interval: 1h\n"
            "receivers:\n"
            "  - name: test\n"
            "    webhook_configs:\n"
            f"      - url: {receiver_url}\n"
            "        send_resolved: true\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.dir / "alertmanager.log").open("ab")
        self.proc = subprocess.Popen(
            [str(self.binary), f"--config.file={self.dir / 'alertmanager.yml'}",
             f"--storage.path={self.dir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--cluster.listen-address=", "--log.level=info"],
            stdout=log, stderr=log,
        )
        wait_for(self.ready, 30, f"Alertmanager on {self.url} (log: {self.dir / 'alertmanager.log'})")

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"Alertmanager exited: {(self.dir / 'alertmanager.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?active=true&silenced=true&inhibited=true",
                                    timeout=5) as response:
            return list(json.loads(response.read()))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


def forwarder_env(kafka: KafkaSettings, prefix: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env.update({
        "GPULENS_TOPIC_PREFIX": prefix,
        "GPULENS_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "GPULENS_GROUP_ID": f"{prefix}-forward",
        "GPULENS_LOG_FORMAT": "text",
        "GPULENS_RETRY_INITIAL_S": "0.2",
        "GPULENS_RETRY_MAX_S": "1",
        "GPULENS_CLUSTER": "test-cluster",
        "GPULENS_RUNBOOK_BASE_URL": "https://docs.example/gpulens/alerts.md",
    })
    env.update({f"GPULENS_{k.upper()}": v for k, v in settings.items()})
    return env


def start_forwarder(env: dict[str, str]) -> GpulensChild:
    """``gpulens alerts forward`` as a child process, its log collected."""
    return GpulensChild(env, "alerts", "forward")
