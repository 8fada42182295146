"""``gpulens watch``: run the cluster watcher (pods, nodes, scheduling events -> Kafka).

Against a real cluster it uses the in-cluster service account or a kubeconfig; ``--simulate``
starts the simulated API server with a small churning GPU cluster and watches it through the
same real client, so the whole path can be seen on a laptop. ``--stdout`` prints the records as
JSON lines instead of producing them.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from common.errors import UserError
from gpulens.commands.base import broker_unavailable, settings_from_flags, with_common_options

if TYPE_CHECKING:
    from common.kafka import BoundedProducer
    from common.settings import WatcherSettings
    from producers.watcher.fake_apiserver import FakeApiServer
    from producers.watcher.service import Sink


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
    from common.kafka import BoundedProducer, BrokerUnavailable, ensure_topics
    from common.logs import get_logger
    from common.settings import ConfigError, WatcherSettings
    from producers.watcher.fake_apiserver import FakeApiServer
    from producers.watcher.fake_cluster import SimulatedCluster
    from producers.watcher.kube import KubeConfigError, api_client
    from producers.watcher.service import KafkaSink, StdoutSink, WatcherConfig, WatcherService, kube_sources
    from schemas.topics import K8S_EVENTS, K8S_NODES, K8S_PODS, K8S_WORKLOADS, WORKLOAD_PROGRESS

    log = get_logger("gpulens.watch")
    settings: WatcherSettings = settings_from_flags(
        WatcherSettings, kubeconfig=kubeconfig, namespaces=list(namespaces) or None, simulate=simulate,
        metrics_port=metrics_port, **flags)
    try:
        config = WatcherConfig.from_settings(settings)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    stop = threading.Event()
    server: FakeApiServer | None = None
    if settings.simulate:
        server = FakeApiServer(bookmark_interval_s=30.0, kueue=True).start()
        cluster = SimulatedCluster(server)
        cluster.populate()
        threading.Thread(target=cluster.run, args=(stop,), name="simulated-cluster", daemon=True).start()
        click.echo(f"simulated API server at {server.url}", err=True)
    try:
        api = api_client(host=server.url if server else None, kubeconfig=settings.kubeconfig,
                         context=settings.kube_context)
    except KubeConfigError as exc:
        raise UserError(f"{exc}. Pass --kubeconfig, run in a cluster, or try --simulate.") from None

    sink: Sink
    producer: BoundedProducer | None = None
    if to_stdout:
        sink = StdoutSink(settings.topic_prefix, on_closed=stop.set)
    else:
        try:
            ensure_topics(settings.kafka, (K8S_PODS, K8S_NODES, K8S_EVENTS, K8S_WORKLOADS, WORKLOAD_PROGRESS),
                          settings.topic_prefix)
        except BrokerUnavailable as exc:
            raise broker_unavailable(exc, also="use --stdout") from None
        except Exception as exc:  # e.g. no ACL to create or describe topics: they may well exist already
            log.warning("could not check topics; producing anyway", error=str(exc)[:300])
        producer = BoundedProducer(settings.kafka, settings.producer)
        sink = KafkaSink(producer, settings.topic_prefix)

    service = WatcherService(kube_sources(api, config.namespaces, config.events_api), sink, config)
    if settings.metrics_port:
        port = service.metrics.registry.serve(settings.metrics_port)
        log.info("metrics", port=port)

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    try:
        service.run(stop)
    except KeyboardInterrupt:
        service.shutdown(stop)
    finally:
        if producer is not None:
            left = producer.close()
            if left:
                log.warning("records not delivered at exit", count=left)
        if server is not None:
            server.stop()


COMMANDS = [watch]
