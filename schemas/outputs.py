"""Typed contracts of the topics the stream jobs write: pod windows, capacity, lifecycle, alerts,
dead letters.

Why apart from :mod:`schemas.messages` (the inputs: samples, Kubernetes state, progress): the two
sides change for different reasons — an input follows NVML or the Kubernetes API, an output
follows what the pipeline works out — and each stays a module a reader takes in at once. The
conventions (units in names, UTC, ``None`` for unknown) are those of :mod:`schemas.messages`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import Field

from schemas.messages import Message, NonNegFloat, NonNegInt, Part, Percent, UsdAmount, UtcDatetime

# --------------------------------------------------------------------------- pod.windows.v1


class PodWindow(Message):
    """Per pod, per GPU, per event-time window utilisation. ``window_id`` is deterministic."""

    window_id: str
    pod_uid: str
    namespace: str
    pod: str
    node: str
    gpu_uuid: str
    gpu_model: str
    window_start: UtcDatetime
    window_end: UtcDatetime
    team: str | None = None
    project: str | None = None
    allocated_s: NonNegFloat
    busy_s: NonNegFloat
    idle_s: NonNegFloat
    gap_s: NonNegFloat = 0.0
    samples: NonNegInt
    avg_sm_util_pct: Percent | None = None
    max_sm_util_pct: Percent | None = None
    avg_mem_used_bytes: NonNegFloat | None = None
    max_mem_used_bytes: NonNegInt | None = None
    energy_j: NonNegFloat | None = None
    share_fraction: Annotated[float, Field(ge=0, le=1)] = 1.0
    share_estimated: bool = False
    cost_usd: UsdAmount = 0.0
    steps: NonNegFloat | None = None
    tokens: NonNegFloat | None = None
    gpu_index: NonNegInt | None = None
    """The GPU's NVML index on its node (a MIG device: its parent's index)."""
    container: str | None = None
    """The pod's container the kubelet assigned the GPU to."""
    mem_total_bytes: NonNegInt | None = None
    """The GPU's (or MIG device's) memory, as last sampled in the window."""
    avg_power_w: NonNegFloat | None = None
    """Mean power draw of the whole device over the seconds with a power figure (not the pod's share:
    ``energy_j`` is)."""
    # The pod's caching allocator on this GPU (workload.allocator.v1; absent: no report in the
    # window): reserved and allocated bytes at the window's last report, the most reserved-but-unused
    # bytes at any report, and the allocation retries and OOMs (growth of the totals) in the window.
    alloc_reserved_bytes: NonNegInt | None = None
    alloc_allocated_bytes: NonNegInt | None = None
    max_reserved_unused_bytes: NonNegInt | None = None
    alloc_retries: NonNegInt | None = None
    alloc_ooms: NonNegInt | None = None
    # The windows of this window's start that the node stage closed together (a pod's GPUs and a
    # GPU's pods are on one node): what a question about the pod's other GPUs or the GPU's other
    # pods needs, on this window alone. Absent: a stream job that does not stamp them.
    pod_busy_s: NonNegFloat | None = None
    """The most busy seconds any GPU of the pod had in the window (above 0: one of the pod's active
    windows, even when this GPU was idle)."""
    gpu_pods: NonNegInt | None = None
    """How many pods held this GPU in the window (this one included)."""
    gpu_busy_s: NonNegFloat | None = None
    """The busy seconds of every pod on this GPU in the window, added up."""
    gpu_allocated_s: NonNegFloat | None = None
    """The most seconds any pod held this GPU in the window: the GPU's time its pods split."""


# --------------------------------------------------------------------------- cluster.capacity.v1


class MigInstanceInfo(Part):
    """One MIG GPU instance on its parent GPU."""

    profile: str
    start: NonNegInt
    """First memory slice (placement start)."""
    used: bool
    """A pod holds it (the kubelet assigned it, or a process runs on it)."""
    uuid: str | None = None
    idle_s: NonNegFloat | None = None
    """How long it has been empty (in capacity windows; absent while used)."""


class MigGpuLayout(Part):
    """A MIG-enabled GPU's instances as one sample saw them (node stage -> cluster stage)."""

    gpu_uuid: str
    gpu_index: NonNegInt
    model: str
    mem_total_bytes: NonNegInt | None = None
    instances: list[MigInstanceInfo] = Field(default_factory=list)
    placement_inferred: bool = False
    """The sample gave no placement starts: these are the driver's default packing of the profiles."""


class MigGpuWindow(Part):
    """One MIG GPU's layout and free slices at a capacity window's last instant."""

    node: str
    gpu_index: NonNegInt
    gpu_uuid: str
    profile_table: str
    instances: list[MigInstanceInfo] = Field(default_factory=list)
    free_compute_slices: NonNegInt
    """Of 7: slices no instance in use holds (an empty instance's count as free)."""
    free_memory_slices: NonNegInt
    """Of 8, likewise."""
    largest_creatable_profile: str | None = None
    """The largest profile that can still be created without destroying an instance."""
    largest_after_relayout: str | None = None
    """The largest profile that could be created once the empty instances are destroyed."""


