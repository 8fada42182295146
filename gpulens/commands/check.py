"""``gpulens check``: what is wrong with an installation, one line per check with its state and
the fix (the checks: :data:`gpulens.check.registry.CHECKS`; the thresholds: docs/operations.md,
"Checking an installation"). Exit 0 when nothing fails (warnings too, unless ``--strict``), 1 when
a check fails, 2 for a usage error."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import orjson

from common.errors import UserError
from common.text import printable
from gpulens.commands.base import clickhouse_option, settings_from_flags, with_common_options

if TYPE_CHECKING:
    from gpulens.check.core import Result, Thresholds

T = TypeVar("T")

_MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


class ChecksFailed(click.ClickException):
    """Exit 1 after the results were printed (nothing more to say)."""

    def __init__(self, status: int) -> None:
        super().__init__("checks failed")
        self.exit_code = status

    def show(self, file: Any = None) -> None:
        pass


def _seconds(value: str | None, flag: str) -> float | None:
    from simulation.scenario import parse_duration

    return None if value is None else parse_duration(value, flag, allow_zero=False)


@click.command("check")
@click.option("--json", "as_json", is_flag=True, help="one JSON object: every result and the exit status")
@click.option("--cluster", default=None, help="only this cluster's freshness (default: every cluster stored)")
@click.option("--strict", is_flag=True, help="exit 1 on warnings too")
@click.option("--only", default=None, help="comma list of checks to run (default: all; see docs/operations.md)")
@click.option("--max-lag", type=click.IntRange(min=0), default=None,
              help="records a worker or sink group may be behind before warn [10000]")
@click.option("--freshness", default=None, help="a GPU node without a sample for this long fails [5m]")
@click.option("--watcher-quiet", default=None, help="the watcher's newest state older than this warns [1h]")
@click.option("--deadletters-warn", type=click.IntRange(min=0), default=None,
              help="dead letters in the last hour above this warn [0]")
@click.option("--deadletters-fail", type=click.IntRange(min=0), default=None,
              help="dead letters in the last hour above this fail [1000]")
@click.option("--worker-group", default=None, help="the workers' consumer group [GPULENS_APP_ID or PREFIX-stream-jobs]")
@click.option("--sink-group", default=None, help="the sink's consumer group [GPULENS_GROUP_ID or gpulens-sink]")
@click.option("--kubeconfig", type=click.Path(path_type=Path), default=None,
              help="kubeconfig for the API checks [in-cluster, then $KUBECONFIG, ~/.kube/config]")
@click.option("--context", "kube_context", default=None, help="kubeconfig context")
@click.option("--agent-namespace", default="gpulens-agent", show_default=True)
@click.option("--agent-daemonset", default="gpulens-agent", show_default=True)
@click.option("--watcher-namespace", default="gpulens", show_default=True)
@click.option("--watcher-service-account", default="gpulens-watcher", show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.5), default=10.0, show_default=True,
              help="seconds each request may take")
@clickhouse_option
@with_common_options
def check(as_json: bool, cluster: str | None, strict: bool, only: str | None, max_lag: int | None,
          freshness: str | None, watcher_quiet: str | None, deadletters_warn: int | None,
          deadletters_fail: int | None, worker_group: str | None, sink_group: str | None,
          kubeconfig: Path | None, kube_context: str | None, agent_namespace: str, agent_daemonset: str,
          watcher_namespace: str, watcher_service_account: str, timeout_s: float, **flags: Any) -> None:
    """Check an installation: Kafka, groups, dead letters, ClickHouse, freshness, Kubernetes."""
    from common.settings import CommonSettings, SinkSettings, WorkerSettings, load_settings
    from gpulens.check.core import Context, exit_status
    from gpulens.check.registry import run_checks

    selected = _selected_checks(only)
    _check_cluster_name(cluster)
    settings = settings_from_flags(CommonSettings, **flags)
    overrides = {"topic_prefix": settings.topic_prefix}
    worker = load_settings(WorkerSettings, **overrides)
    sink = load_settings(SinkSettings, **overrides)
    thresholds = _thresholds(max_lag, freshness, watcher_quiet, deadletters_warn, deadletters_fail)
    ctx = Context(settings=settings, thresholds=thresholds, cluster=cluster,
                  worker_group=worker_group or worker.app_id or f"{settings.topic_prefix}-stream-jobs",
                  sink_group=sink_group or sink.group_id, kubeconfig=kubeconfig, kube_context=kube_context,
                  agent_namespace=agent_namespace, agent_daemonset=agent_daemonset,
                  watcher_namespace=watcher_namespace, watcher_service_account=watcher_service_account,
                  timeout_s=timeout_s)
    results = run_checks(ctx, selected)
    status = exit_status(results, strict)
    if as_json:
        _print_json(results, status, strict)
    else:
        _print_lines(results, strict)
    if status:
        raise ChecksFailed(status)


def _selected_checks(only: str | None) -> set[str] | None:
    """The checks ``--only`` names (``None``: all); an unknown name is a usage error."""
    from gpulens.check.registry import CHECKS

    if only is None:
        return None
    names = {c.name for c in CHECKS}
    selected = {n.strip() for n in only.split(",") if n.strip()}
    if not selected or selected - names:
        raise UserError(f"--only: unknown check(s) {sorted(selected - names)}; known: {', '.join(sorted(names))}")
    return selected


def _check_cluster_name(cluster: str | None) -> None:
    import re

    from schemas.messages import CLUSTER_NAME_PATTERN

    if cluster is not None and not re.fullmatch(CLUSTER_NAME_PATTERN, cluster):
        raise UserError(f"--cluster {cluster!r}: expected a DNS label (e.g. prod-eu-1)")


def _thresholds(max_lag: int | None, freshness: str | None, watcher_quiet: str | None,
                deadletters_warn: int | None, deadletters_fail: int | None) -> Thresholds:
    """The documented defaults with the flags given over them."""
    from gpulens.check.core import Thresholds

    defaults = Thresholds()
    return Thresholds(
        max_lag=_or_default(max_lag, defaults.max_lag),
        freshness_s=_or_default(_seconds(freshness, "--freshness"), defaults.freshness_s),
        watcher_quiet_s=_or_default(_seconds(watcher_quiet, "--watcher-quiet"), defaults.watcher_quiet_s),
        deadletters_warn_per_h=_or_default(deadletters_warn, defaults.deadletters_warn_per_h),
        deadletters_fail_per_h=_or_default(deadletters_fail, defaults.deadletters_fail_per_h),
    )


def _or_default(value: T | None, default: T) -> T:
    return default if value is None else value


def _print_json(results: list[Result], status: int, strict: bool) -> None:
    click.echo(orjson.dumps({"status": status, "strict": strict,
                             "counts": {s: sum(r.state == s for r in results) for s in ("ok", "warn", "fail")},
                             "results": [r.to_json() for r in results]}, option=orjson.OPT_INDENT_2).decode())


def _print_lines(results: list[Result], strict: bool) -> None:
    for r in results:
        line = f"{_MARKS[r.state.value]}  {r.name}: {r.detail}"
        if r.state != "ok" and r.fix:
            line += f"\n      fix: {r.fix}"
        click.echo(printable(line, multiline=True))
    fails = sum(r.state == "fail" for r in results)
    warns = sum(r.state == "warn" for r in results)
    click.echo(f"{len(results)} checks: {fails} failed, {warns} warned" + (" (--strict)" if strict else ""))


COMMANDS = [check]
