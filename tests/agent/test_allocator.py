"""Allocator statistics from inside the pod: the client's PyTorch helper (against a stand-in torch,
``tests/agent/standin_torch.py``), the line it sends, the agent's validation with named reasons,
crediting to the sending pod by kernel facts only, and the ``workload.allocator.v1`` messages the
agent's wiring hands to its sink."""

from __future__ import annotations

import importlib.util
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from common.metrics import MetricsRegistry
from common.settings import AgentSettings, load_settings
from producers.agent.allocator import MAX_DEVICES_PER_POD, MalformedAllocatorLine, parse_allocator_line
from producers.agent.cgroup import ContainerRef, StaticProcessResolver
from producers.agent.main import start_progress
from producers.agent.progress import ProgressCollector, ProgressMetrics, StaticPodAddresses
from producers.agent.service import AgentMetrics
from schemas.codec import decode
from schemas.messages import AllocatorDevice, WorkloadAllocator, WorkloadProgress
from tests.agent.standin_torch import OutOfMemoryError, StandInTorch
from tests.agent.test_progress import (  # noqa: F401
    POD_A,
    POD_B,
    counter,
    load_client,
    short_dir,
    stand_in_agent,
)
from tests.conftest import REPO_ROOT

GIB = 2**30
STANDINS = REPO_ROOT / "tests" / "agent" / "standins"


def fragmented_torch() -> StandInTorch:
    """Two 80 GiB devices; this process trains on device 1 only: 60 GiB reserved in 5 segments of
    12 GiB, one of them in use, and a 20 GiB tensor that needed a retry and then went OOM."""
    torch = StandInTorch([80 * GIB, 80 * GIB])
    handles = [torch.cuda.malloc(1, 12 * GIB) for _ in range(5)]
    for handle in handles[1:]:
        torch.cuda.free(handle)
    torch.cuda.malloc(1, 12 * GIB)  # reuses a cached segment: no retry
    torch.cuda.free((1, 1))
    with pytest.raises(OutOfMemoryError):
        torch.cuda.malloc(1, 70 * GIB)  # frees the 4 cached segments, retries, still does not fit
    for _ in range(4):
        torch.cuda.malloc(1, 12 * GIB)
    for index in range(1, 5):
        torch.cuda.free((1, index))
    return torch


# --------------------------------------------------------------------------- the client's helper


def test_the_helper_reads_the_devices_this_processs_allocator_uses() -> None:
    client = load_client()
    torch = fragmented_torch()
    stats = client.torch_allocator_stats(torch)
    assert stats == [{"device": 1, "gpu_uuid": "GPU-00000000-0000-0000-0000-000000000002",
                      "reserved_bytes": 60 * GIB, "allocated_bytes": 12 * GIB, "max_reserved_bytes": 60 * GIB,
                      "num_alloc_retries": 1, "num_ooms": 1}]


def test_the_helper_gives_nothing_without_torch_or_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    client = load_client()
    assert importlib.util.find_spec("torch") is None  # the test environment has no torch
    assert client.torch_allocator_stats() == []
    assert client.torch_allocator_stats(StandInTorch([80 * GIB], available=False)) == []
    assert client.torch_allocator_stats(StandInTorch([80 * GIB])) == []  # CUDA not initialised yet
    broken = StandInTorch([80 * GIB])
    broken.cuda.malloc(0, GIB)
    monkeypatch.setattr(broken.cuda, "memory_stats", None)  # not callable: the helper must not raise
    assert client.torch_allocator_stats(broken) == []


def test_the_client_sends_allocator_lines_the_agent_parses(short_dir: Path) -> None:  # noqa: F811
    client = load_client()
    path = short_dir / "p.sock"
    agent = stand_in_agent(path)
    try:
        reporter = client.ProgressReporter(socket_path=str(path), host="", min_interval_s=3600)
        reporter.report(steps=4)
        client.report_torch_allocator(reporter, fragmented_torch())
        reporter.flush()
        progress, allocator = agent.recv(1024).decode(), agent.recv(1024).decode()
    finally:
        agent.close()
    assert progress == "steps=+4"  # its own datagram: an agent without allocator lines still counts steps
    assert parse_allocator_line(allocator) == AllocatorDevice(
        device=1, gpu_uuid="GPU-00000000-0000-0000-0000-000000000002", reserved_bytes=60 * GIB,
        allocated_bytes=12 * GIB, max_reserved_bytes=60 * GIB, alloc_retries_total=1, ooms_total=1)


