"""Scenario files (``docs/FORMAT.md``, ``docs/scenarios.md``): parse and validate.

A scenario is a contract users write against, so parsing is strict and every error names the
field (``pods[2].util: ...``); the CLI prints it as one line and exits 2. Durations are
``<number><s|m|h|d>`` (``90s``, ``1.5h``) or a bare number of seconds. Unknown keys are errors
(a typo must not silently change a what-if analysis).

Besides FORMAT.md's fields, optional extensions exercise what the format cannot express:
``nodes[].mig`` (MIG mode), ``nodes[].time_slicing`` (shared GPUs), ``nodes[].process_stats``,
``nodes[].unschedulable``, ``pods[].resource``, and the top-level ``faults`` (XIDs, lost GPUs),
``agent_gaps`` (silent agents), ``late_samples`` (delayed delivery) and ``poison`` (bad records).
``workloads`` are Kueue Workloads: demand a queue holds before any pod exists; ``pods[].workload``
makes a pod one of a workload's pods, created only once the workload is admitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from common.errors import UserError
from schemas.messages import DEFAULT_CLUSTER
from simulation.mig_layouts import MAX_INSTANCES_PER_GPU, GpuLayout, MigRelayout
from simulation.scenario_file import (
    DEFAULT_MODEL,
    MIG_PROFILE,
    NodeFile,
    PodFile,
    ScenarioFile,
    Steps,
    WorkloadFile,
    duration_s,
    error_text,
)
from stream_jobs.config import Thresholds


class ScenarioError(UserError):
    """An invalid scenario file; the message names the field."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: int = 8
    model: str = DEFAULT_MODEL
    memory_gib: float = 80.0
    driver: str = "550.54.15"
    cuda: str = "12.4"
    labels: dict[str, str] = field(default_factory=dict)
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
    mig_relayout: tuple[MigRelayout, ...] = ()
    """Extension: changes of one GPU's MIG layout at a time."""

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


@dataclass(frozen=True)
class AllocatorSpec:
    """Extension: what the pod's caching allocator (PyTorch's) reports through the node agent's
    progress path, per GPU of the pod, every sample interval from ``start`` (after the pod started
    running) until ``until``. Totals of retries and OOMs grow at the given rates from ``start``."""

    reserved_gib: float
    allocated_gib: float
    retries_per_min: float = 0.0
    ooms_per_min: float = 0.0
    start: float = 0.0
    until: float | None = None


@dataclass(frozen=True)
class PodSpec:
    index: int
    name: str
    namespace: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
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


@dataclass(frozen=True)
class PodSetSpec:
    """One pod set of a queued workload: ``count`` pods of ``gpus`` units of ``resource`` each."""

    name: str = "main"
    count: int = 1
    gpus: int = 1
    resource: str = "nvidia.com/gpu"


@dataclass(frozen=True)
class WorkloadSpec:
    """Extension: a Kueue Workload (``kueue.x-k8s.io/v1beta1``) from ``create`` until ``delete``."""

    index: int
    name: str
    namespace: str = "default"
    queue: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    pod_sets: tuple[PodSetSpec, ...] = (PodSetSpec(),)
    create: float = 0.0
    admit: float | None = None
    """QuotaReserved and Admitted at this offset (None: it stays queued)."""
    delete: float | None = None
    reason: str | None = None
    """Why it waits (the QuotaReserved=False message); default: Kueue's insufficient-quota text."""

    @property
    def gpus(self) -> int:
        return sum(s.count * s.gpus for s in self.pod_sets)


@dataclass(frozen=True)
class FaultSpec:
    node: str
    gpu: int
    at: float
    xid: int | None = None
    lost: bool = False
    until: float | None = None


@dataclass(frozen=True)
class GapSpec:
    node: str
    start: float
    end: float


@dataclass(frozen=True)
class LateSpec:
    node: str
    at: float
    by: float