class SharedPodVram(Part):
    """A pod on a shared GPU and its device memory there."""

    namespace: str
    name: str
    mem_bytes: NonNegInt | None = None
    """Now (its processes' memory; None when NVML gives no per-process figure)."""
    peak_bytes: NonNegInt | None = None
    """The most it has held on this GPU."""


class SharedGpuState(Part):
    """A shared GPU (time-slicing, MPS) as one sample saw it (node stage -> cluster stage)."""

    gpu_uuid: str
    gpu_index: NonNegInt
    model: str
    mem_total_bytes: NonNegInt
    mem_used_bytes: NonNegInt | None = None
    pods: list[SharedPodVram] = Field(default_factory=list)


class SharedGpuWindow(Part):
    """One shared GPU's memory and tenants at a capacity window's last instant."""

    node: str
    gpu_index: NonNegInt
    gpu_uuid: str
    mem_total_bytes: NonNegInt
    mem_used_bytes: NonNegInt | None = None
    free_bytes: NonNegInt
    pods: list[SharedPodVram] = Field(default_factory=list)


class ClusterCapacity(Message):
    window_id: str
    window_start: UtcDatetime
    window_end: UtcDatetime
    gpus_total: NonNegInt
    gpus_allocated: NonNegInt
    gpus_busy: NonNegInt
    gpus_idle_allocated: NonNegInt
    gpus_free: NonNegInt
    free_gpus_by_node: dict[str, NonNegInt] = Field(default_factory=dict)
    largest_free_block: NonNegInt = 0
    stranded_gpus: NonNegInt = 0
    pending_pods: NonNegInt = 0
    pending_gpu_demand: NonNegInt = 0
    # Integrals over the window (GPU-seconds; the counts above are the state at the window's last
    # instant): exact GPU-hours even when allocations change inside a window.
    gpu_s_total: NonNegFloat | None = None
    gpu_s_allocated: NonNegFloat | None = None
    gpu_s_busy: NonNegFloat | None = None
    gpu_s_idle_allocated: NonNegFloat | None = None
    gpu_s_free: NonNegFloat | None = None
    stranded_gpus_max: NonNegInt | None = None
    """The most stranded GPUs at any instant of the window."""
    queued_workloads: NonNegInt | None = None
    """Workloads a queue (Kueue) holds that are not admitted and have no pods yet; their GPUs are
    ``queued_gpu_demand``, which ``pending_gpu_demand`` includes (``pending_pods`` counts pods only)."""
    queued_gpu_demand: NonNegInt | None = None
    # MIG (absent on a fleet without MIG GPUs): free compute and memory slices are counted
    # separately, placement follows NVIDIA's profile table (stream_jobs/mig.py)
    mig_gpus: NonNegInt | None = None
    mig_free_compute_slices: NonNegInt | None = None
    mig_free_memory_slices: NonNegInt | None = None
    mig_free_instances_by_profile: dict[str, NonNegInt] | None = None
    """Empty MIG devices by profile: what pods can be placed on now."""
    mig_relayout_capacity_by_profile: dict[str, NonNegInt] | None = None
    """Per profile, how many could exist at once if every empty instance were destroyed (summed over GPUs)."""
    mig_free_by_node: dict[str, dict[str, NonNegInt]] | None = None
    """Empty MIG devices by node and profile."""
    mig_pending_by_profile: dict[str, NonNegInt] | None = None
    """MIG devices pending pods ask for, by profile."""
    mig_layouts: list[MigGpuWindow] | None = None
    # shared GPUs (absent on a fleet without time-slicing or MPS): device memory, which sharing
    # does not isolate and Kubernetes does not schedule (stream_jobs/shared_vram.py)
    shared_gpus: NonNegInt | None = None
    shared_vram_free_bytes: NonNegInt | None = None
    shared_vram_largest_free_bytes: NonNegInt | None = None
    """The most free VRAM on one shared GPU."""
    shared_vram_stranded_bytes: NonNegInt | None = None
    """Free VRAM on schedulable shared GPUs that each have less than the smallest pending pod's need
    (0 with no pending pod that declares one)."""
    shared_vram_pending_bytes: NonNegInt | None = None
    """The memory needs pending pods declare (HAMi nvidia.com/gpumem, gpulens.io/vram-request), summed."""
    shared_gpu_layouts: list[SharedGpuWindow] | None = None


# --------------------------------------------------------------------------- pod.lifecycle.v1

EndReason = Literal[
    "Succeeded", "Failed", "OOMKilled", "Evicted", "Deleted", "Preempted", "Running", "Pending"
]


