"""JSON values as the stream jobs' state documents hold them, and their checked reading.

Why: stage state is checkpointed as plain JSON (faust tables and their changelog,
``LocalPipeline.to_dict``), and an alert's details are JSON too. :data:`JsonValue` is the one type
of such a value, recursive: what a ``to_dict`` builds and what ``orjson.loads`` gives back. Its
containers are the read-only ``Sequence`` and ``Mapping``, so a record's own ``list[float]`` or
``dict[str, int]`` is a JSON value as it is (no copy at every checkpoint).

Reading a document back narrows each value to what the record needs with the ``as_*`` functions:
a document of another shape fails there with a ``TypeError`` naming what it found, not later as an
attribute error deep in a stage. :func:`rebuild` turns a record's flat JSON form (this version's
own ``to_dict``: field name -> value) back into the record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias, TypeVar

JsonScalar: TypeAlias = bool | int | float | str | None
JsonValue: TypeAlias = JsonScalar | Sequence["JsonValue"] | Mapping[str, "JsonValue"]
"""A JSON value: a scalar, an array or an object of JSON values."""
JsonObject: TypeAlias = Mapping[str, JsonValue]
"""A JSON object as a reader takes it."""
JsonDict: TypeAlias = dict[str, JsonValue]
"""A JSON object as a ``to_dict`` builds it (and a stage keeps it, for details it adds to)."""

R = TypeVar("R")


def _mismatch(want: str, value: JsonValue) -> TypeError:
    return TypeError(f"state document: expected {want}, found {type(value).__name__}")


def as_object(value: JsonValue) -> JsonObject:
    if isinstance(value, Mapping):
        return value
    raise _mismatch("an object", value)


def as_array(value: JsonValue) -> Sequence[JsonValue]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return value
    raise _mismatch("an array", value)


def as_float(value: JsonValue) -> float:
    """A number, as it is: an integer stays an integer, as the record held it before its checkpoint."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    raise _mismatch("a number", value)


def as_int(value: JsonValue) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _mismatch("an integer", value)


def as_str(value: JsonValue) -> str:
    if isinstance(value, str):
        return value
    raise _mismatch("a string", value)


def as_bool(value: JsonValue) -> bool:
    if isinstance(value, bool):
        return value
    raise _mismatch("a boolean", value)


def optional_float(value: JsonValue) -> float | None:
    return None if value is None else as_float(value)


def optional_int(value: JsonValue) -> int | None:
    return None if value is None else as_int(value)


def optional_object(value: JsonValue) -> JsonObject | None:
    return None if value is None else as_object(value)


def float_map(value: JsonValue) -> dict[str, float]:
    return {key: as_float(item) for key, item in as_object(value).items()}


def int_map(value: JsonValue) -> dict[str, int]:
    return {key: as_int(item) for key, item in as_object(value).items()}


def record_map(value: JsonValue, read: Callable[[JsonObject], R]) -> dict[str, R]:
    """A JSON object of records (key -> a record's JSON form) read with ``read`` (a ``from_dict``)."""
    return {key: read(as_object(item)) for key, item in as_object(value).items()}


def rebuild(cls: type[R], data: JsonObject, **records: object) -> R:
    """The dataclass record ``cls`` from its flat JSON form, as this version's ``to_dict`` wrote it
    (field name -> JSON value), with ``records`` replacing the fields its ``from_dict`` read into
    records (or tuples, typed maps) of their own. The other fields are passed as they are, unchecked:
    the document is the worker's own checkpoint, and this runs for every record of every restored
    stage."""
    return cls(**({**data, **records} if records else data))
