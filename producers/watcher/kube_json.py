"""Reading the JSON the Kubernetes API server serves: safe access and its two value formats.

The watcher's translations (pods, nodes, Kueue workloads, events), the gang recognisers and the
VRAM-request reader all take untrusted camelCase dicts, where any field may be missing or of the
wrong type. They read them through these few functions, which never raise: a wrong-typed field
reads as empty, an unreadable time as None, an unreadable quantity as 0.

- :func:`first_value`: the first of several keys set in an object's labels, else its annotations
  (team, project and gang keys);
- :func:`parse_time`: RFC 3339 timestamps (``2024-05-01T10:00:00Z``, micro-time too), as aware UTC;
- :func:`parse_quantity`: Kubernetes resource quantities (``2``, ``500m``, ``16Gi``) as a whole
  number, at most int64.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from producers.watcher.bounds import MAX_QUANTITY

JsonDict = Mapping[str, Any]
"""One JSON object of the API server's output (a pod, its ``metadata``, a container status), read."""
JsonObject = dict[str, Any]
"""One API object as a watch or list delivers it, or as a fake server or cluster builds it."""


def json_dict(value: object) -> JsonDict:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def json_list(value: object) -> list[Any]:
    """``value`` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def first_value(meta: JsonDict, keys: Iterable[str]) -> str | None:
    """The first of ``keys`` set in ``meta``'s labels, else its annotations (key by key)."""
    labels = json_dict(meta.get("labels"))
    annotations = json_dict(meta.get("annotations"))
    for key in keys:
        for source in (labels, annotations):
            value = source.get(key)
            if value:
                return str(value)
    return None


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 timestamp (``2024-05-01T10:00:00Z``, micro-time too) as aware UTC, else None."""
    if not value:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = str(value).strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)


_SUFFIXES = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_QUANTITY = re.compile(r"(?P<num>[+-]?[0-9]+(?:\.[0-9]+)?)(?P<suffix>[a-zA-Z]{0,2})")


def parse_quantity(value: object) -> int:
    """A Kubernetes quantity as a whole number (GPU counts are integers); 0 when unparseable;
    at most :data:`~producers.watcher.bounds.MAX_QUANTITY` (int64: ``100E`` is 10^20, above it).
    Callers clamp further to their field's bound (``translate.gpu_quantity``)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return min(max(value, 0), MAX_QUANTITY)
    text = str(value).strip()
    match = _QUANTITY.fullmatch(text) if len(text) <= 64 else None
    if not match:
        return 0
    suffix = match.group("suffix")
    try:
        number = Decimal(match.group("num"))
    except InvalidOperation:
        return 0
    if suffix == "m":
        return min(max(int(number / 1000), 0), MAX_QUANTITY)
    if suffix not in _SUFFIXES:
        return 0
    return min(max(int(number * _SUFFIXES[suffix]), 0), MAX_QUANTITY)