class PodLifecycle(Message):
    """One record when a GPU pod ends (also emitted for pods still open at the end of a replay)."""

    pod_uid: str
    namespace: str
    name: str
    team: str | None = None
    project: str | None = None
    node: str | None = None
    gpus: NonNegInt
    gpu_model: str | None = None
    created_at: UtcDatetime
    scheduled_at: UtcDatetime | None = None
    started_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    pending_reasons: list[str] = Field(default_factory=list)
    pending_s: NonNegFloat
    running_s: NonNegFloat
    gpu_hours: NonNegFloat
    idle_gpu_hours: NonNegFloat
    peak_mem_bytes: NonNegInt | None = None
    avg_sm_util_pct: Percent | None = None
    cost_usd: UsdAmount = 0.0
    end_reason: EndReason
    steps: NonNegFloat | None = None
    cost_per_step_usd: NonNegFloat | None = None
    max_reserved_unused_bytes: NonNegInt | None = None
    """The most reserved-but-unused bytes of the pod's caching allocator on one GPU at any report
    (absent: the pod reported no allocator statistics)."""
    alloc_retries: NonNegInt | None = None
    """Allocation retries reported over the pod's life (all its GPUs)."""
    alloc_ooms: NonNegInt | None = None
    """Allocator OOMs reported over the pod's life (all its GPUs)."""


# --------------------------------------------------------------------------- alerts.v1

AlertType = Literal[  # the alert types gpulens emits today (docs/alerts.md); the wire type is open
    "idle_gpu",
    "vram_pressure",
    "gpu_health",
    "pending_gpu",
    "fragmentation",
    "gang_partial",
    "crashloop_gpu",
    "idle_node",
    "allocator_fragmentation",
    "mig_fragmentation",
    "vram_fragmentation",
    "noisy_neighbour",
]
KNOWN_ALERT_TYPES: tuple[str, ...] = get_args(AlertType)

AlertTypeName = Annotated[
    str,
    Field(
        pattern=r"^[a-z][a-z0-9_]{0,62}$",
        description="Alert type: snake_case; new types are added within a schema version, so consumers "
        "must accept values they do not know (known values in x-known-values and docs/alerts.md).",
        json_schema_extra={"x-known-values": list(KNOWN_ALERT_TYPES)},
    ),
]
"""An open alert type: a consumer written against today's list keeps working when a type is added."""

Severity = Literal["info", "warning", "critical"]

SubjectKind = Literal["pod", "node", "gang", "cluster", "workload"]


class AlertSubject(Part):
    kind: SubjectKind
    namespace: str | None = None
    name: str | None = None
    node: str | None = None
    gpu_uuid: str | None = None


class Alert(Message):
    """One alert transition. ``id`` = hash(type, subject, start) is shared by firing and resolved."""

    id: str
    type: AlertTypeName
    severity: Severity
    state: Literal["firing", "resolved"]
    at: UtcDatetime
    started_at: UtcDatetime
    subject: AlertSubject
    summary: str
    details: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- deadletter.v1


class DeadLetterReason(StrEnum):
    """Why a record was rejected: a fixed list an operator can alert and act on (``error`` beside it
    gives the detail). docs/schemas.md lists what each means and what to change."""

    INVALID = "invalid"
    """Not JSON, not an object, a wrong type or a failed check of the contract."""
    TOO_LARGE = "too_large"
    """Over a size cap: the message, a string or a list."""
    OUT_OF_RANGE = "out_of_range"
    """A number outside its bounds (64-bit integers, finite floats, a column's range)."""
    INCONSISTENT = "inconsistent"
    """Fields that contradict each other: a sample's key and node, duplicate GPUs in one sample."""
    TOO_OLD = "too_old"
    """Older than the event-time bounds of the stream or the store's TTL."""
    TOO_FAR_AHEAD = "too_far_ahead"
    """Further ahead of the clock than the allowed skew."""
    UNKNOWN_CLUSTER = "unknown_cluster"
    """A cluster outside the workers' allow-list (``GPULENS_ACCEPT_CLUSTERS``)."""
    UNAPPLIABLE = "unappliable"
    """A valid record a stage failed to apply (a gpulens fault, kept here so the stream goes on)."""
    REJECTED_BY_STORE = "rejected_by_store"
    """ClickHouse refused the row."""
    UNDELIVERABLE = "undeliverable"
    """No destination accepted an alert (the forwarder)."""


class DeadLetter(Message):
    """A rejected input record; the same facts also travel as Kafka headers."""

    reason: DeadLetterReason = DeadLetterReason.INVALID
    error: str
    source_topic: str
    source_partition: int | None = None
    source_offset: int | None = None
    at: UtcDatetime
    payload_text: str | None = None
    payload_b64: str | None = None
