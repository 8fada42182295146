"""Encode, decode and validate topic messages.

JSON on the wire (orjson: fast, strict UTF-8) so any consumer can read it; validation through the
pydantic models, with errors that name the field path and the reason. A size limit guards every
decode so one giant record cannot exhaust a consumer.

GPU samples repeat most of their readings from one sample to the next (a steady GPU reads the same,
and the agent hands an unchanged reading back as the same immutable object), so :func:`encode`
remembers, per node, the JSON of the readings of the node's last sample (:class:`LastReadings`) and
reuses it for the same reading object: a reading's JSON depends on nothing but its fields. Only the
last sample's readings of each node are kept (replaced at the node's next sample), and the nodes
kept are at most :data:`MAX_REMEMBERED_NODES` (forgotten all at once beyond that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, Generic, TypeVar

import orjson
from pydantic import ValidationError
from pydantic_core import SchemaValidator

from schemas.messages import (
    DEFAULT_CLUSTER,
    INCONSISTENT,
    SCHEMA_VERSION,
    GpuReading,
    GpuSample,
    Message,
    scoped_key,
)
from schemas.outputs import DeadLetterReason

M = TypeVar("M", bound=Message)
V = TypeVar("V")

MAX_MESSAGE_BYTES = 1024 * 1024

CONTENT_TYPE = "application/json"
WIRE_HEADERS: tuple[tuple[str, bytes], ...] = (
    ("content-type", CONTENT_TYPE.encode()),
    ("gpulens-schema-version", str(SCHEMA_VERSION).encode()),
)
"""Kafka headers on every gpulens message, so a consumer can route or reject by format and version
without parsing the value (tombstones carry none: they have no content)."""


class MessageError(ValueError):
    """A message that cannot be accepted; ``field_path`` names where, ``reason`` says why, ``code``
    is the dead letter's reason code."""

    def __init__(self, reason: str, field_path: str = "", code: DeadLetterReason = DeadLetterReason.INVALID) -> None:
        self.reason = reason
        self.field_path = field_path
        self.code = code
        super().__init__(f"{field_path}: {reason}" if field_path else reason)


PlainData = dict[str, Any]
"""A message's fields as plain data (field name -> JSON-friendly value), as the sinks write them."""


def encode(message: Message) -> bytes:
    """The message as compact JSON: fields equal to their default (absent metrics, empty lists) are
    left out, as a reader's validation puts them back; ``schema_version`` and ``cluster`` are always
    written. A GPU sample shrinks to about half, which halves what Kafka carries and what every
    consumer parses."""
    if type(message) is GpuSample and message.gpus:
        data = _encode_sample(message)
    else:
        data = orjson.dumps({"schema_version": message.schema_version, "cluster": message.cluster}
                            | message.model_dump(mode="json", exclude_defaults=True))
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"encoded size {len(data)} bytes exceeds limit {MAX_MESSAGE_BYTES}",
                           code=DeadLetterReason.TOO_LARGE)
    return data


MAX_REMEMBERED_NODES = 8192
"""Nodes whose last sample's readings :class:`LastReadings` keeps (one worker's or simulator's share
of a fleet); a further node makes it forget all of them."""


class LastReadings(Generic[V]):
    """What was made of the GPU readings of each node's last sample (``V``), kept per ``(cluster,
    node)``: what a node's next sample makes replaces it, and beyond ``max_nodes`` nodes all is
    forgotten, so only readings still in use are held."""

    def __init__(self, max_nodes: int = MAX_REMEMBERED_NODES) -> None:
        self.max_nodes = max_nodes
        self._nodes: dict[tuple[str, str], V] = {}

    def get(self, cluster: str, node: str) -> V | None:
        return self._nodes.get((cluster, node))

    def keep(self, cluster: str, node: str, readings: V) -> None:
        """``readings`` (what the node's sample just handled made) in place of the node's last ones."""
        nodes = self._nodes
        if len(nodes) >= self.max_nodes and (cluster, node) not in nodes:
            nodes.clear()
        nodes[(cluster, node)] = readings

    def __len__(self) -> int:
        """How many nodes' readings are kept."""
        return len(self._nodes)


