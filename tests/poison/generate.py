"""Hostile records for every input topic of the stream jobs, each labelled with its expected verdict.

Every record starts from a realistic example (``schemas.examples.all_examples``, with the optional
fields a real agent or watcher sets filled in) and changes **one** thing. The label comes from the
contract's bounds table (``schemas.messages.BOUNDS``) and the reason codes of
``schemas.outputs.DeadLetterReason`` — never from running the code:

- a value exactly at a bound (a string of exactly the cap in code points, with unicode, control
  characters, quotes and backslashes; a list or map of exactly the cap; a number equal to the limit;
  zero) is in bounds: ``applied``;
- one step beyond (one more character or item, ``limit + 1`` or the next float up), a non-finite
  float (``1e400``, and the raw tokens ``NaN`` / ``Infinity``), an integer beyond 64 bits
  (``2^64 + 1``) or below a count's zero: the bound's ``code``;
- a wrong type, a missing field, an unknown enum value, a naive timestamp, garbage bytes, a tombstone
  on a topic that has none: ``invalid``; a tombstone on a compacted topic: ``tombstone`` (skipped,
  no dead letter);
- the same GPU twice in a sample, a sample keyed by another node: ``inconsistent``;
- a cluster outside the allow-list (:data:`ACCEPT_CLUSTERS`): ``unknown_cluster``;
- an event time beyond the stream's ``max_skew_s`` / ``horizon_s`` (``stream_jobs.config``):
  ``too_far_ahead`` / ``too_old``; exactly at them: ``applied``.

Precedence, where one change could break two rules: a record over ``MAX_MESSAGE_BYTES`` is
``too_large`` whatever else it has (``schemas.codec`` measures the bytes before it parses them).
Nothing else combines: each record has one change.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, get_args, get_origin

import orjson
from pydantic import BaseModel

from schemas import examples
from schemas.codec import MAX_MESSAGE_BYTES, encode
from schemas.messages import BOUNDS, DEFAULT_CLUSTER, Bound, Message, scoped_key
from schemas.outputs import DeadLetterReason
from schemas.topics import GPU_SAMPLES
from stream_jobs.config import EngineConfig
from stream_jobs.pipeline import COMPACTED_SUFFIXES, INPUT_TOPICS

APPLIED = "applied"
"""The record is taken: no dead letter names it."""
TOMBSTONE = "tombstone"
"""A compacted topic's delete marker: skipped, no dead letter."""

ACCEPT_CLUSTERS = frozenset({DEFAULT_CLUSTER, "east"})
"""The workers' allow-list in these tests (``GPULENS_ACCEPT_CLUSTERS``)."""
OTHER_CLUSTER = "elsewhere"
ALLOWED_OTHER_CLUSTER = "east"

CONFIG = EngineConfig()
MAX_SKEW_S = CONFIG.max_skew_s
HORIZON_S = CONFIG.horizon_s

INPUT_SUFFIXES = tuple(spec.suffix for spec in INPUT_TOPICS)

HOSTILE_ALPHABET = ("a", "Z", "0", "-", "/", ".", " ", "é", "日", "\u0000", "\u001b", "\u007f", "\u0085",
                    "\u200b", "\u202e", "\ufeff", "\U0001f680", "\U0010fffd", '"', "\\", "<", "&", "[", "%", "\n")
"""Characters of the in-bounds strings: multi-byte UTF-8, C0 and C1 controls, bidi and zero-width
marks, a character outside the BMP (one code point, two UTF-16 units), JSON's escapes, markup."""

DNS_ALPHABET = tuple("abcdefghijklmnopqrstuvwxyz0123456789")
"""A cluster name is a DNS label: its strings are made of these (``-`` only inside)."""

COUNT_ROWS = frozenset({"UINT64_MAX", "UINT32_MAX", "UINT16_MAX", "UINT8_MAX", "percent", "MAX_GPU_COUNT",
                        "MAX_RESOURCES * MAX_GPU_COUNT", "MAX_POD_COUNT", "MAX_GPU_MEMORY_BYTES",
                        "MAX_ALLOCATOR_BYTES", "MAX_ALLOCATOR_COUNT", "MAX_CUDA_DEVICE", "MAX_DURATION_S",
                        "MAX_PROGRESS_TOTAL"})
