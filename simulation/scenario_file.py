"""The scenario file's spellings: how each kind of value is written, and the message when it is wrong.

The scenario's models (:mod:`simulation.scenario`) parse each field with one of these in a
``before`` validator: durations like ``90s``/``1.5h``, util steps like ``[[0m, 90], [10m, 2]]``,
labels, ``Kind/name`` owners, Kubernetes names. A wrong value raises :func:`field_error`, whose
message and sub-path (``[1][0]`` of a step, ``.team`` of a label) :func:`error_text` joins with
pydantic's location into the one line the CLI prints: ``pods[3].gpus: must be >= 0, got -1``.
This module knows no model, so :mod:`simulation.mig_layouts` parses its durations here too.
"""

from __future__ import annotations

import math
import re
import types
import typing
from datetime import UTC, date, datetime

from pydantic import ValidationError
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from schemas.messages import CLUSTER_NAME_PATTERN

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_START = "2026-01-01T00:00:00Z"
END_REASONS = ("Succeeded", "Failed", "OOMKilled", "Evicted")
DRA_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")
"""The DeviceClasses NVIDIA's DRA driver installs, which a scenario's claims may name."""
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


def duration_s(value: object, allow_zero: bool = True) -> float:
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


def optional_duration(value: object) -> float | None:
    return None if value is None else duration_s(value)


def number(value: object, low: float | None = 0.0, high: float | None = None, sub: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise field_error(f"expected a number, got {value!r}", sub)
    if low is not None and value < low:
        raise field_error(f"must be >= {low:g}, got {value!r}", sub)
    if high is not None and value > high:
        raise field_error(f"must be <= {high:g}, got {value!r}", sub)
    return float(value)


def whole(value: object, low: int = 0) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise field_error(f"expected a whole number, got {value!r}")
    if value < low:
        raise field_error(f"must be >= {low}, got {value!r}")
    return int(value)


def text(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
        raise field_error(f"expected a non-empty string, got {value!r}")
    return str(value)


def optional_text(value: object) -> str | None:
    return None if value is None else text(value)


def flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise field_error(f"expected true or false, got {value!r}")
    return value


def k8s_name(value: object) -> str:
    name = text(value)
    if len(name) > 253 or not _NAME.match(name):
        raise field_error(f"{name!r} is not a valid Kubernetes name (lowercase letters, digits, '-', '.')")
    return name


def labels(value: object) -> dict[str, str]:
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


def steps(value: object, low: float, high: float | None) -> Steps:
    """A number, or ``[[offset, value], ...]`` with offsets as durations from the running start."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return ((0.0, number(value, low, high)),)
    if not isinstance(value, list | tuple) or not value:
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


def resource(value: object) -> str:
    name = text(value)
    if not (name == "nvidia.com/gpu" or name.startswith(("nvidia.com/mig-", "nvidia.com/gpu."))):
        raise field_error(f"expected nvidia.com/gpu or nvidia.com/mig-<profile>, got {name!r}")
    return name


def optional_resource(value: object) -> str | None:
    return None if value is None else resource(value)


def listed(value: object) -> list[object]:
    """An absent list is empty (YAML gives lists; a tuple is a model's own default)."""
    if value is None:
        return []
    if isinstance(value, tuple):
        return list(value)
    if not isinstance(value, list):
        raise field_error(f"expected a list, got {type(value).__name__}")
    return value


def mapping(value: object) -> dict[object, object]:
    """An absent mapping is empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise field_error(f"expected a mapping, got {type(value).__name__}")
    return value


def mig_profile(value: object) -> str | None:
    if value is None:
        return None
    profile = text(value)
    if not MIG_PROFILE.match(profile) or int(profile.split("g")[0]) not in (1, 2, 3, 4, 7):
        raise field_error(f"expected a MIG profile like 1g.10gb or 3g.40gb, got {profile!r}")
    return profile


def device_class(value: object) -> str:
    if value not in DRA_DEVICE_CLASSES:
        raise field_error(f"expected one of {', '.join(DRA_DEVICE_CLASSES)}, got {value!r}")
    return str(value)


def end_reason(value: object) -> str:
    if value not in END_REASONS:
        raise field_error(f"expected one of {', '.join(END_REASONS)}, got {value!r}")
    return str(value)


def owner(value: object) -> tuple[str, str] | None:
    """``Kind/name`` of a controller in :data:`OWNER_API_VERSIONS`."""
    if value is None:
        return None
    if isinstance(value, tuple):
        value = "/".join(value)
    kind, _, name = text(value).partition("/")
    if kind not in OWNER_API_VERSIONS:
        raise field_error(f"expected Kind/name with Kind one of {', '.join(sorted(OWNER_API_VERSIONS))}, "
                          f"got {value!r}")
    return kind, k8s_name(name)


def start_time(value: object) -> datetime:
    """An ISO 8601 time (YAML may have parsed it already); a time without zone is UTC."""
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


def cluster_name(value: object) -> str:
    name = text(value)
    if not re.fullmatch(CLUSTER_NAME_PATTERN, name):
        raise field_error(f"expected a DNS label (lowercase letters, digits, '-'; at most 63), got {name!r}")
    return name


# --------------------------------------------------------------------------- one line per error

_ALIASED_KEYS = {"start": "from", "end": "to"}
"""Field names -> the keys a file writes where they differ (``from`` is a Python keyword)."""


def _path(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _fields(model: type) -> dict[str, FieldInfo]:
    return model.__pydantic_fields__ if is_pydantic_dataclass(model) else {}


def _nested_model(annotation: object) -> type | None:
    """The model a field holds (itself, in a tuple, or optional); None for a plain value."""
    if isinstance(annotation, type) and is_pydantic_dataclass(annotation):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) in (tuple, typing.Union):
        return next((m for m in map(_nested_model, typing.get_args(annotation)) if m is not None), None)
    return None


def _keys(model: type) -> dict[str, str]:
    """A model's keys as a file writes them -> its field names."""
    return {info.alias or name: name for name, info in _fields(model).items()}


def _known_fields(root: type, loc: tuple[int | str, ...]) -> list[str]:
    """The keys the mapping at ``loc`` accepts."""
    model = root
    for part in loc:
        info = _fields(model).get(_keys(model).get(part, "")) if isinstance(part, str) else None
        model = (_nested_model(info.annotation) if info else None) or model
    return sorted(_keys(model))


def error_text(exc: ValidationError, root: type) -> str:
    """The first error of validating the model ``root`` as ``field.path: message``; an unknown key
    before anything else, as a typo is the likelier cause of the rest."""
    errors = exc.errors(include_url=False)
    unknown = ("extra_forbidden", "unexpected_keyword_argument")
    error = next((e for e in errors if e["type"] in unknown), errors[0])
    loc = tuple(error["loc"])
    if (loc[:1] == ("agent_gaps",) or "allocator" in loc) and loc[-1] in _ALIASED_KEYS:
        loc = (*loc[:-1], _ALIASED_KEYS[str(loc[-1])])
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == "scenario":
        return f"{(_path(loc) + ctx.get('sub', '')).lstrip('.')}: {ctx['message']}"
    if kind in unknown:
        return f"{_path(loc)}: unknown field; known fields: {', '.join(_known_fields(root, loc[:-1]))}"
    if kind == "missing":
        return f"{_path(loc)}: required" + (" (e.g. duration: 30m)" if loc == ("duration",) else "")
    if kind in ("model_type", "dict_type", "model_attributes_type", "dataclass_type", "dataclass_args_type"):
        return f"{_path(loc)}: expected a mapping, got {type(error['input']).__name__}"
    return f"{_path(loc)}: {error['msg']}"