_ENCODED_READINGS: LastReadings[dict[int, tuple[GpuReading, orjson.Fragment]]] = LastReadings()
"""Each reading's JSON, by the reading object's ``id`` (with the reading, so the ``id`` stays its own):
models are immutable, and the agent hands an unchanged reading back as the same object."""


def _encode_sample(sample: GpuSample) -> bytes:
    """:func:`encode` of a sample with readings, byte for byte, with each reading's JSON made once per
    reading object: the same keys in the same order (``schema_version``, ``cluster``, then the
    model's fields with ``gpus`` at its place), each reading as its own ``model_dump`` writes it."""
    last = _ENCODED_READINGS.get(sample.cluster, sample.node) or {}
    kept: dict[int, tuple[GpuReading, orjson.Fragment]] = {}
    gpus = []
    for reading in sample.gpus:
        entry = last.get(id(reading))
        if entry is None or entry[0] is not reading:
            entry = (reading, orjson.Fragment(orjson.dumps(reading.model_dump(mode="json", exclude_defaults=True))))
        kept[id(reading)] = entry
        gpus.append(entry[1])
    _ENCODED_READINGS.keep(sample.cluster, sample.node, kept)
    fields = sample.model_dump(mode="json", exclude_defaults=True, exclude={"gpus"})
    data: dict[str, Any] = {"schema_version": sample.schema_version, "cluster": sample.cluster}
    for name in GpuSample.model_fields:
        if name == "gpus":
            data[name] = gpus
        elif name in fields:
            data[name] = fields[name]
    return orjson.dumps(data)


def _parse(payload: bytes | str | None) -> PlainData:
    if payload is None:
        raise MessageError("empty value (tombstone) where a message was expected")
    raw = payload.encode() if isinstance(payload, str) else payload
    if len(raw) > MAX_MESSAGE_BYTES:
        raise MessageError(f"message of {len(raw)} bytes exceeds limit {MAX_MESSAGE_BYTES}",
                           code=DeadLetterReason.TOO_LARGE)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # a number beyond float64 (1e400): valid JSON that no float field can hold
        code = DeadLetterReason.OUT_OF_RANGE if str(exc).startswith(ORJSON_INFINITY) else DeadLetterReason.INVALID
        raise MessageError(f"not valid JSON: {exc}", code=code) from None
    if not isinstance(data, dict):
        raise MessageError(f"expected a JSON object, got {type(data).__name__}")
    return data


def decode(payload: bytes | str | None, message_type: type[M]) -> M:
    """Parse and validate one message; raise :class:`MessageError` naming the failing field.

    A record first goes through :func:`model_json_validator`, which parses and validates in one
    pass (a quarter less time for a GPU sample) and accepts only what the two-step path (orjson,
    then the model) accepts, with the same result; anything it refuses goes through the two-step
    path, whose verdict and reason stand."""
    message: M | None = _one_pass(model_json_validator(message_type), payload)
    if message is not None:
        return message
    return validate(_parse(payload), message_type)


def _one_pass(validator: SchemaValidator | None, payload: bytes | str | None) -> Any:
    """What ``validator`` (one of the narrowed JSON validators below) makes of ``payload``, or None
    when there is none, the payload is not bytes within the size limit, or the validator refuses
    it: the caller's two-step path then gives the verdict."""
    if validator is None or not isinstance(payload, bytes) or len(payload) > MAX_MESSAGE_BYTES:
        return None
    try:
        return validator.validate_json(payload)
    except ValidationError:
        return None


def decode_plain(payload: bytes | str | None, message_type: type[Message]) -> PlainData:
    """Parse and validate one message into plain data: what ``decode(...).model_dump()`` gives.

    The same checks, in the same order, with the same field paths and reasons (the validator is
    built from the model's own schema, see :func:`plain_validator`); only no model objects are
    built. A record first goes through :func:`json_validator`, which parses and validates in one
    pass and accepts only what the two-step path accepts with the same result; anything it refuses
    goes through the two-step path, whose verdict and reason stand.
    """
    result: PlainData | None = _one_pass(json_validator(message_type), payload)
    if result is not None:
        return result
    data = _parse(payload)
    try:
        result = plain_validator(message_type).validate_python(data)
    except ValidationError as exc:
        raise _message_error(exc) from None
    return result