def test_many_devices_are_packed_into_datagrams_the_agent_accepts(short_dir: Path) -> None:  # noqa: F811
    client = load_client()
    path = short_dir / "p.sock"
    agent = stand_in_agent(path, blocking=False)
    devices = [{"device": i, "gpu_uuid": f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}", "reserved_bytes": 70 * GIB,
                "allocated_bytes": 60 * GIB, "max_reserved_bytes": 75 * GIB, "num_alloc_retries": 10**6,
                "num_ooms": 3} for i in range(8)]
    devices.append({"device": 9, "reserved_bytes": float("nan"), "allocated_bytes": 0})  # left out
    try:
        reporter = client.ProgressReporter(socket_path=str(path), host="", min_interval_s=0)
        reporter.report_allocator(devices)
        datagrams = []
        while True:
            try:
                datagrams.append(agent.recv(4096))
            except BlockingIOError:
                break
    finally:
        agent.close()
    assert len(datagrams) > 1 and all(len(d) <= 1024 for d in datagrams)
    parsed = [parse_allocator_line(line) for d in datagrams for line in d.decode().splitlines()]
    assert sorted(p.device for p in parsed) == list(range(8))


def test_the_framework_callbacks_report_the_allocator_from_every_rank(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.syspath_prepend(str(STANDINS))
    monkeypatch.setitem(sys.modules, "torch", fragmented_torch())
    client = load_client()
    from lightning.pytorch import Trainer as LightningTrainer
    from transformers import Trainer, TrainingArguments

    path = short_dir / "p.sock"
    agent = stand_in_agent(path, blocking=False)
    try:
        reporter = client.ProgressReporter(socket_path=str(path), host="", min_interval_s=3600)
        trainer = Trainer(TrainingArguments(max_steps=3, logging_steps=5), lambda step: (0.0, 0),
                          callbacks=[client.transformers_callback(reporter=reporter)])
        trainer.state.is_local_process_zero = False  # another rank: no steps, its own allocator
        trainer.train()
        lightning = LightningTrainer(max_steps=2, callbacks=[client.lightning_callback(reporter=reporter)])
        lightning.fit(lambda batch, _i: 0.0, [None])
        lines = []
        while True:
            try:
                lines += agent.recv(4096).decode().splitlines()
            except BlockingIOError:
                break
    finally:
        agent.close()
    # transformers' other rank: at its first step (the reporter's first send is due) and at the end;
    # Lightning's rank 0: its steps, then its allocator, at the end (the interval is an hour)
    assert [line.split()[0] for line in lines] == ["allocator", "allocator", "steps=+2", "allocator"]
    assert parse_allocator_line(lines[0]).reserved_bytes == 60 * GIB


def test_a_callback_without_allocator_sends_no_allocator_line(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.syspath_prepend(str(STANDINS))
    monkeypatch.setitem(sys.modules, "torch", fragmented_torch())
    client = load_client()
    from lightning.pytorch import Trainer as LightningTrainer

    path = short_dir / "p.sock"
    agent = stand_in_agent(path)
    try:
        reporter = client.ProgressReporter(socket_path=str(path), host="", min_interval_s=3600)
        LightningTrainer(max_steps=2, callbacks=[client.lightning_callback(reporter=reporter, allocator=False)]
                         ).fit(lambda batch, _i: 0.0, [None])
        agent.setblocking(False)
        received = []
        while True:
            try:
                received.append(agent.recv(4096))
            except BlockingIOError:
                break
        assert received == [b"steps=+1", b"steps=+1"]  # the first send is due at once, the rest at the end
    finally:
        agent.close()


# --------------------------------------------------------------------------- the agent


@pytest.mark.parametrize(("line", "device"), [
    ("allocator device=0 reserved=100 allocated=40",
     AllocatorDevice(device=0, reserved_bytes=100, allocated_bytes=40)),
    ("allocator device=3 reserved=100 allocated=100 max_reserved=120 retries=2 ooms=0 uuid=MIG-abc-1",
     AllocatorDevice(device=3, gpu_uuid="MIG-abc-1", reserved_bytes=100, allocated_bytes=100,
                     max_reserved_bytes=120, alloc_retries_total=2, ooms_total=0)),
])
def test_allocator_lines_are_read(line: str, device: AllocatorDevice) -> None:
    assert parse_allocator_line(line) == device


@pytest.mark.parametrize(("line", "reason"), [
    ("allocator device=0 reserved=100", "missing_key"),
    ("allocator device=0 reserved=10 allocated=40", "allocated_above_reserved"),
    ("allocator device=0 reserved=-1 allocated=0", "bad_number"),
    ("allocator device=0 reserved=1e9 allocated=0", "bad_number"),
    (f"allocator device=0 reserved={2**50 + 1} allocated=0", "bad_number"),
    ("allocator device=0 reserved=10 allocated=0 retries=1000000000001", "bad_number"),
    ("allocator device=256 reserved=10 allocated=0", "bad_device"),
    ("allocator device=0 reserved=10 allocated=0 uuid=../../etc", "bad_uuid"),
    ("allocator device=0 reserved=10 allocated=0 pod=aaaa", "unknown_key"),
    ("allocator device=0 device=1 reserved=10 allocated=0", "duplicate_key"),
    ("allocator device=0 reserved 10", "bad_field"),
])
def test_a_bad_allocator_line_names_its_reason(line: str, reason: str) -> None:
    with pytest.raises(MalformedAllocatorLine) as caught:
        parse_allocator_line(line)
    assert caught.value.reason == reason


def collector(registry: MetricsRegistry) -> ProgressCollector:
    return ProgressCollector(
        StaticProcessResolver({10: ContainerRef("a" * 64, POD_A, "containerd"),
                               20: ContainerRef("b" * 64, POD_B, "containerd")}),
        StaticPodAddresses({"10.244.1.6": POD_B}), ProgressMetrics(registry),
        pod_names=lambda uid: ("research", "train-0") if uid == POD_A else None, node="gpu-a")


def test_allocator_reports_are_credited_to_the_sending_pod_only() -> None:
    registry = MetricsRegistry()
    c = collector(registry)
    line = b"allocator device=0 reserved=64424509440 allocated=12884901888 retries=3 ooms=0"
    assert c.from_unix(line, 10) == POD_A
    assert c.from_unix(b"allocator device=0 reserved=100 allocated=50 retries=4", 10) == POD_A  # newer figures
    assert c.from_udp(b"steps=+5\nallocator device=1 reserved=10 allocated=5", "10.244.1.6") == POD_B
    assert c.from_unix(line, 30) is None  # a PID in no pod
    assert c.from_unix(line + b" pod=" + POD_B.encode(), 10) is None  # identity is never taken from the line
    assert c.from_unix(b"steps=+5\nallocator device=0 reserved=1 allocated=2", 20) is None  # whole datagram
    ts = datetime(2026, 1, 5, 9, tzinfo=UTC)
    messages = {m.pod_uid: m for m in c.drain_allocator(ts)}
    assert messages[POD_A] == WorkloadAllocator(
        pod_uid=POD_A, namespace="research", pod="train-0", node="gpu-a", ts=ts,
        devices=[AllocatorDevice(device=0, reserved_bytes=100, allocated_bytes=50, alloc_retries_total=4)])
    assert messages[POD_B].devices == [AllocatorDevice(device=1, reserved_bytes=10, allocated_bytes=5)]
    assert messages[POD_B].namespace == "" and messages[POD_B].node == "gpu-a"
    assert set(messages) == {POD_A, POD_B}
    assert [m.steps_total for m in c.drain(ts)] == [5]  # the progress line of the same datagram
    assert c.drain_allocator(ts) == []  # nothing new since
    assert counter(registry, "agent_progress_malformed_total", path="unix", reason="unknown_key") == 1
    assert counter(registry, "agent_progress_malformed_total", path="unix",
                   reason="allocated_above_reserved") == 1
    assert counter(registry, "agent_progress_lines_total", path="unix", outcome="unattributed") == 1


def test_devices_per_pod_are_bounded() -> None:
    c = collector(MetricsRegistry())
    for i in range(MAX_DEVICES_PER_POD + 6):
        assert c.from_unix(f"allocator device=0 reserved=10 allocated=5 uuid=GPU-{i}".encode(), 10) == POD_A
        c.clock = lambda i=i: float(i)  # type: ignore[misc]  # stay under the rate limit
    (message,) = c.drain_allocator(datetime.now(UTC))
    assert len(message.devices) == MAX_DEVICES_PER_POD
    assert "GPU-0" not in {d.gpu_uuid for d in message.devices}  # the least recent went first


class SinkStandIn:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes]] = []

    def send_progress(self, key: str, payload: bytes) -> bool:
        self.sent.append(("progress", key, payload))
        return True

    def send_allocator(self, key: str, payload: bytes) -> bool:
        self.sent.append(("allocator", key, payload))
        return True

    def poll(self) -> None:
        return None


