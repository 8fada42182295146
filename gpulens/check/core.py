"""The checks' shared types: a result (ok / warn / fail with the fix), the thresholds, the context
every check reads, and :data:`CHECKS`, the declared list that ``gpulens check`` runs in order."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
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


CheckFunction = Callable[[Context], list[Result]]


@dataclass(frozen=True)
class Check:
    name: str
    run: CheckFunction
    what: str


def _checks() -> tuple[Check, ...]:
    from gpulens.check import kafka_checks, kube_checks, store_checks

    return (
        Check("kafka", kafka_checks.reachable, "the brokers answer with the configured security"),
        Check("topics", kafka_checks.topics, "every topic with its partitions, cleanup policy, replication"),
        Check("groups", kafka_checks.groups, "the worker and sink consumer groups: members and lag"),
        Check("deadletters", kafka_checks.deadletters, "dead letters of the last hour by reason code"),
        Check("clickhouse", store_checks.reachable, "ClickHouse answers"),
        Check("migrations", store_checks.migrations, "every migration applied"),
        Check("readonly", store_checks.readonly, "the read path refuses writes and setting changes"),
        Check("freshness", store_checks.freshness, "per cluster: every GPU node's agent data, the watcher's"),
        Check("kubernetes", kube_checks.api_access, "API access, Kueue and DRA APIs served"),
        Check("agent-daemonset", kube_checks.agent_daemonset, "the agent DaemonSet covers every GPU node"),
        Check("watcher-rbac", kube_checks.watcher_rbac, "the watcher's ServiceAccount may list and watch"),
    )


CHECKS: Callable[[], tuple[Check, ...]] = _checks
"""The declared list of checks, in the order they run (a function so that the modules load lazily)."""


def run_checks(ctx: Context, only: set[str] | None = None) -> list[Result]:
    """Every check's results in order; a check that raises is a ``fail`` naming the error."""
    results: list[Result] = []
    try:
        for check in CHECKS():
            if only is not None and check.name not in only:
                continue
            try:
                results.extend(check.run(ctx))
            except Exception as exc:
                results.append(Result(check.name, State.FAIL, f"the check itself failed: {type(exc).__name__}: {exc}",
                                      "look at the error; if it is a gpulens fault, report it"))
    finally:
        ctx.close()
    return results


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