@dataclass(frozen=True)
class PoisonSpec:
    at: float
    topic: str
    value: str | None
    key: str | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    start: datetime
    duration_s: float
    sample_interval_s: float = 10.0
    window_s: float = 60.0
    thresholds: Thresholds = field(default_factory=Thresholds)
    prices: dict[str, float] = field(default_factory=dict)
    nodes: tuple[NodeSpec, ...] = ()
    pods: tuple[PodSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    agent_gaps: tuple[GapSpec, ...] = ()
    late_samples: tuple[LateSpec, ...] = ()
    poison: tuple[PoisonSpec, ...] = ()
    workloads: tuple[WorkloadSpec, ...] = ()
    source: str = ""
    cluster: str = DEFAULT_CLUSTER
    """The cluster every message of the scenario carries (``GPULENS_CLUSTER`` of its agents and watcher)."""

    @property
    def ticks(self) -> int:
        """Ticks at t = 0, dt, 2dt, ... while t < duration."""
        return max(0, math.ceil(self.duration_s / self.sample_interval_s - 1e-9))

    @property
    def end_offset_s(self) -> float:
        """End of the simulated time: the last tick's interval closes it."""
        return self.ticks * self.sample_interval_s

    def node(self, name: str) -> NodeSpec | None:
        return next((n for n in self.nodes if n.name == name), None)


# --------------------------------------------------------------------------- parsing


def parse_duration(value: Any, path: str, allow_zero: bool = True) -> float:
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


def _node(raw: NodeFile) -> NodeSpec:
    layouts, changes = raw.layouts()
    return NodeSpec(name=raw.name, gpus=raw.gpus, model=raw.model, memory_gib=raw.memory_gib, driver=raw.driver,
                    cuda=raw.cuda, labels=raw.labels or {}, ready_until=raw.ready_until,
                    unschedulable=raw.unschedulable, mig=raw.mig, time_slicing=raw.time_slicing,
                    process_stats=raw.process_stats, mig_layout=layouts, mig_relayout=changes)


def _pod(raw: PodFile, index: int) -> PodSpec:
    return PodSpec(index=index, name=raw.name, namespace=raw.namespace, labels=raw.labels or {}, gpus=raw.gpus,
                   node=raw.node, create=raw.create, run_for=raw.run_for, delete=raw.delete, end=raw.end,
                   util=raw.util, memory_gib=raw.memory_gib, processes=raw.processes, gang=raw.gang,
                   crashloop=raw.crashloop, steps_per_s=raw.steps_per_s, image=raw.image, resource=raw.resource,
                   owner=raw.owner, active_gpus=raw.active_gpus, workload=raw.workload,
                   allocator=None if raw.allocator is None else AllocatorSpec(
                       raw.allocator.reserved_gib, raw.allocator.allocated_gib, raw.allocator.retries_per_min,
                       raw.allocator.ooms_per_min, raw.allocator.start, raw.allocator.until),
                   vram_request_gib=raw.vram_request_gib)


def _workload(raw: WorkloadFile, index: int) -> WorkloadSpec:
    return WorkloadSpec(index=index, name=raw.name, namespace=raw.namespace, queue=raw.queue,
                        labels=raw.labels or {},
                        pod_sets=tuple(PodSetSpec(s.name, s.count, s.gpus, s.resource) for s in raw.pod_sets),
                        create=raw.create, admit=raw.admit, delete=raw.delete, reason=raw.reason)


def _unique(keys: list[str], path: str, what: str) -> None:
    """The first repeated key of ``keys`` is an error at ``path.format(index)``."""
    seen: set[str] = set()
    for index, key in enumerate(keys):
        if key in seen:
            raise ScenarioError(f"{path.format(index)}: duplicate {what} {key}")
        seen.add(key)


def _check_references(scenario: ScenarioFile, nodes: tuple[NodeSpec, ...]) -> None:
    """What one object of the file says about another: names unique, nodes and workloads exist."""
    _unique([repr(n.name) for n in nodes], "nodes[{}].name", "node name")
    _unique([f"{p.namespace}/{p.name}" for p in scenario.pods], "pods[{}].name", "pod")
    _unique([f"{w.namespace}/{w.name}" for w in scenario.workloads], "workloads[{}].name", "workload")
    workloads = {(w.namespace, w.name) for w in scenario.workloads}
    for i, pod in enumerate(scenario.pods):
        if pod.workload is not None and (pod.namespace, pod.workload) not in workloads:
            raise ScenarioError(f"pods[{i}].workload: no workload {pod.namespace}/{pod.workload} in workloads")
    by_name = {n.name: n for n in nodes}
    for i, fault in enumerate(scenario.faults):
        spec = by_name.get(fault.node)
        if spec is None:
            raise ScenarioError(f"faults[{i}].node: unknown node {fault.node!r}")
        if fault.gpu >= spec.gpus:
            raise ScenarioError(f"faults[{i}].gpu: node {fault.node} has GPUs 0..{spec.gpus - 1}, got {fault.gpu}")
    named = [(f"agent_gaps[{i}]", gap.node) for i, gap in enumerate(scenario.agent_gaps)]
    named += [(f"late_samples[{i}]", late.node) for i, late in enumerate(scenario.late_samples)]
    for where, node in named:
        if node not in by_name:
            raise ScenarioError(f"{where}.node: unknown node {node!r}")


def parse_scenario(data: Any, source: str = "", default_name: str = "scenario") -> Scenario:
    """Validate a loaded YAML document; raises :class:`ScenarioError` naming the field."""
    if not isinstance(data, dict):
        raise ScenarioError("the file must be a YAML mapping with nodes and pods")
    try:
        parsed = ScenarioFile.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(error_text(exc)) from None
    nodes = tuple(_node(raw) for raw in parsed.nodes)
    _check_references(parsed, nodes)
    return Scenario(
        name=str(parsed.name or default_name),
        start=parsed.start,
        duration_s=parsed.duration,
        sample_interval_s=parsed.sample_interval,
        window_s=parsed.window,
        thresholds=parsed.thresholds,
        prices=parsed.prices,
        nodes=nodes,
        pods=tuple(_pod(raw, i) for i, raw in enumerate(parsed.pods)),
        faults=tuple(FaultSpec(f.node, f.gpu, f.at, f.xid, f.lost, f.until) for f in parsed.faults),
        agent_gaps=tuple(GapSpec(g.node, g.start, g.end) for g in parsed.agent_gaps),
        late_samples=tuple(LateSpec(item.node, item.at, item.by) for item in parsed.late_samples),
        poison=tuple(PoisonSpec(p.at, p.topic, None if p.value is None else str(p.value),
                                None if p.key is None else str(p.key)) for p in parsed.poison),
        workloads=tuple(_workload(raw, i) for i, raw in enumerate(parsed.workloads)),
        source=source,
        cluster=parsed.cluster,
    )


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
    try:
        return parse_scenario(data, str(path), default_name=path.stem)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
