"""The topic registry: every gpulens topic's name, key, message type and Kafka settings.

Names live under a configurable prefix (default ``gpulens``) so several installs can share one
Kafka cluster. Compacted topics hold the latest state per key (pods, nodes); the others are
time-bounded streams.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

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
from schemas.outputs import Alert, ClusterCapacity, DeadLetter, PodLifecycle, PodWindow

DEFAULT_PREFIX = "gpulens"
_DAY_MS = 24 * 3600 * 1000
COMPACTION_LAG_S = 24 * 3600
"""``min.compaction.lag.ms`` of the compacted topics, in seconds: a state stays readable for a day
(the stream jobs' default horizon_s) before compaction may replace it, so a worker lagging less
never misses one, and a hole in a compacted topic after a younger record is a consumer's skip,
not compaction (stream_jobs.offsets)."""


@dataclass(frozen=True)
class TopicSpec:
    """One topic's contract. ``suffix`` is the name without the install prefix."""

    suffix: str
    key: str
    message: type[Message]
    partitions: int
    cleanup_policy: str  # "delete" or "compact"
    retention_ms: int
    description: str

    def name(self, prefix: str = DEFAULT_PREFIX) -> str:
        return f"{prefix}.{self.suffix}"

    def kafka_config(self) -> dict[str, str]:
        config = {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms)}
        if self.cleanup_policy == "compact":
            config["min.compaction.lag.ms"] = str(COMPACTION_LAG_S * 1000)
            config["delete.retention.ms"] = str(_DAY_MS)
        return config


GPU_SAMPLES = TopicSpec(
    "gpu.samples.v1", "node", GpuSample, 12, "delete", 3 * _DAY_MS,
    "one NVML sample per node per interval with every GPU and process",
)
K8S_PODS = TopicSpec(
    "k8s.pods.v1", "pod uid", PodState, 6, "compact", -1,
    "full pod state on each change; tombstone on delete",
)
K8S_NODES = TopicSpec(
    "k8s.nodes.v1", "node", NodeState, 3, "compact", -1,
    "GPU capacity, labels, readiness and taints per node",
)
K8S_EVENTS = TopicSpec(
    "k8s.events.v1", "involved uid", K8sEvent, 3, "delete", 7 * _DAY_MS,
    "scheduling failures, evictions, preemptions, OOM kills",
)
K8S_WORKLOADS = TopicSpec(
    "k8s.workloads.v1", "workload uid", WorkloadState, 3, "compact", -1,
    "queued and admitted Kueue workloads with their GPU demand; tombstone on delete",
)
WORKLOAD_PROGRESS = TopicSpec(
    "workload.progress.v1", "pod uid", WorkloadProgress, 3, "delete", 7 * _DAY_MS,
    "counters workloads report (steps, tokens, samples)",
)
WORKLOAD_ALLOCATOR = TopicSpec(
    "workload.allocator.v1", "pod uid", WorkloadAllocator, 3, "delete", 7 * _DAY_MS,
    "caching-allocator statistics workloads report per device (reserved, allocated, retries, OOMs)",
)
POD_WINDOWS = TopicSpec(
    "pod.windows.v1", "pod uid", PodWindow, 6, "delete", 7 * _DAY_MS,
    "per pod, per GPU, per window utilisation and cost",
)
CLUSTER_CAPACITY = TopicSpec(
    "cluster.capacity.v1", "cluster", ClusterCapacity, 1, "delete", 7 * _DAY_MS,
    "per window cluster capacity and fragmentation",
)
POD_LIFECYCLE = TopicSpec(
    "pod.lifecycle.v1", "pod uid", PodLifecycle, 3, "delete", 30 * _DAY_MS,
    "one record when a GPU pod ends",
)
ALERTS = TopicSpec(
    "alerts.v1", "alert id", Alert, 3, "delete", 30 * _DAY_MS,
    "alert transitions (firing / resolved)",
)
DEADLETTER = TopicSpec(
    "deadletter.v1", "original key", DeadLetter, 1, "delete", 14 * _DAY_MS,
    "rejected input with the reason and source position",
)

ALL_TOPICS: tuple[TopicSpec, ...] = (
    GPU_SAMPLES,
    K8S_PODS,
    K8S_NODES,
    K8S_EVENTS,
    WORKLOAD_PROGRESS,
    POD_WINDOWS,
    CLUSTER_CAPACITY,
    POD_LIFECYCLE,
    ALERTS,
    DEADLETTER,
    K8S_WORKLOADS,
    WORKLOAD_ALLOCATOR,
)


# Internal topics of the stream jobs (not part of the public contract, never in ALL_TOPICS):
# envelopes between the route, node and cluster stages, and the watermark control topic.
INTERNAL_NODE_INPUTS = TopicSpec(
    "internal.node-inputs.v1", "node", Message, 12, "delete", 3 * _DAY_MS,
    "internal: decoded inputs and watermark marks for the node stage, keyed by node",
)
INTERNAL_CLUSTER_INPUTS = TopicSpec(
    "internal.cluster-inputs.v1", "cluster", Message, 1, "delete", 3 * _DAY_MS,
    "internal: inputs, node-stage summaries and marks for the cluster stage",
)
INTERNAL_CONTROL = TopicSpec(
    "internal.control.v1", "none", Message, 1, "delete", 3 * _DAY_MS,
    "internal: watermark marks from a replay driver or the worker's clock; done markers",
)
INTERNAL_TOPICS: tuple[TopicSpec, ...] = (INTERNAL_NODE_INPUTS, INTERNAL_CLUSTER_INPUTS, INTERNAL_CONTROL)


def internal_topics(node_input_partitions: int) -> list[TopicSpec]:
    """The internal topics with ``node_input_partitions`` partitions of the node inputs (the one
    setting a deployment sizes: it bounds how many node-stage workers share the work)."""
    return [dataclasses.replace(spec, partitions=node_input_partitions)
            if spec.suffix == INTERNAL_NODE_INPUTS.suffix else spec for spec in INTERNAL_TOPICS]


def node_stage_topics(node_input_partitions: int) -> list[TopicSpec]:
    """The topics a node stage reads partition by partition, with ``node_input_partitions`` each:
    ``gpu.samples.v1`` (read directly) and the internal topics. Partition ``p`` of the samples and
    of node-inputs hold the same nodes (:func:`key_partition`), so they must have one count."""
    return [dataclasses.replace(GPU_SAMPLES, partitions=node_input_partitions), *internal_topics(node_input_partitions)]


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of a record keyed ``key``: librdkafka's default partitioner (CRC-32 of the key),
    which every gpulens producer uses. ``gpu.samples.v1`` is keyed by node key (``<cluster>/<node>``,
    the bare node in the ``default`` cluster), so a node's samples are on partition
    ``key_partition(node key)``, and the stream jobs put its pod and node states on the same
    partition of node-inputs."""
    return zlib.crc32(key) % partitions


def by_suffix(suffix: str) -> TopicSpec:
    for spec in ALL_TOPICS:
        if spec.suffix == suffix:
            return spec
    raise KeyError(f"unknown topic {suffix!r}; known: {', '.join(t.suffix for t in ALL_TOPICS)}")


def spec_for_name(name: str) -> TopicSpec:
    """The spec of a full topic name, whatever its prefix."""
    for spec in ALL_TOPICS:
        if name.endswith("." + spec.suffix):
            return spec
    raise KeyError(f"{name!r} is not a gpulens topic")
