"""List + watch with the informer semantics of client-go, over an abstract source.

Why not just watch: a watch only reports changes after a resourceVersion, and the API server
forgets old versions (etcd compaction). So, like client-go's reflector, we

1. list, remember every object and the list's resourceVersion;
2. watch from that version (with bookmarks, so a quiet resource still advances our version, and
   a server timeout, so a silently dead connection is noticed), applying ADDED / MODIFIED /
   DELETED to the store and advancing the version with every event and bookmark;
3. when the stream ends (timeout, dropped connection, server error) watch again from the last
   version seen — no re-list, no duplicates;
4. on ``410 Gone`` (our version is older than the server keeps) list again and compare with the
   store: every object that vanished while we were not watching is reported deleted exactly once
   (it leaves the store as it is reported), the rest are upserts that the change filter absorbs.

Failures back off exponentially with jitter (``backoff``); a watch that ends at once without a
single event also counts as a failure, so a misbehaving server cannot cause a hot loop. Time and
sleeping come from an injectable :class:`Clock` so tests run the loop with a fake one.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

from common.backoff import Backoff
from common.errors import RetriableError
from common.logs import get_logger
from producers.watcher.kube_json import JsonObject

log = get_logger(__name__)



class Gone(RetriableError):
    """HTTP 410: the resourceVersion we asked for is older than the server retains."""


class WatchRequestError(RetriableError):
    """A failed list or watch request (server error, dropped connection, timeout)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class WatchSource(Protocol):
    """One resource collection of the API server (e.g. pods in all namespaces)."""

    resource: str

    def list(self) -> tuple[list[JsonObject], str]:
        """Every object and the collection's resourceVersion."""
        ...

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[JsonObject]:
        """Raw watch events ``{"type": ..., "object": {...}}`` after ``resource_version``."""
        ...

    def interrupt(self) -> None:
        """Unblock a watch in progress (shutdown)."""
        ...


class Handler(Protocol):
    def upsert(self, obj: JsonObject) -> None: ...

    def delete(self, obj: JsonObject, observed: str) -> None:
        """``observed`` is ``"watch"`` (a DELETED event) or ``"relist"`` (vanished during a gap)."""
        ...


class Clock(Protocol):
    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float, stop: threading.Event) -> bool:
        """Wait ``seconds`` or until ``stop`` is set; True when stopped."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, stop: threading.Event) -> bool:
        return stop.wait(seconds)


class Observer(Protocol):
    """Where an informer reports what it does (self-metrics)."""

    def event(self, resource: str, kind: str) -> None: ...

    def relist(self, resource: str, reason: str, vanished: int) -> None: ...

    def error(self, resource: str, kind: str) -> None: ...

    def lag(self, resource: str, seconds: float) -> None: ...

    def store_size(self, resource: str, size: int) -> None: ...


class NullObserver:
    def event(self, resource: str, kind: str) -> None:
        pass

    def relist(self, resource: str, reason: str, vanished: int) -> None:
        pass

    def error(self, resource: str, kind: str) -> None:
        pass

    def lag(self, resource: str, seconds: float) -> None:
        pass

    def store_size(self, resource: str, size: int) -> None:
        pass


def uid_key(obj: JsonObject) -> str:
    return str(obj.get("metadata", {}).get("uid") or "")


def name_key(obj: JsonObject) -> str:
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name") or "")


def drop_managed_fields(obj: JsonObject) -> JsonObject:
    """What the store keeps by default: the object without ``managedFields`` (often half its size)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def _resource_version(obj: JsonObject) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    value = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return str(value) if value else None


