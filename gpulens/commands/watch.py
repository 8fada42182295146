"""``gpulens watch``: run the cluster watcher (pods, nodes, scheduling events -> Kafka).

Against a real cluster it uses the in-cluster service account or a kubeconfig; ``--simulate``
starts the simulated API server with a small churning GPU cluster and watches it through the
same real client, so the whole path can be seen on a laptop. ``--stdout`` prints the records as
JSON lines instead of producing them. The wiring lives in :mod:`producers.watcher.main` (also
``python -m producers.watcher``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpulens.commands.base import settings_from_flags, with_common_options

if TYPE_CHECKING:
    from common.settings import WatcherSettings


@click.command("watch")
@with_common_options
@click.option("--kubeconfig", type=click.Path(path_type=Path), default=None,
              help="kubeconfig file (default: in-cluster, then $KUBECONFIG / ~/.kube/config) [env GPULENS_KUBECONFIG]")
@click.option("--namespace", "namespaces", multiple=True,
              help="watch only this namespace (repeatable; default: all) [env GPULENS_NAMESPACES]")
@click.option("--stdout", "to_stdout", is_flag=True, help="print records as JSON lines instead of producing")
@click.option("--simulate", is_flag=True, default=None,
              help="watch a simulated API server with a small GPU cluster [env GPULENS_SIMULATE]")
@click.option("--metrics-port", type=int, default=None, help="serve /metrics on this port [env GPULENS_METRICS_PORT]")
def watch(kubeconfig: Path | None, namespaces: tuple[str, ...], to_stdout: bool, simulate: bool | None,
          metrics_port: int | None, **flags: Any) -> None:
    """Follow pods, nodes and scheduling events; produce k8s.pods/nodes/events."""
    from common.settings import WatcherSettings
    from producers.watcher.main import run_watcher

    settings: WatcherSettings = settings_from_flags(
        WatcherSettings, kubeconfig=kubeconfig, namespaces=list(namespaces) or None, simulate=simulate,
        metrics_port=metrics_port, **flags)
    run_watcher(settings, to_stdout=to_stdout, say=lambda line: click.echo(line, err=True))


COMMANDS = [watch]
