"""One Kafka principal per component, and the ACLs each needs: the table, as data.

Every component connects with its own credentials (``GPULENS_KAFKA__SASL_USERNAME`` /
``__SASL_PASSWORD`` from its own Secret) and may do only what its code does: the node agent
writes its three topics and reads none, the watcher writes the cluster's state topics and its
state marks, the stream workers read the inputs and write the outputs, the sink reads what it
stores, the alert forwarder reads the alerts. A compromised GPU node can then write samples and
progress for the fleet (which the workers bound, check and dead-letter) but no pod state, no
stream-job state and no output.

:func:`component_access` is the one declaration; docs/operations.md prints it as ``kafka-acls``
commands (:func:`kafka_acls_commands`, a test checks the two agree) and the ACL test applies it
to a broker with SASL/SCRAM and the StandardAuthorizer (:func:`acl_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.settings import AlertForwardSettings, SinkSettings
from schemas.topics import (
    ALERTS,
    CLUSTER_CAPACITY,
    DEADLETTER,
    DEFAULT_PREFIX,
    GPU_SAMPLES,
    INTERNAL_CLUSTER_INPUTS,
    INTERNAL_CONTROL,
    INTERNAL_NODE_INPUTS,
    K8S_EVENTS,
    K8S_NODES,
    K8S_PODS,
    K8S_WORKLOADS,
    POD_LIFECYCLE,
    POD_WINDOWS,
    WORKLOAD_ALLOCATOR,
    WORKLOAD_PROGRESS,
    TopicSpec,
)

Resource = Literal["topic", "group"]
Pattern = Literal["literal", "prefixed"]
Operation = Literal["READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"]

COMPONENTS = ("topics", "agent", "watcher", "worker", "sink", "alerts-forward")
"""Each runs as its own principal, ``User:gpulens-<component>`` unless named otherwise."""

WORKER_INPUTS: tuple[TopicSpec, ...] = (K8S_NODES, K8S_PODS, K8S_EVENTS, WORKLOAD_PROGRESS, GPU_SAMPLES,
                                        K8S_WORKLOADS, WORKLOAD_ALLOCATOR)
"""What the stream workers read (``stream_jobs.pipeline.INPUT_TOPICS``; a test checks they agree)."""
WORKER_OUTPUTS: tuple[TopicSpec, ...] = (POD_WINDOWS, CLUSTER_CAPACITY, POD_LIFECYCLE, ALERTS)
INTERNAL: tuple[TopicSpec, ...] = (INTERNAL_NODE_INPUTS, INTERNAL_CLUSTER_INPUTS, INTERNAL_CONTROL)
AGENT_WRITES: tuple[TopicSpec, ...] = (GPU_SAMPLES, WORKLOAD_PROGRESS, WORKLOAD_ALLOCATOR)
WATCHER_WRITES: tuple[TopicSpec, ...] = (K8S_PODS, K8S_NODES, K8S_EVENTS, K8S_WORKLOADS, WORKLOAD_PROGRESS,
                                         INTERNAL_CONTROL)
SINK_READS: tuple[TopicSpec, ...] = (GPU_SAMPLES, K8S_PODS, K8S_NODES, K8S_EVENTS, WORKLOAD_PROGRESS, POD_WINDOWS,
                                     CLUSTER_CAPACITY, POD_LIFECYCLE, ALERTS)
"""What the sink stores (``sinks.rows.SINK_TOPICS``; a test checks they agree)."""
FORWARDER_READS: tuple[TopicSpec, ...] = (ALERTS, K8S_PODS)
"""The alert transitions, and the pod states for each alert's team label."""
READER_GROUP_PREFIX = "gpulens-reader-"
"""The group id prefix of ``common.kafka.TopicFollower`` (it commits nothing: only looked up)."""


@dataclass(frozen=True)
class Grant:
    """Operations allowed on resources of one kind, named literally or by a prefix."""

    resource: Resource
    names: tuple[str, ...]
    operations: tuple[Operation, ...]
    pattern: Pattern = "literal"
    why: str = ""


@dataclass(frozen=True)
class ComponentAccess:
    component: str
    principal: str
    grants: tuple[Grant, ...]


def _topics(specs: tuple[TopicSpec, ...], prefix: str) -> tuple[str, ...]:
    return tuple(spec.name(prefix) for spec in specs)