class Informer:
    """Keeps a local copy of one collection in sync and tells a handler what changed."""

    def __init__(
        self,
        source: WatchSource,
        handler: Handler,
        key: Callable[[JsonObject], str] = uid_key,
        *,
        clock: Clock | None = None,
        backoff: Backoff | None = None,
        watch_timeout_s: int = 300,
        observer: Observer | None = None,
        time_of: Callable[[JsonObject], datetime | None] | None = None,
        min_watch_s: float = 1.0,
        rng: random.Random | None = None,
        slim: Callable[[JsonObject], JsonObject] | None = None,
    ) -> None:
        self.source = source
        self.resource = source.resource
        self.handler = handler
        self.key = key
        self.clock = clock or SystemClock()
        self.backoff = backoff or Backoff()
        self.watch_timeout_s = max(int(watch_timeout_s), 1)
        self.observer = observer or NullObserver()
        self.time_of = time_of
        self.min_watch_s = min_watch_s
        self.rng = rng or random.Random()
        self.slim = slim or drop_managed_fields
        self.store: dict[str, JsonObject] = {}
        self.resource_version: str | None = None
        self.synced = False
        self.relists = 0
        self._gone_streak = 0

    # ------------------------------------------------------------------ the two halves

    def relist(self, reason: str = "initial") -> int:
        """List, report vanished objects as deleted, upsert the rest; returns how many vanished."""
        items, resource_version = self.source.list()
        fresh: dict[str, JsonObject] = {}
        for obj in items:
            key = self.key(obj)
            if key:
                fresh[key] = obj
        vanished = [(key, obj) for key, obj in self.store.items() if key not in fresh]
        for key, obj in vanished:
            self.store.pop(key, None)  # leaves the store as it is reported: exactly once
            self._call(self.handler.delete, obj, "relist")
        for key, obj in fresh.items():
            self._call(self.handler.upsert, obj)
            self.store[key] = self.slim(obj)
        self.resource_version = resource_version
        self.synced = True
        self.relists += 1
        self.observer.relist(self.resource, reason, len(vanished))
        self.observer.store_size(self.resource, len(self.store))
        log.info("listed", resource=self.resource, reason=reason, objects=len(fresh), vanished=len(vanished),
                 resource_version=resource_version)
        return len(vanished)

    def watch_once(self, stop: threading.Event | None = None) -> int:
        """One watch request from the last version until the stream ends; returns events applied."""
        if self.resource_version is None:
            raise RuntimeError("watch before list")
        # like client-go, spread timeouts between T and 2T so watchers do not reconnect in lock-step
        timeout_s = self.watch_timeout_s + int(self.rng.random() * self.watch_timeout_s)
        applied = 0
        for event in self.source.watch(self.resource_version, timeout_s):
            kind = str(event.get("type", ""))
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            self.observer.event(self.resource, kind)
            if kind == "ERROR":
                code = obj.get("code")
                if code == 410:
                    raise Gone(str(obj.get("message", "resource version too old")))
                raise WatchRequestError(f"watch error: {obj.get('reason')}: {obj.get('message')}", int(code or 0))
            version = _resource_version(obj)
            if kind in ("ADDED", "MODIFIED"):
                key = self.key(obj)
                if key:
                    self._call(self.handler.upsert, obj)
                    self.store[key] = self.slim(obj)
            elif kind == "DELETED":
                key = self.key(obj)
                if key:
                    self.store.pop(key, None)
                    self._call(self.handler.delete, obj, "watch")
            elif kind != "BOOKMARK":
                log.warning("unknown watch event type", resource=self.resource, type=kind)
                continue
            if version:
                self.resource_version = version
            if kind != "BOOKMARK":
                applied += 1
                self._observe_lag(obj)
            self._gone_streak = 0
            if stop is not None and stop.is_set():
                break
        self.observer.store_size(self.resource, len(self.store))
        return applied

    # ------------------------------------------------------------------ the loop

    def step(self, stop: threading.Event) -> None:
        """One turn of the loop: list if needed, else watch once; errors back off."""
        if not self.synced:
            try:
                self.relist("initial" if self.relists == 0 else "gone")
                self.backoff.reset()
            except Exception as exc:
                self._failed("list", exc, stop)
            return
        started = self.clock.monotonic()
        version_before = self.resource_version
        try:
            applied = self.watch_once(stop)
        except Gone as exc:
            self.observer.error(self.resource, "gone")
            log.info("watch expired; re-listing", resource=self.resource, resource_version=version_before,
                     reason=str(exc))
            self.synced = False
            self._gone_streak += 1
            if self._gone_streak > 1:  # 410 again right after a re-list: do not spin
                self.clock.sleep(self.backoff.next_delay_s(), stop)
            return
        except Exception as exc:
            self._failed("watch", exc, stop)
            return
        quick = self.clock.monotonic() - started < self.min_watch_s
        if applied == 0 and quick and self.resource_version == version_before and not stop.is_set():
            self.observer.error(self.resource, "empty_watch")
            self.clock.sleep(self.backoff.next_delay_s(), stop)
        else:
            self.backoff.reset()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step(stop)

    def sync(self, stop: threading.Event) -> bool:
        """List until it succeeds (backing off) or ``stop``; True when synced."""
        while not self.synced and not stop.is_set():
            self.step(stop)
        return self.synced

    # ------------------------------------------------------------------ helpers

    def _failed(self, what: str, exc: Exception, stop: threading.Event) -> None:
        status = getattr(exc, "status", 0)
        self.observer.error(self.resource, f"{what}_{status}" if status else what)
        delay = self.backoff.next_delay_s()
        log.warning(f"{what} failed; backing off", resource=self.resource, error=str(exc)[:300],
                    status=status, delay_s=round(delay, 2), failures=self.backoff.failures)
        self.clock.sleep(delay, stop)

    def _call(self, method: Callable[..., None], *args: Any) -> None:
        try:
            method(*args)
        except Exception:
            self.observer.error(self.resource, "handler")
            log.error("handler failed", resource=self.resource, exc_info=True,
                      object=args[0].get("metadata", {}).get("name") if args and isinstance(args[0], dict) else None)

    def _observe_lag(self, obj: JsonObject) -> None:
        if self.time_of is None:
            return
        at = self.time_of(obj)
        if at is not None:
            self.observer.lag(self.resource, max((self.clock.now() - at).total_seconds(), 0.0))
