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

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from schemas.codec import MessageError, decode
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
from schemas.outputs import DeadLetter
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
from stream_jobs.node_stage import NodeStage
from stream_jobs.scoping import node_key
from stream_jobs.timeutil import epoch, iso

INPUT_TOPICS: tuple[TopicSpec, ...] = (K8S_NODES, K8S_PODS, K8S_EVENTS, WORKLOAD_PROGRESS, GPU_SAMPLES, K8S_WORKLOADS,
                                       WORKLOAD_ALLOCATOR)
_BY_SUFFIX = {spec.suffix: spec for spec in INPUT_TOPICS}
COMPACTED_SUFFIXES = {K8S_PODS.suffix, K8S_NODES.suffix, K8S_WORKLOADS.suffix}


class TombstoneSkipped(Exception):
    """A compacted topic's delete marker: not an error, nothing to do (the state said ``deleted``)."""


def decode_record(suffix: str, value: bytes | None) -> Message:
    """Decode one input record; raises :class:`MessageError` (dead-letter it) or :class:`TombstoneSkipped`."""
    spec = _BY_SUFFIX.get(suffix)
    if spec is None:
        raise MessageError(f"not an input topic of the stream jobs: {suffix}")
    if value is None and suffix in COMPACTED_SUFFIXES:
        raise TombstoneSkipped(suffix)
    return decode(value, spec.message)


def event_time_error(message: Message, clock: float, config: EngineConfig) -> str | None:
    """Why an input's event time is out of bounds of the stream's clock (None: it is not).

    ``clock``: the worker's wall clock in live mode, the driver's mark in control mode (replay,
    demo: the tick's time in-process). A record far ahead would wait in a reorder buffer for ever;
    one far behind would be dropped later by retention: both are dead-lettered instead, with this
    reason."""
    ts = epoch(message.ts)  # type: ignore[attr-defined]
    if ts > clock + config.max_skew_s:
        return (f"event time {iso(ts)} is more than {config.max_skew_s:g} s ahead of the stream's clock "
                f"{iso(clock)} (max_skew_s)")
    if ts < clock - config.horizon_s:
        return (f"event time {iso(ts)} is more than {config.horizon_s:g} s behind the stream's clock "
                f"{iso(clock)} (horizon_s)")
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

    def node_stage(self, key: str, message: GpuSample | PodState | NodeState | WorkloadAllocator) -> NodeStage:
        """The stage of ``message``'s node (``key``: its node key), started by its first input."""
        stage = self.nodes.get(key)
        if stage is None:
            assert message.node is not None
            stage = self.nodes[key] = NodeStage(message.node, self.config, message.cluster)
        return stage

    def feed(self, suffix: str, value: bytes | None, at: datetime, partition: int | None = None,
             offset: int | None = None) -> None:
        self.counters["records"] += 1
        try:
            message = decode_record(suffix, value)
        except TombstoneSkipped:
            self.counters["tombstones"] += 1
            return
        except MessageError as exc:
            self._dead_letter(str(exc), suffix, value, at, partition, offset)
            return
        error = event_time_error(message, epoch(at), self.config)
        if error is not None:
            self._dead_letter(error, suffix, value, at, partition, offset)
            return
        self.submit(message)

    def _dead_letter(self, error: str, suffix: str, value: bytes | None, at: datetime, partition: int | None,
                     offset: int | None) -> None:
        self.counters["deadletters"] += 1
        self.deadletters.append(dead_letter(error, f"{self.topic_prefix}.{suffix}", value, at, partition, offset))

    def submit(self, message: Message) -> None:
        for stage, key in route(message):
            if stage == "node":
                assert key is not None and isinstance(message, GpuSample | PodState | NodeState | WorkloadAllocator)
                self.node_stage(key, message).submit(message)
            else:
                self.cluster.submit(message)

    def _collect(self, produced: Iterable[Message]) -> None:
        for message in produced:
            if is_internal(message):
                self.cluster.submit(message)
            else:
                self.outputs.append(message)

    def advance(self, watermark: float) -> None:
        for name in sorted(self.nodes):
            self._collect(self.nodes[name].advance(watermark))
        self._collect(self.cluster.advance(watermark))

    def flush(self, end: float) -> None:
        for name in sorted(self.nodes):
            self._collect(self.nodes[name].flush(end))
        self._collect(self.cluster.flush(end))

    def stats(self) -> dict[str, Any]:
        late = sum(stage.counters["late_samples"] for stage in self.nodes.values())
        gaps = sum(stage.counters["gaps"] for stage in self.nodes.values())
        return {"deadletters": self.counters["deadletters"], "late_samples_dropped": late, "sample_gaps": gaps}

    # ------------------------------------------------------------------ checkpoint

    def to_dict(self) -> dict[str, Any]:
        """The whole pipeline's state as plain data (what the faust tables hold, per key)."""
        return {
            "nodes": {name: stage.to_dict() for name, stage in sorted(self.nodes.items())},
            "cluster": self.cluster.to_dict(),
            "counters": dict(self.counters),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], config: EngineConfig, topic_prefix: str = "gpulens") -> LocalPipeline:
        pipeline = cls(config, topic_prefix)
        pipeline.nodes = {name: NodeStage.from_dict(state, config) for name, state in data["nodes"].items()}
        pipeline.cluster = ClusterStages.from_dict(data["cluster"], config)
        pipeline.counters = dict(data["counters"])
        return pipeline
