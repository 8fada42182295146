"""Cluster scoping of stage outputs and stage keys (see :mod:`stream_jobs.clusters`).

Node names and pod uids are unique only within a cluster: a stage's key and the deterministic ids
of what it emits (``window_id``, alert ``id``) are scoped by :func:`schemas.messages.scoped_key`,
and every output carries its cluster. In the ``default`` cluster nothing changes, so a
single-cluster install keeps its ids, keys and stored rows.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.messages import DEFAULT_CLUSTER, Message, scoped_key
from schemas.outputs import Alert, ClusterCapacity, PodWindow


def node_key(cluster: str, node: str) -> str:
    """The key of one node's stage (and of its records on the internal node-inputs topic)."""
    return scoped_key(cluster, node)


def stamped(cluster: str, outputs: Iterable[Message]) -> list[Message]:
    """``outputs`` of a stage of ``cluster``, carrying it and with cluster-scoped ids. Idempotent:
    an output that carries a cluster already is left as it is."""
    if cluster == DEFAULT_CLUSTER:
        return list(outputs)
    result: list[Message] = []
    for message in outputs:
        if message.cluster != DEFAULT_CLUSTER:
            result.append(message)
            continue
        update: dict[str, str] = {"cluster": cluster}
        if isinstance(message, PodWindow | ClusterCapacity):
            update["window_id"] = scoped_key(cluster, message.window_id)
        elif isinstance(message, Alert):
            update["id"] = scoped_key(cluster, message.id)
        result.append(message.model_copy(update=update))
    return result
