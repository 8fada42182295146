"""A simulated Kubernetes API server for tests and ``gpulens watch --simulate``.

No cluster runs here, yet the watcher must be tested through the real ``kubernetes`` client and
its real HTTP behaviour. This server speaks the same protocol for the collections the watcher
reads, with plain ``http.server`` and threads (it imports no Kubernetes library):

- ``GET /api/v1/pods``, ``/api/v1/namespaces/{ns}/pods``, ``/api/v1/nodes``, ``/api/v1/events``,
  ``/api/v1/namespaces/{ns}/events``, ``/apis/events.k8s.io/v1/events`` (and namespaced): lists
  with a resourceVersion per object and per list, ``limit`` / ``continue`` pages over a snapshot;
- ``?watch=true``: a chunked stream of ``{"type", "object"}`` lines from ``resourceVersion``
  (``""``/``"0"`` = synthetic ADDED of the current state first), closed after ``timeoutSeconds``;
  with ``allowWatchBookmarks`` a ``BOOKMARK`` at most every ``bookmark_interval_s``, and only when
  the watched collection moved past what the client was sent (changes it filtered out, e.g. other
  namespaces): like the real server, whose watch cache is per resource, a pod watch is not told
  about node changes and a quiet collection gets no bookmarks; event watches never get one (the
  real server keeps no watch cache for events);
- a bounded history: watching from a version older than the retained window gets what the real
  server sends — HTTP 200 with one ``ERROR`` event carrying a ``Status`` with code 410 — and
  :meth:`compact` drops the whole history to force it;
- fault injection: :meth:`fail_next` answers the next requests with a 5xx ``Status``;
  :meth:`drop_watches` cuts every open watch mid-stream (a broken chunk, then a closed socket).

Events are stored once, in the core/v1 shape, and served converted under events.k8s.io/v1, as
the real server does with its single storage.

With ``kueue=True`` it also serves Kueue's ``workloads`` (``/apis/kueue.x-k8s.io/v1beta1/workloads``
and namespaced) and their discovery document ``/apis/kueue.x-k8s.io/v1beta1``, as a real server
does once the Workload CRD is installed; without it both answer 404, as on a cluster without
Kueue. Custom resources keep ``kind`` and ``apiVersion`` on every list item (the real server
stores them as unstructured objects), unlike built-in kinds.

With ``dra=True`` it serves Dynamic Resource Allocation's ``resource.k8s.io/v1`` as a 1.34+ server
does: ``resourceslices`` and ``deviceclasses`` (cluster-scoped), ``resourceclaims`` (all namespaces
and namespaced), and the group version's discovery document; without it they answer 404, as an
older server does.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from producers.watcher.kube_json import JsonObject

COLLECTIONS = ("pods", "nodes", "events", "workloads", "resourceslices", "resourceclaims", "deviceclasses")
KUEUE_GROUP_VERSION = "kueue.x-k8s.io/v1beta1"
DRA_GROUP_VERSION = "resource.k8s.io/v1"
DRA_COLLECTIONS = ("resourceslices", "resourceclaims", "deviceclasses")
_KINDS = {"pods": ("Pod", "v1"), "nodes": ("Node", "v1"), "events": ("Event", "v1"),
          "workloads": ("Workload", KUEUE_GROUP_VERSION), "resourceslices": ("ResourceSlice", DRA_GROUP_VERSION),
          "resourceclaims": ("ResourceClaim", DRA_GROUP_VERSION), "deviceclasses": ("DeviceClass", DRA_GROUP_VERSION)}
_CUSTOM = {"workloads"}
_CLUSTER_SCOPED = {"nodes", "resourceslices", "deviceclasses"}


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(obj: JsonObject) -> str:
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def _status(code: int, reason: str, message: str) -> JsonObject:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def to_events_v1(event: JsonObject) -> JsonObject:
    """A core/v1 Event in the events.k8s.io/v1 shape (the API server converts the same way)."""
    source = event.get("source") or {}
    converted = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": copy.deepcopy(event.get("metadata", {})),
        "eventTime": event.get("eventTime"),
        "series": event.get("series"),
        "reportingController": event.get("reportingComponent") or source.get("component"),
        "reportingInstance": event.get("reportingInstance") or source.get("host"),
        "action": event.get("action"),
        "reason": event.get("reason"),
        "regarding": event.get("involvedObject"),
        "related": event.get("related"),
        "note": event.get("message"),
        "type": event.get("type"),
        "deprecatedSource": source or None,
        "deprecatedFirstTimestamp": event.get("firstTimestamp"),
        "deprecatedLastTimestamp": event.get("lastTimestamp"),
        "deprecatedCount": event.get("count"),
    }
    return {k: v for k, v in converted.items() if v not in (None, "", {})}


def _kueue_discovery() -> JsonObject:
    """The APIResourceList a real server serves for the Workload CRD's group version."""
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": KUEUE_GROUP_VERSION,
            "resources": [{"name": "workloads", "singularName": "workload", "namespaced": True,
                           "kind": "Workload", "verbs": ["delete", "deletecollection", "get", "list", "patch",
                                                         "create", "update", "watch"]},
                          {"name": "workloads/status", "singularName": "", "namespaced": True,
                           "kind": "Workload", "verbs": ["get", "patch", "update"]}]}


