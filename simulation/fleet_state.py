"""What the fleet simulator keeps per node, pod and Kueue workload while it plays a scenario, and
the records and ticks it emits (:mod:`simulation.simulator` advances them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from producers.agent.fake_kubelet import StaticPodResources
from producers.agent.fake_nvml import FakeGpu, FakeNvml
from producers.agent.sampler import NodeSampler
from schemas.messages import PodState
from simulation.scenario import ClaimSpec, NodeSpec, PodSpec, WorkloadSpec


@dataclass
class SimulatedRecord:
    """One Kafka record as a producer would send it (``value`` None = tombstone)."""

    topic: str
    key: str | None
    value: bytes | None


@dataclass
class Tick:
    offset_s: float
    ts: datetime
    records: list[SimulatedRecord]


@dataclass
class SimNode:
    spec: NodeSpec
    uid: str
    nvml: FakeNvml
    gpus: list[FakeGpu]
    resources: StaticPodResources
    sampler: NodeSampler
    slots: list[int | None]
    """Schedulable unit -> index of the pod holding it."""
    removed: bool = False
    state: Any = None
    slot_res: list[str | None] | None = None
    """A ``mig_layout`` node: the resource of each slot (None: no instance there)."""
    slice_uid: str | None = None
    """A DRA node (``dra: true``): the uid of the ResourceSlice its driver publishes."""
    slice_generation: int = 1
    """The pool generation of that slice (a MIG re-layout publishes a new one)."""
    shares: dict[int, list[SimClaim]] = field(default_factory=dict)
    """A ``dra_shared`` node: the claims holding a share of each unit (consumable capacity)."""


@dataclass
class SimPod:
    spec: PodSpec
    index: int
    """The pod's place in the scenario's ``pods``."""
    uid: str
    container_id: str
    phase: str = "new"  # new | pending | running | ended
    created: float | None = None
    scheduled: float | None = None
    node: str | None = None
    slots: list[int] = field(default_factory=list)
    end_reason: str | None = None
    ended: float | None = None
    deleted: bool = False
    restarts: int = 0
    last_message: str | None = None
    event_count: int = 0
    state: PodState | None = None
    claim: SimClaim | None = None
    """The ResourceClaim the pod's GPUs come through (DRA); None: extended-resource requests."""

    @property
    def resource(self) -> str:
        if self.claim is not None:
            return self.claim.spec.resource
        return self.spec.resource or "nvidia.com/gpu"

    @property
    def devices(self) -> int:
        """How many GPU units the pod holds: its claim's count, or its ``gpus``."""
        return self.claim.spec.count if self.claim is not None else self.spec.gpus


@dataclass
class SimClaim:
    """A ResourceClaim: a user's (``claims[]``, possibly shared) or one made from a template for one pod."""

    spec: ClaimSpec
    name: str
    uid: str
    created: float | None = None
    """Offset of its creation (a user's claim exists from t = 0; a template's with its pod); None: not yet."""
    for_pod: SimPod | None = None
    """A template's claim: the pod it was made for (its owner)."""
    extended: bool = False
    """The claim the scheduler made for the pod's extended-resource request (DRAExtendedResource)."""
    node: str | None = None
    """Where it is allocated (None: not allocated)."""
    slots: list[int] = field(default_factory=list)
    """The node's units it holds, lowest-indexed first."""
    reserved: list[int] = field(default_factory=list)
    """Indices of the pods using it, in the order the scheduler reserved it for them (``status.reservedFor``)."""
    deleted: bool = False


@dataclass
class SimWorkload:
    spec: WorkloadSpec
    uid: str
    job_uid: str
    """The suspended batch Job that owns the workload (and, once admitted, its pods)."""
    phase: str = "new"  # new | queued | admitted | deleted