def test_the_agents_wiring_sends_allocator_messages_to_their_topic(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("GPULENS_PROGRESS_SOCKET", str(short_dir / "p.sock"))
    monkeypatch.setenv("GPULENS_NODE_NAME", "gpu-a")
    monkeypatch.setenv("GPULENS_CLUSTER", "east")
    settings = load_settings(AgentSettings)
    sink = SinkStandIn()
    me = ContainerRef("a" * 64, POD_A, "containerd")
    listener = start_progress(settings, StaticProcessResolver({os.getpid(): me}), AgentMetrics(),
                              sink, lambda: None)
    assert listener is not None
    client = load_client()
    reporter = client.ProgressReporter(socket_path=str(short_dir / "p.sock"), host="", min_interval_s=0)
    reporter.report(steps=2)
    reporter.report_allocator([{"device": 0, "reserved_bytes": 60 * GIB, "allocated_bytes": 12 * GIB,
                                "num_alloc_retries": 2}])
    listener.close()  # reads what is queued and emits
    kinds = {kind: (key, payload) for kind, key, payload in sink.sent}
    assert set(kinds) == {"progress", "allocator"}
    key, payload = kinds["allocator"]
    message = decode(payload, WorkloadAllocator)
    assert key == f"east/{POD_A}" and message.cluster == "east" and message.node == "gpu-a"
    assert message.devices[0].reserved_bytes == 60 * GIB and message.devices[0].alloc_retries_total == 2
    assert decode(kinds["progress"][1], WorkloadProgress).steps_total == 2