def decode_plain_canonical(payload: bytes | str | None, message_type: type[Message]) -> tuple[PlainData, bool]:
    """:func:`decode_plain`, and whether the record is *canonical*: it passed strict validation, so
    every value already has its field's JSON type (numbers where numbers belong, ``true``/``false``
    for booleans, timestamps as strings; nothing coerced). Another JSON reader then reads the same
    values from the bytes as the validation did (what :mod:`sinks.sample_json` relies on).

    Strict validation is tried first and, when it passes, is the validation (its result is the
    lax one's); a record it refuses is validated as :func:`decode_plain` does, with its verdict.
    """
    result: PlainData | None = _one_pass(strict_json_validator(message_type), payload)
    if result is not None:
        return result, True
    return decode_plain(payload, message_type), False


def decode_canonical_sparse(payload: bytes, message_type: type[Message]) -> PlainData | None:
    """What :func:`decode_plain_canonical` gives a canonical record, less the optional fields the
    record leaves out (their defaults are not filled in); None when the record is not canonical
    (:func:`decode_plain` then gives the verdict). For readers that need only a few fields: a GPU
    sample's defaults are most of what validation builds (:func:`sparse_strict_json_validator`)."""
    result: PlainData | None = _one_pass(sparse_strict_json_validator(message_type), payload)
    return result


def validate(data: dict[str, object], message_type: type[M]) -> M:
    try:
        return message_type.model_validate(data)
    except ValidationError as exc:
        raise _message_error(exc) from None


ERROR_CODES: dict[str, DeadLetterReason] = {
    "string_too_long": DeadLetterReason.TOO_LARGE,
    "too_long": DeadLetterReason.TOO_LARGE,
    "bytes_too_long": DeadLetterReason.TOO_LARGE,
    "greater_than": DeadLetterReason.OUT_OF_RANGE,
    "greater_than_equal": DeadLetterReason.OUT_OF_RANGE,
    "less_than": DeadLetterReason.OUT_OF_RANGE,
    "less_than_equal": DeadLetterReason.OUT_OF_RANGE,
    "finite_number": DeadLetterReason.OUT_OF_RANGE,
    "int_parsing_size": DeadLetterReason.OUT_OF_RANGE,
    INCONSISTENT: DeadLetterReason.INCONSISTENT,
}
"""The dead letter's reason code of a pydantic error type (any other type: ``invalid``)."""

ORJSON_INFINITY = "number is infinity"
"""How orjson's error for a number beyond float64 begins (``1e400``)."""


def error_code(error_type: str) -> DeadLetterReason:
    """The reason code of a validation error of type ``error_type`` (pydantic's ``type``)."""
    return ERROR_CODES.get(error_type, DeadLetterReason.INVALID)


