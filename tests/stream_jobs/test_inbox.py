"""The agents read their records from inboxes, not faust's streams (``faust_runtime.Inbox``), and keep
what faust's path gave them: every record of their topics reaches them, in the order fetched;
nothing is handed over while faust suspends the flow (a rebalance, the tables' recovery); what
waits is dropped when faust empties its buffers (a revocation), so a revoked partition's records
are not processed; a full inbox holds the fetch loop; an acknowledgement reaches the consumer that
commits; and a stage's checkpoint goes to its own partition's changelog, with no faust event to
take the partition from. Tested on the worker's real faust app and consumer, not started (on the
app's loop, to which faust's flow control is bound)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from faust.types import TP, Message

from common.settings import WorkerSettings, load_settings
from stream_jobs.faust_app import StreamJobs
from stream_jobs.faust_runtime import DirectConductor, DirectEvent, Inbox
from stream_jobs.node_agent import node_state_partition, state_key


def _jobs(tmp_path: Path) -> StreamJobs:
    return StreamJobs(load_settings(WorkerSettings, topic_prefix="inbox", data_dir=tmp_path))


def _record(topic: str, partition: int, offset: int) -> Message:
    return Message(topic=topic, partition=partition, offset=offset, timestamp=0.0, timestamp_type=0, headers=[],
                   key=b"node-1", value=f"v{offset}".encode(), checksum=None)


def _run(app: Any, scenario: Any) -> Any:
    return app.loop.run_until_complete(asyncio.wait_for(scenario, 5.0))


async def _take(inbox: Inbox, count: int) -> list[DirectEvent]:
    taken: list[DirectEvent] = []
    async for event in inbox.events():
        taken.append(event)
        if len(taken) == count:
            return taken
    return taken


def test_every_topic_an_agent_reads_goes_to_its_inbox(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    conductor = jobs.app.topics
    assert isinstance(conductor, DirectConductor)
    expected = {jobs.samples_name: "node", jobs.node_name: "node", jobs.cluster_name: "cluster",
                jobs.control_name: "route", **{name: "route" for name in jobs.input_names if name != jobs.samples_name}}
    for topic, agent in expected.items():
        assert conductor._build_handler(TP(topic, 0), set()) == jobs.inboxes[agent].put, topic
    assert conductor.direct.keys() == expected.keys(), "and no other topic"


def test_records_come_out_in_the_order_fetched_and_acks_reach_the_consumer(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    app, inbox = jobs.app, jobs.inboxes["node"]

    async def scenario() -> list[DirectEvent]:
        app.topics.add(jobs.node_inputs)  # what the agent's start and the subscription do: its topics
        await app.topics._update_indices()  # are acknowledged ones
        app.flow_control.resume()
        records = [_record(jobs.samples_name, 1, 7), _record(jobs.node_name, 1, 3), _record(jobs.samples_name, 1, 8)]
        for record in records:
            await inbox.put(record)
        taken = await _take(inbox, 3)
        await inbox.ack(taken[0])
        return taken

    taken = _run(app, scenario())
    assert [(event.message.topic, event.message.offset, event.value) for event in taken] == [
        (jobs.samples_name, 7, b"v7"), (jobs.node_name, 3, b"v3"), (jobs.samples_name, 8, b"v8")]
    tp = TP(jobs.samples_name, 1)
    assert app.consumer._acked_index[tp] == {7}, "the consumer commits what the agent acknowledged, only that"
    assert taken[0].message.acked and not taken[2].message.acked
    assert tp in app.monitor.stream_inbound_time, "faust's slow-stream check sees the partition's stream work"


def test_nothing_is_handed_over_while_the_flow_is_suspended(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    app, inbox = jobs.app, jobs.inboxes["route"]

    async def scenario() -> tuple[bool, list[int]]:
        assert not app.flow_control.is_active(), "faust starts suspended: the tables recover first"
        put = asyncio.ensure_future(inbox.put(_record(jobs.control_name, 0, 5)))
        await asyncio.sleep(0.05)
        waited = not put.done()
        app.flow_control.resume()
        await asyncio.wait_for(put, 1.0)
        return waited, [event.message.offset for event in await _take(inbox, 1)]

    waited, offsets = _run(app, scenario())
    assert waited, "a record fetched while the flow is suspended waits"
    assert offsets == [5]


def test_a_revocation_drops_what_waits(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    app, inbox = jobs.app, jobs.inboxes["node"]

    async def scenario() -> list[int]:
        app.flow_control.resume()
        for offset in (5, 6, 7):
            await inbox.put(_record(jobs.samples_name, 0, offset))
        app.flow_control.suspend()  # faust's revocation: suspend, pause, then empty the buffers
        app.flow_control.clear()
        app.flow_control.resume()
        for offset in (6, 7):  # partition 0 assigned again: read from its commit
            await inbox.put(_record(jobs.samples_name, 0, offset))
        return [event.message.offset for event in await _take(inbox, 2)]

    assert _run(app, scenario()) == [6, 7]


def test_a_full_inbox_holds_the_fetch_loop_until_half_is_taken(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    app = jobs.app
    inbox = Inbox(app, limit=4)

    async def scenario() -> list[tuple[int, bool]]:
        app.flow_control.resume()
        for offset in range(3):
            await inbox.put(_record(jobs.samples_name, 0, offset))
        fourth = asyncio.ensure_future(inbox.put(_record(jobs.samples_name, 0, 3)))
        seen: list[tuple[int, bool]] = []
        events: Any = inbox.events()
        await asyncio.sleep(0.01)
        for _ in range(4):
            event = await events.__anext__()
            await asyncio.sleep(0.01)
            seen.append((event.message.offset, fourth.done()))
        return seen

    # the fourth record fills it: the fetch loop waits until two are taken, then goes on
    assert _run(app, scenario()) == [(0, False), (1, True), (2, True), (3, True)]


def test_a_checkpoint_goes_to_its_partitions_changelog(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    for partition in (0, 3, 12):
        key = state_key(partition).encode()
        assert jobs.node_durable.partition_for_key(key) == partition
        assert jobs.node_durable.partition_for_key(key + b"#4#0") == partition, "its chunks too"
        assert node_state_partition(key + b"#1#17") == partition
    assert jobs.cluster_durable.partition_for_key(b"cluster") == 0


def _waiting_for_room(jobs: StreamJobs) -> asyncio.Future[Any]:
    """The fetch loop's hand-over of a changelog record, waiting for room in the tables' full
    changelog queue (faust's own); on the app's loop."""
    app, consumer = jobs.app, jobs.app.consumer
    queue = app.tables.changelog_queue
    app.flow_control.resume()
    while not queue.full():
        queue.force_put_nowait("a changelog event")
    return asyncio.ensure_future(consumer.wait_first(queue.put("one more"), consumer.suspend_flow.wait()))


def test_a_record_waiting_for_a_queue_faust_empties_does_not_end_the_fetch_loop(tmp_path: Path) -> None:
    """The tables' changelog queue (faust's own) fills while a restore reads a long changelog; a
    rebalance then empties it, which cancels the put the fetch loop waits in. In faust that
    cancellation ended the fetch loop: the worker fetched nothing again (a restore that never ends)."""
    jobs = _jobs(tmp_path)
    app = jobs.app

    async def scenario() -> tuple[bool, int]:
        handoff = _waiting_for_room(jobs)
        await asyncio.sleep(0.01)
        waiting = not handoff.done()
        app.flow_control.clear()
        await handoff  # returns: the record went with the queue
        return waiting, app.tables.changelog_queue.qsize()

    assert _run(app, scenario()) == (True, 0)


def test_the_fetch_loop_cancelled_from_outside_still_ends(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)

    async def scenario() -> bool:
        loop_task = _waiting_for_room(jobs)
        await asyncio.sleep(0.01)
        loop_task.cancel()
        try:
            await loop_task
        except asyncio.CancelledError:
            return True
        return False

    assert _run(jobs.app, scenario()), "a stop cancels the fetch loop as before"