def _dra_discovery() -> JsonObject:
    """The APIResourceList a 1.34+ server serves for ``resource.k8s.io/v1`` (the parts the watcher reads)."""
    verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    resources = []
    for name, namespaced in (("deviceclasses", False), ("resourceclaims", True), ("resourceslices", False)):
        kind = _KINDS[name][0]
        resources.append({"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
                          "verbs": verbs})
        if name == "resourceclaims":
            resources.append({"name": "resourceclaims/status", "singularName": "", "namespaced": True,
                              "kind": kind, "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": DRA_GROUP_VERSION,
            "resources": resources}


class _Route:
    def __init__(self, collection: str, namespace: str | None, events_v1: bool) -> None:
        self.collection = collection
        self.namespace = namespace
        self.events_v1 = events_v1

    def matches(self, collection: str, obj: JsonObject) -> bool:
        if collection != self.collection:
            return False
        return self.namespace is None or obj.get("metadata", {}).get("namespace") == self.namespace

    def render(self, obj: JsonObject) -> JsonObject:
        if self.events_v1:
            return to_events_v1(obj)
        kind, version = _KINDS[self.collection]
        return {"kind": kind, "apiVersion": version, **obj}


def _served(parts: list[str], kueue: bool, dra: bool) -> tuple[list[str], tuple[str, ...], bool] | None:
    """The path after its group version, the collections that group version serves, and whether it
    is events.k8s.io; None for a group version not served."""
    if parts[:2] == ["api", "v1"]:
        return parts[2:], ("pods", "nodes", "events"), False
    if parts[:3] == ["apis", "events.k8s.io", "v1"]:
        return parts[3:], ("events",), True
    if kueue and parts[:3] == ["apis", *KUEUE_GROUP_VERSION.split("/")]:
        return parts[3:], ("workloads",), False
    if dra and parts[:3] == ["apis", *DRA_GROUP_VERSION.split("/")]:
        return parts[3:], DRA_COLLECTIONS, False
    return None


def _route(path: str, kueue: bool = False, dra: bool = False) -> _Route | None:
    served = _served([p for p in path.split("/") if p], kueue, dra)
    if served is None:
        return None
    rest, collections, events_v1 = served
    namespace = None
    if len(rest) == 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if len(rest) != 1 or rest[0] not in collections:
        return None
    if rest[0] in _CLUSTER_SCOPED and namespace:
        return None
    return _Route(rest[0], namespace, events_v1)


@dataclass
class _Watch:
    """One open watch connection's place in the history."""

    generation: int
    """The server's drop generation when it opened (a newer one cuts it)."""
    cursor: int
    """The newest history entry it has looked at."""
    sent: int
    """The newest version its client has been told (by an event or a bookmark)."""
    deadline: float
    """When it ends (``time.monotonic``)."""
    bookmarks: bool
    last_bookmark: float


@dataclass(frozen=True)
class _Wake:
    """What a watch woke up to: history to send, or why it ends (with the 410 Status when gone)."""

    batch: list[tuple[int, str, str, JsonObject]]
    current: int
    """The watched collection's newest version."""
    end: Literal["stop", "drop", "gone"] | None = None
    gone: JsonObject | None = None


def _bookmark(route: _Route, rv: int) -> JsonObject:
    kind = "Event" if route.events_v1 else _KINDS[route.collection][0]
    api_version = "events.k8s.io/v1" if route.events_v1 else _KINDS[route.collection][1]
    return {"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                                           "metadata": {"resourceVersion": str(rv)}}}


class FakeApiServer:
    """In-memory objects with resourceVersions, a change history, and HTTP list/watch over them."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, retain: int = 1000,
                 bookmark_interval_s: float = 1.0, max_watch_s: float = 1800.0, kueue: bool = False,
                 dra: bool = False) -> None:
        self.kueue = kueue
        self.dra = dra
        self.retain = retain
        self.bookmark_interval_s = bookmark_interval_s
        self.max_watch_s = max_watch_s
        self._cond = threading.Condition()
        self._rv = 1000
        self._objects: dict[str, dict[str, JsonObject]] = {c: {} for c in COLLECTIONS}
        self._history: list[tuple[int, str, str, JsonObject]] = []
        self._compacted_rv = self._rv
        self._collection_rv = dict.fromkeys(COLLECTIONS, self._rv)
        self._failures: list[tuple[int, str | None]] = []
        self._drop_generation = 0
        self._snapshots: dict[str, tuple[list[JsonObject], int]] = {}
        self._snapshot_ids = itertools.count(1)
        self._stopping = False
        self.requests: list[str] = []
        self.watch_requests: list[dict[str, str]] = []
        self._host = host
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._server.server_port}"

    def start(self) -> FakeApiServer:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ state changes

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def put(self, collection: str, obj: JsonObject) -> JsonObject:
        """Create or replace an object (ADDED or MODIFIED); returns the stored copy."""
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now_text())
        key = _key(stored)
        with self._cond:
            existing = self._objects[collection].get(key)
            if existing is not None:
                meta["uid"] = existing["metadata"]["uid"]
                meta["creationTimestamp"] = existing["metadata"].get("creationTimestamp", meta["creationTimestamp"])
            self._record(collection, "MODIFIED" if existing is not None else "ADDED", stored)
            self._objects[collection][key] = stored
            return copy.deepcopy(stored)

    def patch(self, collection: str, key: str, change: Callable[[JsonObject], None]) -> JsonObject:
        """Apply ``change`` to a copy of the object and store it (one MODIFIED event)."""
        with self._cond:
            obj = copy.deepcopy(self._objects[collection][key])
        change(obj)
        return self.put(collection, obj)

    def delete(self, collection: str, key: str) -> JsonObject | None:
        """Delete at once (``gracePeriodSeconds=0``). A pod goes through graceful deletion even
        then, as on the real server: first a MODIFIED with ``deletionTimestamp`` set, then DELETED."""
        with self._cond:
            obj = self._objects[collection].pop(key, None)
            if obj is None:
                return None
            if collection == "pods":
                meta = obj["metadata"]
                meta.setdefault("deletionTimestamp", _now_text())
                meta.setdefault("deletionGracePeriodSeconds", 0)
                self._record(collection, "MODIFIED", obj)
                obj = copy.deepcopy(obj)
            self._record(collection, "DELETED", obj)
            return copy.deepcopy(obj)

    def get(self, collection: str, key: str) -> JsonObject | None:
        with self._cond:
            obj = self._objects[collection].get(key)
            return copy.deepcopy(obj) if obj is not None else None

    def keys(self, collection: str) -> list[str]:
        with self._cond:
            return sorted(self._objects[collection])

    def _record(self, collection: str, kind: str, obj: JsonObject) -> None:
        self._rv += 1
        self._collection_rv[collection] = self._rv
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, collection, kind, copy.deepcopy(obj)))
        if len(self._history) > self.retain:
            dropped = self._history[: len(self._history) - self.retain]
            del self._history[: len(dropped)]
            self._compacted_rv = dropped[-1][0]
        self._cond.notify_all()

    # ------------------------------------------------------------------ fault injection

    def compact(self) -> None:
        """Forget the whole change history: any watch from an older version gets 410 Gone."""
        with self._cond:
            self._history.clear()
            self._compacted_rv = self._rv
            self._cond.notify_all()

    def fail_next(self, count: int = 1, status: int = 500, path_contains: str | None = None) -> None:
        """Answer the next ``count`` matching requests with HTTP ``status`` and a Status body."""
        with self._cond:
            self._failures.extend([(status, path_contains)] * count)

    def drop_watches(self) -> None:
        """Cut every open watch connection mid-stream, the way a crashing proxy would."""
        with self._cond:
            self._drop_generation += 1
            self._cond.notify_all()

    def _take_failure(self, path: str) -> int | None:
        with self._cond:
            for index, (status, needle) in enumerate(self._failures):
                if needle is None or needle in path:
                    del self._failures[index]
                    return status
        return None

    # ------------------------------------------------------------------ serving

    def _list(self, route: _Route, query: dict[str, str]) -> JsonObject:
        token = query.get("continue")
        limit = int(query.get("limit") or 0)
        if token:
            snap_id, _, offset_text = token.rpartition(":")
            with self._cond:
                snapshot = self._snapshots.get(snap_id)
            if snapshot is None:
                return _status(410, "Expired", "the provided continue parameter is too old")
            items, rv = snapshot
            offset = int(offset_text)
        else:
            with self._cond:
                rv = self._rv
                items = [route.render(copy.deepcopy(obj))
                         for _, obj in sorted(self._objects[route.collection].items())
                         if route.matches(route.collection, obj)]
            offset = 0
        for item in items:
            if not route.events_v1 and route.collection not in _CUSTOM:
                item.pop("kind", None)
                item.pop("apiVersion", None)
        kind, version = ("EventList", "events.k8s.io/v1") if route.events_v1 else (
            _KINDS[route.collection][0] + "List", _KINDS[route.collection][1])
        metadata: JsonObject = {"resourceVersion": str(rv)}
        page = items[offset:]
        if limit and len(page) > limit:
            page = page[:limit]
            snap_id = token.rpartition(":")[0] if token else f"snap{next(self._snapshot_ids)}"
            with self._cond:
                self._snapshots[snap_id] = (items, rv)
                while len(self._snapshots) > 64:
                    self._snapshots.pop(next(iter(self._snapshots)))
            metadata["continue"] = f"{snap_id}:{offset + limit}"
        return {"kind": kind, "apiVersion": version, "metadata": metadata, "items": page}

    def _watch_events(self, route: _Route, query: dict[str, str]) -> Iterator[JsonObject | None]:
        """Watch events to send; ``None`` means "cut the connection now"."""
        timeout_s = float(query.get("timeoutSeconds") or self.max_watch_s)
        # events are served straight from etcd (no watch cache), and only the cache sends bookmarks
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1") and route.collection != "events"
        deadline = time.monotonic() + min(timeout_s, self.max_watch_s)
        watch, initial, gone = self._open_watch(route, query.get("resourceVersion") or "", deadline, bookmarks)
        if gone is not None:
            yield {"type": "ERROR", "object": gone}
            return
        for obj in initial:
            yield {"type": "ADDED", "object": obj}
        while True:
            wake = self._wait_for_events(route.collection, watch)
            if wake.end == "drop":
                yield None
            if wake.end == "gone":
                yield {"type": "ERROR", "object": wake.gone}
            if wake.end:
                return
            for rv, collection, kind, obj in wake.batch:
                watch.cursor = rv
                if route.matches(collection, obj):
                    watch.sent = rv
                    yield {"type": kind, "object": route.render(copy.deepcopy(obj))}
            now = time.monotonic()
            if watch.bookmarks and wake.current > watch.sent and now - watch.last_bookmark >= self.bookmark_interval_s:
                watch.sent = wake.current
                yield _bookmark(route, watch.sent)
                watch.last_bookmark = now
            if now >= deadline:
                return

    def _open_watch(self, route: _Route, requested: str, deadline: float,
                    bookmarks: bool) -> tuple[_Watch, list[JsonObject], JsonObject | None]:
        """The watch from ``requested`` (the current objects first when it is empty or ``0``), and
        the 410 Status to answer when that version is compacted away."""
        with self._cond:
            generation = self._drop_generation
            if requested in ("", "0"):
                cursor = self._rv
                initial = [route.render(copy.deepcopy(obj))
                           for _, obj in sorted(self._objects[route.collection].items())
                           if route.matches(route.collection, obj)]
                gone = None
            else:
                cursor = int(requested)
                initial = []
                gone = self._too_old(cursor) if cursor < self._compacted_rv else None
        return _Watch(generation, cursor, cursor, deadline, bookmarks, time.monotonic()), initial, gone

    def _too_old(self, cursor: int) -> JsonObject:
        return _status(410, "Expired", f"too old resource version: {cursor} ({self._compacted_rv})")

    def _wait_for_events(self, collection: str, watch: _Watch) -> _Wake:
        """Block until the watch has history to send, a bookmark is due, its time is up, or it ends."""
        with self._cond:
            while True:
                end = self._watch_end(watch)
                if end:
                    return _Wake([], self._collection_rv[collection], end,
                                 self._too_old(watch.cursor) if end == "gone" else None)
                start = bisect.bisect_right(self._history, watch.cursor, key=lambda entry: entry[0])
                batch = self._history[start:]
                now = time.monotonic()
                progress = watch.bookmarks and self._collection_rv[collection] > watch.sent
                bookmark_wait = self.bookmark_interval_s - (now - watch.last_bookmark)
                if batch or now >= watch.deadline or (progress and bookmark_wait <= 0):
                    return _Wake(batch, self._collection_rv[collection])
                wait = min(watch.deadline - now, bookmark_wait) if progress else watch.deadline - now
                self._cond.wait(max(min(wait, 0.5), 0.01))

    def _watch_end(self, watch: _Watch) -> Literal["stop", "drop", "gone"] | None:
        """Why the watch ends now (the server stops, its connections are cut, or the events it has
        not yet seen are compacted away), else None. Called under the lock."""
        if self._stopping:
            return "stop"
        if self._drop_generation != watch.generation:
            return "drop"
        if watch.cursor < self._compacted_rv:
            return "gone"
        return None

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _send_json(self, code: int, body: JsonObject) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                server.requests.append(self.path)
                failure = server._take_failure(parts.path)
                if failure is not None:
                    reason = "InternalError" if failure == 500 else "ServiceUnavailable"
                    self._send_json(failure, _status(failure, reason, "injected failure"))
                    return
                if server.kueue and parts.path.rstrip("/") == "/apis/" + KUEUE_GROUP_VERSION:
                    self._send_json(200, _kueue_discovery())
                    return
                if server.dra and parts.path.rstrip("/") == "/apis/" + DRA_GROUP_VERSION:
                    self._send_json(200, _dra_discovery())
                    return
                route = _route(parts.path, server.kueue, server.dra)
                if route is None:
                    self._send_json(404, _status(404, "NotFound", f"the server could not find {parts.path}"))
                    return
                if query.get("watch") in ("true", "1"):
                    server.watch_requests.append(query)
                    self._stream(route, query)
                    return
                body = server._list(route, query)
                self._send_json(int(body.get("code", 200)) if body.get("kind") == "Status" else 200, body)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _stream(self, route: _Route, query: dict[str, str]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                try:
                    for event in server._watch_events(route, query):
                        if event is None:  # a broken chunk, then a dead socket
                            self.wfile.write(b"40\r\n{\"type\":\"MODIF")
                            self.wfile.flush()
                            self.connection.shutdown(socket.SHUT_RDWR)
                            self.close_connection = True
                            return
                        self._chunk(json.dumps(event).encode() + b"\n")
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True

        return Handler
