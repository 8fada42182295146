"""Typed message contracts for every gpulens topic.

These pydantic models are the single source of truth for what travels on Kafka: the JSON Schema
documents committed under ``schemas/json`` are generated from them (a test fails on drift), and
every producer, stream job and sink encodes and decodes through them (see ``schemas.codec``).

Conventions, fixed by DESIGN.md:
- every message carries ``schema_version`` and the ``cluster`` it comes from (version 2 added
  ``cluster``; a version-1 message, which has none, reads as cluster ``default``);
- timestamps are timezone-aware UTC datetimes, serialised as ISO 8601 with ``Z``;
- units are in field names (``mem_used_bytes``, ``sm_util_pct``, ``power_w``, ``*_s`` seconds);
- unknown fields are ignored on decode, so old consumers survive newer producers;
- a value NVML or Kubernetes does not provide is ``None`` (absent), never a made-up zero.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema

SCHEMA_VERSION = 2
"""2: every message carries ``cluster``. Version-1 messages still decode (cluster ``default``)."""

DEFAULT_CLUSTER = "default"
"""The cluster of messages that name none: version-1 messages, replays, ``--simulate``, the demo."""

CLUSTER_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
"""Accepted cluster names: a DNS label (RFC 1123): 1-63 lowercase letters, digits and ``-``, starting
and ending with a letter or digit. So a name never holds ``/`` (the separator of scoped keys) nor
anything that needs quoting in SQL, Grafana variables or Prometheus labels."""

ClusterName = Annotated[
    str,
    Field(pattern=CLUSTER_NAME_PATTERN, min_length=1, max_length=63,
          description="The Kubernetes cluster the message comes from (a DNS label); node names and pod "
          "uids are unique only within it. Absent in version-1 messages: read as 'default'."),
]


def _as_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp must carry a timezone (UTC)")
    return value.astimezone(UTC)


def _iso_z(value: datetime) -> str:
    text = value.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


UtcDatetime = Annotated[
    datetime,
    AfterValidator(_as_utc),
    PlainSerializer(_iso_z, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""A UTC timestamp; naive datetimes are rejected so wall-clock confusion cannot creep in."""

NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Percent = Annotated[float, Field(ge=0, le=100)]

