"""The ClickHouse checks: reachable, migrations current, the read path read-only, and per cluster
the freshness of the agents' and the watcher's data (from what the sink stored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpulens.check.core import Context, Result, State, ago

_REACH_FIX = ("set GPULENS_CLICKHOUSE__URL (chdb:///path or http(s)://user:pass@host:port/db) as the sink has it; "
              "on the embedded engine, the sink creates the store at its first start (`gpulens sink`)")
_MIGRATE_FIX = ("restart `gpulens sink` with this gpulens version: it applies every missing migration at start "
                "(kubectl -n gpulens rollout restart deployment/gpulens-sink)")


def _reader(ctx: Context) -> Any:
    """The read-only reader ``gpulens sql`` uses (the server, the running sink's endpoint, or the
    embedded engine), or None after recording why there is none."""
    if "reader" not in ctx.cache and "reader_error" not in ctx.cache:
        from sinks.clickhouse import StoreError
        from sinks.query_server import open_reader
        from sinks.readonly import ReadLimits

        settings = ctx.settings
        try:
            ctx.cache["reader"] = open_reader(settings.clickhouse_url(), Path(settings.data_dir),
                                              ReadLimits.from_settings(settings.clickhouse))
        except StoreError as exc:
            ctx.cache["reader_error"] = str(exc)
    return ctx.cache.get("reader")


def _rows(ctx: Context, sql: str, parameters: dict[str, Any] | None = None) -> list[list[Any]]:
    return list(_reader(ctx).query(sql, parameters).rows)


def _skipped(name: str) -> list[Result]:
    return [Result(name, State.FAIL, "skipped: ClickHouse did not answer (see the clickhouse line)", _REACH_FIX)]


def reachable(ctx: Context) -> list[Result]:
    target = ctx.settings.clickhouse_target().masked
    reader = _reader(ctx)
    if reader is None:
        return [Result("clickhouse", State.FAIL, f"{target}: {ctx.cache['reader_error']}", _REACH_FIX)]
    try:
        version = _rows(ctx, "SELECT version()")[0][0]
    except Exception as exc:
        ctx.cache.pop("reader", None)
        ctx.cache["reader_error"] = str(exc)
        reader.close()
        return [Result("clickhouse", State.FAIL, f"{target}: {exc}", _REACH_FIX)]
    return [Result("clickhouse", State.OK, f"{target}: ClickHouse {version}")]


def migrations(ctx: Context) -> list[Result]:
    from sinks.migrations import MIGRATIONS

    if _reader(ctx) is None:
        return _skipped("migrations")
    try:
        applied = {int(r[0]) for r in _rows(ctx, "SELECT DISTINCT version FROM schema_migrations")}
    except Exception as exc:
        return [Result("migrations", State.FAIL, f"no schema_migrations table: {exc}", _MIGRATE_FIX)]
    known = {m.version: m.name for m in MIGRATIONS}
    missing = sorted(set(known) - applied)
    newer = sorted(applied - set(known))
    if missing:
        return [Result("migrations", State.FAIL, f"{len(missing)} migration(s) not applied: "
                       + "; ".join(f"{v} ({known[v]})" for v in missing), _MIGRATE_FIX)]
    if newer:
        return [Result("migrations", State.WARN, f"the store has migrations this gpulens does not know: {newer}",
                       "run the gpulens version the sink runs (`pip install -U gpulens`)")]
    return [Result("migrations", State.OK, f"all {len(known)} migrations applied (latest {max(known)})")]


PROBES = (
    ("a write", "INSERT INTO FUNCTION null('x UInt8') VALUES (1)"),
    ("a setting change", "SELECT 1 SETTINGS readonly = 0"),
    ("raising a limit", "SELECT 1 SETTINGS max_result_rows = 0"),
)
"""Statements the read path must refuse; each harmless if it ran (the ``null`` table function keeps nothing)."""


def readonly(ctx: Context) -> list[Result]:
    if _reader(ctx) is None:
        return _skipped("readonly")
    accepted = []
    for what, sql in PROBES:
        try:
            _reader(ctx).query(sql)
        except Exception:
            continue
        accepted.append(f"{what} ({sql})")
    if accepted:
        return [Result("readonly", State.FAIL, "the read-only path accepted " + "; ".join(accepted),
                       "point GPULENS_CLICKHOUSE__URL of the readers at a ClickHouse user whose profile has "
                       "readonly = 1 with the limits as constraints (deploy/clickhouse/users.d)")]
    return [Result("readonly", State.OK, "the read path refuses writes, setting changes and raised limits")]


def freshness(ctx: Context) -> list[Result]:
    if _reader(ctx) is None:
        return _skipped("freshness")
    where = ""
    if ctx.cluster is not None:
        where = "WHERE cluster = {cluster:String}"
    bound = {"cluster": ctx.cluster} if ctx.cluster is not None else None
    samples: dict[str, dict[str, float]] = {}
    for cluster, node, newest in _rows(ctx, "SELECT cluster, node, toUnixTimestamp64Milli(max(ts)) / 1000 "
                                       f"FROM gpu_samples {where} GROUP BY cluster, node", bound):
        samples.setdefault(str(cluster), {})[str(node)] = float(newest)
    gpu_nodes: dict[str, set[str]] = {}
    for cluster, node in _rows(ctx, "SELECT cluster, node FROM node_states FINAL "
                               f"{where or 'WHERE 1'} AND NOT deleted AND gpus_allocatable > 0", bound):
        gpu_nodes.setdefault(str(cluster), set()).add(str(node))
    watcher: dict[str, float] = {}
    for cluster, newest in _rows(
            ctx, "SELECT cluster, max(t) FROM (SELECT cluster, toUnixTimestamp64Milli(ts) / 1000 AS t FROM pod_states "
            "UNION ALL SELECT cluster, toUnixTimestamp64Milli(ts) / 1000 FROM node_states "
            f"UNION ALL SELECT cluster, toUnixTimestamp64Milli(ts) / 1000 FROM k8s_events) {where} GROUP BY cluster",
            bound):
        watcher[str(cluster)] = float(newest)
    clusters = sorted(set(samples) | set(gpu_nodes) | set(watcher))
    if not clusters:
        name = f"freshness {ctx.cluster}" if ctx.cluster else "freshness"
        return [Result(name, State.FAIL, "no agent or watcher data stored" + (
            f" for cluster {ctx.cluster!r}" if ctx.cluster else ""),
            "check the agents and the watcher run with GPULENS_CLUSTER set to this cluster, and the workers-groups "
            "and sink-group lines above")]
    results = []
    for cluster in clusters:
        results += _cluster_freshness(ctx, cluster, samples.get(cluster, {}), gpu_nodes.get(cluster, set()),
                                      watcher.get(cluster))
    return results


def _cluster_freshness(ctx: Context, cluster: str, samples: dict[str, float], gpu_nodes: set[str],
                       watcher: float | None) -> list[Result]:
    limits = ctx.thresholds
    now = ctx.now
    results = []
    silent = sorted(node for node in gpu_nodes | set(samples)
                    if now - samples.get(node, float("-inf")) > limits.freshness_s)
    fresh = len(gpu_nodes | set(samples)) - len(silent)
    if silent:
        parts = [f"{n} ({'never' if n not in samples else 'last sample ' + ago(now - samples[n]) + ' ago'})"
                 for n in silent[:20]]
        more = f" and {len(silent) - 20} more" if len(silent) > 20 else ""
        results.append(Result(f"agents {cluster}", State.FAIL,
                              f"{len(silent)} GPU node(s) without agent data in the last {ago(limits.freshness_s)}: "
                              + ", ".join(parts) + more + f"; {fresh} fresh",
                              "is the agent pod running on the node? `kubectl -n gpulens-agent get pods -o wide "
                              "--field-selector spec.nodeName=NODE`, then its logs; a node's taints the DaemonSet "
                              "does not tolerate keep it off (see the agent-daemonset line)"))
    else:
        results.append(Result(f"agents {cluster}", State.OK,
                              f"{fresh} node(s) with a sample in the last {ago(limits.freshness_s)}"))
    if watcher is None:
        results.append(Result(f"watcher {cluster}", State.FAIL, "no pod, node or event state from the watcher",
                              "start the watcher with GPULENS_CLUSTER=" + cluster + " (deploy/k8s/watcher.yaml) "
                              "and read its logs"))
    elif now - watcher > limits.watcher_quiet_s:
        results.append(Result(f"watcher {cluster}", State.WARN, f"the watcher's newest state is {ago(now - watcher)} "
                              f"old (warn above {ago(limits.watcher_quiet_s)})",
                              "a quiet cluster changes nothing for a while; otherwise check the watcher runs: "
                              "`kubectl -n gpulens logs deployment/gpulens-watcher`"))
    else:
        results.append(Result(f"watcher {cluster}", State.OK, f"newest state {ago(now - watcher)} ago, "
                              f"{len(gpu_nodes)} GPU node(s) known"))
    return results
