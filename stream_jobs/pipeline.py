"""Routing and the in-process pipeline: the two stages wired together without a broker.

:func:`decode_record` and :func:`route` are what the faust agents do with each record too, so the
in-process replay and the Kafka workers share every rule: records are decoded and validated
through ``schemas.codec`` (a record that fails becomes a :class:`DeadLetter` naming the reason
and the source position, and the stream goes on); pod states go to the cluster stage and, re-keyed
by their node, to that node's stage; node states to both; samples to their node's stage; events,
workload progress and Kueue workload states to the cluster stage. Node-stage outputs that are internal
(:class:`NodeSummary`, :class:`PodUsage`) feed the cluster stage; the rest are the public outputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime

import orjson
from pydantic import ValidationError

from schemas.codec import MAX_MESSAGE_BYTES, ORJSON_INT_RANGE, MessageError, check_key, decode, model_json_validator
from schemas.dead_letters import dead_letter
from schemas.messages import (
    GpuSample,
    K8sEvent,
    Message,
    NodeState,
    PodState,
    WorkloadAllocator,
    WorkloadProgress,
    WorkloadState,
)
from schemas.outputs import DeadLetter, DeadLetterReason
from schemas.topics import (
    GPU_SAMPLES,
    K8S_EVENTS,
    K8S_NODES,
    K8S_PODS,
    K8S_WORKLOADS,
    WORKLOAD_ALLOCATOR,
    WORKLOAD_PROGRESS,
    TopicSpec,
)
from stream_jobs.clusters import ClusterStages
from stream_jobs.config import EngineConfig
from stream_jobs.internal import NodeSummary, PodUsage
from stream_jobs.json_types import JsonDict, JsonObject, as_object, int_map, optional_int, record_map
from stream_jobs.node_stage import NodeStage
from stream_jobs.reorder import Source
from stream_jobs.scoping import node_key
from stream_jobs.stage import Rejected
from stream_jobs.timeutil import epoch, iso

INPUT_TOPICS: tuple[TopicSpec, ...] = (K8S_NODES, K8S_PODS, K8S_EVENTS, WORKLOAD_PROGRESS, GPU_SAMPLES, K8S_WORKLOADS,
                                       WORKLOAD_ALLOCATOR)
_BY_SUFFIX = {spec.suffix: spec for spec in INPUT_TOPICS}
COMPACTED_SUFFIXES = {K8S_PODS.suffix, K8S_NODES.suffix, K8S_WORKLOADS.suffix}


class TombstoneSkipped(Exception):
    """A compacted topic's delete marker: not an error, nothing to do (the state said ``deleted``)."""


def decode_record(suffix: str, value: bytes | None, key: bytes | str | None = None,
                  accept_clusters: frozenset[str] | None = None) -> Message:
    """Decode one input record; raises :class:`MessageError` (dead-letter it, with its ``code``) or
    :class:`TombstoneSkipped`.

    Beyond the contract (``schemas.codec.decode``) a record must be one every part of the stream
    reads the same way (:func:`wire_error`), a sample's ``key`` (when given) must be its node's key,
    and its cluster must be in ``accept_clusters`` (None: any)."""
    spec = _BY_SUFFIX.get(suffix)
    if spec is None:
        raise MessageError(f"not an input topic of the stream jobs: {suffix}")
    if value is None and suffix in COMPACTED_SUFFIXES:
        raise TombstoneSkipped(suffix)
    message = _narrowed_sample(suffix, value)
    if message is None:
        message = decode(value, spec.message)
        assert value is not None  # decode refuses a tombstone where a message is expected
        problem = wire_error(suffix, value, message)
        if problem is not None:
            raise problem
    if accept_clusters is not None and message.cluster not in accept_clusters:
        raise MessageError(f"cluster {message.cluster!r} is not one this worker accepts (GPULENS_ACCEPT_CLUSTERS: "
                           f"{', '.join(sorted(accept_clusters))})", "cluster", DeadLetterReason.UNKNOWN_CLUSTER)
    check_key(key, message)  # a sample keyed by one node that claims another: inconsistent
    return message