# What a GPU sample's columns can hold, bounded here so that a value beyond its column is refused
# (and dead-lettered with its reason) wherever the record is read, not stored wrapped or infinite.
FLOAT32_MAX = 3.4028234663852886e38
Uint16 = Annotated[int, Field(ge=0, le=2**16 - 1)]
"""An integer ClickHouse stores as UInt16 (a GPU index)."""
Uint32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
"""An integer ClickHouse stores as UInt32 (a process id, a clock, an XID)."""
Uint64 = Annotated[int, Field(ge=0, le=2**64 - 1)]
"""An integer ClickHouse stores as UInt64 (bytes, a sequence number)."""
Float32 = Annotated[float, Field(ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
"""A float ClickHouse stores as Float32: finite there too (a larger float64 would become infinite)."""
NonNegFloat32 = Annotated[float, Field(ge=0, le=FLOAT32_MAX)]
MAX_PROCESSES_PER_GPU = 2**16 - 1
"""What ``gpu_samples.process_count`` (UInt16) can count."""


class Message(BaseModel):
    """Base of every topic's value: versioned, tolerant of unknown fields, immutable, and scoped to
    the cluster it comes from (every message type inherits ``cluster``)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    schema_version: int = SCHEMA_VERSION
    cluster: ClusterName = DEFAULT_CLUSTER


class Part(BaseModel):
    """Base of nested records inside a message."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# --------------------------------------------------------------------------- gpu.samples.v1

GpuHealth = Literal["ok", "degraded", "lost", "error"]


class XidEvent(Part):
    xid: Uint32
    at: UtcDatetime
    critical: bool
    message: str | None = None


class PodRef(Part):
    """A pod/container the kubelet's PodResources API assigned a device to."""

    namespace: str
    pod: str
    container: str
    pod_uid: str | None = None


class GpuProcess(Part):
    pid: Uint32
    container_id: str | None = None
    pod_uid: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    container_name: str | None = None
    mem_used_bytes: Uint64 | None = None
    sm_util_pct: Percent | None = None
    process_name: str | None = None


class GpuReading(Part):
    uuid: str
    index: Uint16
    model: str
    mig_parent_uuid: str | None = None
    mig_profile: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_placement_start: NonNegInt | None = Field(
        default=None, description="A MIG device's first memory slice on its parent (the GPU instance's placement "
        "start, 0-7); absent when the agent cannot read it (the stream then assumes the driver's default packing)")
    gpu_util_pct: Percent | None = None
    mem_util_pct: Percent | None = None
    mem_used_bytes: Uint64 | None = None
    mem_total_bytes: Uint64 | None = None
    power_w: NonNegFloat32 | None = None
    temperature_c: Float32 | None = None
    sm_clock_mhz: Uint32 | None = None
    mem_clock_mhz: Uint32 | None = None
    pcie_tx_bytes_per_s: NonNegFloat32 | None = None
    pcie_rx_bytes_per_s: NonNegFloat32 | None = None
    nvlink_tx_bytes_per_s: NonNegFloat32 | None = None
    nvlink_rx_bytes_per_s: NonNegFloat32 | None = None
    health: GpuHealth = "ok"
    health_reason: str | None = None
    xids: list[XidEvent] = Field(default_factory=list)
    assigned_to: list[PodRef] = Field(default_factory=list)
    processes: list[GpuProcess] = Field(default_factory=list, max_length=MAX_PROCESSES_PER_GPU)
    shared: bool = False
    # profiling and error counters (from dcgm-exporter; added within v1, absent from NVML samples)
    sm_active_pct: Percent | None = Field(
        default=None, description="Share of cycles an SM had at least one warp assigned (DCGM_FI_PROF_SM_ACTIVE), %")
    sm_occupancy_pct: Percent | None = Field(
        default=None, description="Resident warps per SM over the maximum (DCGM_FI_PROF_SM_OCCUPANCY), %")
    tensor_active_pct: Percent | None = Field(
        default=None, description="Share of cycles the tensor pipe was active (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE), %")
    gr_engine_active_pct: Percent | None = Field(
        default=None, description="Share of time the graphics/compute engine was active "
        "(DCGM_FI_PROF_GR_ENGINE_ACTIVE), %; reported per MIG device too")
    dram_active_pct: Percent | None = Field(
        default=None, description="Share of cycles the memory interface was busy (DCGM_FI_PROF_DRAM_ACTIVE), %")
    ecc_sbe_volatile_total: NonNegInt | None = Field(
        default=None, description="Single-bit ECC errors since the last driver load (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL)")
    ecc_dbe_volatile_total: NonNegInt | None = Field(
        default=None, description="Double-bit ECC errors since the last driver load (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)")
    clock_event_reasons: list[str] | None = Field(
        default=None, description="Why the clocks are held below their maximum now (NVML clock event / throttle "
        "reason bits, DCGM_FI_DEV_CLOCKS_EVENT_REASONS), e.g. sw_power_cap, hw_thermal_slowdown; [] = none; "
        "absent when unknown")


class GpuSample(Message):
    """One node's NVML sample: every GPU and process of the node at one sampling moment."""

    node: str
    ts: UtcDatetime
    agent_boot_id: str
    seq: Uint64
    sample_interval_s: Annotated[float, Field(gt=0, le=FLOAT32_MAX)]
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[GpuReading] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- k8s.pods.v1

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]


class PodCondition(Part):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_transition_at: UtcDatetime | None = None


class OwnerRef(Part):
    kind: str
    name: str
    uid: str | None = None
    api_version: str | None = None


class ContainerState(Part):
    name: str
    container_id: str | None = None
    image: str | None = None
    ready: bool = False
    state: Literal["waiting", "running", "terminated", "unknown"] = "unknown"
    state_reason: str | None = None
    restart_count: NonNegInt = 0
    last_termination_reason: str | None = None
    last_exit_code: int | None = None
    last_finished_at: UtcDatetime | None = None


class PodState(Message):
    """Full state of one pod on each relevant change; a Kafka tombstone follows its deletion."""

    uid: str
    namespace: str
    name: str
    ts: UtcDatetime
    node: str | None = None
    phase: PodPhase
    conditions: list[PodCondition] = Field(default_factory=list)
    gpu_requests: dict[str, NonNegInt] = Field(default_factory=dict)
    vram_request_bytes: NonNegInt | None = Field(
        default=None, description="Device memory the pod needs per GPU on a shared GPU: HAMi's nvidia.com/gpumem "
        "(MiB, summed over containers), else the annotation gpulens.io/vram-request; absent when neither is set")
    owners: list[OwnerRef] = Field(default_factory=list)
    team: str | None = None
    project: str | None = None
    gang_id: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    containers: list[ContainerState] = Field(default_factory=list)
    restarts: NonNegInt = 0
    last_termination_reason: str | None = None
    last_exit_code: int | None = None
    status_reason: str | None = None
    deleted: bool = False
    created_at: UtcDatetime
    scheduled_at: UtcDatetime | None = None
    started_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    deleted_at: UtcDatetime | None = None
    priority_class: str | None = None


# --------------------------------------------------------------------------- k8s.nodes.v1


class Taint(Part):
    key: str
    value: str | None = None
    effect: str


class NodeState(Message):
    node: str
    ts: UtcDatetime
    uid: str | None = None
    gpu_capacity: dict[str, NonNegInt] = Field(default_factory=dict)
    gpu_allocatable: dict[str, NonNegInt] = Field(default_factory=dict)
    gpu_product: str | None = None
    gpu_memory_bytes: NonNegInt | None = None
    gpu_count_label: NonNegInt | None = None
    cuda_driver_version: str | None = None
    driver_version: str | None = None
    mig_strategy: str | None = None
    ready: bool
    unschedulable: bool = False
    taints: list[Taint] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    deleted: bool = False


# --------------------------------------------------------------------------- k8s.events.v1

EventCategory = Literal[
    "scheduling_failed", "preempted", "evicted", "oom_killed", "scheduled", "other"
]


class K8sEvent(Message):
    uid: str
    ts: UtcDatetime
    category: EventCategory
    reason: str
    message: str = ""
    type: str = "Normal"
    count: NonNegInt = 1
    involved_kind: str
    involved_uid: str | None = None
    involved_namespace: str | None = None
    involved_name: str
    source: str | None = None


# --------------------------------------------------------------------------- k8s.workloads.v1

WorkloadPhase = Literal["queued", "quota_reserved", "admitted", "finished", "inactive"]


class PodSetDemand(Part):
    """One pod set of a queued workload: ``count`` pods, each asking ``gpu_requests_per_pod``."""

    name: str
    count: NonNegInt
    gpu_requests_per_pod: dict[str, NonNegInt] = Field(default_factory=dict)


class WorkloadState(Message):
    """A Kueue ``Workload`` (kueue.x-k8s.io) on each change: what a job asks for while it waits.

    A queued job is suspended and has no pods, so this is the only record of its demand. Once
    ``admitted`` its pods exist and carry the demand: consumers count a workload or its pods,
    never both. ``gpu_requests`` is the total over pod sets (per-pod request x count).
    """

    uid: str
    namespace: str
    name: str
    ts: UtcDatetime
    phase: WorkloadPhase
    queue_name: str | None = None
    """``spec.queueName``: the LocalQueue in the workload's namespace."""
    cluster_queue: str | None = None
    """``status.admission.clusterQueue`` once quota is reserved."""
    priority_class: str | None = None
    priority: int | None = None
    pod_sets: list[PodSetDemand] = Field(default_factory=list)
    gpu_requests: dict[str, NonNegInt] = Field(default_factory=dict)
    gpus: NonNegInt = 0
    owners: list[OwnerRef] = Field(default_factory=list)
    team: str | None = None
    project: str | None = None
    gang_id: str | None = None
    pending_reason: str | None = None
    """The message of the latest condition that says why it is not admitted (QuotaReserved False)."""
    created_at: UtcDatetime
    quota_reserved_at: UtcDatetime | None = None
    admitted_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    wait_s: NonNegFloat | None = None
    """Creation to admission, once admitted (while queued: ``ts`` minus ``created_at``)."""
    deleted: bool = False
    deleted_at: UtcDatetime | None = None


# --------------------------------------------------------------------------- workload.progress.v1


class WorkloadProgress(Message):
    """Monotonic counters a workload reports, for cost per unit of work."""

    pod_uid: str
    namespace: str
    pod: str
    ts: UtcDatetime
    steps_total: NonNegFloat | None = None
    tokens_total: NonNegFloat | None = None
    samples_total: NonNegFloat | None = None


# --------------------------------------------------------------------------- workload.allocator.v1

MAX_ALLOCATOR_BYTES = 2**50
"""Largest byte figure an allocator report may carry (1 PiB: far above any GPU, below a typo)."""
MAX_ALLOCATOR_COUNT = 10**12
"""Largest retry or OOM total an allocator report may carry."""
AllocatorBytes = Annotated[int, Field(ge=0, le=MAX_ALLOCATOR_BYTES)]
AllocatorCount = Annotated[int, Field(ge=0, le=MAX_ALLOCATOR_COUNT)]


class AllocatorDevice(Part):
    """What a framework's caching allocator (PyTorch's) holds on one device of one process.

    ``reserved_bytes`` is what the allocator took from the driver (what NVML sees as used);
    ``allocated_bytes`` what live tensors use of it; the difference is reserved but unused.
    Totals count since the process started (a restarted process counts from zero again)."""

    device: Annotated[int, Field(ge=0, le=255)]
    """The CUDA device index as the process sees it (``torch.cuda.current_device()``)."""
    gpu_uuid: str | None = None
    """The device's NVML UUID when the process could tell it (``GPU-...`` / ``MIG-...``)."""
    reserved_bytes: AllocatorBytes
    allocated_bytes: AllocatorBytes
    max_reserved_bytes: AllocatorBytes | None = None
    alloc_retries_total: AllocatorCount | None = None
    """``num_alloc_retries``: allocations that failed, freed the cache and were retried."""
    ooms_total: AllocatorCount | None = None
    """``num_ooms``: out-of-memory errors the allocator raised."""


class WorkloadAllocator(Message):
    """The latest allocator statistics of one pod's devices, from the node agent that received them
    (the pod is taken from the sender's kernel identity, as for progress); key = pod uid."""

    pod_uid: str
    namespace: str
    pod: str
    node: str
    """The node of the agent that received the report (routes it to that node's stage)."""
    ts: UtcDatetime
    devices: Annotated[list[AllocatorDevice], Field(min_length=1, max_length=64)]


def scoped_key(cluster: str, key: str) -> str:
    """``key`` (a node name, pod uid, alert id) made unique across clusters: ``<cluster>/<key>``, and
    ``key`` itself in the ``default`` cluster, so a single-cluster install keeps its keys and ids."""
    return key if cluster == DEFAULT_CLUSTER else f"{cluster}/{key}"


def utc_now() -> datetime:
    return datetime.now(UTC)
