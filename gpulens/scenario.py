"""Scenario files (``docs/FORMAT.md``, ``docs/scenarios.md``): parse and validate.

A scenario is a contract users write against, so parsing is strict and every error names the
field (``pods[2].util: ...``); the CLI prints it as one line and exits 2. Durations are
``<number><s|m|h|d>`` (``90s``, ``1.5h``) or a bare number of seconds. Unknown keys are errors
(a typo must not silently change a what-if analysis).

Besides FORMAT.md's fields, optional extensions exercise what the format cannot express:
``nodes[].mig`` (MIG mode), ``nodes[].mig_layout`` / ``mig_relayout`` (per-GPU MIG layouts),
``nodes[].time_slicing`` (shared GPUs), ``nodes[].process_stats``,
``nodes[].unschedulable``, ``pods[].resource``, and the top-level ``faults`` (XIDs, lost GPUs),
``agent_gaps`` (silent agents), ``late_samples`` (delayed delivery) and ``poison`` (bad records).
``workloads`` are Kueue Workloads: demand a queue holds before any pod exists; ``pods[].workload``
makes a pod one of a workload's pods, created only once the workload is admitted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import yaml

from gpulens.errors import UserError
from gpulens.mig_layouts import MAX_INSTANCES_PER_GPU, GpuLayout, MigLayoutError, MigRelayout, parse_node_layouts
from schemas.messages import CLUSTER_NAME_PATTERN, DEFAULT_CLUSTER
from stream_jobs.config import Thresholds

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_START = "2026-01-01T00:00:00Z"
END_REASONS = ("Succeeded", "Failed", "OOMKilled", "Evicted")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class ScenarioError(UserError):
    """An invalid scenario file; the message names the field."""


Steps = tuple[tuple[float, float], ...]
"""``((offset_s, value), ...)`` sorted by offset; a constant is ``((0, value),)``."""


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
    """Extension: every GPU in MIG mode with its own instances (``gpulens.mig_layouts``)."""
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
        match = _MIG_PROFILE.match(self.mig)
        assert match is not None
        return max(1, 7 // int(match.group(1)))

    @property
    def units(self) -> int:
        """Schedulable units of :attr:`resource`."""
        return self.gpus * (self.mig_per_gpu if self.mig or self.mig_layout is not None else self.time_slicing)


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


# --------------------------------------------------------------------------- field parsers


def _fail(path: str, message: str) -> ScenarioError:
    return ScenarioError(f"{path}: {message}")


def parse_duration(value: Any, path: str, allow_zero: bool = True) -> float:
    """``90s``, ``10m``, ``1.5h``, ``2d``, ``500ms`` or a bare number of seconds."""
    if isinstance(value, bool):
        raise _fail(path, f"expected a duration like 90s, 10m or 1.5h, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise _fail(path, f"expected a duration like 90s, 10m or 1.5h, got {value!r}")
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        raise _fail(path, f"expected a duration like 90s, 10m or 1.5h, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise _fail(path, f"must be a non-negative duration, got {value!r}")
    if not allow_zero and seconds <= 0:
        raise _fail(path, f"must be greater than zero, got {value!r}")
    return seconds


def _number(value: Any, path: str, low: float | None = 0.0, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(path, f"expected a number, got {value!r}")
    if low is not None and value < low:
        raise _fail(path, f"must be >= {low:g}, got {value!r}")
    if high is not None and value > high:
        raise _fail(path, f"must be <= {high:g}, got {value!r}")
    return float(value)


def _int(value: Any, path: str, low: int = 0) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise _fail(path, f"expected a whole number, got {value!r}")
    if value < low:
        raise _fail(path, f"must be >= {low}, got {value!r}")
    return int(value)


def _str(value: Any, path: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
        raise _fail(path, f"expected a non-empty string, got {value!r}")
    return str(value)


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, f"expected true or false, got {value!r}")
    return value


def _k8s_name(value: Any, path: str) -> str:
    text = _str(value, path)
    if len(text) > 253 or not _NAME.match(text):
        raise _fail(path, f"{text!r} is not a valid Kubernetes name (lowercase letters, digits, '-', '.')")
    return text


def _labels(value: Any, path: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, f"expected a mapping of label keys to values, got {value!r}")
    out = {}
    for key, item in value.items():
        if item is None or isinstance(item, dict | list):
            raise _fail(f"{path}.{key}", f"expected a string value, got {item!r}")
        out[str(key)] = str(item).lower() if isinstance(item, bool) else str(item)
    return out


def parse_steps(value: Any, path: str, low: float, high: float | None) -> Steps:
    """A number, or ``[[offset, value], ...]`` with offsets as durations from the running start."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return ((0.0, _number(value, path, low, high)),)
    if not isinstance(value, list) or not value:
        raise _fail(path, f"expected a number or steps like [[0m, 90], [10m, 2]], got {value!r}")
    steps = []
    for i, item in enumerate(value):
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise _fail(f"{path}[{i}]", f"expected [offset, value], got {item!r}")
        steps.append((parse_duration(item[0], f"{path}[{i}][0]"), _number(item[1], f"{path}[{i}][1]", low, high)))
    offsets = [s[0] for s in steps]
    if len(set(offsets)) != len(offsets):
        raise _fail(path, "two steps have the same offset")
    return tuple(sorted(steps))


