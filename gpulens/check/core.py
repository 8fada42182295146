"""The checks' shared types: a result (ok / warn / fail with the fix), the thresholds and the
context every check reads (the list of checks is :data:`gpulens.check.registry.CHECKS`)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from common.settings import CommonSettings


class State(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Result:
    """One line of ``gpulens check``: what was checked, its state, what was found, and what to do."""

    name: str
    state: State
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"state": self.state.value}


@dataclass(frozen=True)
class Thresholds:
    """The documented defaults (docs/operations.md, "Checking an installation"); each has a flag."""

    max_lag: int = 10_000
    """Records a consumer group (worker, sink) may be behind before ``warn``."""
    freshness_s: float = 300.0
    """A GPU node whose newest sample is older than this is ``fail`` (the agent samples every 10 s)."""
    watcher_quiet_s: float = 3600.0
    """The watcher's newest pod, node or event state older than this is ``warn`` (a quiet cluster
    changes nothing for a while; an hour without any change usually means the watcher stopped)."""
    deadletters_warn_per_h: int = 0
    """Dead letters in the last hour above this are ``warn``."""
    deadletters_fail_per_h: int = 1000
    """Dead letters in the last hour above this are ``fail``."""


@dataclass
class Context:
    """What the checks read: settings, names, thresholds, and the clients they share."""

    settings: CommonSettings
    worker_group: str
    sink_group: str
    thresholds: Thresholds = field(default_factory=Thresholds)
    cluster: str | None = None
    kubeconfig: Path | None = None
    kube_context: str | None = None
    agent_namespace: str = "gpulens-agent"
    agent_daemonset: str = "gpulens-agent"
    watcher_namespace: str = "gpulens"
    watcher_service_account: str = "gpulens-watcher"
    timeout_s: float = 10.0
    now: float = field(default_factory=time.time)
    cache: dict[str, Any] = field(default_factory=dict)
    """Clients and answers shared between checks (a reader, the Kubernetes client); closed at the end."""

    @property
    def prefix(self) -> str:
        return self.settings.topic_prefix

    def close(self) -> None:
        for value in self.cache.values():
            close = getattr(value, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):  # closing must not hide the results
                    close()


def exit_status(results: list[Result], strict: bool = False) -> int:
    """0 when nothing fails (no warning either with ``strict``), 1 otherwise."""
    bad = {State.FAIL, State.WARN} if strict else {State.FAIL}
    return 1 if any(r.state in bad for r in results) else 0


def ago(seconds: float) -> str:
    """``42s``, ``7m``, ``3h 5m``, ``2d 4h``."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"
