"""Reading ClickHouse while the sink owns the embedded engine.

chDB allows one process per data directory. The sink therefore serves a small read-only query
endpoint on 127.0.0.1 (a random port and a random token, recorded in a 0600 file in the data dir);
``gpulens sql`` and ``gpulens report`` find that file and relay their queries through it, or open
the engine themselves when no sink runs. Against a ClickHouse server they just query the server.
The SQL is the same in every case and results come back in the same JSON-friendly form.

The endpoint applies exactly the guard and limits of ``gpulens sql`` (a read-only
:class:`ClickHouseStore` per running query, see sinks/readonly.py). A query whose client closes
the connection is killed, and so is every running query when the sink stops, so a long read never
holds the sink's shutdown.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import select
import socket
import threading
from collections.abc import Callable
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
from sinks.readonly import ReadLimits, ReadOnlyViolation

log = get_logger(__name__)

ENDPOINT_FILE = "sink-query-endpoint.json"
TOKEN_HEADER = "X-Gpulens-Token"
MAX_CONCURRENT_QUERIES = 4


class ClosableSqlReader(Protocol):
    """Anything that answers read-only SQL (a store, or the sink's endpoint)."""

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult: ...

    def close(self) -> None: ...


def endpoint_file(data_dir: Path) -> Path:
    return data_dir / ENDPOINT_FILE


STOP_WAIT_S = 6.0
"""How long stopping waits for cancelled queries to leave the engine (SIGTERM -> exit within 10 s)."""


class ReaderPool:
    """Read-only stores, one per running query (a chDB handle runs one query at a time)."""

    def __init__(self, open_reader: Callable[[], ClickHouseStore], size: int = MAX_CONCURRENT_QUERIES) -> None:
        self._open = open_reader
        self._idle: list[ClickHouseStore] = []
        self._busy = 0
        self._size = size
        self._closed = False
        self._lock = threading.Lock()
        self._idle_now = threading.Condition(self._lock)

    def acquire(self) -> ClickHouseStore:
        with self._lock:
            if self._idle:
                self._busy += 1
                return self._idle.pop()
            if self._busy >= self._size:
                raise StoreUnavailable(f"busy: {self._busy} queries are running; try again")
            self._busy += 1
        try:
            return self._open()
        except BaseException:
            with self._lock:
                self._busy -= 1
            raise

    def release(self, store: ClickHouseStore) -> None:
        with self._lock:
            self._busy -= 1
            self._idle_now.notify_all()
            if not self._closed:
                self._idle.append(store)
                return
        store.close()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no query runs (cancelled ones return within moments); False on timeout."""
        with self._lock:
            return self._idle_now.wait_for(lambda: self._busy == 0, timeout_s)

    def close(self) -> None:
        """Close the idle stores now; a busy one closes when its (cancelled) query returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for store in idle:
            store.close()


def _client_gone(connection: socket.socket) -> bool:
    """True once the peer closed its end (readable with nothing to read)."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class QueryServer:
    """The sink's local read-only endpoint: ``POST /query`` {"sql", "parameters"} -> QueryResult JSON."""

    def __init__(self, url: str, data_dir: Path, port: int = 0, limits: ReadLimits | None = None) -> None:
        self.url = url
        self.data_dir = data_dir
        self.limits = limits or ReadLimits()
        self.token = secrets.token_hex(16)
        self.stopping = threading.Event()
        self.pool = ReaderPool(lambda: ClickHouseStore(url, read_only=True, limits=self.limits))
        max_body = self.limits.max_query_bytes * 2 + 64 * 1024
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                log.debug("query endpoint", request=format % args)

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = orjson.dumps(body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    log.debug("query client went away before the reply")

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._reply(200, {"ok": True, "url": server.url, "pid": os.getpid()})
                else:
                    self._reply(404, {"error": "not found"})

            def _request(self) -> tuple[str, dict[str, Any] | None]:
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                except ValueError:
                    raise ValueError("Content-Length is not a number") from None
                if length < 0 or length > max_body:
                    raise ValueError(f"the body is {length} bytes; the limit is {max_body}")
                request = orjson.loads(self.rfile.read(length))
                if not isinstance(request, dict) or not isinstance(request.get("sql"), str):
                    raise ValueError('expected a JSON object {"sql": "...", "parameters": {...}}')
                parameters = request.get("parameters") or None
                if parameters is not None and not isinstance(parameters, dict):
                    raise ValueError("parameters must be a JSON object")
                return request["sql"], parameters

            def do_POST(self) -> None:
                if self.path != "/query":
                    self._reply(404, {"error": "not found"})
                    return
                if not secrets.compare_digest(self.headers.get(TOKEN_HEADER, ""), server.token):
                    self._reply(403, {"error": "bad token"})
                    return
                try:
                    sql, parameters = self._request()
                    result = server.run(sql, parameters, lambda: _client_gone(self.connection))
                except ReadOnlyViolation as exc:
                    self._reply(400, {"error": str(exc), "kind": "readonly"})
                except StoreUnavailable as exc:
                    self._reply(503, {"error": str(exc), "kind": "unavailable"})
                except StoreError as exc:
                    self._reply(400, {"error": str(exc), "kind": "rejected"})
                except (ValueError, orjson.JSONDecodeError) as exc:
                    self._reply(400, {"error": f"bad request: {exc}", "kind": "rejected"})
                else:
                    self._reply(200, result.to_json())

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="sink-query", daemon=True)

    def run(self, sql: str, parameters: dict[str, Any] | None, client_gone: Callable[[], bool]) -> QueryResult:
        """One guarded query on a pooled reader, killed when ``client_gone()`` or the server stops."""
        if self.stopping.is_set():
            raise StoreUnavailable("the sink is stopping")
        store = self.pool.acquire()
        cancel = threading.Event()
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.2):
                if self.stopping.is_set() or client_gone():
                    cancel.set()
                    return

        watcher = threading.Thread(target=watch, name="query-client-watch", daemon=True)
        watcher.start()
        try:
            return store.query(sql, parameters, cancel=cancel)
        finally:
            done.set()
            watcher.join()
            self.pool.release(store)

    def start(self) -> int:
        self._thread.start()
        path = endpoint_file(self.data_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(orjson.dumps({"pid": os.getpid(), "port": self.port, "token": self.token,
                                       "url": self.url, "timeout_s": self.limits.max_execution_time_s + 30}))
        tmp.replace(path)
        log.info("query endpoint serving", port=self.port, endpoint_file=str(path))
        return self.port

    def stop(self) -> None:
        self.stopping.set()  # running queries are killed within a watcher tick
        self._httpd.shutdown()
        self._httpd.server_close()
        # the process must not exit while a query thread is still inside the engine (chDB crashes
        # at interpreter exit under a running query): give the cancelled ones time to return
        if not self.pool.wait_idle(STOP_WAIT_S):
            log.warning("queries still running at stop", waited_s=STOP_WAIT_S)
        self.pool.close()
        with contextlib.suppress(FileNotFoundError, ValueError, OSError):
            path = endpoint_file(self.data_dir)
            if orjson.loads(path.read_bytes()).get("pid") == os.getpid():
                path.unlink()


class RemoteReader:
    """Queries relayed through a running sink's endpoint."""

    def __init__(self, port: int, token: str, timeout_s: float = 330.0) -> None:
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
    reader = RemoteReader(int(info["port"]), str(info["token"]), float(info.get("timeout_s", 330.0)))
    return reader if reader.healthy() else None


def open_reader(url: str, data_dir: Path, limits: ReadLimits | None = None) -> ClosableSqlReader:
    """A read-only reader for ``url``: the server, the running sink's endpoint, or the engine itself."""
    if not is_embedded(url):
        return ClickHouseStore(url, read_only=True, limits=limits)
    remote = running_sink_endpoint(url, data_dir)
    if remote is not None:
        return remote
    if not Path(embedded_path(url)).exists():
        raise StoreRejected(
            f"no ClickHouse data at {embedded_path(url)} yet: run `gpulens sink` first (or set GPULENS_CLICKHOUSE__URL)"
        )
    try:
        return ClickHouseStore(url, read_only=True, limits=limits)
    except StoreLocked as exc:
        raise StoreLocked(f"{exc} and no sink query endpoint answers ({endpoint_file(data_dir)})") from None