def component_access(prefix: str = DEFAULT_PREFIX, app_id: str | None = None,
                     sink_group: str | None = None, forward_group: str | None = None,
                     principals: dict[str, str] | None = None) -> dict[str, ComponentAccess]:
    """Every component's principal and grants, for topic prefix ``prefix``, the workers' faust
    application id ``app_id`` (default ``<prefix>-stream-jobs``: their consumer group and the
    prefix of their changelog and assignor topics), the sink's and the forwarder's consumer groups
    (defaults: their settings' defaults) and principal names by component (default
    ``User:gpulens-<component>``)."""
    app = app_id or f"{prefix}-stream-jobs"
    sink = sink_group or str(SinkSettings.model_fields["group_id"].default)
    forward = forward_group or str(AlertForwardSettings.model_fields["group_id"].default)
    names = {component: f"User:gpulens-{component}" for component in COMPONENTS} | (principals or {})
    grants: dict[str, tuple[Grant, ...]] = {
        "topics": (
            Grant("topic", (f"{prefix}.",), ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"), "prefixed",
                  "gpulens topics create: create and check every topic of the install"),
        ),
        "agent": (
            Grant("topic", _topics(AGENT_WRITES, prefix), ("WRITE",), why="samples, progress and allocator reports"),
        ),
        "watcher": (
            Grant("topic", _topics(WATCHER_WRITES, prefix), ("WRITE", "CREATE", "DESCRIBE_CONFIGS"),
                  why="pod, node, event and workload states, progress from annotations, state marks; "
                      "checks (and creates when missing) its topics at start"),
        ),
        "worker": (
            Grant("topic", _topics(WORKER_INPUTS, prefix), ("READ",), why="the inputs"),
            Grant("topic", _topics((GPU_SAMPLES,), prefix), ("CREATE", "DESCRIBE_CONFIGS"),
                  why="checks (and creates when missing) the samples topic with the node-input partitions"),
            Grant("topic", _topics(INTERNAL, prefix), ("READ", "WRITE", "CREATE", "DESCRIBE_CONFIGS"),
                  why="envelopes between the stages and the watermark marks; created at start"),
            Grant("topic", _topics((*WORKER_OUTPUTS, DEADLETTER), prefix), ("WRITE",),
                  why="windows, capacity, lifecycle, alerts and dead letters"),
            Grant("topic", (f"{app}-",), ("READ", "WRITE", "CREATE", "DESCRIBE_CONFIGS"), "prefixed",
                  "the stages' changelog topics and faust's assignor topic"),
            Grant("group", (app,), ("READ",), why="the workers' consumer group"),
        ),
        "sink": (
            Grant("topic", _topics(SINK_READS, prefix), ("READ", "DESCRIBE_CONFIGS"),
                  why="what it stores; checks them at start"),
            Grant("topic", _topics((DEADLETTER,), prefix), ("WRITE", "DESCRIBE_CONFIGS"),
                  why="records the store refuses"),
            Grant("group", (sink,), ("READ",), why="the sink's consumer group"),
        ),
        "alerts-forward": (
            Grant("topic", _topics(FORWARDER_READS, prefix), ("READ",), why="alert transitions; pod teams"),
            Grant("topic", _topics((DEADLETTER,), prefix), ("WRITE",), why="undeliverable transitions"),
            Grant("group", (forward,), ("READ",), why="the forwarder's consumer group"),
            Grant("group", (READER_GROUP_PREFIX,), ("DESCRIBE",), "prefixed",
                  "the pod-state reader's group (assigned partitions, no offsets committed)"),
        ),
    }
    return {component: ComponentAccess(component, names[component], grants[component]) for component in COMPONENTS}


def acl_rows(access: ComponentAccess) -> list[tuple[Resource, str, Pattern, str, Operation]]:
    """One (resource, name, pattern, principal, operation) row per ACL binding to create (allow,
    any host)."""
    return [(grant.resource, name, grant.pattern, access.principal, operation)
            for grant in access.grants for name in grant.names for operation in grant.operations]


def kafka_acls_commands(access: dict[str, ComponentAccess]) -> list[str]:
    """The ``kafka-acls.sh`` commands that create ``access``, one per grant, each a shell command
    over several lines (``$ADMIN``: the admin's ``--bootstrap-server ... --command-config ...``)."""
    commands = []
    for component in access.values():
        for grant in component.grants:
            head = f"kafka-acls.sh $ADMIN --add --allow-principal {component.principal}"
            head += "".join(f" --operation {_cli_operation(op)}" for op in grant.operations)
            if grant.pattern == "prefixed":
                head += " --resource-pattern-type prefixed"
            lines = [head, *(f"  --{grant.resource} {name}" for name in grant.names)]
            commands.append(" \\\n".join(lines))
    return commands


def _cli_operation(operation: Operation) -> str:
    return "".join(word.capitalize() for word in operation.split("_"))