def _narrowed_sample(suffix: str, value: bytes | None) -> Message | None:
    """A GPU sample as the contract's narrowed one-pass validator (``schemas.codec.model_json_validator``,
    the first path of ``schemas.codec.decode``) reads it, or None when the record is not a sample, not
    bytes within the size limit, or refused (:func:`decode` and :func:`wire_error` then give the verdict).

    A sample it accepts passes :func:`wire_error` by construction, so the check is not run: for a
    sample that check is only that every number lies within what orjson writes and reads back (the
    stages checkpoint the sample through orjson; it is not forwarded as bytes), and that validator
    bounds every integer of the schema to orjson's range and refuses every float that is not finite.
    The check's byte search costs about a sixth of decoding a GPU sample."""
    if suffix != GPU_SAMPLES.suffix or not isinstance(value, bytes) or len(value) > MAX_MESSAGE_BYTES:
        return None
    validator = model_json_validator(GpuSample)
    if validator is None:
        return None
    try:
        message: GpuSample = validator.validate_json(value)
    except ValidationError:
        return None
    return message


_SUSPECT = re.compile(rb"[:\[,]\s*+-?(?:\d{19}|\d++(?:\.\d*+)?+[eE]|[NI])")
"""A JSON number (or token) that may read differently in another JSON reader: 19 digits or more
(beyond 64 bits, or near), an exponent (``1e400`` is infinite, ``1e20`` an integer beyond 64 bits
in an integer field), ``NaN`` / ``Infinity``. Records without one (nearly all) skip the walk below.
Possessive quantifiers: what follows each run (``-``, a digit, ``.``, ``e``) cannot be in it, so
giving characters back never finds a match, and the search does not try (about a quarter faster)."""


def _byte_classes() -> bytes:
    """A ``bytes.translate`` table onto what :data:`_SUSPECT` tells apart: ``0`` a digit, ``,`` one of
    ``:[,``, a space any ASCII whitespace (``\\s``), ``e`` either exponent letter, ``N`` ``N`` or ``I``,
    ``-`` and ``.`` themselves, ``x`` any other byte."""
    table = bytearray(b"x" * 256)
    for chars, cls in ((b"0123456789", b"0"), (b":[,", b","), (b" \t\n\r\x0b\x0c", b" "), (b"eE", b"e"),
                       (b"NI", b"N"), (b"-", b"-"), (b".", b".")):
        for char in chars:
            table[char] = cls[0]
    return bytes(table)


_CLASSES = _byte_classes()
_SUSPECT_CLASSES = re.compile(rb",[ ]*+-?(?:0{19}|0++(?:\.0*+)?+e|N)")
""":data:`_SUSPECT` over bytes translated by :data:`_CLASSES`: it matches where that matches."""


def _suspect(value: bytes) -> bool:
    """Whether :data:`_SUSPECT` finds a number in ``value``, in a third of the time: over the byte classes,
    with each separator before a byte of class ``x`` (a string, an object, ``true``: no match goes on
    over one) made ``x`` first, so that the search tries only at the few that are left, before numbers
    (a search's cost is in its tries: one at each separator of the raw bytes)."""
    classes = value.translate(_CLASSES).replace(b",x", b"xx")
    return _SUSPECT_CLASSES.search(classes) is not None


def wire_error(suffix: str, value: bytes, message: Message) -> MessageError | None:
    """Why a decoded record cannot go on through the stream exactly as decoded (None: it can).

    The stages keep and forward what they read as JSON through orjson (the route's copies to the
    stages, checkpoints): every integer must lie within what orjson reads as an integer and every
    float must be finite, and a record the route forwards must be one orjson reads at all (pydantic's
    parser reads ``NaN``, ``1e400``, integers beyond 64 bits; orjson refuses or rounds them). Holds
    whatever bounds the contract itself declares."""
    if not _suspect(value):
        return None
    if suffix != GPU_SAMPLES.suffix:  # forwarded by the route: re-read with orjson by the stages
        try:
            orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            text = str(exc)
            numeric = "infinity" in text or b"NaN" in value or b"Infinity" in value
            if numeric:
                return MessageError(f"a number JSON readers disagree on: {text}", code=DeadLetterReason.OUT_OF_RANGE)
            return MessageError(f"not valid JSON: {text}")
    path = _out_of_range(message.model_dump(), "")
    if path is None:
        return None
    where, number = path
    return MessageError(f"{number!r} is not a finite number within 64 bits", where, DeadLetterReason.OUT_OF_RANGE)