"""Rows of the table whose numbers are counts, sizes, indexes or percentages: their minimum is 0
(docs/schemas.md: ``out_of_range`` is "a number below its minimum or above its maximum"), so -1 is
out of range and 0 in range. The signed rows (INT64, INT32, FLOAT32_MAX) have no such minimum."""

POSITIVE_FIELDS = frozenset({"GpuSample.sample_interval_s"})
"""Numbers that must be above zero (the committed JSON Schema's ``exclusiveMinimum``; not a row of
the table): zero is not generated for them."""

# --------------------------------------------------------------------------- the bases


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


TS = examples.TS
TS_TEXT = _iso(TS)


def _bases() -> dict[str, Message]:
    """One realistic record per input topic, with the optional fields a real producer sets."""
    ex = examples.all_examples()
    ts = TS_TEXT
    sample = orjson.loads(encode(examples.gpu_sample(gpus=2)))
    gpu = sample["gpus"][0]
    gpu.update(xids=[{"xid": 79, "at": ts, "critical": True, "message": "GPU has fallen off the bus"}],
               clock_event_reasons=["sw_power_cap"], ecc_sbe_volatile_total=3, ecc_dbe_volatile_total=0,
               health_reason="", sm_active_pct=80.0, sm_occupancy_pct=40.0, tensor_active_pct=30.0,
               gr_engine_active_pct=85.0, dram_active_pct=20.0, nvlink_tx_bytes_per_s=1e10,
               nvlink_rx_bytes_per_s=1e10, shared=False)
    mig = {"uuid": "MIG-4e0c2a9b-1111-5c7d-8e9f-0123456789ab", "index": gpu["index"],
           "model": "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "mig_parent_uuid": gpu["uuid"], "mig_profile": "1g.10gb",
           "gpu_instance_id": 13, "compute_instance_id": 0, "mig_placement_start": 6, "gpu_util_pct": 10.0,
           "mem_used_bytes": 2**30, "mem_total_bytes": 10 * 2**30}
    sample["gpus"].append(mig)
    sample["errors"] = ["nvmlDeviceGetPowerUsage: Not Supported"]
    pod = orjson.loads(encode(ex["k8s.pods.v1"]))
    pod.update(labels={"app": "train-llm", "gpulens.io/team": "nlp"}, vram_request_bytes=40 * 2**30,
               priority_class="high", status_reason="", last_termination_reason="OOMKilled", last_exit_code=137,
               restarts=1, finished_at=None)
    pod["containers"][0].update(state_reason="", restart_count=1, last_termination_reason="Error",
                                last_exit_code=-1, last_finished_at=ts)
    pod["conditions"][0].update(reason="Scheduled", message="assigned")
    pod["owners"][0].update(api_version="kubeflow.org/v1")
    node = orjson.loads(encode(ex["k8s.nodes.v1"]))
    node.update(uid="9d3c5b1a-3333-4e5f-8a9b-0123456789ab", gpu_count_label=8, cuda_driver_version="12.4",
                driver_version="550.54.15", mig_strategy="single", labels={"nvidia.com/gpu.product": "H100"})
    event = orjson.loads(encode(ex["k8s.events.v1"]))
    event.update(count=3, source="default-scheduler")
    progress = orjson.loads(encode(ex["workload.progress.v1"]))
    progress.update(samples_total=64000.0)
    workload = orjson.loads(encode(ex["k8s.workloads.v1"]))
    workload.update(cluster_queue="research-cq", wait_s=12.5)
    allocator = orjson.loads(encode(ex["workload.allocator.v1"]))
    raw = {"gpu.samples.v1": sample, "k8s.pods.v1": pod, "k8s.nodes.v1": node, "k8s.events.v1": event,
           "workload.progress.v1": progress, "k8s.workloads.v1": workload, "workload.allocator.v1": allocator}
    specs = {spec.suffix: spec for spec in INPUT_TOPICS}
    return {suffix: specs[suffix].message.model_validate(data) for suffix, data in raw.items()}


BASES: dict[str, Message] = _bases()
assert set(BASES) == set(INPUT_SUFFIXES), "a base record for every input topic of the stream jobs"

# --------------------------------------------------------------------------- the table


def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(re.escape(text).replace(r"\*", ".*") + r"\Z")


_BOUND_PATTERNS: list[tuple[re.Pattern[str], Bound]] = [
    (_pattern(name), bound) for bound in BOUNDS for name in bound.fields if "." in name and " " not in name]
