"""Fakes of what the route and the stages talk to (faust events and streams, topics, the offset
guard, the group's committed offsets), for unit tests of the agents without a broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from stream_jobs.config import EngineConfig
from stream_jobs.delivery import Delivery
from stream_jobs.offset_guard import WorkerMetrics


class TP(NamedTuple):
    topic: str
    partition: int


class Message:
    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None = None) -> None:
        self.topic, self.partition, self.offset, self.key = topic, partition, offset, key
        self.tp = TP(topic, partition)
        self.timestamp: float | None = None


class Event:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes = b"", key: bytes | None = None) -> None:
        self.message = Message(topic, partition, offset, key)
        self.value = value


class Offsets:
    """The offset guard as far as acknowledgements go: everything done is acknowledgeable."""

    def __init__(self) -> None:
        self.done_calls: list[Any] = []
        self.flow: list[tuple[str, Any]] = []
        """``("pause" | "resume", tp)`` in the order asked."""

    def done(self, tp: Any, offset: int, token: Any) -> list[Any]:
        self.done_calls.append(token)
        return [token]

    async def admit(self, *args: Any) -> bool:
        return True

    def pause(self, tp: Any) -> None:
        self.flow.append(("pause", tp))

    async def resume(self, tp: Any) -> None:
        self.flow.append(("resume", tp))


class Metrics(WorkerMetrics):
    """The worker's own metrics, in a registry of their own (what the agents count is real)."""


class Events:
    """An agent's events as far as acknowledgements go (none to read)."""

    def __init__(self) -> None:
        self.acked: list[Any] = []

    async def events(self) -> AsyncIterator[Event]:
        none: tuple[Event, ...] = ()
        for event in none:
            yield event

    async def ack(self, event: Any) -> None:
        self.acked.append(event)


def fake_delivery(offsets: Offsets) -> Delivery:
    return Delivery(EngineConfig(), Metrics(), offsets, None, {}, set())  # type: ignore[arg-type]


class Topic:
    def __init__(self, name: str, log: list[tuple[str, int | None, bytes]]) -> None:
        self.name, self.log = name, log

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes | None, value: bytes, partition: int | None = None, headers: Any = None) -> Any:
        self.log.append((self.name, partition, value))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class Committed:
    def local_committed(self) -> dict[str, int]:
        return {}

    async def group_committed(self, keys: list[str]) -> dict[str, int]:
        return {}


class Stream:
    def __init__(self, events: list[Event]) -> None:
        self.events_list, self.acks = events, Events()

    def noack(self) -> Stream:
        return self

    async def events(self) -> Any:
        for event in self.events_list:
            yield event

    async def ack(self, event: Any) -> None:
        await self.acks.ack(event)