def _out_of_range(value: object, path: str) -> tuple[str, int | float] | None:
    """The first (path, number) in ``value`` (a model's ``model_dump``: any value, only numbers and
    containers are looked into) that is an integer beyond orjson's range or a float that is not finite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        low, high = ORJSON_INT_RANGE
        return None if low <= value <= high else (path, value)
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, dict):
        items: Iterable[tuple[object, object]] = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for name, item in items:
        found = _out_of_range(item, f"{path}.{name}" if path else str(name))
        if found is not None:
            return found
    return None


def event_time_error(message: Message, clock: float, config: EngineConfig) -> MessageError | None:
    """Why an input's event time is out of bounds of the stream's clock (None: it is not); its
    ``code`` is ``too_far_ahead`` or ``too_old``.

    ``clock``: the worker's wall clock in live mode, the driver's mark in control mode (replay,
    demo: the tick's time in-process). A record far ahead would wait in a reorder buffer for ever;
    one far behind would be dropped later by retention: both are dead-lettered instead, with this
    reason."""
    ts = epoch(message.ts)  # type: ignore[attr-defined]
    if ts > clock + config.max_skew_s:
        return MessageError(f"event time {iso(ts)} is more than {config.max_skew_s:g} s ahead of the stream's clock "
                            f"{iso(clock)} (max_skew_s)", code=DeadLetterReason.TOO_FAR_AHEAD)
    if ts < clock - config.horizon_s:
        return MessageError(f"event time {iso(ts)} is more than {config.horizon_s:g} s behind the stream's clock "
                            f"{iso(clock)} (horizon_s)", code=DeadLetterReason.TOO_OLD)
    return None


def route(message: Message) -> list[tuple[str, str | None]]:
    """Where a decoded input goes: ``("node", node key)`` (``stream_jobs.scoping.node_key``: the node
    within its cluster) and/or ``("cluster", None)``."""
    if isinstance(message, GpuSample):
        return [("node", node_key(message.cluster, message.node))]
    if isinstance(message, PodState):
        targets: list[tuple[str, str | None]] = [("cluster", None)]
        if message.node:
            targets.insert(0, ("node", node_key(message.cluster, message.node)))
        return targets
    if isinstance(message, NodeState):
        return [("node", node_key(message.cluster, message.node)), ("cluster", None)]
    if isinstance(message, WorkloadAllocator):
        return [("node", node_key(message.cluster, message.node))]
    if isinstance(message, K8sEvent | WorkloadProgress | WorkloadState | NodeSummary | PodUsage):
        return [("cluster", None)]
    raise TypeError(f"no route for {type(message).__name__}")


def is_internal(message: Message) -> bool:
    return isinstance(message, NodeSummary | PodUsage)


class LocalPipeline:
    """Both stages in one process. Feed records, then ``advance`` the watermark; outputs accumulate."""

    def __init__(self, config: EngineConfig, topic_prefix: str = "gpulens") -> None:
        self.config = config
        self.topic_prefix = topic_prefix
        self.nodes: dict[str, NodeStage] = {}
        self.cluster = ClusterStages(config)
        self.outputs: list[Message] = []
        self.deadletters: list[DeadLetter] = []
        self.counters: dict[str, int] = {"records": 0, "tombstones": 0, "deadletters": 0}
        self._rejected_seen: set[tuple[str | int | None, ...]] = set()
        self._at = datetime.fromtimestamp(0, UTC)
        """The time of the last record fed (a dead letter's ``at``)."""

    def node_stage(self, key: str, message: GpuSample | PodState | NodeState | WorkloadAllocator) -> NodeStage:
        """The stage of ``message``'s node (``key``: its node key), started by its first input."""
        stage = self.nodes.get(key)
        if stage is None:
            assert message.node is not None
            stage = self.nodes[key] = NodeStage(message.node, self.config, message.cluster)
        return stage

    def feed(self, suffix: str, value: bytes | None, at: datetime, partition: int | None = None,
             offset: int | None = None, key: bytes | str | None = None) -> None:
        self.counters["records"] += 1
        try:
            message = decode_record(suffix, value, key, self.config.accept_clusters)
        except TombstoneSkipped:
            self.counters["tombstones"] += 1
            return
        except MessageError as exc:
            self._dead_letter(str(exc), f"{self.topic_prefix}.{suffix}", value, at, partition, offset, exc.code)
            return
        error = event_time_error(message, epoch(at), self.config)
        if error is not None:
            self._dead_letter(str(error), f"{self.topic_prefix}.{suffix}", value, at, partition, offset, error.code)
            return
        self._at = at
        self.submit(message, [f"{self.topic_prefix}.{suffix}", partition, offset, self.counters["records"]])

    def _dead_letter(self, error: str, topic: str, value: bytes | None, at: datetime, partition: int | None,
                     offset: int | None, reason: DeadLetterReason = DeadLetterReason.INVALID) -> None:
        self.counters["deadletters"] += 1
        self.deadletters.append(dead_letter(error, topic, value, at, partition, offset, reason))

    def submit(self, message: Message, source: Source | None = None) -> None:
        """``source``: where ``message`` came from (named by its dead letter should a stage fail to
        apply it): ``[topic, partition, offset, n]``, ``n`` the record's number in this pipeline."""
        if type(message) is GpuSample:  # most inputs: :func:`route`'s first case, without its list
            self.node_stage(node_key(message.cluster, message.node), message).submit(message, source)
            return
        for stage, key in route(message):
            if stage == "node":
                assert key is not None and isinstance(message, GpuSample | PodState | NodeState | WorkloadAllocator)
                self.node_stage(key, message).submit(message, source)
            else:
                self.cluster.submit(message, source)

    def _collect(self, produced: Iterable[Message]) -> None:
        for message in produced:
            if is_internal(message):
                self.cluster.submit(message)
            else:
                self.outputs.append(message)

    def _collect_rejected(self, rejected: Iterable[Rejected]) -> None:
        """Dead-letter the inputs a stage did not apply, once per record (a pod state goes to two
        stages; through Kafka both letters name one source and count once)."""
        for r in rejected:
            if r.source is None:  # an internal input (a node stage's summary): logged by the stage
                continue
            identity = tuple(r.source)
            if identity in self._rejected_seen:
                continue
            self._rejected_seen.add(identity)
            topic, partition, offset = r.source[0], optional_int(r.source[1]), optional_int(r.source[2])
            self._dead_letter(r.error, str(topic), r.value, self._at, partition, offset, r.reason)

    def advance(self, watermark: float) -> None:
        for name in sorted(self.nodes):
            stage = self.nodes[name]
            self._collect(stage.advance(watermark))
            self._collect_rejected(stage.take_rejected())
        self._collect(self.cluster.advance(watermark))
        self._collect_rejected(self.cluster.take_rejected())

    def flush(self, end: float) -> None:
        for name in sorted(self.nodes):
            stage = self.nodes[name]
            self._collect(stage.flush(end))
            self._collect_rejected(stage.take_rejected())
        self._collect(self.cluster.flush(end))
        self._collect_rejected(self.cluster.take_rejected())

    def stats(self) -> dict[str, int]:
        late = sum(stage.counters["late_samples"] for stage in self.nodes.values())
        gaps = sum(stage.counters["gaps"] for stage in self.nodes.values())
        return {"deadletters": self.counters["deadletters"], "late_samples_dropped": late, "sample_gaps": gaps}

    # ------------------------------------------------------------------ checkpoint

    def to_dict(self) -> JsonDict:
        """The whole pipeline's state as plain data (what the faust tables hold, per key)."""
        return {
            "nodes": {name: stage.to_dict() for name, stage in sorted(self.nodes.items())},
            "cluster": self.cluster.to_dict(),
            "counters": dict(self.counters),
        }

    @classmethod
    def from_dict(cls, data: JsonObject, config: EngineConfig, topic_prefix: str = "gpulens") -> LocalPipeline:
        pipeline = cls(config, topic_prefix)
        pipeline.nodes = record_map(data["nodes"], lambda state: NodeStage.from_dict(state, config))
        pipeline.cluster = ClusterStages.from_dict(as_object(data["cluster"]), config)
        pipeline.counters = int_map(data["counters"])
        for stage in [*pipeline.nodes.values(), *pipeline.cluster.stages.values()]:  # not restorable: letters
            pipeline._collect_rejected(stage.take_rejected())
        return pipeline
