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

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema
from pydantic_core import PydanticCustomError

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

# --------------------------------------------------------------------------- bounds
# Every value a record may carry is bounded here, once: a named limit, the alias that applies it
# (reused by every field it fits) and a row of ``BOUNDS`` (docs/schemas.md lists them all). A value
# beyond its bound is refused wherever the record is read, with the field's path and the dead
# letter's reason code (``too_large`` for a string or list, ``out_of_range`` for a number).

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
UINT64_MAX = 2**64 - 1
"""The widest integer anywhere: what ClickHouse's UInt64 holds and orjson still reads as an integer
(beyond it orjson reads a float, and writes nothing: ``Integer exceeds 64-bit range``)."""
FLOAT32_MAX = 3.4028234663852886e38

MAX_DNS_LABEL_CHARS = 63
"""Kubernetes' DNS label (RFC 1123): namespaces, container names."""
MAX_NAME_CHARS = 253
"""Kubernetes' DNS subdomain: pod, node, owner and priority class names."""
MAX_QUALIFIED_NAME_CHARS = 317
"""Kubernetes' qualified name with its prefix (253 + ``/`` + 63): label and taint keys, resource
names, condition types, API versions."""
MAX_LABEL_VALUE_CHARS = 63
"""Kubernetes' label value (and taint value)."""
MAX_LABELS = 256
"""Labels per pod or node: far more than any object carries that gpulens has seen; the watcher trims
to it (Kubernetes bounds only an object's total size)."""
MAX_ID_CHARS = 128
"""Identifiers: pod and object uids (36), GPU and MIG UUIDs (about 40), agent boot ids."""
MAX_SHORT_TEXT_CHARS = 256
"""Short free text from a driver or Kubernetes: GPU models, versions, MIG profiles, container ids,
kinds, statuses, types, clock event reasons."""
MAX_TEXT_CHARS = 4096
"""Reasons and messages (Kubernetes' own limit on a termination message), image references,
process names (Linux' PATH_MAX), errors."""
MAX_TAG_CHARS = 253
"""A team or project value (from a label or an annotation)."""
MAX_GANG_CHARS = MAX_DNS_LABEL_CHARS + 1 + MAX_NAME_CHARS
"""A gang id: ``<namespace>/<group name>``."""
MAX_LIST_ITEMS = 256
"""Lists of a pod, node or workload (conditions, owners, containers, taints, pod sets) and a
sample's errors."""
MAX_RESOURCES = 64
"""GPU resource names in one request or capacity map."""
MAX_GPUS_PER_SAMPLE = 256
"""GPU readings in one sample: 16 GPUs with 7 MIG devices each are 128."""
MAX_PODS_PER_GPU = 1024
"""Pods the kubelet assigned one GPU to (time-slicing replicas)."""
MAX_PROCESSES_PER_GPU = 2**16 - 1
"""What ``gpu_samples.process_count`` (UInt16) can count; the 1 MiB message caps a sample's total."""
MAX_XIDS_PER_GPU = 1024
"""XID events on one GPU in one sample (the NVML agent buffers at most 1024 per sample)."""
MAX_CLOCK_REASONS = 64
"""Clock event reasons of one GPU (NVML has 64 bits of them)."""
MAX_GPU_COUNT = 2**24
"""GPUs (or devices of one GPU resource) one pod, pod set or node asks for or has: a sum over a
map's ``MAX_RESOURCES`` entries stays within UInt32 (``gpus_requested``, ``gpus_capacity``)."""
MAX_POD_COUNT = 2**20
"""Pods of one Kueue pod set (Kubernetes supports 150,000 pods per cluster)."""
MAX_GPU_MEMORY_BYTES = 2**44
"""A GPU's memory as a node label or a pod's request declares it (16 TiB: 50 times the largest GPU
of 2026), so sums over every pod of a cluster stay within 64 bits."""
MAX_SAMPLE_INTERVAL_S = 3600.0
"""A sample's interval: the most the agent's ``GPULENS_SAMPLE_INTERVAL_S`` allows (a sample covers
``[ts, ts + interval)``, so the stream jobs' work per sample stays bounded)."""
MAX_DURATION_S = 1e10
"""A duration in seconds (317 years)."""
MAX_PROGRESS_TOTAL = 2.0**53
"""A progress counter (steps, tokens, samples): a float counts by ones up to 2^53."""
MAX_USD = 1e12
"""A cost in US dollars: a trillion."""

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
"""A signed integer: within 64 bits."""
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
"""A Kubernetes int32 (an exit code, a priority): ClickHouse stores exit codes as Int32."""
NonNegInt = Annotated[int, Field(ge=0, le=UINT64_MAX)]
"""A count or size: at most :data:`UINT64_MAX` (the stream jobs' outputs; inputs use narrower aliases)."""
NonNegInt32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
"""A Kubernetes int32 counter (restarts, an event's count): stored as UInt32."""
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite non-negative float."""
Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
Uint8 = Annotated[int, Field(ge=0, le=2**8 - 1)]
"""An integer ClickHouse stores as UInt8 (a MIG placement start)."""
Uint16 = Annotated[int, Field(ge=0, le=2**16 - 1)]
"""An integer ClickHouse stores as UInt16 (a GPU index)."""
Uint32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
"""An integer ClickHouse stores as UInt32 (a process id, a clock, an XID)."""
Uint64 = Annotated[int, Field(ge=0, le=UINT64_MAX)]
"""An integer ClickHouse stores as UInt64 (bytes, a sequence number)."""
Float32 = Annotated[float, Field(ge=-FLOAT32_MAX, le=FLOAT32_MAX, allow_inf_nan=False)]
"""A float ClickHouse stores as Float32: finite there too (a larger float64 would become infinite)."""
NonNegFloat32 = Annotated[float, Field(ge=0, le=FLOAT32_MAX, allow_inf_nan=False)]
GpuCount = Annotated[int, Field(ge=0, le=MAX_GPU_COUNT)]
PodCount = Annotated[int, Field(ge=0, le=MAX_POD_COUNT)]
GpuMemoryBytes = Annotated[int, Field(ge=0, le=MAX_GPU_MEMORY_BYTES)]
DurationS = Annotated[float, Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False)]
ProgressTotal = Annotated[float, Field(ge=0, le=MAX_PROGRESS_TOTAL, allow_inf_nan=False)]
UsdAmount = Annotated[float, Field(ge=0, le=MAX_USD, allow_inf_nan=False)]

DnsLabel = Annotated[str, Field(max_length=MAX_DNS_LABEL_CHARS)]
K8sName = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
QualifiedName = Annotated[str, Field(max_length=MAX_QUALIFIED_NAME_CHARS)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE_CHARS)]
Identifier = Annotated[str, Field(max_length=MAX_ID_CHARS)]
ShortText = Annotated[str, Field(max_length=MAX_SHORT_TEXT_CHARS)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
TagValue = Annotated[str, Field(max_length=MAX_TAG_CHARS)]
GangId = Annotated[str, Field(max_length=MAX_GANG_CHARS)]
Labels = Annotated[dict[QualifiedName, LabelValue], Field(max_length=MAX_LABELS)]
GpuResources = Annotated[dict[QualifiedName, GpuCount], Field(max_length=MAX_RESOURCES)]
"""GPUs by resource name (``nvidia.com/gpu``, a MIG profile's resource, ...)."""
GpuTotal = Annotated[int, Field(ge=0, le=MAX_RESOURCES * MAX_GPU_COUNT)]
"""A sum over a :data:`GpuResources` map."""


BoundCode = Literal["too_large", "out_of_range", "inconsistent"]
"""The dead letters' reason codes a bound gives (``schemas.outputs.DeadLetterReason`` values)."""


@dataclass(frozen=True)
class Bound:
    """One bound of the contracts, as data: ``limit`` on ``fields`` (``Model.field``; ``{key}`` /
    ``{value}``: a map's keys or values; ``[]``: a list's items), of ``kind`` ``chars`` (at most so
    many characters), ``items`` (list items or map entries), ``max`` / ``min`` (a number),
    ``finite`` or ``distinct``; a record beyond it is dead-lettered with reason ``code``."""

    name: str
    kind: Literal["chars", "items", "max", "min", "finite", "distinct", "key"]
    limit: int | float | None
    fields: tuple[str, ...]
    why: str
    code: BoundCode


class Message(BaseModel):
    """Base of every topic's value: versioned, tolerant of unknown fields, immutable, and scoped to
    the cluster it comes from (every message type inherits ``cluster``)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    schema_version: Int64 = SCHEMA_VERSION
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
    message: Text | None = None


class PodRef(Part):
    """A pod/container the kubelet's PodResources API assigned a device to."""

    namespace: DnsLabel
    pod: K8sName
    container: DnsLabel
    pod_uid: Identifier | None = None


class GpuProcess(Part):
    pid: Uint32
    container_id: ShortText | None = None
    pod_uid: Identifier | None = None
    pod_namespace: DnsLabel | None = None
    pod_name: K8sName | None = None
    container_name: DnsLabel | None = None
    mem_used_bytes: Uint64 | None = None
    sm_util_pct: Percent | None = None
    process_name: Text | None = None


class GpuReading(Part):
    uuid: Identifier
    index: Uint16
    model: ShortText
    mig_parent_uuid: Identifier | None = None
    mig_profile: ShortText | None = None
    gpu_instance_id: Uint32 | None = None
    compute_instance_id: Uint32 | None = None
    mig_placement_start: Uint8 | None = Field(
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
    health_reason: Text | None = None
    xids: list[XidEvent] = Field(default_factory=list, max_length=MAX_XIDS_PER_GPU)
    assigned_to: list[PodRef] = Field(default_factory=list, max_length=MAX_PODS_PER_GPU)
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
    ecc_sbe_volatile_total: Uint64 | None = Field(
        default=None, description="Single-bit ECC errors since the last driver load (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL)")
    ecc_dbe_volatile_total: Uint64 | None = Field(
        default=None, description="Double-bit ECC errors since the last driver load (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)")
    clock_event_reasons: list[ShortText] | None = Field(
        default=None, max_length=MAX_CLOCK_REASONS,
        description="Why the clocks are held below their maximum now (NVML clock event / throttle "
        "reason bits, DCGM_FI_DEV_CLOCKS_EVENT_REASONS), e.g. sw_power_cap, hw_thermal_slowdown; [] = none; "
        "absent when unknown")


INCONSISTENT = "inconsistent"
"""The pydantic error type of a contradiction between fields (:data:`DeadLetterReason.INCONSISTENT`)."""


def _distinct_gpus(gpus: list[Any]) -> list[Any]:
    """A sample's GPU readings, each GPU once: no UUID twice, no index twice among the physical GPUs
    (a MIG device carries its parent's index). Readings are models or, validated into plain data
    (``schemas.codec.plain_validator``), dicts."""
    fields_of = [gpu if type(gpu) is dict else gpu.__dict__ for gpu in gpus]
    physical = [fields["index"] for fields in fields_of if fields.get("mig_parent_uuid") is None]
    if len({fields["uuid"] for fields in fields_of}) == len(fields_of) and len(set(physical)) == len(physical):
        return gpus  # nothing repeats (every valid sample): the walk below finds the first repeat
    uuids: set[str] = set()
    indexes: set[int] = set()
    for position, gpu in enumerate(gpus):
        fields: Mapping[str, Any] = gpu if isinstance(gpu, Mapping) else gpu.__dict__
        uuid, index = fields["uuid"], fields["index"]
        if uuid in uuids:
            raise PydanticCustomError(INCONSISTENT, "GPU {position} repeats the UUID of an earlier GPU of the sample",
                                      {"position": position})
        uuids.add(uuid)
        if fields.get("mig_parent_uuid") is None:
            if index in indexes:
                raise PydanticCustomError(INCONSISTENT, "GPU {position} repeats the index {index} of an earlier GPU "
                                          "of the sample", {"position": position, "index": index})
            indexes.add(index)
    return gpus


# --------------------------------------------------------------------------- DRA devices

MAX_DRA_DEVICES = 1024
"""GPU devices one node publishes through DRA ResourceSlices: 16 GPUs, each as a whole device and
partitions (dynamic MIG publishes every placement a GPU allows, up to about 50)."""
MAX_DRA_ALLOCATIONS = 1024
"""DRA devices the kubelet reports for one node's containers in one sample."""
MAX_CDI_IDS = 16
"""CDI device ids of one allocated DRA device."""


class DraDeviceRef(Part):
    """A device as Dynamic Resource Allocation names it: ``(driver, pool, device)`` is unique in a
    cluster (a ResourceSlice's ``spec.driver``, ``spec.pool.name`` and ``devices[].name``)."""

    driver: K8sName
    pool: K8sName
    device: DnsLabel


class DraDevice(DraDeviceRef):
    """A GPU device a node publishes in its ResourceSlices, mapped by the watcher's driver table
    (docs/dra.md): what it counts as, and how NVML knows it (its UUID)."""

    resource: QualifiedName = Field(
        description="The extended-resource name the device counts as (nvidia.com/gpu, nvidia.com/mig-1g.10gb), "
        "so DRA capacity and demand read like the device plugin's")
    uuid: Identifier | None = Field(None, description="The GPU or MIG device UUID NVML reports; absent when the "
                                    "driver publishes none")
    model: ShortText | None = None
    mig_profile: ShortText | None = None
    mig_parent_uuid: Identifier | None = None
    memory_bytes: GpuMemoryBytes | None = None
    physical_gpu: Identifier | None = Field(
        None, description="The physical GPU the device is or is part of (its UUID, or the counter set partitions "
        "share): partitions of one GPU count once in capacity")
    multi_allocatable: bool = Field(False, description="Several claims may share the device (consumable capacity)")


class DraAllocation(DraDeviceRef):
    """One DRA device the kubelet gave a container, as PodResources' ``dynamic_resources`` reports
    it: the node stage resolves it to a GPU through the node's :class:`DraDevice` list."""

    namespace: DnsLabel
    pod: K8sName
    container: DnsLabel
    claim_namespace: DnsLabel
    claim_name: K8sName
    cdi_ids: list[Text] = Field(default_factory=list, max_length=MAX_CDI_IDS)
    share_id: Identifier | None = Field(None, description="The share of a device several claims hold (consumable "
                                        "capacity); absent for a device held whole")


DistinctGpus = Annotated[list[GpuReading], AfterValidator(_distinct_gpus)]
"""A sample's readings: at most :data:`MAX_GPUS_PER_SAMPLE`, each GPU once (``inconsistent`` otherwise)."""


class GpuSample(Message):
    """One node's NVML sample: every GPU and process of the node at one sampling moment."""

    node: K8sName
    ts: UtcDatetime
    agent_boot_id: Identifier
    seq: Uint64
    sample_interval_s: Annotated[float, Field(gt=0, le=MAX_SAMPLE_INTERVAL_S, allow_inf_nan=False)]
    driver_version: ShortText | None = None
    cuda_driver_version: ShortText | None = None
    gpus: DistinctGpus = Field(default_factory=list, max_length=MAX_GPUS_PER_SAMPLE)
    errors: list[Text] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    dra_allocations: list[DraAllocation] = Field(
        default_factory=list, max_length=MAX_DRA_ALLOCATIONS,
        description="DRA devices the kubelet gave the node's containers (PodResources dynamic_resources)")


# --------------------------------------------------------------------------- k8s.pods.v1

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]


class PodCondition(Part):
    type: QualifiedName
    status: ShortText
    reason: Text | None = None
    message: Text | None = None
    last_transition_at: UtcDatetime | None = None


class OwnerRef(Part):
    kind: ShortText
    name: K8sName
    uid: Identifier | None = None
    api_version: QualifiedName | None = None


class ContainerState(Part):
    name: DnsLabel
    container_id: ShortText | None = None
    image: Text | None = None
    ready: bool = False
    state: Literal["waiting", "running", "terminated", "unknown"] = "unknown"
    state_reason: Text | None = None
    restart_count: NonNegInt32 = 0
    last_termination_reason: Text | None = None
    last_exit_code: Int32 | None = None
    last_finished_at: UtcDatetime | None = None


class PodState(Message):
    """Full state of one pod on each relevant change; a Kafka tombstone follows its deletion."""

    uid: Identifier
    namespace: DnsLabel
    name: K8sName
    ts: UtcDatetime
    node: K8sName | None = None
    phase: PodPhase
    conditions: list[PodCondition] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    gpu_requests: GpuResources = Field(default_factory=dict)
    vram_request_bytes: GpuMemoryBytes | None = Field(
        default=None, description="Device memory the pod needs per GPU on a shared GPU: HAMi's nvidia.com/gpumem "
        "(MiB, summed over containers), else the annotation gpulens.io/vram-request; absent when neither is set")
    owners: list[OwnerRef] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    team: TagValue | None = None
    project: TagValue | None = None
    gang_id: GangId | None = None
    labels: Labels = Field(default_factory=dict)
    containers: list[ContainerState] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    restarts: NonNegInt32 = 0
    last_termination_reason: Text | None = None
    last_exit_code: Int32 | None = None
    status_reason: Text | None = None
    deleted: bool = False
    created_at: UtcDatetime
    scheduled_at: UtcDatetime | None = None
    started_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    deleted_at: UtcDatetime | None = None
    priority_class: K8sName | None = None
    truncated: bool = False
    """Set when the watcher cut what it publishes to the contract's bounds (labels over budget, text
    over its length, lists over their cap, quantities clamped): see docs/watcher.md."""


# --------------------------------------------------------------------------- k8s.nodes.v1


class Taint(Part):
    key: QualifiedName
    value: LabelValue | None = None
    effect: ShortText


class NodeState(Message):
    node: K8sName
    ts: UtcDatetime
    uid: Identifier | None = None
    gpu_capacity: GpuResources = Field(default_factory=dict)
    gpu_allocatable: GpuResources = Field(default_factory=dict)
    gpu_product: ShortText | None = None
    gpu_memory_bytes: GpuMemoryBytes | None = None
    gpu_count_label: GpuCount | None = None
    cuda_driver_version: ShortText | None = None
    driver_version: ShortText | None = None
    mig_strategy: ShortText | None = None
    ready: bool
    unschedulable: bool = False
    taints: list[Taint] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    labels: Labels = Field(default_factory=dict)
    dra_devices: list[DraDevice] = Field(
        default_factory=list, max_length=MAX_DRA_DEVICES,
        description="GPU devices the node publishes through DRA ResourceSlices (docs/dra.md)")
    deleted: bool = False
    truncated: bool = False
    """Set when the watcher cut what it publishes to the contract's bounds (labels over budget, text
    over its length, lists over their cap, quantities clamped): see docs/watcher.md."""


# --------------------------------------------------------------------------- k8s.events.v1

EventCategory = Literal[
    "scheduling_failed", "preempted", "evicted", "oom_killed", "scheduled", "other"
]


class K8sEvent(Message):
    uid: Identifier
    ts: UtcDatetime
    category: EventCategory
    reason: Text
    message: Text = ""
    type: ShortText = "Normal"
    count: NonNegInt32 = 1
    involved_kind: ShortText
    involved_uid: Identifier | None = None
    involved_namespace: DnsLabel | None = None
    involved_name: K8sName
    source: ShortText | None = None
    truncated: bool = False
    """Set when the watcher cut what it publishes to the contract's bounds (labels over budget, text
    over its length, lists over their cap, quantities clamped): see docs/watcher.md."""


# --------------------------------------------------------------------------- k8s.workloads.v1

WorkloadPhase = Literal["queued", "quota_reserved", "admitted", "finished", "inactive"]


class PodSetDemand(Part):
    """One pod set of a queued workload: ``count`` pods, each asking ``gpu_requests_per_pod``."""

    name: DnsLabel
    count: PodCount
    gpu_requests_per_pod: GpuResources = Field(default_factory=dict)


class WorkloadState(Message):
    """A Kueue ``Workload`` (kueue.x-k8s.io) on each change: what a job asks for while it waits.

    A queued job is suspended and has no pods, so this is the only record of its demand. Once
    ``admitted`` its pods exist and carry the demand: consumers count a workload or its pods,
    never both. ``gpu_requests`` is the total over pod sets (per-pod request x count).
    """

    uid: Identifier
    namespace: DnsLabel
    name: K8sName
    ts: UtcDatetime
    phase: WorkloadPhase
    queue_name: K8sName | None = None
    """``spec.queueName``: the LocalQueue in the workload's namespace."""
    cluster_queue: K8sName | None = None
    """``status.admission.clusterQueue`` once quota is reserved."""
    priority_class: K8sName | None = None
    priority: Int32 | None = None
    pod_sets: list[PodSetDemand] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    gpu_requests: GpuResources = Field(default_factory=dict)
    gpus: GpuTotal = 0
    owners: list[OwnerRef] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    team: TagValue | None = None
    project: TagValue | None = None
    gang_id: GangId | None = None
    pending_reason: Text | None = None
    """The message of the latest condition that says why it is not admitted (QuotaReserved False)."""
    created_at: UtcDatetime
    quota_reserved_at: UtcDatetime | None = None
    admitted_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    wait_s: DurationS | None = None
    """Creation to admission, once admitted (while queued: ``ts`` minus ``created_at``)."""
    deleted: bool = False
    deleted_at: UtcDatetime | None = None
    truncated: bool = False
    """Set when the watcher cut what it publishes to the contract's bounds (labels over budget, text
    over its length, lists over their cap, quantities clamped): see docs/watcher.md."""


# --------------------------------------------------------------------------- workload.progress.v1


class WorkloadProgress(Message):
    """Monotonic counters a workload reports, for cost per unit of work."""

    pod_uid: Identifier
    namespace: DnsLabel
    pod: K8sName
    ts: UtcDatetime
    steps_total: ProgressTotal | None = None
    tokens_total: ProgressTotal | None = None
    samples_total: ProgressTotal | None = None


# --------------------------------------------------------------------------- workload.allocator.v1

MAX_ALLOCATOR_BYTES = 2**50
"""Largest byte figure an allocator report may carry (1 PiB: far above any GPU, below a typo)."""
MAX_ALLOCATOR_COUNT = 10**12
"""Largest retry or OOM total an allocator report may carry."""
MAX_CUDA_DEVICE = 255
"""Largest CUDA device index an allocator report may name."""
MAX_ALLOCATOR_DEVICES = 64
"""Devices in one allocator report."""
AllocatorBytes = Annotated[int, Field(ge=0, le=MAX_ALLOCATOR_BYTES)]
AllocatorCount = Annotated[int, Field(ge=0, le=MAX_ALLOCATOR_COUNT)]


class AllocatorDevice(Part):
    """What a framework's caching allocator (PyTorch's) holds on one device of one process.

    ``reserved_bytes`` is what the allocator took from the driver (what NVML sees as used);
    ``allocated_bytes`` what live tensors use of it; the difference is reserved but unused.
    Totals count since the process started (a restarted process counts from zero again)."""

    device: Annotated[int, Field(ge=0, le=MAX_CUDA_DEVICE)]
    """The CUDA device index as the process sees it (``torch.cuda.current_device()``)."""
    gpu_uuid: Identifier | None = None
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

    pod_uid: Identifier
    namespace: DnsLabel
    pod: K8sName
    node: K8sName
    """The node of the agent that received the report (routes it to that node's stage)."""
    ts: UtcDatetime
    devices: Annotated[list[AllocatorDevice], Field(min_length=1, max_length=MAX_ALLOCATOR_DEVICES)]


def scoped_key(cluster: str, key: str) -> str:
    """``key`` (a node name, pod uid, alert id) made unique across clusters: ``<cluster>/<key>``, and
    ``key`` itself in the ``default`` cluster, so a single-cluster install keeps its keys and ids."""
    return key if cluster == DEFAULT_CLUSTER else f"{cluster}/{key}"


def utc_now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- the bounds, as data

_TOO_LARGE: BoundCode = "too_large"
_OUT_OF_RANGE: BoundCode = "out_of_range"
BOUNDS: tuple[Bound, ...] = (
    Bound("MAX_MESSAGE_BYTES", "chars", 1024 * 1024, ("every message",),
          "a record's value: one giant record cannot exhaust a consumer (bytes, schemas.codec)", _TOO_LARGE),
    Bound("finite", "finite", None, ("every float",),
          "JSON has no infinity; orjson refuses 1e400, so no reader meets one", _OUT_OF_RANGE),
    Bound("INT64", "max", INT64_MAX, ("*.schema_version",), "a signed integer: 64 bits", _OUT_OF_RANGE),
    Bound("UINT64_MAX", "max", UINT64_MAX, (
        "GpuReading.mem_used_bytes", "GpuReading.mem_total_bytes", "GpuReading.ecc_sbe_volatile_total",
        "GpuReading.ecc_dbe_volatile_total", "GpuProcess.mem_used_bytes", "GpuSample.seq", "outputs: every count"),
        "ClickHouse UInt64; beyond it orjson reads a float and writes nothing", _OUT_OF_RANGE),
    Bound("UINT32_MAX", "max", 2**32 - 1, (
        "XidEvent.xid", "GpuProcess.pid", "GpuReading.sm_clock_mhz", "GpuReading.mem_clock_mhz",
        "GpuReading.gpu_instance_id", "GpuReading.compute_instance_id"), "ClickHouse UInt32 (NVML's unsigned int)",
        _OUT_OF_RANGE),
    Bound("UINT16_MAX", "max", 2**16 - 1, ("GpuReading.index",), "ClickHouse UInt16 (gpu_index)", _OUT_OF_RANGE),
    Bound("UINT8_MAX", "max", 2**8 - 1, ("GpuReading.mig_placement_start",), "ClickHouse UInt8 (instance_starts)",
          _OUT_OF_RANGE),
    Bound("INT32", "max", INT32_MAX, (
        "ContainerState.last_exit_code", "PodState.last_exit_code", "WorkloadState.priority",
        "ContainerState.restart_count", "PodState.restarts", "K8sEvent.count"),
        "Kubernetes int32; ClickHouse Int32 / UInt32 (also at least INT32_MIN where signed)", _OUT_OF_RANGE),
    Bound("FLOAT32_MAX", "max", FLOAT32_MAX, (
        "GpuReading.power_w", "GpuReading.temperature_c", "GpuReading.pcie_tx_bytes_per_s",
        "GpuReading.pcie_rx_bytes_per_s", "GpuReading.nvlink_tx_bytes_per_s", "GpuReading.nvlink_rx_bytes_per_s"),
        "ClickHouse Float32: a larger float64 would become infinite there "
        "(temperature_c also at least -FLOAT32_MAX)", _OUT_OF_RANGE),
    Bound("MAX_SAMPLE_INTERVAL_S", "max", MAX_SAMPLE_INTERVAL_S, ("GpuSample.sample_interval_s",),
          "the agent's longest interval; a sample's work in the stream jobs grows with it", _OUT_OF_RANGE),
    Bound("percent", "max", 100, ("GpuReading.*_pct", "GpuProcess.sm_util_pct"), "a percentage: 0-100", _OUT_OF_RANGE),
    Bound("MAX_GPU_COUNT", "max", MAX_GPU_COUNT, (
        "PodState.gpu_requests{value}", "NodeState.gpu_capacity{value}", "NodeState.gpu_allocatable{value}",
        "NodeState.gpu_count_label", "PodSetDemand.gpu_requests_per_pod{value}", "WorkloadState.gpu_requests{value}"),
        "a map's sum stays within UInt32 (gpus_requested, gpus_capacity)", _OUT_OF_RANGE),
    Bound("MAX_RESOURCES * MAX_GPU_COUNT", "max", MAX_RESOURCES * MAX_GPU_COUNT, ("WorkloadState.gpus",),
          "the sum of a GpuResources map", _OUT_OF_RANGE),
    Bound("MAX_POD_COUNT", "max", MAX_POD_COUNT, ("PodSetDemand.count",),
          "Kubernetes supports 150,000 pods per cluster", _OUT_OF_RANGE),
    Bound("MAX_GPU_MEMORY_BYTES", "max", MAX_GPU_MEMORY_BYTES, ("PodState.vram_request_bytes",
          "NodeState.gpu_memory_bytes", "DraDevice.memory_bytes"),
          "16 TiB per GPU: sums over a cluster's pods stay within 64 bits", _OUT_OF_RANGE),
    Bound("MAX_ALLOCATOR_BYTES", "max", MAX_ALLOCATOR_BYTES, ("AllocatorDevice.*_bytes",), "1 PiB", _OUT_OF_RANGE),
    Bound("MAX_ALLOCATOR_COUNT", "max", MAX_ALLOCATOR_COUNT, ("AllocatorDevice.alloc_retries_total",
          "AllocatorDevice.ooms_total"), "a retry or OOM total", _OUT_OF_RANGE),
    Bound("MAX_CUDA_DEVICE", "max", MAX_CUDA_DEVICE, ("AllocatorDevice.device",), "a CUDA device index",
          _OUT_OF_RANGE),
    Bound("MAX_DURATION_S", "max", MAX_DURATION_S, ("WorkloadState.wait_s",), "317 years", _OUT_OF_RANGE),
    Bound("MAX_PROGRESS_TOTAL", "max", MAX_PROGRESS_TOTAL, (
        "WorkloadProgress.steps_total", "WorkloadProgress.tokens_total", "WorkloadProgress.samples_total"),
        "a float counts by ones up to 2^53", _OUT_OF_RANGE),
    Bound("MAX_USD", "max", MAX_USD, ("PodWindow.cost_usd", "PodLifecycle.cost_usd"),
          "a trillion dollars (the stream jobs' costs saturate there)", _OUT_OF_RANGE),
    Bound("MAX_DNS_LABEL_CHARS", "chars", MAX_DNS_LABEL_CHARS, (
        "*.cluster", "PodRef.namespace", "PodRef.container", "GpuProcess.pod_namespace",
        "GpuProcess.container_name", "ContainerState.name", "PodState.namespace", "K8sEvent.involved_namespace",
        "PodSetDemand.name", "WorkloadState.namespace", "WorkloadProgress.namespace", "WorkloadAllocator.namespace",
        "Dra*.device", "DraAllocation.namespace", "DraAllocation.container", "DraAllocation.claim_namespace"),
        "Kubernetes' DNS label", _TOO_LARGE),
    Bound("MAX_NAME_CHARS", "chars", MAX_NAME_CHARS, (
        "PodRef.pod", "GpuProcess.pod_name", "GpuSample.node", "OwnerRef.name", "PodState.name", "PodState.node",
        "PodState.priority_class", "NodeState.node", "K8sEvent.involved_name", "WorkloadState.name",
        "WorkloadState.queue_name", "WorkloadState.cluster_queue", "WorkloadState.priority_class",
        "WorkloadProgress.pod", "WorkloadAllocator.pod", "WorkloadAllocator.node", "Dra*.driver", "Dra*.pool",
        "DraAllocation.pod", "DraAllocation.claim_name"),
        "Kubernetes' DNS subdomain (object names)", _TOO_LARGE),
    Bound("MAX_QUALIFIED_NAME_CHARS", "chars", MAX_QUALIFIED_NAME_CHARS, (
        "PodState.labels{key}", "NodeState.labels{key}", "Taint.key", "PodCondition.type", "OwnerRef.api_version",
        "PodState.gpu_requests{key}", "NodeState.gpu_capacity{key}", "NodeState.gpu_allocatable{key}",
        "PodSetDemand.gpu_requests_per_pod{key}", "WorkloadState.gpu_requests{key}", "DraDevice.resource"),
        "Kubernetes' qualified name: a 253-character prefix, '/', a 63-character name", _TOO_LARGE),
    Bound("MAX_LABEL_VALUE_CHARS", "chars", MAX_LABEL_VALUE_CHARS, (
        "PodState.labels{value}", "NodeState.labels{value}", "Taint.value"), "Kubernetes' label value", _TOO_LARGE),
    Bound("MAX_LABELS", "items", MAX_LABELS, ("PodState.labels", "NodeState.labels"),
          "labels per object (the watcher trims to it)", _TOO_LARGE),
    Bound("MAX_ID_CHARS", "chars", MAX_ID_CHARS, (
        "PodRef.pod_uid", "GpuProcess.pod_uid", "GpuReading.uuid", "GpuReading.mig_parent_uuid",
        "GpuSample.agent_boot_id", "OwnerRef.uid", "PodState.uid", "NodeState.uid", "K8sEvent.uid",
        "K8sEvent.involved_uid", "WorkloadState.uid", "WorkloadProgress.pod_uid", "AllocatorDevice.gpu_uuid",
        "WorkloadAllocator.pod_uid", "DraDevice.uuid", "DraDevice.mig_parent_uuid",
        "DraDevice.physical_gpu", "DraAllocation.share_id"), "uids (36) and GPU / MIG UUIDs (about 40)", _TOO_LARGE),
    Bound("MAX_SHORT_TEXT_CHARS", "chars", MAX_SHORT_TEXT_CHARS, (
        "GpuProcess.container_id", "ContainerState.container_id", "GpuReading.model", "GpuReading.mig_profile",
        "GpuReading.clock_event_reasons[]", "GpuSample.driver_version", "GpuSample.cuda_driver_version",
        "PodCondition.status", "OwnerRef.kind", "Taint.effect", "NodeState.gpu_product",
        "NodeState.cuda_driver_version", "NodeState.driver_version", "NodeState.mig_strategy", "K8sEvent.type",
        "K8sEvent.involved_kind", "K8sEvent.source", "DraDevice.model", "DraDevice.mig_profile"),
        "names and versions from a driver or Kubernetes", _TOO_LARGE),
    Bound("MAX_TEXT_CHARS", "chars", MAX_TEXT_CHARS, (
        "XidEvent.message", "GpuProcess.process_name", "GpuReading.health_reason", "GpuSample.errors[]",
        "PodCondition.reason", "PodCondition.message", "ContainerState.image", "ContainerState.state_reason",
        "ContainerState.last_termination_reason", "PodState.last_termination_reason", "PodState.status_reason",
        "K8sEvent.reason", "K8sEvent.message", "WorkloadState.pending_reason", "DraAllocation.cdi_ids[]"),
        "reasons and messages: Kubernetes' termination message limit", _TOO_LARGE),
    Bound("MAX_TAG_CHARS", "chars", MAX_TAG_CHARS, (
        "PodState.team", "PodState.project", "WorkloadState.team", "WorkloadState.project"),
        "a team or project (a label or an annotation value)", _TOO_LARGE),
    Bound("MAX_GANG_CHARS", "chars", MAX_GANG_CHARS, ("PodState.gang_id", "WorkloadState.gang_id"),
          "a namespace, '/', a group name", _TOO_LARGE),
    Bound("MAX_LIST_ITEMS", "items", MAX_LIST_ITEMS, (
        "GpuSample.errors", "PodState.conditions", "PodState.owners", "PodState.containers", "NodeState.taints",
        "WorkloadState.pod_sets", "WorkloadState.owners"), "lists of one object", _TOO_LARGE),
    Bound("MAX_RESOURCES", "items", MAX_RESOURCES, (
        "PodState.gpu_requests", "NodeState.gpu_capacity", "NodeState.gpu_allocatable",
        "PodSetDemand.gpu_requests_per_pod", "WorkloadState.gpu_requests"), "GPU resource names in one map",
        _TOO_LARGE),
    Bound("MAX_GPUS_PER_SAMPLE", "items", MAX_GPUS_PER_SAMPLE, ("GpuSample.gpus",),
          "16 GPUs with 7 MIG devices each are 128", _TOO_LARGE),
    Bound("MAX_PODS_PER_GPU", "items", MAX_PODS_PER_GPU, ("GpuReading.assigned_to",),
          "pods sharing one GPU (time-slicing replicas)", _TOO_LARGE),
    Bound("MAX_PROCESSES_PER_GPU", "items", MAX_PROCESSES_PER_GPU, ("GpuReading.processes",),
          "ClickHouse UInt16 process_count; the 1 MiB message caps a sample's total", _TOO_LARGE),
    Bound("MAX_XIDS_PER_GPU", "items", MAX_XIDS_PER_GPU, ("GpuReading.xids",),
          "the NVML agent buffers at most 1024 XIDs per sample", _TOO_LARGE),
    Bound("MAX_CLOCK_REASONS", "items", MAX_CLOCK_REASONS, ("GpuReading.clock_event_reasons",),
          "NVML's 64 reason bits", _TOO_LARGE),
    Bound("MAX_DRA_DEVICES", "items", MAX_DRA_DEVICES, ("NodeState.dra_devices",),
          "GPU devices a node publishes through DRA (whole GPUs and partitions)", _TOO_LARGE),
    Bound("MAX_DRA_ALLOCATIONS", "items", MAX_DRA_ALLOCATIONS, ("GpuSample.dra_allocations",),
          "DRA devices the kubelet reports for one node", _TOO_LARGE),
    Bound("MAX_CDI_IDS", "items", MAX_CDI_IDS, ("DraAllocation.cdi_ids",), "CDI ids of one device", _TOO_LARGE),
    Bound("MAX_ALLOCATOR_DEVICES", "items", MAX_ALLOCATOR_DEVICES, ("WorkloadAllocator.devices",),
          "devices one pod reports", _TOO_LARGE),
    Bound("distinct GPUs", "distinct", None, ("GpuSample.gpus",),
          "no GPU UUID twice, no index twice among physical GPUs (a MIG device has its parent's index)",
          "inconsistent"),
    Bound("sample key", "key", None, ("GpuSample.node",),
          "a keyed sample's key is scoped_key(cluster, node) or the bare node name (schemas.codec.check_key); "
          "a keyless one is accepted",
          "inconsistent"),
)
"""Every bound of the input contracts, with the dead letter's reason code (docs/schemas.md's table
is rendered from it). The limits are the constants the aliases above apply."""
