"""What the agent's run loop needs from a GPU source, whichever it is.

Two sources implement :class:`SampleSource`: :class:`producers.agent.sampler.NodeSampler` (NVML,
the kubelet and ``/proc``: the default) and :class:`producers.agent.dcgm.DcgmExporterSource` (the
node's dcgm-exporter, for clusters that already run it: no second poller). The run loop
(:class:`producers.agent.service.AgentService`) initialises the source with backoff, samples it
on the interval grid, and re-initialises it when it fails as a whole; its errors say which.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from common.errors import GpulensError, RetriableError
from schemas.messages import GpuSample


class SourceError(GpulensError):
    """The source failed; ``kind`` is a short stable label (metrics, logs)."""

    kind = "unknown"

    def __init__(self, message: str = "", kind: str | None = None) -> None:
        super().__init__(message or self.kind)
        if kind is not None:
            self.kind = kind


class SourceUnavailable(SourceError, RetriableError):
    """The source as a whole cannot give a sample now: the loop re-initialises it with backoff."""

    kind = "unavailable"


class SampleSource(Protocol):
    name: str
    """``nvml`` or ``dcgm-exporter`` (logs and the ``source`` label of the agent's metrics)."""
    node_name: str
    boot_id: str
    sample_interval_s: float

    def init(self) -> None:
        """Make the source ready; raises :class:`SourceError`."""

    def shutdown(self) -> None: ...

    def reset(self) -> None:
        """Forget what belonged to the previous session (after a re-initialisation)."""

    def sample(self, ts: datetime) -> GpuSample:
        """One sample of every GPU; raises :class:`SourceUnavailable` when the source as a whole failed."""
