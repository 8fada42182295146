"""Fast decoding of the sink's hot topic: msgspec Structs generated from the pydantic models.

The sink validates every GPU sample it stores (hundreds of fields per node sample); pydantic's
validation of a sample of 8 GPUs costs about 60 µs, msgspec's about 20, and at fleet scale that
difference is most of the sink's CPU. The models stay the contract: each model's mirror is generated
from it (the same field names, types, numeric and length constraints and defaults), never written
by hand, and a mirror only ever accepts *less*:

- what the mirror accepts, it reads into the same values the models' validation gives (tests
  compare both on every topic's example, on broken, coerced and parser-edge inputs);
- what it refuses (a wrong type pydantic would coerce, a value out of range, anything odd) goes
  through :func:`schemas.codec.decode_plain`, whose verdict and reason stand;
- values msgspec would parse by rules of its own are not left to it: timestamps, patterned strings
  and fields with validators are read as plain JSON values and then handed to pydantic's validator
  of that very field annotation (a *leaf*), so their parsing and checks are pydantic's.

A model with behaviour outside its fields (model or field validators, aliases, strict config, fields
of type ``Any``) gets no mirror: :func:`mirror` raises :class:`TypeError`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from datetime import datetime
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import msgspec
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from schemas.codec import MAX_MESSAGE_BYTES, decode_plain
from schemas.messages import Message

_NUMERIC_BOUNDS = {annotated_types.Ge: "ge", annotated_types.Gt: "gt", annotated_types.Le: "le",
                   annotated_types.Lt: "lt", annotated_types.MultipleOf: "multiple_of"}
INT64_RANGE = (-(2**63), 2**63 - 1)
_LENGTH_BOUNDS = {annotated_types.MinLen: "min_length", annotated_types.MaxLen: "max_length"}


Fix = Callable[[Any], Any]
"""What turns a decoded value into the model's value (a leaf's pydantic validation; nested fixes)."""


def _optional(fix: Fix) -> Fix:
    return lambda value: None if value is None else fix(value)


def _each(fix: Fix) -> Fix:
    return lambda values: [fix(value) for value in values] if values else values


def _each_value(fix: Fix) -> Fix:
    return lambda values: {key: fix(value) for key, value in values.items()}


def _flatten(metadata: list[Any]) -> list[Any]:
    """pydantic's ``Field(ge=0)`` inside ``Annotated`` is a FieldInfo holding the constraint objects."""
    flat: list[Any] = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            if item.default is not PydanticUndefined or item.default_factory is not None or item.alias:
                raise TypeError("a Field() with a default or an alias inside Annotated")
            flat.extend(_flatten(item.metadata))
        else:
            flat.append(item)
    return flat


def _meta(metadata: list[Any], allowed: dict[Any, str]) -> dict[str, Any] | None:
    """msgspec ``Meta`` arguments for these constraints; None when one of them is not a plain bound."""
    bounds: dict[str, Any] = {}
    for item in metadata:
        key = allowed.get(type(item))
        if key is None:
            return None
        bounds[key] = getattr(item, key)
    return bounds


def _mirror_type(annotation: Any, metadata: list[Any], name: str) -> tuple[Any, Fix | None]:
    """The msgspec type of one annotation (with the constraints pydantic attached to it), and the fix
    its decoded value needs (None when msgspec's value is already the model's)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extra = get_args(annotation)
        return _mirror_type(base, metadata + _flatten(extra), name)
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        others = [arg for arg in args if arg is not type(None)]
        if metadata or len(others) != 1 or len(args) != 2:
            raise TypeError(f"{name}: only 'X | None' unions are mirrored")
        kind, fix = _mirror_type(others[0], [], name)
        return (Any if kind is Any else kind | None), (None if fix is None else _optional(fix))
    if origin is list:
        (item,) = get_args(annotation)
        bounds = _meta(metadata, _LENGTH_BOUNDS)
        if bounds is None:
            raise TypeError(f"{name}: a list constraint msgspec does not share")
        kind, fix = _mirror_type(item, [], name)
        inner = list[kind]  # type: ignore[valid-type]
        return (Annotated[inner, msgspec.Meta(**bounds)] if bounds else inner), (None if fix is None else _each(fix))
    if origin is dict:
        key, value = get_args(annotation)
        if key is not str or metadata:
            raise TypeError(f"{name}: only dict[str, X] is mirrored")
        kind, fix = _mirror_type(value, [], name)
        return dict[str, kind], (None if fix is None else _each_value(fix))  # type: ignore[valid-type]
    if origin is Literal:
        if metadata or not all(isinstance(arg, str) for arg in get_args(annotation)):
            raise TypeError(f"{name}: only Literal strings are mirrored")
        return annotation, None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if metadata:
            raise TypeError(f"{name}: constraints on a model")
        return mirror(annotation), _FIXES[mirror(annotation)]
    if annotation in (int, float):
        bounds = _meta(metadata, _NUMERIC_BOUNDS)
        if bounds is not None:
            if annotation is int:
                # msgspec reads integers of any size, the models' decoding (orjson) none beyond 64
                # bits, and msgspec's bounds must fit in int64: the mirror takes int64, the rest is
                # left to the models
                low, high = INT64_RANGE
                bounds["ge"], bounds["le"] = max(low, bounds.get("ge", low)), min(high, bounds.get("le", high))
            return (Annotated[annotation, msgspec.Meta(**bounds)] if bounds else annotation), None
    elif annotation is str:
        bounds = _meta(metadata, _LENGTH_BOUNDS)
        if bounds is not None:
            return (Annotated[str, msgspec.Meta(**bounds)] if bounds else str), None
    elif annotation is bool and not metadata:
        return bool, None
    if annotation in (str, datetime, int, float):
        # a leaf: a pattern, a validator or a type msgspec parses by rules of its own (timestamps) is
        # read as whatever JSON holds and validated by pydantic, as the model would
        return Any, TypeAdapter(Annotated[annotation, *metadata] if metadata else annotation).validate_python
    raise TypeError(f"{name}: {annotation!r} is not mirrored")


_FIXES: dict[type[msgspec.Struct], Fix | None] = {}
"""Each mirror's fix: its leaves validated, its nested mirrors fixed (None when nothing needs it)."""