FINITE = next(bound for bound in BOUNDS if bound.kind == "finite")
MESSAGE_SIZE = next(bound for bound in BOUNDS if bound.name == "MAX_MESSAGE_BYTES")
DISTINCT_GPUS = next(bound for bound in BOUNDS if bound.kind == "distinct")
SAMPLE_KEY = next(bound for bound in BOUNDS if bound.kind == "key")


def bounds_of(name: str) -> list[Bound]:
    """The rows of the table that name ``name`` (``Model.field``, ``Model.field{key}``, ...)."""
    return [bound for pattern, bound in _BOUND_PATTERNS if pattern.match(name)]


# --------------------------------------------------------------------------- sites


@dataclass(frozen=True)
class Site:
    """A place in a base record: ``path`` into its JSON, ``name`` as the table names it
    (``Model.field``, ``{key}`` / ``{value}`` for a map's, ``[]`` for a list's items), the example's
    ``value`` there, and what it is (``str``, ``int``, ``float``, ``bool``, ``list``, ``map``,
    ``model``, ``datetime``, ``literal``)."""

    suffix: str
    path: tuple[str | int, ...]
    name: str
    kind: str
    value: Any
    required: bool
    element: Any = None
    """A list's or map's element type (a model class, ``str``, ...)."""


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> ``X``; ``Annotated[X, ...]`` -> ``X``."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is not None and type(None) in get_args(annotation) and len(args) == 1:
        return _unwrap(args[0])
    return annotation


def _kind(annotation: Any) -> tuple[str, Any]:
    annotation = _unwrap(annotation)
    origin = get_origin(annotation)
    if origin is list:
        return "list", get_args(annotation)[0]
    if origin is dict:
        return "map", get_args(annotation)[1]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "model", annotation
    if isinstance(annotation, type) and issubclass(annotation, datetime):
        return "datetime", None
    if annotation in (str, int, float, bool):
        return annotation.__name__, None
    if str(origin) == "typing.Literal" or "Literal" in str(annotation):
        return "literal", None
    return "other", None


def sites(suffix: str) -> list[Site]:
    """Every place of ``suffix``'s base record the mutations below change."""
    found: list[Site] = []

    def walk(model: BaseModel, data: Any, path: tuple[str | int, ...]) -> None:
        cls = type(model)
        for name, info in cls.model_fields.items():
            value: Any = data.get(name)
            kind, element = _kind(info.annotation)
            here = (*path, name)
            label = f"{cls.__name__}.{name}"
            found.append(Site(suffix, here, label, kind, value, info.is_required(), element))
            sub = getattr(model, name)
            if kind == "model" and sub is not None:
                walk(sub, value, here)
            elif kind == "list" and sub:
                if isinstance(sub[0], BaseModel):
                    walk(sub[0], value[0], (*here, 0))
                else:
                    elem_kind, _ = _kind(element)
                    found.append(Site(suffix, (*here, 0), f"{label}[]", elem_kind, value[0], True))
            elif kind == "map" and sub:
                first = next(iter(value))
                found.append(Site(suffix, (*here, first, "<key>"), f"{label}{{key}}", "str", first, True))
                found.append(Site(suffix, (*here, first), f"{label}{{value}}", _kind(element)[0], value[first], True))

    base = BASES[suffix]
    walk(base, base.model_dump(mode="json"), ())
    return found


# --------------------------------------------------------------------------- mutations

RAW = "\u0001RAW\u0001"
"""A placeholder a rendered record carries where a raw JSON token (``NaN``, ``1e400``, an integer
orjson cannot write) goes."""


@dataclass(frozen=True)
class Mutation:
    """One change to one topic's base record, and the verdict the table gives it."""

    suffix: str
    what: str
    expected: str
    change: Callable[[dict[str, Any], str], Any] = field(compare=False, repr=False)
    """``change(data, text)`` edits the record's JSON in place (``text``: hostile characters to build
    strings from); returns a raw JSON token for :data:`RAW`, a new whole value (bytes / None), or None."""
    key: Callable[[dict[str, Any]], str | None] | None = field(default=None, compare=False, repr=False)
    """The record's Kafka key from its final data; None: the producer's key."""
    stream_only: bool = False
    """A check only the stream workers make (allow-list, event time, the sample's key): the sink's
    verdict is not asserted."""


