"""Wiring of the agent process, shared by ``gpulens agent`` and the lean ``python -m producers.agent``.

Real node: :class:`PynvmlBackend`, the kubelet PodResources client on its socket, the host's
``/proc``; or, with ``source = dcgm-exporter``, the node's dcgm-exporter
(:class:`producers.agent.dcgm.DcgmExporterSource`). ``simulate``: the NVML path over
:func:`producers.agent.simulate.build_simulated_node`.
The lean entry point exists because the full ``gpulens`` CLI imports every part's commands (and
their ClickHouse / Kubernetes clients); the DaemonSet only needs the agent's own imports.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from common import logs
from common.metrics import MetricsRegistry
from common.settings import AgentSettings, ConfigError, load_settings
from producers.agent.cgroup import ProcessResolver, ProcFsResolver
from producers.agent.dcgm import DcgmExporterSource
from producers.agent.nvml import NvmlBackend, NvmlLibraryNotFound, PynvmlBackend
from producers.agent.podresources import KubeletPodResources, PodResourcesSource
from producers.agent.sampler import NodeSampler
from producers.agent.service import AgentError, AgentMetrics, AgentService, KafkaSink, SampleSink, StdoutSink
from producers.agent.source import SampleSource

log = logs.get_logger(__name__)

SIMULATED_NODE_NAME = "sim-node-0"


def run_agent(
    settings: AgentSettings, *, once: bool = False, to_stdout: bool = False, stop: threading.Event | None = None
) -> int:
    """Run the agent until ``stop`` (or SIGTERM/SIGINT) or once; returns samples produced.

    Raises :class:`AgentError` or :class:`NvmlLibraryNotFound` for what the user must fix.
    """
    node_name = settings.node_name or (SIMULATED_NODE_NAME if settings.simulate else None)
    settings.cluster_name(real=not settings.simulate)
    if not node_name:
        raise AgentError("no node name: pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)")
    stop = stop or threading.Event()
    if settings.source == "dcgm-exporter":
        if settings.simulate:
            raise AgentError("--simulate simulates NVML and the kubelet; it cannot be combined with "
                             "--source dcgm-exporter (GPULENS_SOURCE)")
        metrics = _serve_metrics(settings)
        source = DcgmExporterSource(node_name, settings.dcgm_url, str(uuid.uuid4()), settings.sample_interval_s,
                                    settings.dcgm_timeout_s)
        return _run(settings, source, metrics, stop, once=once, to_stdout=to_stdout)
    with contextlib.ExitStack() as stack:
        nvml: NvmlBackend
        pod_resources: PodResourcesSource
        resolver: ProcessResolver
        before_sample: Callable[[datetime], None] | None = None
        if settings.simulate:
            from producers.agent.simulate import build_simulated_node

            node = stack.enter_context(build_simulated_node(node_name))
            nvml, pod_resources, resolver = node.nvml, node.pod_resources, node.resolver
            before_sample = node.advance
        else:
            nvml = PynvmlBackend()
            kubelet = KubeletPodResources(
                settings.kubelet_socket, settings.kubelet_timeout_s, settings.gpu_resource_prefixes
            )
            stack.callback(kubelet.close)
            pod_resources, resolver = kubelet, ProcFsResolver(settings.proc_root)

        metrics = _serve_metrics(settings)
        sampler = NodeSampler(
            node_name,
            nvml,
            pod_resources,
            resolver,
            boot_id=str(uuid.uuid4()),
            sample_interval_s=settings.sample_interval_s,
            on_nvml_error=lambda kind: metrics.nvml_errors.labels(kind).inc(),
            on_pod_resources_error=metrics.pod_resources_errors.inc,
        )
        return _run(settings, sampler, metrics, stop, once=once, to_stdout=to_stdout, before_sample=before_sample)
    raise AssertionError("unreachable")


def _serve_metrics(settings: AgentSettings) -> AgentMetrics:
    metrics = AgentMetrics(MetricsRegistry())
    if settings.metrics_port:
        port = metrics.registry.serve(settings.metrics_port)
        log.info("metrics endpoint", port=port, path="/metrics")
    return metrics


def _run(settings: AgentSettings, source: SampleSource, metrics: AgentMetrics, stop: threading.Event, *,
         once: bool, to_stdout: bool, before_sample: Callable[[datetime], None] | None = None) -> int:
    sink: SampleSink = StdoutSink() if to_stdout else KafkaSink(settings, metrics)
    service = AgentService(source, sink, metrics, backoff_max_s=settings.nvml_backoff_max_s,
                           before_sample=before_sample, cluster=settings.cluster_name(real=not settings.simulate))
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    return service.run(stop, once=once)


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m producers.agent`` (those of ``gpulens agent`` a DaemonSet needs)."""
    parser = argparse.ArgumentParser(prog="python -m producers.agent", description="gpulens node agent")
    parser.add_argument("--node-name", default=None, help="this node's name [env GPULENS_NODE_NAME, NODE_NAME]")
    parser.add_argument("--interval", type=float, default=None, help="seconds between samples (default 10)")
    parser.add_argument("--once", action="store_true", help="take one sample, deliver it, exit")
    parser.add_argument("--stdout", action="store_true", help="print samples as JSON lines instead of producing")
    parser.add_argument("--simulate", action="store_true", default=None, help="a simulated 8-GPU node")
    parser.add_argument("--metrics-port", type=int, default=None, help="Prometheus /metrics port; 0 = off")
    parser.add_argument("--source", choices=["nvml", "dcgm-exporter"], default=None,
                        help="GPU readings from NVML (default) or the node's dcgm-exporter")
    parser.add_argument("--dcgm-url", default=None, help="dcgm-exporter's /metrics (default http://127.0.0.1:9400/metrics)")
    parser.add_argument("--bootstrap-servers", default=None, help="Kafka bootstrap servers")
    parser.add_argument("--topic-prefix", default=None, help="topic name prefix")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m producers.agent``: the same flags as ``gpulens agent``; exit 2 on user errors."""
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(
            AgentSettings,
            node_name=args.node_name,
            sample_interval_s=args.interval,
            simulate=args.simulate,
            metrics_port=args.metrics_port,
            topic_prefix=args.topic_prefix,
            source=args.source,
            dcgm_url=args.dcgm_url,
        )
        if args.bootstrap_servers:
            kafka = settings.kafka.model_copy(update={"bootstrap_servers": args.bootstrap_servers})
            settings = settings.model_copy(update={"kafka": kafka})
        logs.configure(settings.log_level, settings.log_format)
        run_agent(settings, once=args.once, to_stdout=args.stdout)
    except (ConfigError, AgentError, NvmlLibraryNotFound) as exc:
        print(f"gpulens agent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
