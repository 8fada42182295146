"""Wiring of the agent process, shared by ``gpulens agent`` and the lean ``python -m producers.agent``.

Real node: :class:`PynvmlBackend`, the kubelet PodResources client on its socket, the host's
``/proc``; or, with ``source = dcgm-exporter``, the node's dcgm-exporter
(:class:`producers.agent.dcgm.DcgmExporterSource`). ``simulate``: the NVML path over
:func:`producers.agent.simulate.build_simulated_node`. Outside ``--once``, the progress paths of
:mod:`producers.agent.progress` run beside the sampling loop and share its sink.
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
from pathlib import Path

from common import logs
from common.metrics import MetricsRegistry
from common.settings import AgentSettings, ConfigError, load_settings
from producers.agent.cgroup import ProcessResolver, ProcFsResolver
from producers.agent.dcgm import DcgmExporterSource
from producers.agent.nvml import PynvmlBackend
from producers.agent.nvml_api import NvmlBackend, NvmlLibraryNotFound
from producers.agent.podresources import KubeletPodResources, PodResourcesSource
from producers.agent.progress import (
    ProcNetPodAddresses,
    ProgressCollector,
    ProgressLimits,
    ProgressListener,
    ProgressMetrics,
)
from producers.agent.sampler import NodeSampler
from producers.agent.service import (
    AgentError,
    AgentKafkaSink,
    AgentMetrics,
    AgentService,
    AgentStdoutSink,
    ProgressSink,
)
from producers.agent.source import SampleSource
from schemas.codec import encode
from schemas.messages import DEFAULT_CLUSTER, GpuSample, WorkloadAllocator, WorkloadProgress, scoped_key

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
        return _run(settings, source, metrics, stop, once=once, to_stdout=to_stdout,
                    resolver=ProcFsResolver(settings.proc_root))
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
        return _run(settings, sampler, metrics, stop, once=once, to_stdout=to_stdout, before_sample=before_sample,
                    resolver=resolver)
    raise AssertionError("unreachable")


def _serve_metrics(settings: AgentSettings) -> AgentMetrics:
    metrics = AgentMetrics(MetricsRegistry())
    if settings.metrics_port:
        port = metrics.registry.serve(settings.metrics_port, settings.metrics_addr)
        log.info("metrics endpoint", port=port, path="/metrics")
    return metrics


def _run(settings: AgentSettings, source: SampleSource, metrics: AgentMetrics, stop: threading.Event, *,
         once: bool, to_stdout: bool, resolver: ProcessResolver,
         before_sample: Callable[[datetime], None] | None = None) -> int:
    sink: AgentStdoutSink | AgentKafkaSink = AgentStdoutSink() if to_stdout else AgentKafkaSink(settings, metrics)
    service = AgentService(source, sink, metrics, backoff_max_s=settings.nvml_backoff_max_s,
                           before_sample=before_sample, cluster=settings.cluster_name(real=not settings.simulate))
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    listener = None if once else start_progress(settings, resolver, metrics, sink, lambda: service.last_sample)
    try:
        return service.run(stop, once=once)
    finally:
        if listener is not None:
            listener.close()
            remaining = sink.close(10.0)
            if remaining:
                log.warning("progress messages not delivered at shutdown", count=remaining)


def start_progress(settings: AgentSettings, resolver: ProcessResolver, metrics: AgentMetrics, sink: ProgressSink,
                   last_sample: Callable[[], GpuSample | None]) -> ProgressListener | None:
    """The progress paths (docs/progress.md) the settings enable, on their own thread; None if none is."""
    socket_path = Path(settings.progress_socket) if settings.progress_socket else None
    udp = (str(settings.progress_udp_bind), settings.progress_udp_port) if settings.progress_udp_port else None
    if socket_path is None and udp is None:
        return None

    def pod_names(pod_uid: str) -> tuple[str, str] | None:
        sample = last_sample()
        for gpu in sample.gpus if sample is not None else ():
            for process in gpu.processes:
                if process.pod_uid == pod_uid and process.pod_namespace and process.pod_name:
                    return process.pod_namespace, process.pod_name
        return None

    collector = ProgressCollector(
        resolver, ProcNetPodAddresses(settings.proc_root, resolver), ProgressMetrics(metrics.registry),
        limits=ProgressLimits(max_datagram_bytes=settings.progress_max_datagram_bytes,
                              rate_per_s=settings.progress_rate_per_s),
        pod_names=pod_names, node=settings.node_name or (SIMULATED_NODE_NAME if settings.simulate else ""))
    cluster = settings.cluster_name(real=not settings.simulate)

    def send(message: WorkloadProgress) -> bool:
        if cluster != DEFAULT_CLUSTER:
            message = message.model_copy(update={"cluster": cluster})
        return sink.send_progress(scoped_key(cluster, message.pod_uid), encode(message))

    def send_allocator(message: WorkloadAllocator) -> bool:
        if cluster != DEFAULT_CLUSTER:
            message = message.model_copy(update={"cluster": cluster})
        return sink.send_allocator(scoped_key(cluster, message.pod_uid), encode(message))

    listener = ProgressListener(collector, send, interval_s=settings.progress_interval_s, socket_path=socket_path,
                                udp=udp, emit_allocator=send_allocator)
    if not listener.listening:
        listener.close()
        return None
    listener.start()
    return listener


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
