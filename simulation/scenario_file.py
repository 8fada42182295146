"""The scenario file format as pydantic models: what each key accepts, its default, and the message
when it is wrong.

Every model forbids unknown keys (a typo must not silently change a what-if analysis). A field's
value is parsed by a ``before`` validator that knows the format's own spellings (durations like
``90s``/``1.5h``, util steps like ``[[0m, 90], [10m, 2]]``, labels, ``Kind/name`` owners), and
defaults are written the way a file would write them and validated like one. A wrong value raises
:func:`field_error`, whose message and sub-path (``[1][0]`` of a step, ``.team`` of a label)
:func:`error_text` joins with pydantic's location into the one line the CLI prints:
``pods[3].gpus: must be >= 0, got -1``. :mod:`simulation.scenario` turns the models into the
simulator's specs and checks what spans objects (duplicates, references to nodes and workloads).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from schemas.messages import CLUSTER_NAME_PATTERN, DEFAULT_CLUSTER
from simulation.mig_layouts import GpuLayout, MigLayoutError, MigRelayout, parse_node_layouts
from stream_jobs.config import Thresholds

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_START = "2026-01-01T00:00:00Z"
END_REASONS = ("Succeeded", "Failed", "OOMKilled", "Evicted")
MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_START_HINT = 'expected an ISO 8601 UTC time like "2026-01-05T09:00:00Z"'

OWNER_API_VERSIONS = {
    "Job": "batch/v1", "CronJob": "batch/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1", "JobSet": "jobset.x-k8s.io/v1alpha2", "PyTorchJob": "kubeflow.org/v1",
    "MPIJob": "kubeflow.org/v2beta1", "Notebook": "kubeflow.org/v1", "RayCluster": "ray.io/v1",
}
"""Controller kinds a scenario pod may name as its owner, with the API version of their objects."""

Steps = tuple[tuple[float, float], ...]
"""``((offset_s, value), ...)`` sorted by offset; a constant is ``((0, value),)``."""


def field_error(message: str, sub: str = "") -> PydanticCustomError:
    """A wrong value: ``message`` says what was expected and what came; ``sub`` is the path inside
    the field (``[1][0]``, ``.team``), empty for the field itself."""
    return PydanticCustomError("scenario", "{message}", {"message": message, "sub": sub})


# --------------------------------------------------------------------------- value parsers


def duration_s(value: Any, allow_zero: bool = True) -> float:
    """``90s``, ``10m``, ``1.5h``, ``2d``, ``500ms`` or a bare number of seconds."""
    if isinstance(value, bool):
        raise field_error(f"expected a duration like 90s, 10m or 1.5h, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise field_error(f"expected a duration like 90s, 10m or 1.5h, got {value!r}")
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        raise field_error(f"expected a duration like 90s, 10m or 1.5h, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise field_error(f"must be a non-negative duration, got {value!r}")
    if not allow_zero and seconds <= 0:
        raise field_error(f"must be greater than zero, got {value!r}")
    return seconds


def _optional_duration(value: Any) -> float | None:
    return None if value is None else duration_s(value)


def number(value: Any, low: float | None = 0.0, high: float | None = None, sub: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise field_error(f"expected a number, got {value!r}", sub)
    if low is not None and value < low:
        raise field_error(f"must be >= {low:g}, got {value!r}", sub)
    if high is not None and value > high:
        raise field_error(f"must be <= {high:g}, got {value!r}", sub)
    return float(value)


def whole(value: Any, low: int = 0) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise field_error(f"expected a whole number, got {value!r}")
    if value < low:
        raise field_error(f"must be >= {low}, got {value!r}")
    return int(value)


def text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
        raise field_error(f"expected a non-empty string, got {value!r}")
    return str(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None else text(value)


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise field_error(f"expected true or false, got {value!r}")
    return value


def k8s_name(value: Any) -> str:
    name = text(value)
    if len(name) > 253 or not _NAME.match(name):
        raise field_error(f"{name!r} is not a valid Kubernetes name (lowercase letters, digits, '-', '.')")
    return name


def labels(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise field_error(f"expected a mapping of label keys to values, got {value!r}")
    out = {}
    for key, item in value.items():
        if item is None or isinstance(item, dict | list):
            raise field_error(f"expected a string value, got {item!r}", f".{key}")
        out[str(key)] = str(item).lower() if isinstance(item, bool) else str(item)
    return out


def steps(value: Any, low: float, high: float | None) -> Steps:
    """A number, or ``[[offset, value], ...]`` with offsets as durations from the running start."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return ((0.0, number(value, low, high)),)
    if not isinstance(value, list) or not value:
        raise field_error(f"expected a number or steps like [[0m, 90], [10m, 2]], got {value!r}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise field_error(f"expected [offset, value], got {item!r}", f"[{i}]")
        try:
            offset = duration_s(item[0])
        except PydanticCustomError as exc:
            raise field_error(str(exc), f"[{i}][0]") from None
        out.append((offset, number(item[1], low, high, sub=f"[{i}][1]")))
    offsets = [s[0] for s in out]
    if len(set(offsets)) != len(offsets):
        raise field_error("two steps have the same offset")
    return tuple(sorted(out))


def resource(value: Any) -> str:
    name = text(value)
    if not (name == "nvidia.com/gpu" or name.startswith(("nvidia.com/mig-", "nvidia.com/gpu."))):
        raise field_error(f"expected nvidia.com/gpu or nvidia.com/mig-<profile>, got {name!r}")
    return name


def listed(value: Any) -> list[Any]:
    """An absent list is empty (YAML gives lists; a tuple is a model's own default)."""
    if value is None:
        return []
    if isinstance(value, tuple):
        return list(value)
    if not isinstance(value, list):
        raise field_error(f"expected a list, got {type(value).__name__}")
    return value


def _list_field(*names: str) -> Any:
    return field_validator(*names, mode="before")(lambda value: listed(value))


class FileModel(BaseModel):
    """A mapping of the file: unknown keys are errors; defaults are validated like written values."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, arbitrary_types_allowed=True)


# --------------------------------------------------------------------------- the models


class NodeFile(FileModel):
    name: str
    gpus: int = 8
    model: str = DEFAULT_MODEL
    memory_gib: float = 80
    driver: str = "550.54.15"
    cuda: str = "12.4"
    labels: dict[str, str] | None = None
    ready_until: float | None = None
    unschedulable: bool = False
    mig: str | None = None
    time_slicing: int = 1
    process_stats: bool = True
    mig_layout: list[Any] | None = None
    """Checked with the node's size by :meth:`layouts` (``simulation.mig_layouts``)."""
    mig_relayout: list[Any] | None = None

    _name = field_validator("name", mode="before")(lambda v: k8s_name(v))
    _gpus = field_validator("gpus", mode="before")(lambda v: whole(v))
    _texts = field_validator("model", "driver", "cuda", mode="before")(lambda v: text(v))
    _memory = field_validator("memory_gib", mode="before")(lambda v: number(v, 0.0))
    _labels = field_validator("labels", mode="before")(lambda v: labels(v))
    _ready = field_validator("ready_until", mode="before")(lambda v: _optional_duration(v))
    _flags = field_validator("unschedulable", "process_stats", mode="before")(lambda v: flag(v))
    _slicing = field_validator("time_slicing", mode="before")(lambda v: whole(v, 1))

    @field_validator("mig", mode="before")
    @classmethod
    def _mig(cls, value: Any) -> str | None:
        if value is None:
            return None
        profile = text(value)
        if not MIG_PROFILE.match(profile) or int(profile.split("g")[0]) not in (1, 2, 3, 4, 7):
            raise field_error(f"expected a MIG profile like 1g.10gb or 3g.40gb, got {profile!r}")
        return profile

    @model_validator(mode="after")
    def _mig_or_slicing(self) -> NodeFile:
        if self.mig and self.time_slicing > 1:
            raise field_error("cannot be combined with mig", ".time_slicing")
        try:
            self.layouts()
        except MigLayoutError as exc:  # "<.sub.path>: <message>"
            sub, _, message = str(exc).partition(": ")
            raise field_error(message, sub) from None
        return self

    def layouts(self) -> tuple[tuple[GpuLayout, ...] | None, tuple[MigRelayout, ...]]:
        """The per-GPU MIG layouts and their changes; raises :class:`MigLayoutError`."""
        return parse_node_layouts(self.model_dump(include={"mig", "time_slicing", "mig_layout", "mig_relayout"}),
                                  "", self.gpus, self.model, self.memory_gib)


class AllocatorFile(FileModel):
    """Extension ``pods[].allocator``: what the pod's caching allocator reports (docs/scenarios.md)."""

    reserved_gib: float
    allocated_gib: float
    retries_per_min: float = 0
    ooms_per_min: float = 0
    start: float = Field(default=0, alias="from")
    until: float | None = None

    _gib = field_validator("reserved_gib", "allocated_gib", mode="before")(
        lambda v: number(v, 0.0, 2**20))  # the agent's bound: 1 PiB
    _rates = field_validator("retries_per_min", "ooms_per_min", mode="before")(lambda v: number(v, 0.0))
    _start = field_validator("start", mode="before")(lambda v: duration_s(v))
    _until = field_validator("until", mode="before")(lambda v: _optional_duration(v))

    @model_validator(mode="after")
    def _consistent(self) -> AllocatorFile:
        if self.allocated_gib > self.reserved_gib:
            raise field_error(f"must be <= {self.reserved_gib:g} (reserved_gib), got {self.allocated_gib:g}",
                              ".allocated_gib")
        if self.until is not None and self.until <= self.start:
            raise field_error("must be after from", ".until")
        return self


class PodFile(FileModel):
    name: str
    namespace: str = "default"
    labels: dict[str, str] | None = None
    gpus: int = 1
    node: str | None = None
    create: float = 0
    run_for: float | None = None
    delete: float | None = None
    end: str = "Succeeded"
    util: Steps = 0  # type: ignore[assignment]  # the file's spelling; the validator makes it Steps
    memory_gib: Steps = 0  # type: ignore[assignment]
    processes: int = 1
    gang: str | None = None
    crashloop: bool = False
    steps_per_s: float | None = None
    image: str = "nvcr.io/nvidia/pytorch:24.05-py3"
    resource: str | None = None
    owner: tuple[str, str] | None = None
    active_gpus: int | None = None
    workload: str | None = None
    allocator: AllocatorFile | None = None
    vram_request_gib: float | None = None

    _names = field_validator("name", "namespace", mode="before")(lambda v: k8s_name(v))
    _labels = field_validator("labels", mode="before")(lambda v: labels(v))
    _whole = field_validator("gpus", "processes", mode="before")(lambda v: whole(v))
    _texts = field_validator("node", "gang", mode="before")(lambda v: _optional_text(v))
    _create = field_validator("create", mode="before")(lambda v: duration_s(v))
    _durations = field_validator("run_for", "delete", mode="before")(lambda v: _optional_duration(v))
    _util = field_validator("util", mode="before")(lambda v: steps(v, 0.0, 100.0))
    _memory = field_validator("memory_gib", mode="before")(lambda v: steps(v, 0.0, None))
    _crashloop = field_validator("crashloop", mode="before")(lambda v: flag(v))
    _rate = field_validator("steps_per_s", mode="before")(lambda v: None if v is None else number(v, 0.0))
    _image = field_validator("image", mode="before")(lambda v: text(v))
    _resource = field_validator("resource", mode="before")(lambda v: None if v is None else resource(v))
    _active = field_validator("active_gpus", mode="before")(lambda v: None if v is None else whole(v))
    _workload = field_validator("workload", mode="before")(lambda v: None if v is None else k8s_name(v))
    _vram = field_validator("vram_request_gib", mode="before")(lambda v: None if v is None else number(v, 0.0))

    @field_validator("end", mode="before")
    @classmethod
    def _end(cls, value: Any) -> str:
        if value not in END_REASONS:
            raise field_error(f"expected one of {', '.join(END_REASONS)}, got {value!r}")
        return str(value)

    @field_validator("owner", mode="before")
    @classmethod
    def _owner(cls, value: Any) -> tuple[str, str] | None:
        if value is None:
            return None
        kind, _, name = text(value).partition("/")
        if kind not in OWNER_API_VERSIONS:
            raise field_error(f"expected Kind/name with Kind one of {', '.join(sorted(OWNER_API_VERSIONS))}, "
                              f"got {value!r}")
        return kind, k8s_name(name)

    @model_validator(mode="after")
    def _active_within_gpus(self) -> PodFile:
        if self.active_gpus is not None and self.active_gpus > self.gpus:
            raise field_error(f"must be <= gpus ({self.gpus}), got {self.active_gpus}", ".active_gpus")
        return self


class PodSetFile(FileModel):
    name: str = "main"
    count: int = 1
    gpus: int = 1
    resource: str = "nvidia.com/gpu"

    _name = field_validator("name", mode="before")(lambda v: k8s_name(v))
    _counts = field_validator("count", "gpus", mode="before")(lambda v: whole(v, 1))
    _resource = field_validator("resource", mode="before")(lambda v: resource(v))


class WorkloadFile(FileModel):
    name: str
    namespace: str = "default"
    queue: str = "default"
    labels: dict[str, str] | None = None
    pod_sets: tuple[PodSetFile, ...] = [{}]  # type: ignore[assignment]  # one default pod set, as written
    create: float = 0
    admit: float | None = None
    delete: float | None = None
    reason: str | None = None

    _names = field_validator("name", "namespace", "queue", mode="before")(lambda v: k8s_name(v))
    _labels = field_validator("labels", mode="before")(lambda v: labels(v))
    _sets = _list_field("pod_sets")
    _create = field_validator("create", mode="before")(lambda v: duration_s(v))
    _durations = field_validator("admit", "delete", mode="before")(lambda v: _optional_duration(v))
    _reason = field_validator("reason", mode="before")(lambda v: _optional_text(v))

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadFile:
        if not self.pod_sets:
            raise field_error("at least one pod set", ".pod_sets")
        if len({s.name for s in self.pod_sets}) != len(self.pod_sets):
            raise field_error("pod set names must be unique", ".pod_sets")
        if self.admit is not None and self.admit < self.create:
            raise field_error("must not be before create", ".admit")
        return self


class FaultFile(FileModel):
    node: str = None  # type: ignore[assignment]  # required, with the format's own message
    gpu: int = 0
    at: float = 0
    xid: int | None = None
    lost: bool = False
    until: float | None = None

    _node = field_validator("node", mode="before")(lambda v: text(v))
    _gpu = field_validator("gpu", mode="before")(lambda v: whole(v))
    _at = field_validator("at", mode="before")(lambda v: duration_s(v))
    _xid = field_validator("xid", mode="before")(lambda v: None if v is None else whole(v, 1))
    _lost = field_validator("lost", mode="before")(lambda v: flag(v))
    _until = field_validator("until", mode="before")(lambda v: _optional_duration(v))

    @model_validator(mode="after")
    def _what(self) -> FaultFile:
        if self.xid is None and not self.lost:
            raise field_error("give xid: <number> or lost: true")
        return self


class GapFile(FileModel):
    node: str = None  # type: ignore[assignment]
    start: float = Field(default=None, alias="from")  # type: ignore[assignment]
    end: float = Field(default=None, alias="to")  # type: ignore[assignment]

    _node = field_validator("node", mode="before")(lambda v: text(v))
    _span = field_validator("start", "end", mode="before")(lambda v: duration_s(v))

    @model_validator(mode="after")
    def _ordered(self) -> GapFile:
        if self.end <= self.start:
            raise field_error("must be after from", ".to")
        return self


class LateFile(FileModel):
    node: str = None  # type: ignore[assignment]
    at: float = None  # type: ignore[assignment]
    by: float = None  # type: ignore[assignment]

    _node = field_validator("node", mode="before")(lambda v: text(v))
    _at = field_validator("at", mode="before")(lambda v: duration_s(v))
    _by = field_validator("by", mode="before")(lambda v: duration_s(v, allow_zero=False))


class PoisonFile(FileModel):
    at: float = 0
    topic: str = None  # type: ignore[assignment]
    value: Any = None
    key: Any = None

    _at = field_validator("at", mode="before")(lambda v: duration_s(v))

    @field_validator("topic", mode="before")
    @classmethod
    def _topic(cls, value: Any) -> str:
        from stream_jobs.pipeline import INPUT_TOPICS

        topic = text(value)
        suffixes = [t.suffix for t in INPUT_TOPICS]
        if topic not in suffixes:
            raise field_error(f"expected one of {', '.join(suffixes)}, got {topic!r}")
        return topic


class ScenarioFile(FileModel):
    name: Any = None
    description: Any = None
    start: datetime = DEFAULT_START  # type: ignore[assignment]
    duration: float
    sample_interval: float = "10s"  # type: ignore[assignment]
    window: float = "1m"  # type: ignore[assignment]
    thresholds: Thresholds = None  # type: ignore[assignment]
    prices: dict[str, float] = None  # type: ignore[assignment]
    nodes: tuple[NodeFile, ...] = ()
    pods: tuple[PodFile, ...] = ()
    workloads: tuple[WorkloadFile, ...] = ()
    faults: tuple[FaultFile, ...] = ()
    agent_gaps: tuple[GapFile, ...] = ()
    late_samples: tuple[LateFile, ...] = ()
    poison: tuple[PoisonFile, ...] = ()
    cluster: str = DEFAULT_CLUSTER

    _lists = _list_field("nodes", "pods", "workloads", "faults", "agent_gaps", "late_samples", "poison")
    _duration = field_validator("duration", mode="before")(lambda v: duration_s(v, allow_zero=False))
    _intervals = field_validator("sample_interval", "window", mode="before")(lambda v: duration_s(v, allow_zero=False))

    @field_validator("start", mode="before")
    @classmethod
    def _start(cls, value: Any) -> datetime:
        if isinstance(value, datetime):
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        if isinstance(value, date):
            return datetime(value.year, value.month, value.day, tzinfo=UTC)
        if isinstance(value, str):
            written = value.strip()
            written = written[:-1] + "+00:00" if written.endswith(("Z", "z")) else written
            try:
                parsed = datetime.fromisoformat(written)
            except ValueError:
                raise field_error(f"{_START_HINT}, got {value!r}") from None
            return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
        raise field_error(f"{_START_HINT}, got {value!r}")

    @field_validator("thresholds", mode="before")
    @classmethod
    def _thresholds(cls, value: Any) -> Thresholds:
        if value is None:
            return Thresholds()
        if not isinstance(value, dict):
            raise field_error(f"expected a mapping, got {type(value).__name__}")
        values: dict[str, float] = {}
        known = set(Thresholds.names())
        for key, item in value.items():
            name = key[:-2] if str(key).endswith("_s") and key[:-2] in Thresholds.DURATIONS else key
            if name not in known:
                raise field_error(f"unknown threshold; known: {', '.join(sorted(known))}", f".{key}")
            try:
                if name in Thresholds.DURATIONS:
                    values[name] = duration_s(item)
                elif name in ("idle_util_pct", "vram_pressure_pct", "allocator_unused_pct"):
                    values[name] = number(item, 0.0, 100.0)
                else:
                    values[name] = number(item, 0.0)
            except PydanticCustomError as exc:
                raise field_error(str(exc), f".{key}") from None
        return Thresholds().with_overrides(values)

    @field_validator("prices", mode="before")
    @classmethod
    def _prices(cls, value: Any) -> dict[str, float]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise field_error(f"expected a mapping, got {type(value).__name__}")
        return {str(model): number(price, 0.0, sub=f".{model}") for model, price in value.items()}

    @field_validator("cluster", mode="before")
    @classmethod
    def _cluster(cls, value: Any) -> str:
        name = text(value)
        if not re.fullmatch(CLUSTER_NAME_PATTERN, name):
            raise field_error(f"expected a DNS label (lowercase letters, digits, '-'; at most 63), got {name!r}")
        return name


# --------------------------------------------------------------------------- one line per error

_MODEL_OF_LIST: dict[str, type[FileModel]] = {
    "nodes": NodeFile, "pods": PodFile, "workloads": WorkloadFile, "pod_sets": PodSetFile, "faults": FaultFile,
    "agent_gaps": GapFile, "late_samples": LateFile, "poison": PoisonFile, "allocator": AllocatorFile}


_GAP_KEYS = {"start": "from", "end": "to"}
"""Field names of :class:`GapFile` -> the keys a file writes (``from`` is a Python keyword)."""


def _path(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _known_fields(loc: tuple[int | str, ...]) -> list[str]:
    owner = next((part for part in reversed(loc) if isinstance(part, str)), None)
    model: type[FileModel] = _MODEL_OF_LIST.get(owner, ScenarioFile) if owner else ScenarioFile
    return sorted(info.alias or name for name, info in model.model_fields.items())


def error_text(exc: ValidationError) -> str:
    """The first error as ``field.path: message``; an unknown key before anything else, as a typo
    is the likelier cause of the rest."""
    errors = exc.errors(include_url=False)
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(error["loc"])
    if (loc[:1] == ("agent_gaps",) or "allocator" in loc) and loc[-1] in _GAP_KEYS:
        loc = (*loc[:-1], _GAP_KEYS[str(loc[-1])])
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == "scenario":
        return f"{(_path(loc) + ctx.get('sub', '')).lstrip('.')}: {ctx['message']}"
    if kind == "extra_forbidden":
        return f"{_path(loc)}: unknown field; known fields: {', '.join(_known_fields(loc[:-1]))}"
    if kind == "missing":
        return f"{_path(loc)}: required" + (" (e.g. duration: 30m)" if loc == ("duration",) else "")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{_path(loc)}: expected a mapping, got {type(error['input']).__name__}"
    return f"{_path(loc)}: {error['msg']}"
