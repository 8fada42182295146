"""The checks ``gpulens check`` runs: :data:`CHECKS`, the one declared list (adding a check is a
function in a ``*_checks`` module and a row here), and :func:`run_checks`.

Above the check modules (they import :mod:`gpulens.check.core`, never this one), and imported only
when ``gpulens check`` runs: the Kafka checks load the Kafka client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpulens.check import kafka_checks, kube_checks, store_checks
from gpulens.check.core import Context, Result, State

CheckFunction = Callable[[Context], list[Result]]


@dataclass(frozen=True)
class Check:
    name: str
    run: CheckFunction
    what: str


CHECKS: tuple[Check, ...] = (
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
"""The declared list of checks, in the order they run."""


def run_checks(ctx: Context, only: set[str] | None = None) -> list[Result]:
    """Every check's results in order; a check that raises is a ``fail`` naming the error."""
    results: list[Result] = []
    try:
        for check in CHECKS:
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
