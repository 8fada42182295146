"""Scenario pods' allocator statistics, played through the node agent's own progress ingestion.

A scenario pod with ``allocator:`` (``simulation.scenario.AllocatorSpec``) reports, every sample
interval while it runs, one ``allocator device=N reserved=... allocated=... retries=... ooms=...``
line per GPU it holds, as ``clients/gpulens_progress.py`` would write it. The lines go through the
agent's :class:`producers.agent.progress.ProgressCollector` of the pod's node (parsing, bounds,
rate limit, attribution by the sender's source address), and what it drains becomes the
``workload.allocator.v1`` records of the tick: the simulator takes the same path as a real report,
not a shortcut that builds the message. A scenario without ``allocator:`` produces nothing here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol, TypeVar

from common.metrics import MetricsRegistry
from producers.agent.cgroup import StaticProcessResolver
from producers.agent.progress import ProgressCollector, ProgressMetrics, StaticPodAddresses
from schemas.messages import Message
from schemas.topics import WORKLOAD_ALLOCATOR
from simulation.scenario import AllocatorSpec, PodSpec, Scenario

GIB = 2**30
EPS = 1e-6
R = TypeVar("R")


class PlayedPod(Protocol):
    """What the player reads of a simulated pod."""

    spec: PodSpec
    index: int
    uid: str
    phase: str
    scheduled: float | None
    node: str | None


def allocator_line(spec: AllocatorSpec, device: int, offset_s: float) -> str:
    """The line the client sends for ``device`` ``offset_s`` after the pod started running."""
    minutes = max(offset_s - spec.start, 0.0) / 60.0
    reserved, allocated = int(spec.reserved_gib * GIB), int(spec.allocated_gib * GIB)
    retries = math.floor(spec.retries_per_min * minutes + EPS)
    ooms = math.floor(spec.ooms_per_min * minutes + EPS)
    return (f"allocator device={device} reserved={reserved} allocated={allocated} max_reserved={reserved} "
            f"retries={retries} ooms={ooms}")


class AllocatorPlayer:
    """One agent collector per node; each reporting pod sends from an address of its own."""

    def __init__(self, scenario: Scenario) -> None:
        self.active = any(pod.allocator is not None for pod in scenario.pods)
        self.gaps = scenario.agent_gaps
        self._now = 0.0
        self._collectors: dict[str, ProgressCollector] = {}
        self._names: dict[str, tuple[str, str]] = {}
        self._addresses: dict[str, str] = {}

    def _collector(self, node: str) -> ProgressCollector:
        collector = self._collectors.get(node)
        if collector is None:
            collector = self._collectors[node] = ProgressCollector(
                StaticProcessResolver({}), StaticPodAddresses(self._addresses), ProgressMetrics(MetricsRegistry()),
                pod_names=self._names.get, clock=lambda: self._now, node=node)
        return collector

    def _address(self, pod: PlayedPod) -> str:
        address = f"10.{pod.index // 65536 % 256}.{pod.index // 256 % 256}.{pod.index % 256}"
        if self._addresses.get(address) != pod.uid:  # a kube replay gives the pod the server's uid
            self._addresses[address] = pod.uid
            for collector in self._collectors.values():
                collector.addresses = StaticPodAddresses(self._addresses)
        return address

    def records(self, t: float, ts: datetime, pods: Sequence[PlayedPod],
                encode: Callable[[str, str, Message], R]) -> list[R]:
        """This tick's ``workload.allocator.v1`` records (``encode(topic suffix, key, message)``)."""
        if not self.active:
            return []
        self._now = t
        nodes: set[str] = set()
        for pod in pods:
            spec = pod.spec.allocator
            if spec is None or pod.phase != "running" or pod.scheduled is None or pod.node is None:
                continue
            offset = t - pod.scheduled
            if offset < spec.start - EPS or (spec.until is not None and offset >= spec.until - EPS):
                continue
            if any(g.node == pod.node and g.start <= t + EPS < g.end for g in self.gaps):
                continue  # the node's agent is down: nobody receives the report
            self._names[pod.uid] = (pod.spec.namespace, pod.spec.name)
            address = self._address(pod)
            collector = self._collector(pod.node)
            for device in range(pod.spec.gpus):  # one datagram per device, as the client packs 8 to 1 KiB
                line = allocator_line(spec, device, offset)
                if collector.from_udp(line.encode(), address) != pod.uid:
                    raise AssertionError(f"the agent rejected the allocator line of {pod.spec.name}: {line!r}")
            nodes.add(pod.node)
        return [encode(WORKLOAD_ALLOCATOR.suffix, message.pod_uid, message)
                for node in sorted(nodes) for message in self._collector(node).drain_allocator(ts)]