def _set(data: Any, path: tuple[str | int, ...], value: Any) -> None:
    if path and path[-1] == "<key>":  # rename a map key
        *parent, old, _ = path
        holder = _get(data, tuple(parent))
        holder[value] = holder.pop(old)
        return
    holder = _get(data, path[:-1])
    holder[path[-1]] = value


def _get(data: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def _delete(data: Any, path: tuple[str | int, ...]) -> None:
    del _get(data, path[:-1])[path[-1]]


def hostile_text(length: int, seed: str, alphabet: tuple[str, ...] = HOSTILE_ALPHABET) -> str:
    """``length`` code points: ``seed`` (hypothesis' draw) repeated, then filled from ``alphabet``."""
    chars = [c for c in seed if c in alphabet] or list(alphabet)
    if alphabet is DNS_ALPHABET:
        return "".join(chars[i % len(chars)] for i in range(length))
    text = "".join(chars[i % len(chars)] for i in range(length))
    extra = [c for c in alphabet if c not in text]
    if extra and length >= len(extra):
        text = "".join(extra) + text[len(extra):]  # every hostile character at least once
    return text


def _element(site: Site, value: Any) -> Any:
    """A small valid element of a list: a model's required fields only (so that a list at its cap
    stays within the message size where it can), or the example's item."""
    if isinstance(site.element, type) and issubclass(site.element, BaseModel) and isinstance(value, dict):
        required = {n for n, info in site.element.model_fields.items() if info.is_required()}
        return {k: v for k, v in value.items() if k in required}
    return value


def _items(site: Site, count: int, text: str) -> Any:
    """A list or map of ``count`` items at ``site`` (distinct where the contract wants them so)."""
    if site.kind == "map":
        first = next(iter(site.value.values()))
        width = max(len(str(count)), 1)
        return {f"{text[:1] if text[:1].isalnum() else 'k'}{i:0{width}d}": first for i in range(count)}
    item = _element(site, site.value[0])
    if site.name == "GpuSample.gpus":  # each GPU once: its own UUID and index
        return [item | {"uuid": f"GPU-{i:08d}-0000-4000-8000-000000000000", "index": i} for i in range(count)]
    return [item] * count


def _number_text(value: int | float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def _at_limit(site: Site, bound: Bound) -> int | float:
    limit = bound.limit
    assert limit is not None
    if site.kind == "int":
        return int(limit)
    return float(limit)


def _beyond(site: Site, bound: Bound) -> int | float:
    limit = bound.limit
    assert limit is not None
    if site.kind == "int":
        return int(limit) + 1
    return math.nextafter(float(limit), math.inf)


def _mutations_of(site: Site) -> Iterator[Mutation]:
    suffix, path, name = site.suffix, site.path, site.name
    rows = bounds_of(name)
    is_cluster = name.endswith(".cluster")
    map_key = name.endswith("{key}")

    def put(value: Any) -> Callable[[dict[str, Any], str], None]:
        return lambda data, text: _set(data, path, value)

    def put_raw(token: str) -> Callable[[dict[str, Any], str], str]:
        def change(data: dict[str, Any], text: str) -> str:
            _set(data, path, RAW)
            return token
        return change

    for bound in rows:
        if bound.kind == "chars":
            alphabet = DNS_ALPHABET if is_cluster else HOSTILE_ALPHABET
            limit = int(bound.limit or 0)

            def chars(count: int, alphabet: tuple[str, ...] = alphabet) -> Callable[[dict[str, Any], str], None]:
                return lambda data, text: _set(data, path, hostile_text(count, text, alphabet))

            # a cluster name at its cap is a valid name the allow-list does not hold
            yield Mutation(suffix, f"{name}: {limit} characters (at {bound.name})",
                           DeadLetterReason.UNKNOWN_CLUSTER.value if is_cluster else APPLIED, chars(limit),
                           stream_only=is_cluster)
            yield Mutation(suffix, f"{name}: {limit + 1} characters (beyond {bound.name})", bound.code,
                           chars(limit + 1))
        elif bound.kind == "items":
            limit = int(bound.limit or 0)

            def items(count: int) -> Callable[[dict[str, Any], str], None]:
                return lambda data, text: _set(data, path, _items(site, count, text))

            yield Mutation(suffix, f"{name}: {limit} items (at {bound.name})", APPLIED, items(limit))
            yield Mutation(suffix, f"{name}: {limit + 1} items (beyond {bound.name})", bound.code, items(limit + 1))
        elif bound.kind == "max":
            at, beyond = _at_limit(site, bound), _beyond(site, bound)
            yield Mutation(suffix, f"{name} = {_number_text(at)} (at {bound.name})", APPLIED,
                           put_raw(_number_text(at)))
            yield Mutation(suffix, f"{name} = {_number_text(beyond)} (beyond {bound.name})", bound.code,
                           put_raw(_number_text(beyond)))
            if bound.name in COUNT_ROWS:
                yield Mutation(suffix, f"{name} = -1 (below a count's 0)", DeadLetterReason.OUT_OF_RANGE.value,
                               put_raw("-1"))
    if map_key:  # a map's key is a string: its bound is all there is to change
        return
    numeric = site.kind in ("int", "float")
    if numeric:
        big = 2**64 + 1
        limits = [float(b.limit) for b in rows if b.kind == "max" and b.limit is not None]
        if site.kind == "int" or (limits and big > min(limits)):
            expected = DeadLetterReason.OUT_OF_RANGE.value
        else:
            expected = APPLIED  # a float field within its bound: 2^64+1 is an ordinary float there
        yield Mutation(suffix, f"{name} = 2^64+1", expected, put_raw(str(big)))
        yield Mutation(suffix, f"{name} = 1e400", DeadLetterReason.OUT_OF_RANGE.value, put_raw("1e400"))
        if name not in POSITIVE_FIELDS:
            yield Mutation(suffix, f"{name} = 0", APPLIED, put_raw("0"))
    if site.kind == "float":
        # the table's "finite" row: every float; NaN and Infinity are no JSON at all (RFC 8259,
        # docs/schemas.md: refused as invalid JSON), a number that overflows is out of range
        for token in ("NaN", "Infinity", "-Infinity"):
            yield Mutation(suffix, f"{name} = {token} (not JSON)", DeadLetterReason.INVALID.value, put_raw(token))
        yield Mutation(suffix, f"{name} = -1e400 ({FINITE.name})", FINITE.code, put_raw("-1e400"))
    # wrong types: nothing a lax reader may coerce (a list for a scalar, a number for a list or map)
    if site.kind in ("str", "int", "float", "bool", "datetime", "literal"):
        yield Mutation(suffix, f"{name}: a list instead of a {site.kind}", DeadLetterReason.INVALID.value,
                       put([["x"]]))
    elif site.kind in ("list", "map", "model"):
        yield Mutation(suffix, f"{name}: a number instead of a {site.kind}", DeadLetterReason.INVALID.value, put(7))
    if site.kind == "literal":
        yield Mutation(suffix, f"{name}: an unknown value", DeadLetterReason.INVALID.value, put("Bogus"))
    if site.kind == "datetime":
        yield Mutation(suffix, f"{name}: a naive timestamp", DeadLetterReason.INVALID.value,
                       put("2026-01-05T09:00:00"))
    if site.required and site.value is not None and not str(path[-1]).startswith("<") and isinstance(path[-1], str) \
            and not name.endswith(("{value}", "{key}")):
        yield Mutation(suffix, f"{name}: missing", DeadLetterReason.INVALID.value,
                       lambda data, text: _delete(data, path))


def _record_mutations(suffix: str) -> Iterator[Mutation]:
    """Changes to a whole record (not one field)."""
    invalid = DeadLetterReason.INVALID.value

    def whole(value: bytes | None) -> Callable[[dict[str, Any], str], bytes | None]:
        return lambda data, text: value

    yield Mutation(suffix, "unchanged", APPLIED, lambda data, text: None)
    yield Mutation(suffix, "an unknown extra field", APPLIED,
                   lambda data, text: data.update({"x_future_field": hostile_text(64, text)}))
    yield Mutation(suffix, "version 1 (no cluster)", APPLIED, _version_1)
    yield Mutation(suffix, "garbage bytes", invalid, whole(b"\xff\xfe\x00garbage\x80"))
    yield Mutation(suffix, "empty value", invalid, whole(b""))
    yield Mutation(suffix, "a JSON array", invalid, whole(b"[1, 2, 3]"))
    yield Mutation(suffix, "JSON null", invalid, whole(b"null"))
    yield Mutation(suffix, "a JSON string", invalid, whole(b'"pod"'))
    yield Mutation(suffix, "truncated JSON", invalid, lambda data, text: orjson.dumps(data)[:-7])
    yield Mutation(suffix, "10,000 nested arrays", invalid, whole(b"[" * 10_000 + b"]" * 10_000))
    yield Mutation(suffix, "a lone surrogate escape", invalid,
                   lambda data, text: orjson.dumps(data)[:-1] + b',"x":"\\ud800"}')
    yield Mutation(suffix, "a tombstone", TOMBSTONE if suffix in COMPACTED_SUFFIXES else invalid, whole(None))
    yield Mutation(suffix, f"over {MESSAGE_SIZE.name} (padding)", MESSAGE_SIZE.code,
                   lambda data, text: data.update({"pad": "x" * MAX_MESSAGE_BYTES}))
    yield Mutation(suffix, f"exactly {MESSAGE_SIZE.name}", APPLIED, _exactly_max_size)
    yield Mutation(suffix, f"cluster {ALLOWED_OTHER_CLUSTER!r} (allowed)", APPLIED,
                   lambda data, text: data.update(cluster=ALLOWED_OTHER_CLUSTER))
    yield Mutation(suffix, f"cluster {OTHER_CLUSTER!r} (not allowed)", DeadLetterReason.UNKNOWN_CLUSTER.value,
                   lambda data, text: data.update(cluster=OTHER_CLUSTER), stream_only=True)
    # event time against the stream's clock (the tick the record is fed at: see render)
    for what, offset_s, code in (
            ("at max_skew_s ahead", MAX_SKEW_S, APPLIED),
            ("beyond max_skew_s ahead", MAX_SKEW_S + 1, DeadLetterReason.TOO_FAR_AHEAD.value),
            ("at horizon_s behind", -HORIZON_S, APPLIED),
            ("beyond horizon_s behind", -HORIZON_S - 1, DeadLetterReason.TOO_OLD.value)):
        yield Mutation(suffix, f"ts {what}", code, _shift_ts(offset_s), stream_only=True)
    for what, when, code in (("1970", "1970-01-01T00:00:00Z", DeadLetterReason.TOO_OLD.value),
                             ("2100", "2100-01-01T00:00:00Z", DeadLetterReason.TOO_FAR_AHEAD.value),
                             ("9999-12-31", "9999-12-31T23:59:59Z", DeadLetterReason.TOO_FAR_AHEAD.value)):
        yield Mutation(suffix, f"ts {what}", code, _set_ts(when), stream_only=True)
    if suffix == GPU_SAMPLES.suffix:
        inconsistent = DISTINCT_GPUS.code
        yield Mutation(suffix, "a GPU's UUID twice (another index)", inconsistent,
                       lambda data, text: data["gpus"].append(data["gpus"][0] | {"index": 77}))
        yield Mutation(suffix, "a GPU's index twice (another UUID)", inconsistent,
                       lambda data, text: data["gpus"].append(data["gpus"][0] | {"uuid": "GPU-other"}))
        yield Mutation(suffix, "200 readings of one GPU", inconsistent,
                       lambda data, text: data.update(gpus=[data["gpus"][0]] * 200))
        yield Mutation(suffix, "a second MIG device on its parent's index", APPLIED,
                       lambda data, text: data["gpus"].append(data["gpus"][2] | {"uuid": "MIG-second",
                                                                                 "gpu_instance_id": 14}))
        yield Mutation(suffix, "keyed by another node", SAMPLE_KEY.code, lambda data, text: None,
                       key=lambda data: "gpu-other", stream_only=True)
        yield Mutation(suffix, "keyed by its node in another cluster's scope", SAMPLE_KEY.code,
                       lambda data, text: None, key=lambda data: f"east/{data.get('node')}", stream_only=True)
        yield Mutation(suffix, "keyless", APPLIED, lambda data, text: None, key=lambda data: None)


def _set_ts(when: str) -> Callable[[dict[str, Any], str], None]:
    return lambda data, text: data.update(ts=when)


def _version_1(data: dict[str, Any], text: str) -> None:
    data.pop("cluster", None)
    data["schema_version"] = 1


def _shift_ts(offset_s: float) -> Callable[[dict[str, Any], str], None]:
    def change(data: dict[str, Any], text: str) -> None:
        at = datetime.fromisoformat(data["ts"].replace("Z", "+00:00"))
        data["ts"] = _iso(at + timedelta(seconds=offset_s))
    return change


def _exactly_max_size(data: dict[str, Any], text: str) -> bytes:
    """The record padded by an unknown field to exactly the message cap."""
    data["pad"] = ""
    room = MAX_MESSAGE_BYTES - len(orjson.dumps(data))
    data["pad"] = "x" * room
    value = orjson.dumps(data)
    assert len(value) == MAX_MESSAGE_BYTES
    return value


def mutations(suffix: str) -> list[Mutation]:
    return [*_record_mutations(suffix), *(m for site in sites(suffix) for m in _mutations_of(site))]


CATALOGUE: list[Mutation] = [m for suffix in INPUT_SUFFIXES for m in mutations(suffix)]
"""Every mutation of every input topic, in a fixed order (hypothesis draws indexes into it)."""

# --------------------------------------------------------------------------- rendering


@dataclass(frozen=True)
class Case:
    """One hostile record, ready to feed: its topic suffix, Kafka key and value, and its label."""

    suffix: str
    key: str | None
    value: bytes | None
    expected: str
    what: str
    stream_only: bool

    def describe(self) -> str:
        size = "tombstone" if self.value is None else f"{len(self.value)} bytes"
        head = "" if self.value is None else f": {self.value[:160]!r}"
        return f"{self.suffix} [{self.what}] key={self.key!r} ({size}) expected {self.expected}{head}"


def _retime(node: Any, at_text: str) -> Any:
    """Every timestamp of the example moved to ``at``."""
    if isinstance(node, dict):
        return {k: _retime(v, at_text) for k, v in node.items()}
    if isinstance(node, list):
        return [_retime(v, at_text) for v in node]
    return at_text if node == TS_TEXT else node


def _producer_key(suffix: str, data: Any) -> str | None:
    """The key a gpulens producer gives the record: a sample's node, a state's uid (scoped)."""
    if not isinstance(data, dict):
        return None
    cluster = data.get("cluster", DEFAULT_CLUSTER)
    cluster = cluster if isinstance(cluster, str) else DEFAULT_CLUSTER
    field_name = {"gpu.samples.v1": "node", "k8s.nodes.v1": "node"}.get(suffix, "uid")
    if suffix in ("workload.progress.v1", "workload.allocator.v1"):
        field_name = "pod_uid"
    value = data.get(field_name)
    if not isinstance(value, str):
        return None
    return scoped_key(cluster, value)


def render(mutation: Mutation, at: datetime, text: str = "") -> Case:
    """``mutation`` applied to its topic's base record whose times are ``at`` (the tick it is fed
    at); labelled, with the size rule applied last."""
    data = _retime(BASES[mutation.suffix].model_dump(mode="json"), _iso(at))
    data = orjson.loads(encode(BASES[mutation.suffix].model_validate(data)))
    result = mutation.change(data, text)
    key = _producer_key(mutation.suffix, data)
    value: bytes | None
    if isinstance(result, bytes) or (result is None and mutation.what in ("a tombstone",)):
        value = result
    elif isinstance(result, str):
        value = orjson.dumps(data).replace(orjson.dumps(RAW), result.encode())
    else:
        value = orjson.dumps(data)
    if mutation.key is not None:
        key = mutation.key(data)
    elif mutation.what == "a tombstone" and mutation.suffix not in COMPACTED_SUFFIXES:
        key = key or "tombstone"
    expected = mutation.expected
    if value is not None and len(value) > MAX_MESSAGE_BYTES:
        expected = MESSAGE_SIZE.code
    return Case(mutation.suffix, key, value, expected, mutation.what, mutation.stream_only)


def seeded_cases(seed: int, count: int, at: Callable[[int], datetime], ticks: int,
                 pool: list[Mutation] | None = None) -> list[tuple[int, Case]]:
    """``count`` cases drawn with ``random.Random(seed)`` from ``pool`` (default: the catalogue):
    (tick, case), for the Kafka test's seeded sets."""
    rng = random.Random(seed)
    chosen: list[tuple[int, Case]] = []
    for _ in range(count):
        mutation = rng.choice(pool or CATALOGUE)
        tick = rng.randrange(1, ticks - 1)
        text = "".join(rng.choice(HOSTILE_ALPHABET) for _ in range(rng.randrange(1, 6)))
        chosen.append((tick, render(mutation, at(tick), text)))
    return chosen