def _struct_fix(leaves: list[tuple[str, Fix]], nested: list[tuple[str, Fix]]) -> Fix | None:
    """A mirror's fix: every leaf validated; nested mirrors fixed where the field holds any."""
    if not leaves and not nested:
        return None

    def fix(struct: Any) -> Any:
        for name, field_fix in leaves:
            setattr(struct, name, field_fix(getattr(struct, name)))
        for name, field_fix in nested:
            value = getattr(struct, name)
            if value:  # None, [] and {} hold nothing to fix
                setattr(struct, name, field_fix(value))
        return struct
    return fix


@cache
def mirror(model: type[BaseModel]) -> type[msgspec.Struct]:
    """The msgspec Struct mirroring ``model`` (nested models become nested mirrors)."""
    config = model.model_config
    decorators = model.__pydantic_decorators__
    if (config.get("extra", "ignore") != "ignore" or config.get("strict") or decorators.validators
            or decorators.field_validators or decorators.root_validators or decorators.model_validators
            or decorators.computed_fields or model.__pydantic_root_model__):
        raise TypeError(f"{model.__name__} has behaviour outside its fields: it has no mirror")
    fields: list[tuple[str, Any, Any]] = []
    leaves: list[tuple[str, Fix]] = []
    nested: list[tuple[str, Fix]] = []
    for name, info in model.model_fields.items():
        if info.alias not in (None, name) or info.validation_alias is not None:
            raise TypeError(f"{model.__name__}.{name} has an alias: it has no mirror")
        kind, fix = _mirror_type(info.annotation, _flatten(list(info.metadata)), f"{model.__name__}.{name}")
        if fix is not None:
            (leaves if kind is Any else nested).append((name, fix))
        if info.default_factory is not None:
            fields.append((name, kind, msgspec.field(default_factory=info.default_factory)))  # type: ignore[arg-type]
        elif info.default is not PydanticUndefined:
            fields.append((name, kind, info.default))
        else:
            fields.append((name, kind, msgspec.NODEFAULT))
    # gc=False: a decoded message holds no reference cycles, and the sink creates millions of them
    struct = msgspec.defstruct(f"{model.__name__}Struct", fields, kw_only=True, gc=False)
    _FIXES[struct] = _struct_fix(leaves, nested)
    return struct


@cache
def mirror_decoder(model: type[Message]) -> Callable[[bytes], Any]:
    """The mirror's own decoder: refuses (msgspec's or pydantic's error) what it does not read as the model."""
    struct = mirror(model)
    decode, fix = msgspec.json.Decoder(struct).decode, _FIXES[struct]
    return decode if fix is None else (lambda payload: fix(decode(payload)))


def decode_struct(payload: bytes | str | None, message_type: type[Message]) -> Any:
    """``message_type``'s message of ``payload`` as its mirror Struct; the verdict and the reason of a
    refusal are :func:`schemas.codec.decode_plain`'s (:class:`schemas.codec.MessageError`)."""
    if isinstance(payload, bytes) and len(payload) <= MAX_MESSAGE_BYTES:
        try:
            return mirror_decoder(message_type)(payload)
        except (msgspec.MsgspecError, ValueError):  # pydantic's errors and invalid UTF-8 are ValueErrors
            pass
    return from_plain(message_type, decode_plain(payload, message_type))


def from_plain(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """The mirror Struct of plain data already validated by the model (``model_dump()`` or
    :func:`schemas.codec.decode_plain`): built field by field, nothing checked again."""
    return _builder(mirror(model))(data)


def as_plain(struct: Any) -> dict[str, Any]:
    """A mirror Struct as the plain data ``model_dump()`` gives (for tests and diagnostics)."""
    result: dict[str, Any] = msgspec.to_builtins(struct, builtin_types=(datetime,))
    return result


@cache
def _builder(struct: type[msgspec.Struct]) -> Callable[[dict[str, Any]], Any]:
    hints = typing.get_type_hints(struct, include_extras=True)
    converters = {name: _converter(hints[name]) for name in struct.__struct_fields__}

    def build(data: dict[str, Any]) -> Any:
        return struct(**{name: value if (convert := converters[name]) is None or value is None else convert(value)
                         for name, value in data.items() if name in converters})
    return build


def _converter(kind: Any) -> Callable[[Any], Any] | None:
    origin = get_origin(kind)
    if origin is Annotated:
        return _converter(get_args(kind)[0])
    if origin in (Union, types.UnionType):
        return _converter(next(arg for arg in get_args(kind) if arg is not type(None)))
    if origin is list:
        inner = _converter(get_args(kind)[0])
        return None if inner is None else _each(inner)
    if origin is dict:
        inner = _converter(get_args(kind)[1])
        return None if inner is None else _each_value(inner)
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return _builder(kind)
    return None
