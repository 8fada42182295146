"""The records of ``<prefix>.internal.control.v1`` that producers write: state marks.

The stream workers read the control topic for event-time progress. Three kinds of record travel
on it (``k``): a watermark mark ``m`` (a replay driver's, or a live worker's clock), a ``done``
marker (the cluster stage, after a replay's end mark) and the **state mark** ``s`` defined here,
which the cluster watcher writes about once a second:

    {"k": "s", "seq": int, "ts": epoch seconds, "cluster": str, "off": {"<topic>:<partition>": offset}}

It says: every pod and node change the watcher observed before ``ts`` has been written to
``k8s.pods.v1`` / ``k8s.nodes.v1`` at or below these offsets (the last one delivered per partition).
A live worker forwards it, once those offsets are consumed, to every node stage, which may then
run a node's rules up to that node's own latest sample instead of waiting out the allowed lateness
for every node of the fleet (``docs/stream_jobs.md``, "Event time per node"): pod state has its own
progress signal, so a node's rules never act on pod state older than its samples.

``seq`` grows strictly (wall-clock microseconds), also across watcher restarts.
"""

from __future__ import annotations

import threading
import time

import orjson

from schemas.topics import K8S_NODES, K8S_PODS, TopicSpec

STATE_MARK_KIND = "s"
STATE_TOPICS: tuple[TopicSpec, ...] = (K8S_PODS, K8S_NODES)
"""The inputs a state mark covers: the pod and node state the node stages join samples with."""


def state_mark_value(seq: int, ts: float, cluster: str, offsets: dict[str, int]) -> bytes:
    return orjson.dumps({"k": STATE_MARK_KIND, "seq": seq, "ts": ts, "cluster": cluster, "off": offsets})


class DeliveredOffsets:
    """The last offset delivered per ``topic:partition`` of the topics named in ``topics`` (None:
    every topic but those in ``exclude``) (a producer's ``on_delivery_report``), and the numbering
    of the marks written about them: strictly increasing, also across restarts (wall-clock based)."""

    def __init__(self, topics: set[str] | None, exclude: frozenset[str] = frozenset()) -> None:
        self.topics, self.exclude = topics, exclude
        self._offsets: dict[str, int] = {}
        self._lock = threading.Lock()
        self._seq = 0

    def __call__(self, topic: str, partition: int, offset: int, ok: bool) -> None:
        if not ok or (self.topics is not None and topic not in self.topics) or topic in self.exclude:
            return
        key = f"{topic}:{partition}"
        with self._lock:
            if offset > self._offsets.get(key, -1):
                self._offsets[key] = offset

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._offsets)

    def next_seq(self) -> int:
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return self._seq
