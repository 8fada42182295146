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
from simulation.scenario import NodeSpec, PodSpec, WorkloadSpec


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

    @property
    def resource(self) -> str:
        return self.spec.resource or "nvidia.com/gpu"


@dataclass
class SimWorkload:
    spec: WorkloadSpec
    uid: str
    job_uid: str
    """The suspended batch Job that owns the workload (and, once admitted, its pods)."""
    phase: str = "new"  # new | queued | admitted | deleted
