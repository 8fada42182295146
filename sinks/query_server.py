"""Reading ClickHouse while the sink owns the embedded engine.

chDB allows one process per data directory. The sink therefore serves a small read-only query
endpoint on 127.0.0.1 (a random port and a random token, recorded in a 0600 file in the data dir);
``gpulens sql`` and ``gpulens report`` find that file and relay their queries through it, or open
the engine themselves when no sink runs. Against a ClickHouse server they just query the server.
The SQL is the same in every case and results come back in the same JSON-friendly form.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import orjson

from common.logs import get_logger
from common.processes import pid_alive
from sinks.clickhouse import (
    ClickHouseStore,
    QueryResult,
    StoreError,
    StoreLocked,
    StoreRejected,
    StoreUnavailable,
    embedded_path,
    is_embedded,
)
from sinks.readonly import ReadOnlyViolation, check_read_only

log = get_logger(__name__)

ENDPOINT_FILE = "sink-query-endpoint.json"
TOKEN_HEADER = "X-Gpulens-Token"


class Reader(Protocol):
    """Anything that answers read-only SQL (a store, or the sink's endpoint)."""

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult: ...

    def close(self) -> None: ...


def endpoint_file(data_dir: Path) -> Path:
    return data_dir / ENDPOINT_FILE


class QueryServer:
    """The sink's local read-only endpoint: ``POST /query`` {"sql", "parameters"} -> QueryResult JSON."""

    def __init__(self, store: ClickHouseStore, data_dir: Path, port: int = 0) -> None:
        self.store = store
        self.data_dir = data_dir
        self.token = secrets.token_hex(16)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                log.debug("query endpoint", request=format % args)

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = orjson.dumps(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._reply(200, {"ok": True, "url": server.store.url, "pid": os.getpid()})
                else:
                    self._reply(404, {"error": "not found"})

            def do_POST(self) -> None:
                if self.path != "/query":
                    self._reply(404, {"error": "not found"})
                    return
                if not secrets.compare_digest(self.headers.get(TOKEN_HEADER, ""), server.token):
                    self._reply(403, {"error": "bad token"})
                    return
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                    request = orjson.loads(self.rfile.read(length))
                    sql = check_read_only(str(request["sql"]))
                    result = server.store.query(sql, request.get("parameters") or None)
                except ReadOnlyViolation as exc:
                    self._reply(400, {"error": str(exc), "kind": "readonly"})
                except StoreUnavailable as exc:
                    self._reply(503, {"error": str(exc), "kind": "unavailable"})
                except StoreError as exc:
                    self._reply(400, {"error": str(exc), "kind": "rejected"})
                except (KeyError, ValueError, orjson.JSONDecodeError) as exc:
                    self._reply(400, {"error": f"bad request: {exc}", "kind": "rejected"})
                else:
                    self._reply(200, result.to_json())

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="sink-query", daemon=True)

    def start(self) -> int:
        self._thread.start()
        path = endpoint_file(self.data_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(orjson.dumps({"pid": os.getpid(), "port": self.port, "token": self.token,
                                       "url": self.store.url}))
        tmp.replace(path)
        log.info("query endpoint serving", port=self.port, endpoint_file=str(path))
        return self.port

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        with contextlib.suppress(FileNotFoundError, ValueError, OSError):
            path = endpoint_file(self.data_dir)
            if orjson.loads(path.read_bytes()).get("pid") == os.getpid():
                path.unlink()


class RemoteReader:
    """Queries relayed through a running sink's endpoint."""

    def __init__(self, port: int, token: str, timeout_s: float = 300.0) -> None:
        self.port = port
        self.token = token
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        try:
            conn.request(method, path, body=body, headers={TOKEN_HEADER: self.token,
                                                           "Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, orjson.loads(response.read() or b"{}")
        except (OSError, http.client.HTTPException, orjson.JSONDecodeError) as exc:
            raise StoreUnavailable(f"sink query endpoint on port {self.port} did not answer: {exc}") from None
        finally:
            conn.close()

    def healthy(self) -> bool:
        try:
            status, _ = self._request("GET", "/health")
        except StoreUnavailable:
            return False
        return status == 200

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        status, body = self._request("POST", "/query", orjson.dumps({"sql": sql, "parameters": parameters or {}},
                                                                    default=str))
        if status == 200:
            return QueryResult.from_json(body)
        if body.get("kind") == "readonly":
            raise ReadOnlyViolation(str(body.get("error")))
        if status == 503:
            raise StoreUnavailable(str(body.get("error")))
        raise StoreRejected(str(body.get("error", f"HTTP {status}")))

    def close(self) -> None:
        return None


def running_sink_endpoint(url: str, data_dir: Path) -> RemoteReader | None:
    """The endpoint of a live sink that owns this embedded URL, if there is one."""
    path = endpoint_file(data_dir)
    try:
        info = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    if info.get("url") != url or not pid_alive(int(info.get("pid", 0))):
        return None
    reader = RemoteReader(int(info["port"]), str(info["token"]))
    return reader if reader.healthy() else None


def open_reader(url: str, data_dir: Path) -> Reader:
    """A read-only reader for ``url``: the server, the running sink's endpoint, or the engine itself."""
    if not is_embedded(url):
        return ClickHouseStore(url, read_only=True)
    remote = running_sink_endpoint(url, data_dir)
    if remote is not None:
        return remote
    if not Path(embedded_path(url)).exists():
        raise StoreRejected(
            f"no ClickHouse data at {embedded_path(url)} yet: run `gpulens sink` first (or set GPULENS_CLICKHOUSE__URL)"
        )
    try:
        return ClickHouseStore(url, read_only=True)
    except StoreLocked as exc:
        raise StoreLocked(f"{exc} and no sink query endpoint answers ({endpoint_file(data_dir)})") from None
