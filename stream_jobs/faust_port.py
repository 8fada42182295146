"""The faust side of the ports the stream jobs run on: the consumer as
:class:`~stream_jobs.offset_guard.OffsetGuard` and the route see it (:class:`FaustConsumerPort`),
the sender :class:`~stream_jobs.delivery.Delivery` writes with (:class:`DirectSender`) and the
table a checkpoint awaits (:class:`DurableTable`).

With :mod:`stream_jobs.faust_runtime`, the only code that reaches into faust's (and its aiokafka
driver's) private attributes; ``tests/stream_jobs/test_faust_internals.py`` checks each one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import faust
from faust.types import TP

from stream_jobs.offsets import TopicPartition
from stream_jobs.watermark import tp_key

__all__ = ["DirectSender", "DurableTable", "FaustConsumerPort", "durable_table"]


class DurableTable(faust.Table):  # type: ignore[misc]
    """A faust table whose changelog writes can be awaited (:meth:`confirm`).

    faust hands a table write to its producer buffer and returns; the commit before which it
    flushes that buffer gives up after 0.1 s without a message leaving it (a loaded process, a
    broker away) and does not fail on a send that failed. A stage checkpoint acknowledged its
    inputs right after writing its state, so offsets could be committed while the state that
    applied them was still in the buffer: a SIGKILL, or a rebalance whose new owner restored the
    changelog before the write arrived, lost those inputs (a chaos run with a broker outage lost
    pod-window samples). A checkpoint now awaits the delivery of its state before acknowledging.
    """

    def __init__(self, *args: Any, partition_of: Callable[[bytes], int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unconfirmed: list[Any] = []
        self._partition_of = partition_of

    def partition_for_key(self, key: bytes) -> int:
        """The changelog partition of ``key``, from the key itself: faust takes it from the event
        being processed, which the agents' :class:`Inbox` does not make."""
        return self._partition_of(key)

    def send_changelog(self, *args: Any, **kwargs: Any) -> Any:
        fut = super().send_changelog(*args, **kwargs)
        self._unconfirmed.append(fut)
        return fut

    async def confirm(self) -> None:
        """Until every changelog write made so far is delivered; raises if one failed."""
        pending, self._unconfirmed = self._unconfirmed, []
        await asyncio.gather(*pending)


def durable_table(app: Any, name: str, partitions: int, partition_of: Callable[[bytes], int]) -> DurableTable:
    """A :class:`DurableTable` registered with ``app`` as ``app.Table`` would (bytes keys/values)."""
    table = DurableTable(app, name=name, default=None, beacon=app.tables.beacon, partitions=partitions,
                         key_type=bytes, value_type=bytes, partition_of=partition_of)
    app.tables.add(table)
    return table


