"""The private attributes and call shapes of faust, mode and aiokafka that the worker relies on
(:mod:`stream_jobs.faust_runtime`, :mod:`stream_jobs.faust_port`), checked against the installed
versions, which must be the ones pinned in ``pyproject.toml``.

None of these is a public API: an upgrade can rename or drop any of them, and the worker would
then fail somewhere deep in a rebalance or a restore. This test is the one place that fails
first, naming the attribute and the code that uses it. After an upgrade: fix what it names, then
move the pins.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version

import faust
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.fetcher import Fetcher as AioKafkaFetcher
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.consumer.subscription_state import Assignment, Subscription, SubscriptionState, TopicPartitionState
from faust.sensors import Monitor
from faust.tables.recovery import Recovery
from faust.transport.conductor import Conductor
from faust.transport.consumer import Consumer as FaustConsumer
from faust.transport.consumer import Fetcher
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Producer
from faust.transport.drivers.aiokafka import Consumer as AioKafkaDriverConsumer
from mode.services import WaitResults
from mode.utils.queues import FlowControlEvent

from tests.conftest import REPO_ROOT

PINNED = ("faust-streaming", "aiokafka")

RELIED_ON: list[tuple[type, str, str]] = [
    # (owner, attribute, what uses it)
    (FaustConsumer, "_gap", "FaustConsumerPort.seek: forget the gap beyond a seek"),
    (FaustConsumer, "_committed_offset", "FaustConsumerPort.local_committed"),
    (FaustConsumer, "_paused_partitions", "FaustConsumerPort.unsettled_state"),
    (FaustConsumer, "flow_active", "FaustConsumerPort.settled"),
    (FaustConsumer, "earliest_offsets", "FaustConsumerPort.log_start, committed_many"),
    (FaustConsumer, "highwaters", "FaustConsumerPort.log_ends"),
    (FaustConsumer, "pause_partitions", "FaustConsumerPort.pause"),
    (FaustConsumer, "resume_partitions", "FaustConsumerPort.resume"),
    (FaustConsumer, "seek", "FaustConsumerPort.seek"),
    (FaustConsumer, "ack", "Inbox.ack"),
    (AioKafkaDriverConsumer, "_thread", "FaustConsumerPort: the aiokafka client lives in the consumer thread"),
    (AioKafkaDriverConsumer, "_get_active_partitions", "FaustConsumerPort.unsettled_state"),
    (AioKafkaDriverConsumer, "_new_consumer_thread", "DirectHandoffConsumer: the batching consumer thread"),
    (AioKafkaDriverConsumer, "wait_first", "DirectHandoffConsumer.wait_first: the hand-over without tasks"),
    (AIOKafkaConsumerThread, "_ensure_consumer", "FaustConsumerPort: the aiokafka client"),
    (AIOKafkaConsumerThread, "call_thread", "FaustConsumerPort: calls into the consumer thread"),
    (AIOKafkaConsumerThread, "_create_worker_consumer", "_BatchingFetchThread: the fetch sizes"),
    (Fetcher, "crash", "ExitingFetcher.crash"),
    (Fetcher, "set_shutdown", "ExitingFetcher.set_shutdown"),
    (Fetcher, "_shutdown", "FaustConsumerPort.unsettled_state: the fetch loop ended"),
    (Conductor, "_build_handler", "DirectConductor: routes a topic's records to its Inbox"),
    (Recovery, "_recovery_started_at", "FaustConsumerPort.recovery_idle_s"),
    (Recovery, "_active_events_received_at", "FaustConsumerPort.recovery_idle_s"),
    (Recovery, "in_recovery", "FaustConsumerPort.unsettled_state, recovery_idle_s"),
    (Recovery, "active_offsets", "FaustConsumerPort.unsettled_state"),
    (Recovery, "active_highwaters", "FaustConsumerPort.unsettled_state"),
    (Recovery, "active_remaining", "FaustConsumerPort.unsettled_state"),
    (Recovery, "active_remaining_total", "FaustConsumerPort.recovery_idle_s"),
    (Monitor, "stream_inbound_time", "Inbox.events: when a partition's stream last took a record"),
    (Monitor, "on_message_in", "LeanMonitor"),
    (Monitor, "on_stream_event_in", "LeanMonitor"),
    (Monitor, "on_stream_event_out", "LeanMonitor"),
    (Monitor, "on_message_out", "LeanMonitor"),
    (FlowControlEvent, "manage_queue", "Inbox: emptied as faust empties its queues"),
    (FlowControlEvent, "acquire", "Inbox.put: nothing is appended while the flow is suspended"),
    (FlowControlEvent, "is_active", "FaustConsumerPort.unsettled_state"),
    (faust.Table, "send_changelog", "DurableTable: awaited changelog writes"),
    (faust.Table, "partition_for_key", "DurableTable.partition_for_key"),
    (faust.Worker, "execute_from_commandline", "RestartingWorker"),
    (Producer, "send", "DirectSender.send"),
    (AIOKafkaConsumer, "_fetch_min_bytes", "_BatchingFetchThread: FETCH_MIN_BYTES"),
    (AIOKafkaConsumer, "_fetch_max_wait_ms", "_BatchingFetchThread: FETCH_MAX_WAIT_MS"),
    (AIOKafkaConsumer, "_coordinator", "FaustConsumerPort: the group's committed offsets in one request"),
    (AIOKafkaConsumer, "_subscription", "FaustConsumerPort._client_state"),
    (AIOKafkaConsumer, "_fetcher", "FaustConsumerPort._client_state"),
    (AIOKafkaConsumer, "committed", "FaustConsumerPort.committed"),
    (GroupCoordinator, "fetch_committed_offsets", "FaustConsumerPort._group_commits"),
    (SubscriptionState, "subscription", "FaustConsumerPort._client_state"),
    (Subscription, "assignment", "FaustConsumerPort._client_state"),
    (Assignment, "state_value", "FaustConsumerPort._client_state"),
    (TopicPartitionState, "_status", "FaustConsumerPort._client_state"),
    (TopicPartitionState, "_position", "FaustConsumerPort._client_state"),
    (TopicPartitionState, "_paused", "FaustConsumerPort._client_state"),
    (AioKafkaFetcher, "_records", "FaustConsumerPort._client_state"),
]


def _has(owner: type, name: str) -> bool:
    """``owner`` has ``name`` as a class attribute, or one of its classes assigns ``self.<name>``."""
    if hasattr(owner, name):
        return True
    assigned = re.compile(rf"self\.{re.escape(name)}\b\s*(:[^=\n]*)?=[^=]")
    for cls in owner.__mro__:
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):  # builtins
            continue
        if assigned.search(source):
            return True
    return False


def _pins() -> dict[str, str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for requirement in project["optional-dependencies"]["worker"]:
        name, sep, pinned = requirement.partition("==")
        if sep:
            pins[name.strip()] = pinned.strip()
    return pins


@pytest.mark.parametrize("package", PINNED)
def test_the_installed_version_is_the_pinned_one(package: str) -> None:
    pins = _pins()
    assert package in pins, f"pyproject.toml must pin {package} (==) in the worker extra"
    assert version(package) == pins[package], (
        f"{package} {version(package)} is installed, {pins[package]} is pinned: the worker relies on its "
        "internals; run this test against the new version and fix what it names before moving the pin")


@pytest.mark.parametrize(("owner", "name", "user"), RELIED_ON,
                         ids=[f"{owner.__name__}.{name}" for owner, name, _ in RELIED_ON])
def test_each_internal_relied_on_exists(owner: type, name: str, user: str) -> None:
    assert _has(owner, name), (
        f"{owner.__module__}.{owner.__name__} has no {name!r} any more; used by {user} "
        "(stream_jobs/faust_runtime.py, stream_jobs/faust_port.py)")


def test_the_call_shapes_relied_on() -> None:
    """The positional calls and results the runtime builds by hand."""
    send = list(inspect.signature(Producer.send).parameters)
    assert send[:7] == ["self", "topic", "key", "value", "partition", "timestamp", "headers"], (
        f"DirectSender.send calls the producer's send(topic, key, value, partition, timestamp, headers): {send}")
    assert WaitResults._fields == ("done", "results", "stopped"), "DirectHandoffConsumer builds WaitResults"
    handler = list(inspect.signature(Conductor._build_handler).parameters)
    assert handler == ["self", "tp", "channels"], f"DirectConductor._build_handler overrides {handler}"
    thread = inspect.signature(AIOKafkaConsumerThread.__init__).parameters
    assert "consumer" in thread, "DirectHandoffConsumer._new_consumer_thread passes the consumer"
