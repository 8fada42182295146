"""``gpulens agent``: run the node agent (NVML + kubelet + cgroups -> gpu.samples topic).

On a GPU node (the DaemonSet) it reads the real NVML, the kubelet's PodResources socket and the
host's ``/proc`` — or, with ``--source dcgm-exporter``, the node's dcgm-exporter instead.
``--simulate`` runs the same code over a simulated 8-GPU node (fake NVML, a fake
kubelet gRPC server on a temporary socket, a temporary ``/proc`` tree), so the whole path can be
tried on any machine. ``--stdout`` prints each sample as one JSON line instead of producing it.
The wiring lives in :mod:`producers.agent.main` (also ``python -m producers.agent``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from common.errors import UserError
from gpulens.commands.base import settings_from_flags, with_common_options

if TYPE_CHECKING:
    from common.settings import AgentSettings


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
@click.option("--source", type=click.Choice(["nvml", "dcgm-exporter"]), default=None,
              help="GPU readings from NVML (default) or the node's dcgm-exporter [env GPULENS_SOURCE]")
@click.option("--dcgm-url", default=None,
              help="dcgm-exporter's /metrics, default http://127.0.0.1:9400/metrics [env GPULENS_DCGM_URL]")
@with_common_options
def agent(once: bool, to_stdout: bool, **flags: Any) -> None:
    """Sample every GPU of this node and produce to the gpu.samples topic."""
    from common.settings import AgentSettings, ConfigError
    from producers.agent.main import run_agent
    from producers.agent.nvml_api import NvmlLibraryNotFound
    from producers.agent.service import AgentError

    settings: AgentSettings = settings_from_flags(AgentSettings, **flags)
    try:
        run_agent(settings, once=once, to_stdout=to_stdout)
    except (AgentError, ConfigError, NvmlLibraryNotFound) as exc:
        raise UserError(str(exc)) from None


COMMANDS = [agent]