class FaustConsumerPort:
    """The consumer as :class:`~stream_jobs.offset_guard.OffsetGuard` and the route see it: the
    only code that reaches into faust's (and its aiokafka driver's) private attributes."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def committed(self, tp: TopicPartition) -> int:
        consumer = self.app.consumer
        thread = consumer._thread  # faust's aiokafka driver: the client lives in its own thread
        offset = await thread.call_thread(thread._ensure_consumer().committed, tp)
        return int(offset) if offset is not None else await self.log_start(tp)

    def local_committed(self) -> dict[str, int]:
        """The offsets this consumer committed, ``topic:partition`` -> next offset (no broker call)."""
        committed = getattr(self.app.consumer, "_committed_offset", {}) or {}
        return {tp_key(tp.topic, tp.partition): int(off) for tp, off in list(committed.items()) if off is not None}

    async def log_start(self, tp: TopicPartition) -> int:
        return int((await self.app.consumer.earliest_offsets(tp))[tp])

    async def committed_many(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        found = await self._group_commits([TP(tp.topic, tp.partition) for tp in tps])
        out: dict[TopicPartition, int] = {tp: offset for tp, offset in found.items()}
        missing = [tp for tp in tps if tp not in out]
        if missing:
            starts = await self.app.consumer.earliest_offsets(*missing)
            out.update({tp: int(off) for tp, off in starts.items() if off is not None})
        return out

    async def log_ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        found = await self.app.consumer.highwaters(*tps)
        return {tp: int(offset) for tp, offset in found.items() if offset is not None}

    async def group_committed(self, keys: list[str]) -> dict[str, int]:
        """The group's committed offsets of ``topic:partition`` keys, owned by this consumer or not
        (keys with no commit are left out)."""
        tps = [TP(topic, int(partition)) for topic, partition in (key.rsplit(":", 1) for key in keys)]
        found = await self._group_commits(tps)
        return {tp_key(tp.topic, tp.partition): offset for tp, offset in found.items()}

    async def _group_commits(self, tps: list[TP]) -> dict[TP, int]:
        """The group's committed offsets of ``tps`` in one request to its coordinator (those with
        no commit are left out), keyed by :class:`TP`."""
        thread = self.app.consumer._thread
        coordinator = thread._ensure_consumer()._coordinator
        found = await thread.call_thread(coordinator.fetch_committed_offsets, tps)
        return {TP(tp.topic, tp.partition): int(meta.offset) for tp, meta in found.items() if meta.offset >= 0}

    def assignment(self) -> set[TopicPartition]:
        return set(self.app.consumer.assignment())

    def settled(self) -> bool:
        return not self.app.rebalancing and bool(self.app.consumer.flow_active)

    def unsettled_state(self) -> dict[str, Any]:
        app, consumer = self.app, self.app.consumer
        state: dict[str, Any] = {"rebalancing": bool(app.rebalancing), "flow_active": bool(consumer.flow_active)}
        recovery = app.tables.recovery
        if recovery.in_recovery:
            # what a restore that reads nothing looks like from here (a chaos run in CI hung so once)
            fetching, paused = consumer._get_active_partitions(), consumer._paused_partitions
            state["restoring"] = {
                tp_key(tp.topic, tp.partition): {
                    "offset": recovery.active_offsets.get(tp), "highwater": recovery.active_highwaters.get(tp),
                    "fetching": tp in fetching, "paused": tp in paused, "client": self._client_state(tp)}
                for tp, remaining in sorted(recovery.active_remaining().items()) if remaining > 0}
            # the fetch task marks its service shut down whenever it ends, stopped or not
            state["fetcher"] = {"state": app._fetcher.state, "loop_ended": app._fetcher._shutdown.is_set()}
            state["flow_control_active"] = bool(app.flow_control.is_active())
            state["full_inboxes"] = sorted({topic for topic, inbox in app.topics.direct.items() if inbox.full})
        return state

    def _client_state(self, tp: TopicPartition) -> str:
        """aiokafka's state of ``tp``, for the log only: it belongs to the consumer's thread."""
        try:
            client = self.app.consumer._thread._ensure_consumer()
            subscription = client._subscription.subscription
            state = subscription.assignment.state_value(tp) if subscription and subscription.assignment else None
            if state is None:
                return "not assigned"
            buffered = tp in list(client._fetcher._records)
            return (f"{state._status.name.lower()}, position {state._position}, paused {state._paused}, "
                    f"fetched and not taken {buffered}")
        except Exception as exc:  # a diagnostic never fails the check that logs it
            return f"unknown ({exc!r})"

    def recovery_idle_s(self) -> float | None:
        recovery = self.app.tables.recovery
        started = recovery._recovery_started_at
        if not recovery.in_recovery or started is None or not recovery.active_remaining_total():
            return None
        last = max(recovery._active_events_received_at.values(), default=started)
        return time.monotonic() - last

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        consumer = self.app.consumer
        consumer._gap.pop(tp, None)  # else faust counts the skipped offsets as acknowledged
        await consumer.seek(tp, offset)

    def pause(self, tp: TopicPartition) -> None:
        self.app.consumer.pause_partitions({TP(tp.topic, tp.partition)})

    def resume(self, tp: TopicPartition) -> None:
        # faust's own TP: resume_partitions adds what it is given to a set it asserts holds only those
        self.app.consumer.resume_partitions({TP(tp.topic, tp.partition)})


@dataclass(frozen=True)
class DirectSender:
    """Sends records to one topic with the app's producer, without faust's ``Topic.send``.

    faust's path builds a pending message, a future message and a sensor state per record and
    resolves one future through another; the stream jobs need none of it (their records are bytes,
    their futures are awaited before inputs are acknowledged). What :class:`~stream_jobs.delivery.Delivery`
    calls: ``send`` (the record's delivery, a future to await) and ``get_topic_name``."""

    app: Any
    name: str

    async def send(self, *, key: bytes | None, value: bytes, partition: int | None = None,
                   headers: list[tuple[str, bytes]] | None = None) -> Awaitable[Any]:
        result: Awaitable[Any] = await self.app.producer.send(self.name, key, value, partition, None, headers)
        return result

    def get_topic_name(self) -> str:
        return self.name
