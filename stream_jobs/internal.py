"""Messages between the two stages (not public topics).

The node stage tells the cluster stage what only it can see: per node, how many allocated GPUs are
busy or idle at each sample (``NodeSummary``), and per pod, what its GPUs did while it held them
(``PodUsage``, sent once when the pod leaves the node or the replay ends). In the faust runtime
these travel on internal topics; in-process they are handed over directly. Both are JSON
messages like the public ones, so they survive a worker restart.
"""

from __future__ import annotations

from schemas.messages import (
    GpuSample,
    K8sEvent,
    Message,
    NodeState,
    NonNegFloat,
    NonNegInt,
    PodState,
    UtcDatetime,
    WorkloadAllocator,
    WorkloadProgress,
    WorkloadState,
)
from schemas.outputs import MigGpuLayout, SharedGpuState

MAX_NAME_CHARS = 256
"""Longest team / project / gang name a stage keeps (longer ones are cut)."""


def kept(message: Message) -> Message:
    """What a stage keeps of an input: labels are dropped (the stages use the team, project and
    gang the watcher extracted from them) and those names are cut to ``MAX_NAME_CHARS``, so stage
    state grows with the fleet, never with the size of what users put in labels."""
    if type(message) in _KEPT_AS_IS:
        return message  # no labels, no names to cut (a sample, most of a stage's inputs)
    if isinstance(message, PodState):
        names = {key: getattr(message, key) for key in ("team", "project", "gang_id")}
        cut = {key: value[:MAX_NAME_CHARS] for key, value in names.items()
               if value is not None and len(value) > MAX_NAME_CHARS}
        if message.labels or cut:
            return message.model_copy(update={"labels": {}} | cut)
    elif isinstance(message, NodeState) and message.labels:
        return message.model_copy(update={"labels": {}})
    elif isinstance(message, WorkloadState):
        names = {key: getattr(message, key) for key in ("team", "project", "gang_id", "queue_name", "pending_reason")}
        cut = {key: value[:MAX_NAME_CHARS] for key, value in names.items()
               if value is not None and len(value) > MAX_NAME_CHARS}
        if cut:
            return message.model_copy(update=cut)
    return message


class NodeSummary(Message):
    node: str
    ts: UtcDatetime
    sample_interval_s: float
    gpus: NonNegInt
    """Allocation units seen in the sample (physical GPUs, or MIG devices in MIG mode)."""
    allocated: NonNegInt
    busy: NonNegInt
    idle_allocated: NonNegInt
    mig: list[MigGpuLayout] | None = None
    """The node's MIG-enabled GPUs and their instances (None: the node has none)."""
    shared: list[SharedGpuState] | None = None
    """The node's shared GPUs with their memory and tenants (None: the node has none)."""


class PodUsage(Message):
    pod_uid: str
    node: str
    ts: UtcDatetime
    """When the pod left the node (or the replay ended)."""
    open: bool = False
    """True: the pod was still on the node when the replay ended."""
    gpu_model: str | None = None
    unit_s: NonNegFloat = 0.0
    """Sampled unit-seconds (each GPU's sample covers its interval)."""
    data_s: NonNegFloat = 0.0
    """Unit-seconds with a utilisation figure."""
    idle_s: NonNegFloat = 0.0
    busy_s: NonNegFloat = 0.0
    gap_s: NonNegFloat = 0.0
    util_s: NonNegFloat = 0.0
    """Sum of SM util % x seconds (for the time-weighted mean)."""
    cost_units_s: NonNegFloat = 0.0
    """Sum of seconds x unit fraction x share (how much of a whole GPU it paid for)."""
    peak_mem_bytes: NonNegInt | None = None
    samples: NonNegInt = 0
    share_estimated: bool = False
    max_reserved_unused_bytes: NonNegInt | None = None
    """The pod's caching allocator (workload.allocator.v1): most reserved-but-unused bytes on one GPU."""
    alloc_retries: NonNegInt | None = None
    alloc_ooms: NonNegInt | None = None


_KEPT_AS_IS: frozenset[type[Message]] = frozenset({GpuSample, K8sEvent, WorkloadAllocator, WorkloadProgress,
                                                   NodeSummary, PodUsage})
"""Input types :func:`kept` returns as they are (exactly these types: a subclass is looked at)."""