def _message_error(exc: ValidationError) -> MessageError:
    first = exc.errors()[0]
    path = ".".join(str(part) for part in first["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return MessageError(f"{first['msg']}{more}", path, error_code(first["type"]))


KEY_FIELDS: dict[type[Message], str] = {GpuSample: "node"}
"""Input types whose Kafka key is a field of the message, scoped by its cluster
(:func:`schemas.messages.scoped_key`): a sample is keyed by its node."""


def key_error(key: bytes | str | None, message_type: type[Message], data: Message | Mapping[str, Any]) -> str | None:
    """Why a record keyed ``key`` cannot carry ``data`` (a decoded ``message_type``: the model or
    its plain data), or None: a keyless record, a type with no key field, or the key it should have
    (the scoped ``<cluster>/<node>``, or the bare field value, which names the same node of the
    record's cluster and is what agents before clusters wrote)."""
    field = KEY_FIELDS.get(message_type)
    if key is None or field is None:
        return None
    values: Mapping[str, Any] = data if isinstance(data, Mapping) else data.__dict__
    cluster = values.get("cluster", DEFAULT_CLUSTER)
    expected = scoped_key(cluster, str(values[field]))
    text = key if isinstance(key, str) else key.decode("utf-8", errors="replace")
    if text in (expected, str(values[field])):
        return None
    return f"record key {text[:MAX_KEY_CHARS_SHOWN]!r} is not the key of its {field} {expected[:MAX_KEY_CHARS_SHOWN]!r}"


MAX_KEY_CHARS_SHOWN = 300
"""A key is shown in an error up to this many characters."""


def check_key(key: bytes | str | None, message: Message | Mapping[str, Any],
              message_type: type[Message] | None = None) -> None:
    """Raise :class:`MessageError` (``inconsistent``, naming the key field) when ``key`` is not the
    key of ``message`` (:func:`key_error`); ``message_type`` is needed for plain data."""
    kind = message_type if message_type is not None else type(message)
    if not (isinstance(kind, type) and issubclass(kind, Message)):
        raise TypeError("check_key needs the message type of plain data")
    error = key_error(key, kind, message)
    if error is not None:
        raise MessageError(error, KEY_FIELDS[kind], DeadLetterReason.INCONSISTENT)


def decode_keyed(payload: bytes | str | None, key: bytes | str | None, message_type: type[M]) -> M:
    """:func:`decode`, and the record's ``key`` checked against the message (:func:`check_key`): a
    sample keyed by one node that names another is refused (``inconsistent``). A keyless record is
    accepted as :func:`decode` accepts it."""
    message = decode(payload, message_type)
    check_key(key, message)
    return message


@cache
def plain_validator(message_type: type[Message]) -> SchemaValidator:
    """A validator of ``message_type``'s schema whose output is dicts instead of models.

    Every model node of the model's core schema becomes a typed-dict node over the same field
    schemas (types, constraints, field validators, defaults), so validation is unchanged. Models
    whose behaviour lives outside their fields (model validators, custom ``__init__``, aliases,
    root models) are refused with :class:`TypeError`: their plain form could differ.
    """
    return SchemaValidator(_plain_schema(message_type.__pydantic_core_schema__))  # type: ignore[arg-type]


ORJSON_INT_RANGE = (-(2**63), 2**64 - 1)
"""Integers orjson reads as integers; it reads larger ones as floats, pydantic's JSON parser does not."""


@cache
def json_validator(message_type: type[Message]) -> SchemaValidator | None:
    """:func:`plain_validator` narrowed to what orjson parses the same way, for ``validate_json``.

    pydantic's JSON parser reads ``NaN`` and ``Infinity`` (orjson refuses them) and integers beyond
    64 bits exactly (orjson turns them into floats): here every float must be finite and every
    integer within orjson's range, so what this validator accepts, orjson and the plain validator
    accept with the same result. None for types with fields of any type, validators that see the raw
    input or strict parts (strict JSON validation reads a timestamp string, strict Python does not).
    """
    try:
        return SchemaValidator(_json_schema(_plain_schema(message_type.__pydantic_core_schema__)))  # type: ignore[arg-type]
    except TypeError:
        return None


@cache
def model_json_validator(message_type: type[Message]) -> SchemaValidator | None:
    """The model's own validator narrowed as :func:`json_validator` narrows the plain one (finite
    floats, integers in orjson's range), for ``validate_json``: it builds the same models from what
    it accepts as orjson and ``model_validate`` do. None where that narrowing does not apply."""
    try:
        return SchemaValidator(_json_schema(message_type.__pydantic_core_schema__))  # type: ignore[arg-type]
    except TypeError:
        return None


STRICT_KINDS = frozenset({"int", "float", "bool", "str", "datetime", "date", "time", "timedelta", "list", "tuple",
                          "set", "frozenset", "dict", "typed-dict", "literal", "decimal", "uuid", "bytes"})
"""Core-schema nodes that take a ``strict`` flag."""


@cache
def strict_json_validator(message_type: type[Message]) -> SchemaValidator | None:
    """:func:`json_validator` with every node strict: it accepts a subset of what that accepts,
    with the same result. None where :func:`json_validator` is None."""
    try:
        return SchemaValidator(_strict_schema(_json_schema(_plain_schema(message_type.__pydantic_core_schema__))))  # type: ignore[arg-type]
    except TypeError:
        return None


@cache
def sparse_strict_json_validator(message_type: type[Message]) -> SchemaValidator | None:
    """:func:`strict_json_validator` whose result has only the fields the input has: a field with a
    default is optional instead, without the default. It accepts exactly what that accepts (a
    default is not validated, and an invalid value is an error, never replaced by the default);
    present fields read the same. None where :func:`strict_json_validator` is None."""
    try:
        return SchemaValidator(_sparse_schema(_strict_schema(_json_schema(_plain_schema(  # type: ignore[arg-type]
            message_type.__pydantic_core_schema__)))))
    except TypeError:
        return None


SchemaNode = dict[str, Any]
"""One node of a pydantic-core schema: a JSON-like dict whose ``type`` names its kind."""


def _rewrite(node: Any, rewrite_node: Callable[[SchemaNode, SchemaNode], SchemaNode]) -> Any:
    """A core schema with every node rewritten bottom-up: ``rewrite_node(original, with_children_rewritten)``
    (serialization schemas are left as they are)."""
    if isinstance(node, list):
        return [_rewrite(item, rewrite_node) for item in node]
    if not isinstance(node, dict):
        return node
    children = {key: value if key == "serialization" else _rewrite(value, rewrite_node) for key, value in node.items()}
    return rewrite_node(node, children)


def _strict_schema(node: Any) -> Any:
    def strict(original: SchemaNode, rewritten: SchemaNode) -> SchemaNode:
        if original.get("type") in STRICT_KINDS:
            rewritten["strict"] = True
        return rewritten
    return _rewrite(node, strict)


def _sparse_schema(node: Any) -> Any:
    def sparse(original: SchemaNode, rewritten: SchemaNode) -> SchemaNode:
        if (original.get("config") or {}).get("validate_default"):
            raise TypeError("a default that is validated changes the verdict")
        inner = rewritten.get("schema")
        if original.get("type") != "typed-dict-field" or not isinstance(inner, dict) or inner.get("type") != "default":
            return rewritten
        if inner.get("validate_default") or inner.get("on_error", "raise") != "raise":
            raise TypeError("a default that is validated or replaces invalid input changes the verdict")
        return {**rewritten, "required": False, "schema": inner["schema"]}
    return _rewrite(node, sparse)


def _json_schema(node: Any) -> Any:
    def narrow(original: SchemaNode, narrowed: SchemaNode) -> SchemaNode:
        kind = original.get("type")
        if kind in ("any", "function-before", "function-wrap", "function-plain"):
            raise TypeError(f"a {kind} schema sees the raw input")
        if original.get("strict") or (original.get("config") or {}).get("strict"):
            raise TypeError("strict validation of JSON input accepts what strict validation of Python data refuses")
        if kind == "float":
            narrowed["allow_inf_nan"] = False
        elif kind == "int":
            low, high = ORJSON_INT_RANGE
            narrowed["ge"] = max(low, original.get("ge", low))
            narrowed["le"] = min(high, original.get("le", high))
        return narrowed
    return _rewrite(node, narrow)


def _plain_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_plain_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "model":
        return _plain_model(node)
    if str(kind).startswith("function-") and isinstance(node.get("schema"), dict) \
            and node["schema"].get("type") == "model":
        raise TypeError(f"{node['schema'].get('cls')} has a model validator: it cannot be validated into plain data")
    return {key: _plain_schema(value) for key, value in node.items()}


def _plain_model(node: SchemaNode) -> SchemaNode:
    """A model's schema as the schema of a typed dict of the same fields; TypeError for a model whose
    validation does more than check its fields (its own ``__init__``, validators, computed fields,
    aliases, frozen fields, extra fields other than ignored)."""
    fields = node["schema"]
    if (node.get("custom_init") or node.get("root_model") or node.get("post_init")
            or fields.get("type") != "model-fields" or fields.get("model_validators")
            or fields.get("computed_fields")):
        raise TypeError(f"{node.get('cls')} cannot be validated into plain data")
    plain_fields = {name: _plain_field(node, name, spec) for name, spec in fields["fields"].items()}
    extra = node.get("config", {}).get("extra_fields_behavior", "ignore")
    if extra != "ignore":
        raise TypeError(f"{node.get('cls')} has extra={extra!r}: only 'ignore' is supported")
    # the model's config goes along: settings such as strictness apply to the fields as before
    return {"type": "typed-dict", "fields": plain_fields, "extra_behavior": "ignore",
            **{key: node[key] for key in ("ref", "config") if key in node}}


def _plain_field(model: SchemaNode, name: str, spec: SchemaNode) -> SchemaNode:
    if spec.get("validation_alias") is not None or spec.get("frozen"):
        raise TypeError(f"{model.get('cls')}.{name} cannot be validated into plain data")
    schema = spec["schema"]
    return {"type": "typed-dict-field", "schema": _plain_schema(schema), "required": schema.get("type") != "default"}
