"""Wiring of the watcher process, shared by ``gpulens watch`` and ``python -m producers.watcher``.

Against a real cluster it uses the in-cluster service account or a kubeconfig; ``simulate`` starts
the simulated API server with a small churning GPU cluster and watches it through the same real
client. ``to_stdout`` prints the records as JSON lines instead of producing them to Kafka (whose
topics it creates when missing and allowed to).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import logs
from common.errors import UserError
from common.kafka import (
    TOPIC_CALL_TIMEOUT_S,
    BoundedProducer,
    BrokerUnavailable,
    broker_unavailable,
    ensure_topics,
    wait_for_broker,
)
from common.settings import WatcherSettings, load_settings
from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.fake_cluster import SimulatedCluster
from producers.watcher.kube import KubeConfigError, api_client
from producers.watcher.service import (
    WatcherConfig,
    WatcherKafkaSink,
    WatcherService,
    WatcherSink,
    WatcherStdoutSink,
    kube_sources,
)
from schemas.control import STATE_TOPICS, DeliveredOffsets
from schemas.topics import INTERNAL_CONTROL, K8S_EVENTS, K8S_NODES, K8S_PODS, K8S_WORKLOADS, WORKLOAD_PROGRESS

log = logs.get_logger("gpulens.watch")


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def run_watcher(settings: WatcherSettings, *, to_stdout: bool = False, stop: threading.Event | None = None,
                say: Callable[[str], None] = _to_stderr) -> None:
    """Watch until ``stop`` (or SIGTERM); raises :class:`~common.errors.UserError` for what the
    user must fix (configuration, no cluster configuration, no broker)."""
    config = WatcherConfig.from_settings(settings)
    stop = stop or threading.Event()
    server: FakeApiServer | None = None
    if settings.simulate:
        server = FakeApiServer(bookmark_interval_s=30.0, kueue=True, dra=True).start()
        cluster = SimulatedCluster(server)
        cluster.populate()
        threading.Thread(target=cluster.run, args=(stop,), name="simulated-cluster", daemon=True).start()
        say(f"simulated API server at {server.url}")
    try:
        api = api_client(host=server.url if server else None, kubeconfig=settings.kubeconfig,
                         context=settings.kube_context)
    except KubeConfigError as exc:
        raise UserError(f"{exc}. Pass --kubeconfig, run in a cluster, or try --simulate.") from None

    sink: WatcherSink
    producer: BoundedProducer | None = None
    if to_stdout:
        sink = WatcherStdoutSink(settings.topic_prefix, on_closed=stop.set)
    else:
        try:
            wait_for_broker(lambda: ensure_topics(settings.kafka, (K8S_PODS, K8S_NODES, K8S_EVENTS, K8S_WORKLOADS,
                                                                   WORKLOAD_PROGRESS, INTERNAL_CONTROL),
                                                  settings.topic_prefix, settings.topics,
                                                  timeout_s=TOPIC_CALL_TIMEOUT_S),
                            settings.broker_wait_s, "watcher")
        except BrokerUnavailable as exc:
            raise broker_unavailable(exc, also="use --stdout") from None
        except Exception as exc:  # e.g. no ACL to create or describe topics: they may well exist already
            log.warning("could not check topics; producing anyway", error=str(exc)[:300])
        delivered = DeliveredOffsets({topic.name(settings.topic_prefix) for topic in STATE_TOPICS})
        producer = BoundedProducer(settings.kafka, settings.producer, on_delivery_report=delivered)
        sink = WatcherKafkaSink(producer, settings.topic_prefix, delivered)

    service = WatcherService(kube_sources(api, config.namespaces, config.events_api), sink, config)
    if settings.metrics_port:
        port = service.metrics.registry.serve(settings.metrics_port, settings.metrics_addr)
        log.info("metrics", port=port)

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
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


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m producers.watcher`` (those of ``gpulens watch``)."""
    parser = argparse.ArgumentParser(prog="python -m producers.watcher", description="gpulens cluster watcher")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="kubeconfig file (default: in-cluster, then $KUBECONFIG / ~/.kube/config)")
    parser.add_argument("--namespace", dest="namespaces", action="append", default=None,
                        help="watch only this namespace (repeatable; default: all)")
    parser.add_argument("--stdout", action="store_true", help="print records as JSON lines instead of producing")
    parser.add_argument("--simulate", action="store_true", default=None,
                        help="watch a simulated API server with a small GPU cluster")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve /metrics on this port")
    parser.add_argument("--bootstrap-servers", default=None, help="Kafka bootstrap servers")
    parser.add_argument("--topic-prefix", default=None, help="topic name prefix")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m producers.watcher``: the same flags as ``gpulens watch``; exit 2 on user errors."""
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(WatcherSettings, kubeconfig=args.kubeconfig, namespaces=args.namespaces,
                                 simulate=args.simulate, metrics_port=args.metrics_port,
                                 topic_prefix=args.topic_prefix)
        if args.bootstrap_servers:
            kafka = settings.kafka.model_copy(update={"bootstrap_servers": args.bootstrap_servers})
            settings = settings.model_copy(update={"kafka": kafka})
        logs.configure(settings.log_level, settings.log_format)
        run_watcher(settings, to_stdout=args.stdout)
    except UserError as exc:
        print(f"gpulens watch: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
