"""Scenario files (``docs/FORMAT.md``, ``docs/scenarios.md``): the validated model the simulator plays.

A scenario is a contract users write against, so parsing is strict and every error names the
field (``pods[2].util: ...``); the CLI prints it as one line and exits 2. Durations are
``<number><s|m|h|d>`` (``90s``, ``1.5h``) or a bare number of seconds. Unknown keys are errors
(a typo must not silently change a what-if analysis).

Each class below is at once the format of one mapping of the file (its keys, defaults and the
message when a value is wrong: the spellings of :mod:`simulation.scenario_file`) and what the
simulator reads: a key is declared once, as a field. Defaults are written the way a file would
write them and validated like one. They are pydantic dataclasses: frozen, and
``dataclasses.replace`` validates the changed scenario again.

Besides FORMAT.md's fields, optional extensions exercise what the format cannot express:
``nodes[].mig`` (MIG mode), ``nodes[].time_slicing`` (shared GPUs), ``nodes[].process_stats``,
``nodes[].unschedulable``, ``pods[].resource``, and the top-level ``faults`` (XIDs, lost GPUs),
``agent_gaps`` (silent agents), ``late_samples`` (delayed delivery) and ``poison`` (bad records).
``workloads`` are Kueue Workloads: demand a queue holds before any pod exists; ``pods[].workload``
makes a pod one of a workload's pods, created only once the workload is admitted.
Dynamic Resource Allocation (docs/dra.md): ``nodes[].dra`` publishes a node's GPUs (or MIG devices)
as ResourceSlices instead of device-plugin allocatable, ``claims`` are ResourceClaims (or templates)
naming a device class and a count, ``pods[].claim`` makes a pod use one, and
``dra_extended_resources`` lets DRA nodes serve pods that ask ``nvidia.com/gpu``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import yaml
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from common.errors import UserError
from common.settings import Thresholds
from schemas.messages import DEFAULT_CLUSTER
from simulation.mig_layouts import (
    MAX_INSTANCES_PER_GPU,
    GpuLayout,
    MigLayoutError,
    MigRelayout,
    parse_layouts,
    parse_relayouts,
)
from simulation.scenario_file import (
    DEFAULT_MODEL,
    DEFAULT_START,
    MIG_PROFILE,
    Steps,
    cluster_name,
    device_class,
    duration_s,
    end_reason,
    error_text,
    field_error,
    flag,
    k8s_name,
    labels,
    listed,
    mapping,
    mig_profile,
    number,
    optional_duration,
    optional_resource,
    optional_text,
    owner,
    resource,
    start_time,
    steps,
    text,
    whole,
)
from stream_jobs.pipeline import INPUT_TOPICS


class ScenarioError(UserError):
    """An invalid scenario file; the message names the field."""


_FORMAT = ConfigDict(extra="forbid", validate_default=True, arbitrary_types_allowed=True)
"""Every mapping of the file: unknown keys are errors; defaults are validated like written values."""


def _list_field(*names: str) -> Callable[[object], list[object]]:
    return field_validator(*names, mode="before")(lambda value: listed(value))


@dataclass(frozen=True, config=_FORMAT)
class NodeSpec:
    name: str
    gpus: int = 8
    model: str = DEFAULT_MODEL
    memory_gib: float = 80.0
    driver: str = "550.54.15"
    cuda: str = "12.4"
    labels: dict[str, str] = Field(default_factory=dict)
    ready_until: float | None = None
    unschedulable: bool = False
    mig: str | None = None
    """Extension: every GPU in MIG mode, split into as many ``mig`` devices as fit (7 slices)."""
    time_slicing: int = 1
    """Extension: replicas per GPU (``nvidia.com/gpu`` advertised ``gpus x time_slicing``)."""
    process_stats: bool = True
    """Extension: False = NVML gives no per-process memory or utilisation on this node."""
    mig_layout: tuple[GpuLayout, ...] | None = None
    """Extension: every GPU in MIG mode with its own instances (``simulation.mig_layouts``)."""
    mig_relayout: tuple[MigRelayout, ...] = Field(default=None, validate_default=True)
    """Extension: changes of one GPU's MIG layout at a time."""
    dra: bool = False
    """Extension: NVIDIA's DRA driver publishes the node's GPUs (or, with ``mig``/``mig_layout``, its
    MIG devices) as ResourceSlices; the node advertises no GPU extended resource."""
    dra_shared: bool = False
    """Extension (with ``dra``): each GPU may be allocated to several claims at once (consumable
    capacity: ``allowMultipleAllocations``), each taking the memory its claim asks (``claims[].memory_gib``)."""

    _name = field_validator("name", mode="before")(lambda v: k8s_name(v))
    _gpus = field_validator("gpus", mode="before")(lambda v: whole(v))
    _texts = field_validator("model", "driver", "cuda", mode="before")(lambda v: text(v))
    _memory = field_validator("memory_gib", mode="before")(lambda v: number(v, 0.0))
    _labels = field_validator("labels", mode="before")(lambda v: labels(v))
    _ready = field_validator("ready_until", mode="before")(lambda v: optional_duration(v))
    _flags = field_validator("unschedulable", "process_stats", mode="before")(lambda v: flag(v))
    _mig = field_validator("mig", mode="before")(lambda v: mig_profile(v))

    @field_validator("time_slicing", mode="before")
    @classmethod
    def _slicing(cls, value: object, info: ValidationInfo) -> int:
        replicas = whole(value, 1)
        if info.data.get("mig") and replicas > 1:
            raise field_error("cannot be combined with mig")
        return replicas

    @field_validator("mig_layout", mode="before")
    @classmethod
    def _layout(cls, value: object, info: ValidationInfo) -> tuple[GpuLayout, ...] | None:
        if value is None:
            return None
        if info.data.get("mig") is not None or info.data.get("time_slicing", 1) != 1:
            raise field_error("cannot be combined with mig or time_slicing")
        if not {"gpus", "model", "memory_gib"} <= info.data.keys():
            return None  # the node's size is wrong: that error is the one reported
        try:
            return parse_layouts(value, info.data["gpus"], info.data["model"], info.data["memory_gib"])
        except MigLayoutError as exc:
            raise field_error(exc.message, exc.sub) from None

    @field_validator("mig_relayout", mode="before")
    @classmethod
    def _relayout(cls, value: object, info: ValidationInfo) -> tuple[MigRelayout, ...]:
        if value is None or info.data.get("mig_layout") is None:
            if value is not None and "mig_layout" in info.data:
                raise field_error("needs mig_layout")
            return ()
        try:
            return parse_relayouts(value, info.data["gpus"], info.data["model"], info.data["memory_gib"])
        except MigLayoutError as exc:
            raise field_error(exc.message, exc.sub) from None

    @field_validator("dra", mode="before")
    @classmethod
    def _dra(cls, value: object, info: ValidationInfo) -> bool:
        published = flag(value)
        if published and info.data.get("time_slicing", 1) > 1:
            raise field_error("cannot be combined with time_slicing (a DRA device is shared through a shared claim)")
        return published

    @field_validator("dra_shared", mode="before")
    @classmethod
    def _dra_shared(cls, value: object, info: ValidationInfo) -> bool:
        shared = flag(value)
        if shared and not info.data.get("dra", False):
            raise field_error("needs dra: true")
        if shared and (info.data.get("mig") is not None or info.data.get("mig_layout") is not None):
            raise field_error("only for whole GPUs, not with mig or mig_layout")
        return shared

    @property
    def resource(self) -> str:
        return f"nvidia.com/mig-{self.mig}" if self.mig else "nvidia.com/gpu"

    @property
    def mig_per_gpu(self) -> int:
        if self.mig_layout is not None:
            return MAX_INSTANCES_PER_GPU
        if not self.mig:
            return 1
        match = MIG_PROFILE.match(self.mig)
        assert match is not None
        return max(1, 7 // int(match.group(1)))

    @property
    def units(self) -> int:
        """Schedulable units of :attr:`resource`."""
        return self.gpus * (self.mig_per_gpu if self.mig or self.mig_layout is not None else self.time_slicing)


@dataclass(frozen=True, config=_FORMAT)
class AllocatorSpec:
    """Extension ``pods[].allocator``: what the pod's caching allocator (PyTorch's) reports through
    the node agent's progress path, per GPU of the pod, every sample interval from ``start`` (file
    key ``from``; after the pod started running) until ``until``. Totals of retries and OOMs grow at
    the given rates from ``start``."""

    reserved_gib: float
    allocated_gib: float
    retries_per_min: float = 0.0
    ooms_per_min: float = 0.0
    start: float = Field(default=0.0, alias="from")
    until: float | None = None

    _gib = field_validator("reserved_gib", "allocated_gib", mode="before")(
        lambda v: number(v, 0.0, 2**20))  # the agent's bound: 1 PiB
    _rates = field_validator("retries_per_min", "ooms_per_min", mode="before")(lambda v: number(v, 0.0))
    _start = field_validator("start", mode="before")(lambda v: duration_s(v))
    _until = field_validator("until", mode="before")(lambda v: optional_duration(v))

    @model_validator(mode="after")
    def _consistent(self) -> AllocatorSpec:
        if self.allocated_gib > self.reserved_gib:
            raise field_error(f"must be <= {self.reserved_gib:g} (reserved_gib), got {self.allocated_gib:g}",
                              ".allocated_gib")
        if self.until is not None and self.until <= self.start:
            raise field_error("must be after from", ".until")
        return self


@dataclass(frozen=True, config=_FORMAT)
class PodSpec:
    name: str
    namespace: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: int = 1
    node: str | None = None
    create: float = 0.0
    run_for: float | None = None
    delete: float | None = None
    end: str = "Succeeded"
    util: Steps = ((0.0, 0.0),)
    memory_gib: Steps = ((0.0, 0.0),)
    processes: int = 1
    gang: str | None = None
    crashloop: bool = False
    steps_per_s: float | None = None
    image: str = "nvcr.io/nvidia/pytorch:24.05-py3"
    resource: str | None = None
    """Extension: the GPU resource name requested (default ``nvidia.com/gpu``)."""
    owner: tuple[str, str] | None = None
    """Extension: the controller that owns the pod, ``(kind, name)``, e.g. ``("PyTorchJob", "train")``."""
    active_gpus: int | None = None
    """Extension: only the pod's first ``active_gpus`` devices run its processes; the rest stay allocated
    with nothing on them (None: all of them)."""
    workload: str | None = None
    """Extension: the Kueue workload (same namespace) this pod belongs to; ``create`` then counts from
    the workload's admission, and a workload never admitted never creates it."""
    allocator: AllocatorSpec | None = None
    """Extension: allocator statistics the pod reports (docs/scenarios.md)."""
    vram_request_gib: float | None = None
    """Extension: the pod's device memory need per GPU (annotation ``gpulens.io/vram-request``); on a
    shared GPU it is placed only where that much is free, as HAMi's scheduler does."""
    claim: str | None = None
    """Extension: the entry of ``claims`` (same namespace) the pod's GPUs come through (DRA); the pod
    then requests no extended resource and its ``gpus`` is the claim's ``count``."""

    _names = field_validator("name", "namespace", mode="before")(lambda v: k8s_name(v))
    _labels = field_validator("labels", mode="before")(lambda v: labels(v))
    _whole = field_validator("gpus", "processes", mode="before")(lambda v: whole(v))
    _texts = field_validator("node", "gang", mode="before")(lambda v: optional_text(v))
    _create = field_validator("create", mode="before")(lambda v: duration_s(v))
    _durations = field_validator("run_for", "delete", mode="before")(lambda v: optional_duration(v))
    _end = field_validator("end", mode="before")(lambda v: end_reason(v))
    _util = field_validator("util", mode="before")(lambda v: steps(v, 0.0, 100.0))
    _memory = field_validator("memory_gib", mode="before")(lambda v: steps(v, 0.0, None))
    _crashloop = field_validator("crashloop", mode="before")(lambda v: flag(v))
    _rate = field_validator("steps_per_s", mode="before")(lambda v: None if v is None else number(v, 0.0))
    _image = field_validator("image", mode="before")(lambda v: text(v))
    _resource = field_validator("resource", mode="before")(lambda v: optional_resource(v))
    _owner = field_validator("owner", mode="before")(lambda v: owner(v))
    _active = field_validator("active_gpus", mode="before")(lambda v: None if v is None else whole(v))
    _workload = field_validator("workload", mode="before")(lambda v: None if v is None else k8s_name(v))
    _vram = field_validator("vram_request_gib", mode="before")(lambda v: None if v is None else number(v, 0.0))
    _claim = field_validator("claim", mode="before")(lambda v: None if v is None else k8s_name(v))

    @model_validator(mode="after")
    def _active_within_gpus(self) -> PodSpec:
        if self.active_gpus is not None and self.active_gpus > self.gpus:
            raise field_error(f"must be <= gpus ({self.gpus}), got {self.active_gpus}", ".active_gpus")
        return self


@dataclass(frozen=True, config=_FORMAT)
class ClaimSpec:
    """Extension: a ResourceClaim (``resource.k8s.io/v1``) asking ``count`` devices of
    ``device_class``; with ``template`` a ResourceClaimTemplate instead, from which every pod naming
    it gets a claim of its own. A claim (not a template) that several pods name is shared: allocated
    once, on the node of the first pod scheduled, its devices used by all of them."""

    name: str
    namespace: str = "default"
    device_class: str = "gpu.nvidia.com"
    """``gpu.nvidia.com`` (whole GPUs) or ``mig.nvidia.com`` (MIG devices of ``profile``)."""
    profile: str | None = None
    count: int = 1
    template: bool = False
    memory_gib: float | None = None
    """Consumable capacity: the memory the claim takes of each device, which other claims may share
    (only ``dra_shared`` nodes' devices); None: whole devices."""

    _names = field_validator("name", "namespace", mode="before")(lambda v: k8s_name(v))
    _class = field_validator("device_class", mode="before")(lambda v: device_class(v))
    _profile = field_validator("profile", mode="before")(lambda v: mig_profile(v))
    _count = field_validator("count", mode="before")(lambda v: whole(v, 1))
    _template = field_validator("template", mode="before")(lambda v: flag(v))
    _memory = field_validator("memory_gib", mode="before")(
        lambda v: None if v is None else number(v, 1 / 1024, 2**20))

    @model_validator(mode="after")
    def _profile_for_mig(self) -> ClaimSpec:
        if self.device_class == "mig.nvidia.com" and self.profile is None:
            raise field_error("mig.nvidia.com needs a profile like 1g.10gb", ".profile")
        if self.device_class != "mig.nvidia.com" and self.profile is not None:
            raise field_error(f"only with device_class: mig.nvidia.com, not {self.device_class}", ".profile")
        if self.memory_gib is not None and self.profile is not None:
            raise field_error("a share of a whole GPU: not with a MIG profile", ".memory_gib")
        return self

    @property
    def resource(self) -> str:
        """The extended-resource name the claimed devices count as."""
        return f"nvidia.com/mig-{self.profile}" if self.profile else "nvidia.com/gpu"


@dataclass(frozen=True, config=_FORMAT)
class PodSetSpec:
    """One pod set of a queued workload: ``count`` pods of ``gpus`` units of ``resource`` each."""

    name: str = "main"
    count: int = 1
    gpus: int = 1
    resource: str = "nvidia.com/gpu"

    _name = field_validator("name", mode="before")(lambda v: k8s_name(v))
    _counts = field_validator("count", "gpus", mode="before")(lambda v: whole(v, 1))
    _resource = field_validator("resource", mode="before")(lambda v: resource(v))


@dataclass(frozen=True, config=_FORMAT)
class WorkloadSpec:
    """Extension: a Kueue Workload (``kueue.x-k8s.io/v1beta1``) from ``create`` until ``delete``."""

    name: str
    namespace: str = "default"
    queue: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    pod_sets: tuple[PodSetSpec, ...] = (PodSetSpec(),)
    create: float = 0.0
    admit: float | None = None
    """QuotaReserved and Admitted at this offset (None: it stays queued)."""
    delete: float | None = None
    reason: str | None = None
    """Why it waits (the QuotaReserved=False message); default: Kueue's insufficient-quota text."""

    _names = field_validator("name", "namespace", "queue", mode="before")(lambda v: k8s_name(v))
    _labels = field_validator("labels", mode="before")(lambda v: labels(v))
    _sets = _list_field("pod_sets")
    _create = field_validator("create", mode="before")(lambda v: duration_s(v))
    _durations = field_validator("admit", "delete", mode="before")(lambda v: optional_duration(v))
    _reason = field_validator("reason", mode="before")(lambda v: optional_text(v))

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        if not self.pod_sets:
            raise field_error("at least one pod set", ".pod_sets")
        if len({s.name for s in self.pod_sets}) != len(self.pod_sets):
            raise field_error("pod set names must be unique", ".pod_sets")
        if self.admit is not None and self.admit < self.create:
            raise field_error("must not be before create", ".admit")
        return self

    @property
    def gpus(self) -> int:
        return sum(s.count * s.gpus for s in self.pod_sets)


@dataclass(frozen=True, config=_FORMAT)
class FaultSpec:
    node: str = Field(default=None, validate_default=True)
    """Required; a missing node says what a node name is."""
    gpu: int = 0
    at: float = 0.0
    xid: int | None = None
    lost: bool = False
    until: float | None = None

    _node = field_validator("node", mode="before")(lambda v: text(v))
    _gpu = field_validator("gpu", mode="before")(lambda v: whole(v))
    _at = field_validator("at", mode="before")(lambda v: duration_s(v))
    _xid = field_validator("xid", mode="before")(lambda v: None if v is None else whole(v, 1))
    _lost = field_validator("lost", mode="before")(lambda v: flag(v))
    _until = field_validator("until", mode="before")(lambda v: optional_duration(v))

    @model_validator(mode="after")
    def _what(self) -> FaultSpec:
        if self.xid is None and not self.lost:
            raise field_error("give xid: <number> or lost: true")
        return self


@dataclass(frozen=True, config=_FORMAT)
class GapSpec:
    """A silent agent from ``start`` to ``end`` (file keys ``from`` and ``to``; all required)."""

    node: str = Field(default=None, validate_default=True)
    start: float = Field(default=None, alias="from", validate_default=True)
    end: float = Field(default=None, alias="to", validate_default=True)

    _node = field_validator("node", mode="before")(lambda v: text(v))
    _span = field_validator("start", "end", mode="before")(lambda v: duration_s(v))

    @model_validator(mode="after")
    def _ordered(self) -> GapSpec:
        if self.end <= self.start:
            raise field_error("must be after from", ".to")
        return self


@dataclass(frozen=True, config=_FORMAT)
class LateSpec:
    """A node's samples from ``at`` on delivered ``by`` seconds late (all required)."""

    node: str = Field(default=None, validate_default=True)
    at: float = Field(default=None, validate_default=True)
    by: float = Field(default=None, validate_default=True)

    _node = field_validator("node", mode="before")(lambda v: text(v))
    _at = field_validator("at", mode="before")(lambda v: duration_s(v))
    _by = field_validator("by", mode="before")(lambda v: duration_s(v, allow_zero=False))


@dataclass(frozen=True, config=_FORMAT)
class PoisonSpec:
    """A record written as-is to an input topic at ``at`` (``topic`` required)."""

    at: float = 0.0
    topic: str = Field(default=None, validate_default=True)
    value: str | None = None
    key: str | None = None

    _at = field_validator("at", mode="before")(lambda v: duration_s(v))
    _written = field_validator("value", "key", mode="before")(lambda v: None if v is None else str(v))

    @field_validator("topic", mode="before")
    @classmethod
    def _topic(cls, value: object) -> str:
        topic = text(value)
        suffixes = [t.suffix for t in INPUT_TOPICS]
        if topic not in suffixes:
            raise field_error(f"expected one of {', '.join(suffixes)}, got {topic!r}")
        return topic


@dataclass(frozen=True, config=_FORMAT, kw_only=True)
class Scenario:
    name: str = Field(default=None, validate_default=True)
    """Empty when the file names none (:func:`parse_scenario` then gives the file's name)."""
    description: str | None = None
    start: datetime = Field(default=DEFAULT_START, validate_default=True)
    duration: float
    """Seconds (:attr:`duration_s`); required."""
    sample_interval: float = Field(default="10s", validate_default=True)
    window: float = Field(default="1m", validate_default=True)
    thresholds: Thresholds = Field(default_factory=Thresholds)
    prices: dict[str, float] = Field(default_factory=dict)
    nodes: tuple[NodeSpec, ...] = ()
    pods: tuple[PodSpec, ...] = ()
    workloads: tuple[WorkloadSpec, ...] = ()
    claims: tuple[ClaimSpec, ...] = ()
    dra_extended_resources: bool = False
    """Extension: the gpu.nvidia.com DeviceClass declares ``extendedResourceName: nvidia.com/gpu``, so
    DRA nodes serve pods that ask ``nvidia.com/gpu`` in their containers (DRAExtendedResource)."""
    faults: tuple[FaultSpec, ...] = ()
    agent_gaps: tuple[GapSpec, ...] = ()
    late_samples: tuple[LateSpec, ...] = ()
    poison: tuple[PoisonSpec, ...] = ()
    cluster: str = DEFAULT_CLUSTER
    """The cluster every message of the scenario carries (``GPULENS_CLUSTER`` of its agents and watcher)."""

    _name = field_validator("name", mode="before")(lambda v: str(v) if v else "")
    _description = field_validator("description", mode="before")(lambda v: None if v is None else str(v))
    _start = field_validator("start", mode="before")(lambda v: start_time(v))
    _duration = field_validator("duration", mode="before")(lambda v: duration_s(v, allow_zero=False))
    _intervals = field_validator("sample_interval", "window", mode="before")(lambda v: duration_s(v, allow_zero=False))
    _lists = _list_field("nodes", "pods", "workloads", "claims", "faults", "agent_gaps", "late_samples", "poison")
    _cluster = field_validator("cluster", mode="before")(lambda v: cluster_name(v))
    _extended = field_validator("dra_extended_resources", mode="before")(lambda v: flag(v))

    @field_validator("thresholds", mode="before")
    @classmethod
    def _thresholds(cls, value: object) -> object:
        """Each value as the file spells it (a duration, or a number); the settings' model checks
        the names and the bounds."""
        if isinstance(value, Thresholds):
            return value
        written = {}
        for key, item in mapping(value).items():
            name = Thresholds.name_of(str(key))
            try:
                if name is None:
                    written[key] = item  # the model names it unknown
                else:
                    written[key] = duration_s(item) if name in Thresholds.durations() else number(item, low=None)
            except PydanticCustomError as exc:
                raise field_error(str(exc), f".{key}") from None
        return written

    @field_validator("prices", mode="before")
    @classmethod
    def _prices(cls, value: object) -> dict[str, float]:
        return {str(model): number(price, 0.0, sub=f".{model}") for model, price in mapping(value).items()}

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        _check_references(self)
        return self

    @property
    def duration_s(self) -> float:
        return self.duration

    @property
    def sample_interval_s(self) -> float:
        return self.sample_interval

    @property
    def window_s(self) -> float:
        return self.window

    @property
    def ticks(self) -> int:
        """Ticks at t = 0, dt, 2dt, ... while t < duration."""
        return max(0, math.ceil(self.duration / self.sample_interval - 1e-9))

    @property
    def end_offset_s(self) -> float:
        """End of the simulated time: the last tick's interval closes it."""
        return self.ticks * self.sample_interval

    def node(self, name: str) -> NodeSpec | None:
        return next((n for n in self.nodes if n.name == name), None)

    def claim(self, pod: PodSpec) -> ClaimSpec | None:
        """The entry of ``claims`` a pod names (None: it requests extended resources)."""
        return next((c for c in self.claims if c.namespace == pod.namespace and c.name == pod.claim), None)


_SCENARIO = TypeAdapter(Scenario)


def _unique(keys: list[str], path: str, what: str) -> None:
    """The first repeated key of ``keys`` is an error at ``path.format(index)``."""
    seen: set[str] = set()
    for index, key in enumerate(keys):
        if key in seen:
            raise field_error(f"duplicate {what} {key}", path.format(index))
        seen.add(key)


def _check_references(scenario: Scenario) -> None:
    """What one object of the file says about another: names unique, nodes and workloads exist."""
    _unique([repr(n.name) for n in scenario.nodes], "nodes[{}].name", "node name")
    _unique([f"{p.namespace}/{p.name}" for p in scenario.pods], "pods[{}].name", "pod")
    _unique([f"{w.namespace}/{w.name}" for w in scenario.workloads], "workloads[{}].name", "workload")
    _unique([f"{c.namespace}/{c.name}" for c in scenario.claims], "claims[{}].name", "claim")
    workloads = {(w.namespace, w.name) for w in scenario.workloads}
    for i, pod in enumerate(scenario.pods):
        if pod.workload is not None and (pod.namespace, pod.workload) not in workloads:
            raise field_error(f"no workload {pod.namespace}/{pod.workload} in workloads", f"pods[{i}].workload")
        if pod.claim is not None:
            _check_claim(scenario, i, pod)
    by_name = {n.name: n for n in scenario.nodes}
    for i, fault in enumerate(scenario.faults):
        spec = by_name.get(fault.node)
        if spec is None:
            raise field_error(f"unknown node {fault.node!r}", f"faults[{i}].node")
        if fault.gpu >= spec.gpus:
            raise field_error(f"node {fault.node} has GPUs 0..{spec.gpus - 1}, got {fault.gpu}", f"faults[{i}].gpu")
    named = [(f"agent_gaps[{i}]", gap.node) for i, gap in enumerate(scenario.agent_gaps)]
    named += [(f"late_samples[{i}]", late.node) for i, late in enumerate(scenario.late_samples)]
    for where, node in named:
        if node not in by_name:
            raise field_error(f"unknown node {node!r}", f"{where}.node")


def _check_claim(scenario: Scenario, index: int, pod: PodSpec) -> None:
    """A pod's claim exists in its namespace and says what the pod gets: no extended resource of
    its own, and ``gpus`` left out or equal to the claim's count."""
    claim = scenario.claim(pod)
    if claim is None:
        raise field_error(f"no claim {pod.namespace}/{pod.claim} in claims", f"pods[{index}].claim")
    if pod.resource is not None:
        raise field_error(f"a pod with a claim requests no extended resource (claim {claim.name} asks "
                          f"{claim.device_class})", f"pods[{index}].resource")
    if pod.gpus not in (1, claim.count):
        raise field_error(f"a pod with claim {claim.name} gets its {claim.count} device(s): leave gpus out or "
                          f"write {claim.count}, got {pod.gpus}", f"pods[{index}].gpus")


# --------------------------------------------------------------------------- parsing


def parse_duration(value: object, path: str, allow_zero: bool = True) -> float:
    """``90s``, ``10m``, ``1.5h``, ``2d``, ``500ms`` or a bare number of seconds (also for CLI flags,
    ``path`` naming the flag)."""
    try:
        return duration_s(value, allow_zero)
    except PydanticCustomError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def step_value(steps: Steps, offset_s: float) -> float:
    """The value in force ``offset_s`` after the running start (0 before the first step)."""
    current = 0.0
    for at, value in steps:
        if at <= offset_s + 1e-9:
            current = value
        else:
            break
    return current


def parse_scenario(data: object, source: str = "", default_name: str = "scenario") -> Scenario:
    """Validate a loaded YAML document; raises :class:`ScenarioError` naming the field (after
    ``source``, where the document came from, when given)."""
    prefix = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ScenarioError(f"{prefix}the file must be a YAML mapping with nodes and pods")
    try:
        scenario = _SCENARIO.validate_python(data)
    except ValidationError as exc:
        raise ScenarioError(prefix + error_text(exc, Scenario)) from None
    return scenario if scenario.name else dataclasses.replace(scenario, name=default_name)


def load_scenario(path: Path | str) -> Scenario:
    """Read and validate a scenario file; raises :class:`ScenarioError` with ``FILE: field: reason``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{path}: not valid YAML{where}: {problem}") from None
    return parse_scenario(data, str(path), default_name=path.stem)