def step_value(steps: Steps, offset_s: float) -> float:
    """The value in force ``offset_s`` after the running start (0 before the first step)."""
    current = 0.0
    for at, value in steps:
        if at <= offset_s + 1e-9:
            current = value
        else:
            break
    return current


def _check_keys(data: dict[str, Any], allowed: set[str], path: str) -> None:
    for key in data:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise _fail(where, f"unknown field; known fields: {', '.join(sorted(allowed))}")


def _mapping(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, f"expected a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(path, f"expected a list, got {type(value).__name__}")
    return value


_START_HINT = 'expected an ISO 8601 UTC time like "2026-01-05T09:00:00Z"'


def _start(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, str):
        text = value.strip()
        text = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise _fail("start", f"{_START_HINT}, got {value!r}") from None
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    raise _fail("start", f"{_START_HINT}, got {value!r}")


_NODE_KEYS = {"name", "gpus", "model", "memory_gib", "driver", "cuda", "labels", "ready_until", "unschedulable",
              "mig", "time_slicing", "process_stats", "mig_layout", "mig_relayout"}
_POD_KEYS = {"name", "namespace", "labels", "gpus", "node", "create", "run_for", "delete", "end", "util",
             "memory_gib", "processes", "gang", "crashloop", "steps_per_s", "image", "resource", "owner",
             "active_gpus", "workload", "vram_request_gib"}
_TOP_KEYS = {"name", "start", "duration", "sample_interval", "window", "thresholds", "prices", "nodes", "pods",
             "faults", "agent_gaps", "late_samples", "poison", "description", "workloads", "cluster"}
_WORKLOAD_KEYS = {"name", "namespace", "queue", "labels", "pod_sets", "create", "admit", "delete", "reason"}
_POD_SET_KEYS = {"name", "count", "gpus", "resource"}


def _node(raw: Any, path: str) -> NodeSpec:
    data = _mapping(raw, path)
    _check_keys(data, _NODE_KEYS, path)
    if "name" not in data:
        raise _fail(f"{path}.name", "required")
    mig = None
    if data.get("mig") is not None:
        mig = _str(data["mig"], f"{path}.mig")
        if not _MIG_PROFILE.match(mig) or int(mig.split("g")[0]) not in (1, 2, 3, 4, 7):
            raise _fail(f"{path}.mig", f"expected a MIG profile like 1g.10gb or 3g.40gb, got {mig!r}")
    node = NodeSpec(
        name=_k8s_name(data["name"], f"{path}.name"),
        gpus=_int(data.get("gpus", 8), f"{path}.gpus"),
        model=_str(data.get("model", DEFAULT_MODEL), f"{path}.model"),
        memory_gib=_number(data.get("memory_gib", 80), f"{path}.memory_gib", 0.0),
        driver=_str(data.get("driver", "550.54.15"), f"{path}.driver"),
        cuda=_str(data.get("cuda", "12.4"), f"{path}.cuda"),
        labels=_labels(data.get("labels"), f"{path}.labels"),
        ready_until=None if data.get("ready_until") is None
        else parse_duration(data["ready_until"], f"{path}.ready_until"),
        unschedulable=_bool(data.get("unschedulable", False), f"{path}.unschedulable"),
        mig=mig,
        time_slicing=_int(data.get("time_slicing", 1), f"{path}.time_slicing", 1),
        process_stats=_bool(data.get("process_stats", True), f"{path}.process_stats"),
    )
    if node.mig and node.time_slicing > 1:
        raise _fail(f"{path}.time_slicing", "cannot be combined with mig")
    try:
        layouts, changes = parse_node_layouts(data, path, node.gpus, node.model, node.memory_gib)
    except MigLayoutError as exc:
        raise ScenarioError(str(exc)) from None
    if layouts is not None:
        node = replace(node, mig_layout=layouts, mig_relayout=changes)
    return node


def _pod(raw: Any, index: int, path: str) -> PodSpec:
    data = _mapping(raw, path)
    _check_keys(data, _POD_KEYS, path)
    if "name" not in data:
        raise _fail(f"{path}.name", "required")
    end = data.get("end", "Succeeded")
    if end not in END_REASONS:
        raise _fail(f"{path}.end", f"expected one of {', '.join(END_REASONS)}, got {end!r}")
    active_gpus = None if data.get("active_gpus") is None else _int(data["active_gpus"], f"{path}.active_gpus")
    gpus = _int(data.get("gpus", 1), f"{path}.gpus")
    if active_gpus is not None and active_gpus > gpus:
        raise _fail(f"{path}.active_gpus", f"must be <= gpus ({gpus}), got {active_gpus}")
    resource = data.get("resource")
    if resource is not None:
        resource = _str(resource, f"{path}.resource")
        if not (resource == "nvidia.com/gpu" or resource.startswith(("nvidia.com/mig-", "nvidia.com/gpu."))):
            raise _fail(f"{path}.resource", f"expected nvidia.com/gpu or nvidia.com/mig-<profile>, got {resource!r}")
    return PodSpec(
        index=index,
        name=_k8s_name(data["name"], f"{path}.name"),
        namespace=_k8s_name(data.get("namespace", "default"), f"{path}.namespace"),
        labels=_labels(data.get("labels"), f"{path}.labels"),
        gpus=gpus,
        node=None if data.get("node") is None else _str(data["node"], f"{path}.node"),
        create=parse_duration(data.get("create", 0), f"{path}.create"),
        run_for=None if data.get("run_for") is None else parse_duration(data["run_for"], f"{path}.run_for"),
        delete=None if data.get("delete") is None else parse_duration(data["delete"], f"{path}.delete"),
        end=str(end),
        util=parse_steps(data.get("util", 0), f"{path}.util", 0.0, 100.0),
        memory_gib=parse_steps(data.get("memory_gib", 0), f"{path}.memory_gib", 0.0, None),
        processes=_int(data.get("processes", 1), f"{path}.processes"),
        gang=None if data.get("gang") is None else _str(data["gang"], f"{path}.gang"),
        crashloop=_bool(data.get("crashloop", False), f"{path}.crashloop"),
        steps_per_s=None if data.get("steps_per_s") is None
        else _number(data["steps_per_s"], f"{path}.steps_per_s", 0.0),
        image=_str(data.get("image", "nvcr.io/nvidia/pytorch:24.05-py3"), f"{path}.image"),
        resource=resource,
        owner=None if data.get("owner") is None else _owner(data["owner"], f"{path}.owner"),
        active_gpus=active_gpus,
        workload=None if data.get("workload") is None else _k8s_name(data["workload"], f"{path}.workload"),
        vram_request_gib=None if data.get("vram_request_gib") is None
        else _number(data["vram_request_gib"], f"{path}.vram_request_gib", 0.0),
    )


def _resource(value: Any, path: str) -> str:
    resource = _str(value, path)
    if not (resource == "nvidia.com/gpu" or resource.startswith(("nvidia.com/mig-", "nvidia.com/gpu."))):
        raise _fail(path, f"expected nvidia.com/gpu or nvidia.com/mig-<profile>, got {resource!r}")
    return resource


def _pod_set(raw: Any, path: str) -> PodSetSpec:
    data = _mapping(raw, path)
    _check_keys(data, _POD_SET_KEYS, path)
    return PodSetSpec(
        name=_k8s_name(data.get("name", "main"), f"{path}.name"),
        count=_int(data.get("count", 1), f"{path}.count", 1),
        gpus=_int(data.get("gpus", 1), f"{path}.gpus", 1),
        resource=_resource(data.get("resource", "nvidia.com/gpu"), f"{path}.resource"),
    )


def _workload(raw: Any, index: int, path: str) -> WorkloadSpec:
    data = _mapping(raw, path)
    _check_keys(data, _WORKLOAD_KEYS, path)
    if "name" not in data:
        raise _fail(f"{path}.name", "required")
    sets = tuple(_pod_set(item, f"{path}.pod_sets[{i}]")
                 for i, item in enumerate(_list(data.get("pod_sets", [{}]), f"{path}.pod_sets")))
    if not sets:
        raise _fail(f"{path}.pod_sets", "at least one pod set")
    if len({s.name for s in sets}) != len(sets):
        raise _fail(f"{path}.pod_sets", "pod set names must be unique")
    create = parse_duration(data.get("create", 0), f"{path}.create")
    admit = None if data.get("admit") is None else parse_duration(data["admit"], f"{path}.admit")
    if admit is not None and admit < create:
        raise _fail(f"{path}.admit", "must not be before create")
    return WorkloadSpec(
        index=index,
        name=_k8s_name(data["name"], f"{path}.name"),
        namespace=_k8s_name(data.get("namespace", "default"), f"{path}.namespace"),
        queue=_k8s_name(data.get("queue", "default"), f"{path}.queue"),
        labels=_labels(data.get("labels"), f"{path}.labels"),
        pod_sets=sets,
        create=create,
        admit=admit,
        delete=None if data.get("delete") is None else parse_duration(data["delete"], f"{path}.delete"),
        reason=None if data.get("reason") is None else _str(data["reason"], f"{path}.reason"),
    )


OWNER_API_VERSIONS = {
    "Job": "batch/v1", "CronJob": "batch/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1", "JobSet": "jobset.x-k8s.io/v1alpha2", "PyTorchJob": "kubeflow.org/v1",
    "MPIJob": "kubeflow.org/v2beta1", "Notebook": "kubeflow.org/v1", "RayCluster": "ray.io/v1",
}
"""Controller kinds a scenario pod may name as its owner, with the API version of their objects."""


def _owner(value: Any, path: str) -> tuple[str, str]:
    kind, _, name = _str(value, path).partition("/")
    if kind not in OWNER_API_VERSIONS:
        raise _fail(path, f"expected Kind/name with Kind one of {', '.join(sorted(OWNER_API_VERSIONS))}, got {value!r}")
    return kind, _k8s_name(name, path)


def _thresholds(raw: Any) -> Thresholds:
    if raw is None:
        return Thresholds()
    data = _mapping(raw, "thresholds")
    values: dict[str, float] = {}
    known = set(Thresholds.names())
    for key, value in data.items():
        path = f"thresholds.{key}"
        name = key[:-2] if str(key).endswith("_s") and key[:-2] in Thresholds.DURATIONS else key
        if name not in known:
            raise _fail(path, f"unknown threshold; known: {', '.join(sorted(known))}")
        if name in Thresholds.DURATIONS:
            values[name] = parse_duration(value, path)
        elif name in ("idle_util_pct", "vram_pressure_pct"):
            values[name] = _number(value, path, 0.0, 100.0)
        else:
            values[name] = _number(value, path, 0.0)
    return Thresholds().with_overrides(values)


def _prices(raw: Any) -> dict[str, float]:
    if raw is None:
        return {}
    data = _mapping(raw, "prices")
    return {str(model): _number(price, f"prices.{model}", 0.0) for model, price in data.items()}


def parse_scenario(data: Any, source: str = "", default_name: str = "scenario") -> Scenario:
    """Validate a loaded YAML document; raises :class:`ScenarioError` naming the field."""
    if not isinstance(data, dict):
        raise ScenarioError("the file must be a YAML mapping with nodes and pods")
    _check_keys(data, _TOP_KEYS, "")
    if "duration" not in data:
        raise _fail("duration", "required (e.g. duration: 30m)")
    nodes = tuple(_node(raw, f"nodes[{i}]") for i, raw in enumerate(_list(data.get("nodes"), "nodes")))
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        if node.name in seen:
            raise _fail(f"nodes[{i}].name", f"duplicate node name {node.name!r}")
        seen.add(node.name)
    pods = tuple(_pod(raw, i, f"pods[{i}]") for i, raw in enumerate(_list(data.get("pods"), "pods")))
    names: set[tuple[str, str]] = set()
    for pod in pods:
        if (pod.namespace, pod.name) in names:
            raise _fail(f"pods[{pod.index}].name", f"duplicate pod {pod.namespace}/{pod.name}")
        names.add((pod.namespace, pod.name))
    workloads = tuple(_workload(raw, i, f"workloads[{i}]")
                      for i, raw in enumerate(_list(data.get("workloads"), "workloads")))
    workload_names: set[tuple[str, str]] = set()
    for workload in workloads:
        if (workload.namespace, workload.name) in workload_names:
            raise _fail(f"workloads[{workload.index}].name", f"duplicate workload {workload.namespace}/{workload.name}")
        workload_names.add((workload.namespace, workload.name))
    for pod in pods:
        if pod.workload is not None and (pod.namespace, pod.workload) not in workload_names:
            raise _fail(f"pods[{pod.index}].workload", f"no workload {pod.namespace}/{pod.workload} in workloads")
    faults = []
    for i, raw in enumerate(_list(data.get("faults"), "faults")):
        path = f"faults[{i}]"
        item = _mapping(raw, path)
        _check_keys(item, {"node", "gpu", "at", "xid", "lost", "until"}, path)
        node_name = _str(item.get("node"), f"{path}.node")
        spec = next((n for n in nodes if n.name == node_name), None)
        if spec is None:
            raise _fail(f"{path}.node", f"unknown node {node_name!r}")
        gpu = _int(item.get("gpu", 0), f"{path}.gpu")
        if gpu >= spec.gpus:
            raise _fail(f"{path}.gpu", f"node {node_name} has GPUs 0..{spec.gpus - 1}, got {gpu}")
        lost = _bool(item.get("lost", False), f"{path}.lost")
        xid = None if item.get("xid") is None else _int(item["xid"], f"{path}.xid", 1)
        if xid is None and not lost:
            raise _fail(path, "give xid: <number> or lost: true")
        faults.append(FaultSpec(node_name, gpu, parse_duration(item.get("at", 0), f"{path}.at"), xid, lost,
                                None if item.get("until") is None else parse_duration(item["until"], f"{path}.until")))
    gaps = []
    for i, raw in enumerate(_list(data.get("agent_gaps"), "agent_gaps")):
        path = f"agent_gaps[{i}]"
        item = _mapping(raw, path)
        _check_keys(item, {"node", "from", "to"}, path)
        node_name = _str(item.get("node"), f"{path}.node")
        if node_name not in seen:
            raise _fail(f"{path}.node", f"unknown node {node_name!r}")
        start = parse_duration(item.get("from"), f"{path}.from")
        end = parse_duration(item.get("to"), f"{path}.to")
        if end <= start:
            raise _fail(f"{path}.to", "must be after from")
        gaps.append(GapSpec(node_name, start, end))
    late = []
    for i, raw in enumerate(_list(data.get("late_samples"), "late_samples")):
        path = f"late_samples[{i}]"
        item = _mapping(raw, path)
        _check_keys(item, {"node", "at", "by"}, path)
        node_name = _str(item.get("node"), f"{path}.node")
        if node_name not in seen:
            raise _fail(f"{path}.node", f"unknown node {node_name!r}")
        late.append(LateSpec(node_name, parse_duration(item.get("at"), f"{path}.at"),
                             parse_duration(item.get("by"), f"{path}.by", allow_zero=False)))
    poison = []
    for i, raw in enumerate(_list(data.get("poison"), "poison")):
        path = f"poison[{i}]"
        item = _mapping(raw, path)
        _check_keys(item, {"at", "topic", "value", "key"}, path)
        topic = _str(item.get("topic"), f"{path}.topic")
        from stream_jobs.pipeline import INPUT_TOPICS

        suffixes = [t.suffix for t in INPUT_TOPICS]
        if topic not in suffixes:
            raise _fail(f"{path}.topic", f"expected one of {', '.join(suffixes)}, got {topic!r}")
        value = item.get("value")
        poison.append(PoisonSpec(parse_duration(item.get("at", 0), f"{path}.at"), topic,
                                 None if value is None else str(value),
                                 None if item.get("key") is None else str(item["key"])))
    sample_interval = parse_duration(data.get("sample_interval", "10s"), "sample_interval", allow_zero=False)
    return Scenario(
        name=str(data.get("name") or default_name),
        start=_start(data.get("start", DEFAULT_START)),
        duration_s=parse_duration(data["duration"], "duration", allow_zero=False),
        sample_interval_s=sample_interval,
        window_s=parse_duration(data.get("window", "1m"), "window", allow_zero=False),
        thresholds=_thresholds(data.get("thresholds")),
        prices=_prices(data.get("prices")),
        nodes=nodes,
        pods=pods,
        faults=tuple(faults),
        agent_gaps=tuple(gaps),
        late_samples=tuple(late),
        poison=tuple(poison),
        workloads=workloads,
        source=source,
        cluster=_cluster(data.get("cluster", DEFAULT_CLUSTER)),
    )


def _cluster(value: Any) -> str:
    name = _str(value, "cluster")
    if not re.fullmatch(CLUSTER_NAME_PATTERN, name):
        raise _fail("cluster", f"expected a DNS label (lowercase letters, digits, '-'; at most 63), got {name!r}")
    return name


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
