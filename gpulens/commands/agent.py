"""``gpulens agent``: run the node agent (NVML + kubelet + cgroups -> gpu.samples topic).

On a GPU node (the DaemonSet) it reads the real NVML, the kubelet's PodResources socket and the
host's ``/proc``. ``--simulate`` runs the same code over a simulated 8-GPU node (fake NVML, a fake
kubelet gRPC server on a temporary socket, a temporary ``/proc`` tree), so the whole path can be
tried on any machine. ``--stdout`` prints each sample as one JSON line instead of producing it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import uuid
from typing import Any

import click

from common.metrics import MetricsRegistry
from common.settings import AgentSettings
from gpulens.cli import settings_from_flags, with_common_options
from gpulens.errors import UserError
from producers.agent.cgroup import ProcessResolver, ProcFsResolver
from producers.agent.nvml import NvmlBackend, NvmlLibraryNotFound, PynvmlBackend
from producers.agent.podresources import KubeletPodResources, PodResourcesSource
from producers.agent.sampler import NodeSampler
from producers.agent.service import AgentError, AgentMetrics, AgentService, KafkaSink, SampleSink, StdoutSink
from producers.agent.simulate import build_simulated_node


@click.command("agent")
@click.option("--node-name", default=None, help="this node's name [env GPULENS_NODE_NAME, then NODE_NAME]")
@click.option("--interval", "sample_interval_s", type=float, default=None,
              help="seconds between samples, 1-3600 (default 10) [env GPULENS_SAMPLE_INTERVAL_S]")
@click.option("--once", is_flag=True, help="take one sample, deliver it, exit")
@click.option("--stdout", "to_stdout", is_flag=True, help="print each sample as a JSON line instead of producing")
@click.option("--simulate", is_flag=True, default=None,
              help="a simulated 8-GPU node (fake NVML and kubelet) instead of the real ones [env GPULENS_SIMULATE]")
@click.option("--metrics-port", type=int, default=None,
              help="serve Prometheus /metrics on this port; 0 = off [env GPULENS_METRICS_PORT]")
@with_common_options
def agent(once: bool, to_stdout: bool, **flags: Any) -> None:
    """Sample every GPU of this node and produce to the gpu.samples topic."""
    settings: AgentSettings = settings_from_flags(AgentSettings, **flags)
    node_name = settings.node_name or ("sim-node-0" if settings.simulate else None)
    if not node_name:
        raise UserError("no node name: pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)")

    with contextlib.ExitStack() as stack:
        nvml: NvmlBackend
        pod_resources: PodResourcesSource
        resolver: ProcessResolver
        before_sample = None
        if settings.simulate:
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

        metrics = AgentMetrics(MetricsRegistry())
        if settings.metrics_port:
            port = metrics.registry.serve(settings.metrics_port)
            click.echo(f"metrics on :{port}/metrics", err=True)
        sampler = NodeSampler(
            node_name, nvml, pod_resources, resolver, boot_id=str(uuid.uuid4()),
            sample_interval_s=settings.sample_interval_s,
            on_nvml_error=lambda kind: metrics.nvml_errors.labels(kind).inc(),
            on_pod_resources_error=metrics.pod_resources_errors.inc,
        )
        sink: SampleSink = StdoutSink() if to_stdout else KafkaSink(settings, metrics)
        service = AgentService(sampler, sink, metrics, backoff_max_s=settings.nvml_backoff_max_s,
                               before_sample=before_sample)
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
        try:
            service.run(stop, once=once)
        except NvmlLibraryNotFound as exc:
            raise UserError(str(exc)) from None
        except AgentError as exc:
            raise UserError(str(exc)) from None


COMMANDS = [agent]
