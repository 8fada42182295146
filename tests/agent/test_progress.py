"""Training progress from real processes: the client and callbacks in a real training loop, the
agent's two paths, attribution by what the kernel says about the sender (never by the line), bad
input bounded, and the messages through Kafka and into the replay report's cost per step.

Pods are simulated the way the rest of the agent's tests do it: a fake ``/proc`` tree whose
``<pid>/cgroup`` files put real PIDs (the training processes this test starts) into pod cgroups,
read by the agent's real cgroup resolver. The Hugging Face and Lightning callbacks run against
stand-ins with the frameworks' hook signatures (``tests/agent/standins``): neither framework (nor
torch) is installed here.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

from common.kafka import ensure_topics
from common.metrics import MetricsRegistry
from common.settings import AgentSettings, ConfigError, KafkaSettings, load_settings
from producers.agent.cgroup import ContainerRef, ProcFsResolver, StaticProcessResolver
from producers.agent.fake_kubelet import FakePodResourcesServer
from producers.agent.main import start_progress
from producers.agent.progress import (
    MalformedLine,
    ProcNetPodAddresses,
    ProgressCollector,
    ProgressDelta,
    ProgressLimits,
    ProgressListener,
    ProgressMetrics,
    StaticPodAddresses,
    parse_progress_line,
)
from producers.agent.service import AgentKafkaSink, AgentMetrics
from schemas.codec import decode, encode
from schemas.messages import WorkloadProgress
from schemas.topics import WORKLOAD_PROGRESS
from simulation.fleet_state import SimulatedRecord, Tick
from simulation.replay import run_in_process
from simulation.scenario import parse_scenario
from simulation.simulator import FleetSimulator
from tests.agent.fakenvml import VARIANTS, standard_node
from tests.agent.test_agent_process import assignments, pod_name, pod_uid, write_proc
from tests.agent.test_kafka_integration import read
from tests.conftest import REPO_ROOT

JOB = REPO_ROOT / "tests" / "agent" / "data" / "train_job.py"
PYTHONPATH = os.pathsep.join([str(REPO_ROOT / "clients"), str(REPO_ROOT / "tests" / "agent" / "standins")])
POD_A = "aaaaaaaa-1111-2222-3333-000000000001"
POD_B = "bbbbbbbb-1111-2222-3333-000000000002"
POD_C = "cccccccc-1111-2222-3333-000000000003"


def cgroup_line(pod_uid: str, n: int) -> str:
    return ("0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-{n:064x}.scope\n")


class FakeProc:
    """A ``/proc`` tree: real PIDs put into pod cgroups (and network namespaces) by the test."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, pid: int, pod_uid: str, addresses: tuple[str, ...] = ()) -> None:
        (self.root / str(pid) / "net").mkdir(parents=True, exist_ok=True)
        (self.root / str(pid) / "cgroup").write_text(cgroup_line(pod_uid, pid))
        trie = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 127.0.0.1\n        /32 host LOCAL\n"
        for address in addresses:
            trie += f"     |-- {address}\n        /32 host LOCAL\n     |-- {address.rsplit('.', 1)[0]}.255\n" \
                    "        /32 link BROADCAST\n"
        (self.root / str(pid) / "net" / "fib_trie").write_text(trie)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must fit in 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gpl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_job(mode: str, steps: int, env: dict[str, str], forged: str | None = None) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    return subprocess.Popen([sys.executable, str(JOB), mode, str(steps), *([forged] if forged else [])],
                            env=base | env | {"PYTHONPATH": PYTHONPATH}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(job: subprocess.Popen[str]) -> dict[str, float]:
    out, err = job.communicate("go\n", timeout=120)
    assert job.returncode == 0, err
    return dict(json.loads(out))


def collect(listener: ProgressListener, emitted: list[WorkloadProgress], want: dict[str, float],
            timeout_s: float = 60.0) -> dict[str, WorkloadProgress]:
    """Flush until every pod in ``want`` has reached its steps (the datagrams are in flight)."""
    latest: dict[str, WorkloadProgress] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listener.flush()
        for message in emitted:
            latest[message.pod_uid] = message
        if all(uid in latest and latest[uid].steps_total == steps for uid, steps in want.items()):
            break
        time.sleep(0.2)
    return latest


def keep(emitted: list[WorkloadProgress]) -> Callable[[WorkloadProgress], bool]:
    def emit(message: WorkloadProgress) -> bool:
        emitted.append(message)
        return True
    return emit


def counter(registry: MetricsRegistry, name: str, **labels: str) -> float:
    return registry.registry.get_sample_value(f"gpulens_{name}", labels) or 0.0


# --------------------------------------------------------------------------- lines


@pytest.mark.parametrize(("line", "delta"), [
    ("steps=+10 tokens=+40960", ProgressDelta(steps=10, tokens=40960)),
    ("samples=+32", ProgressDelta(samples=32)),
    ("  steps=+1.5   samples=+0 ", ProgressDelta(steps=1.5, samples=0)),
])
def test_increments_are_read_from_a_line(line: str, delta: ProgressDelta) -> None:
    assert parse_progress_line(line) == delta


@pytest.mark.parametrize(("line", "reason"), [
    ("", "empty"),
    ("steps", "bad_field"),
    ("steps=10", "bad_number"),
    ("steps=+-3", "bad_number"),
    ("steps=+nan", "bad_number"),
    ("steps=+1e30", "bad_number"),
    ("steps=+1 steps=+2", "duplicate_key"),
    (f"pod={POD_A} steps=+1000", "unknown_key"),
    ("namespace=team-a steps=+1", "unknown_key"),
])
def test_a_bad_line_names_its_reason(line: str, reason: str) -> None:
    with pytest.raises(MalformedLine) as info:
        parse_progress_line(line)
    assert info.value.reason == reason


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(("variable", "value"), [
    ("GPULENS_PROGRESS_SOCKET", "run/progress.sock"),
    ("GPULENS_PROGRESS_SOCKET", "/" + "x" * 120),
    ("GPULENS_PROGRESS_UDP_PORT", "70000"),
    ("GPULENS_PROGRESS_UDP_BIND", "node-ip"),
    ("GPULENS_PROGRESS_RATE_PER_S", "0"),
])
def test_invalid_progress_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str,
                                                     value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings(AgentSettings)
    assert variable in str(info.value)


def test_both_paths_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_PROGRESS_SOCKET", "")
    monkeypatch.setenv("GPULENS_PROGRESS_UDP_PORT", "0")
    settings = load_settings(AgentSettings)
    assert start_progress(settings, StaticProcessResolver({}), AgentMetrics(), KafkaSinkStandIn(), lambda: None) is None


class KafkaSinkStandIn:
    def send_progress(self, key: str, payload: bytes) -> bool:
        raise AssertionError("nothing may be sent with both paths off")

    def send_allocator(self, key: str, payload: bytes) -> bool:
        raise AssertionError("nothing may be sent with both paths off")

    def poll(self) -> None:
        return None


# --------------------------------------------------------------------------- the client


def load_client() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpulens_progress", REPO_ROOT / "clients" / "gpulens_progress.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_in_agent(path: Path, blocking: bool = True) -> socket.socket:
    """A datagram socket bound at ``path``, where the agent would listen: what the client sent."""
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(str(path))
    agent.setblocking(blocking)
    return agent


def test_the_client_is_silent_without_an_agent_and_delivers_once_one_appears(short_dir: Path) -> None:
    client = load_client()
    path = short_dir / "p.sock"
    reporter = client.ProgressReporter(socket_path=str(path), host="", min_interval_s=0)
    reporter.report(steps=3, tokens=4096)
    reporter.report(steps=float("nan"), tokens=-5, samples="many")  # ignored, not raised
    assert reporter.sent_lines == 0
    agent = stand_in_agent(path)
    try:
        reporter.report(steps=2, samples=8)
        assert parse_progress_line(agent.recv(1024).decode()) == ProgressDelta(steps=5, tokens=4096, samples=8)
    finally:
        agent.close()


def test_the_first_report_goes_at_once_even_on_a_host_booted_moments_ago(short_dir: Path) -> None:
    client = load_client()
    path = short_dir / "p.sock"
    agent = stand_in_agent(path, blocking=False)
    now = [5.0]  # the monotonic clock counts from boot: 5 s of uptime, well under the interval
    reporter = client.ProgressReporter(socket_path=str(path), host="", min_interval_s=60, clock=lambda: now[0])
    try:
        reporter.report(steps=1)
        assert agent.recv(1024) == b"steps=+1"
        now[0] = 30.0
        reporter.report(steps=2)  # within the interval: coalesced
        with pytest.raises(BlockingIOError):
            agent.recv(1024)
        now[0] = 65.0
        reporter.report(steps=4)
        assert agent.recv(1024) == b"steps=+6"
    finally:
        agent.close()


def test_the_client_never_blocks_and_loses_nothing_when_the_agent_stops_reading(short_dir: Path) -> None:
    client = load_client()
    path = short_dir / "p.sock"
    agent = stand_in_agent(path, blocking=False)
    reporter = client.ProgressReporter(socket_path=str(path), host="", min_interval_s=0)
    try:
        started = time.monotonic()
        for _ in range(5000):
            reporter.report(steps=1)
        elapsed = time.monotonic() - started
        assert reporter.failed_sends > 0  # the agent's queue filled up
        received = 0.0
        while True:
            try:
                received += parse_progress_line(agent.recv(1024).decode()).steps or 0
            except BlockingIOError:
                break
        reporter.flush()
        received += parse_progress_line(agent.recv(1024).decode()).steps or 0
    finally:
        agent.close()
    assert received == 5000
    assert elapsed < 30  # 5000 calls; a blocking send would have hung at the first full queue


# --------------------------------------------------------------------------- the done-when test


def test_real_training_loops_are_credited_to_their_own_pods(short_dir: Path) -> None:
    proc = FakeProc(short_dir / "proc")
    registry = MetricsRegistry()
    collector = ProgressCollector(
        ProcFsResolver(proc.root), StaticPodAddresses({}), ProgressMetrics(registry),
        pod_names=lambda uid: ("research", "train-llm-0") if uid == POD_A else None)
    emitted: list[WorkloadProgress] = []
    socket_path = short_dir / "progress.sock"
    listener = ProgressListener(collector, keep(emitted), interval_s=3600,
                                socket_path=socket_path)
    listener.start()
    try:
        env = {"GPULENS_PROGRESS_SOCKET": str(socket_path), "GPULENS_PROGRESS_MIN_INTERVAL_S": "0.1"}
        plain = start_job("plain", 40, env)
        hf = start_job("transformers", 30, env)
        lightning = start_job("lightning", 20, env, forged=POD_A)  # also claims pod A in a line
        for job, pod in ((plain, POD_A), (hf, POD_B), (lightning, POD_C)):
            proc.put(job.pid, pod)
        trained = {pod: finish(job) for job, pod in ((plain, POD_A), (hf, POD_B), (lightning, POD_C))}
        latest = collect(listener, emitted, {POD_A: 40, POD_B: 30, POD_C: 20})
    finally:
        listener.close()

    assert set(latest) == {POD_A, POD_B, POD_C}
    for pod, figures in trained.items():
        message = latest[pod]
        assert (message.steps_total, message.tokens_total, message.samples_total) == (
            figures["steps"], figures["tokens"], figures["samples"]), pod
    assert all(t["loss_after"] < t["loss_before"] / 4 for t in trained.values())  # they really trained
    assert (latest[POD_A].namespace, latest[POD_A].pod) == ("research", "train-llm-0")
    assert (latest[POD_B].namespace, latest[POD_B].pod) == ("", "")  # not known to the agent: joined by uid
    assert all(decode(encode(m), WorkloadProgress) == m for m in latest.values())
    assert counter(registry, "agent_progress_malformed_total", path="unix", reason="unknown_key") == 1
    assert not socket_path.exists()  # removed on close


def test_what_is_queued_at_shutdown_is_read_and_emitted(short_dir: Path) -> None:
    emitted: list[WorkloadProgress] = []
    collector = ProgressCollector(ProcFsResolver(short_dir / "proc"), StaticPodAddresses({}),
                                  ProgressMetrics(MetricsRegistry()))
    listener = ProgressListener(collector, keep(emitted), interval_s=3600, socket_path=short_dir / "p.sock")
    FakeProc(short_dir / "proc").put(os.getpid(), POD_A)
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for _ in range(3):
        sender.sendto(b"steps=+2 tokens=+10", str(short_dir / "p.sock"))
    sender.close()
    listener.close()  # never started: only the shutdown drain reads them
    assert [(m.pod_uid, m.steps_total, m.tokens_total) for m in emitted] == [(POD_A, 6, 30)]


def test_a_process_outside_any_pod_is_credited_to_nobody(short_dir: Path) -> None:
    registry = MetricsRegistry()
    collector = ProgressCollector(ProcFsResolver(short_dir / "empty-proc"), StaticPodAddresses({}),
                                  ProgressMetrics(registry))
    listener = ProgressListener(collector, lambda m: True, interval_s=3600, socket_path=short_dir / "p.sock")
    listener.start()
    try:
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.sendto(b"steps=+5", str(short_dir / "p.sock"))
        sender.close()
        deadline = time.monotonic() + 30
        while counter(registry, "agent_progress_lines_total", path="unix", outcome="unattributed") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        listener.close()
    assert listener.flush() == 0


def test_the_udp_path_credits_the_pod_owning_the_source_address() -> None:
    registry = MetricsRegistry()
    collector = ProgressCollector(StaticProcessResolver({}), StaticPodAddresses(
        {"127.0.0.1": POD_A, "127.0.0.3": POD_B}), ProgressMetrics(registry))
    emitted: list[WorkloadProgress] = []
    listener = ProgressListener(collector, keep(emitted), interval_s=3600,
                                udp=("127.0.0.1", 0))
    listener.start()
    try:
        port = listener.udp_port
        assert port
        job = start_job("plain", 25, {"GPULENS_PROGRESS_SOCKET": "", "GPULENS_PROGRESS_HOST": "127.0.0.1",
                                      "GPULENS_PROGRESS_UDP_PORT": str(port)})
        trained = finish(job)
        for source, line in (("127.0.0.3", b"steps=+7"), ("127.0.0.2", b"steps=+9")):
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sender.bind((source, 0))
            sender.sendto(line, ("127.0.0.1", port))
            sender.close()
        latest = collect(listener, emitted, {POD_A: 25, POD_B: 7})
        deadline = time.monotonic() + 30
        while counter(registry, "agent_progress_lines_total", path="udp", outcome="unattributed") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        listener.close()
    assert latest[POD_A].steps_total == trained["steps"] and latest[POD_A].tokens_total == trained["tokens"]
    assert latest[POD_B].steps_total == 7
    assert set(latest) == {POD_A, POD_B}  # 127.0.0.2 owns no pod: its steps went nowhere


def test_pod_addresses_come_from_each_pods_network_namespace(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.put(1, "", ("192.168.1.10",))  # the host: PID 1 (no pod in its cgroup)
    (tmp_path / "1" / "cgroup").write_text("0::/init.scope\n")
    proc.put(101, POD_A, ("10.244.1.5",))
    proc.put(102, POD_A, ("10.244.1.5",))  # another process of the same pod
    proc.put(201, POD_B, ("10.244.1.6",))
    proc.put(301, POD_C, ("192.168.1.10",))  # a host-network pod
    book = ProcNetPodAddresses(tmp_path, ProcFsResolver(tmp_path), min_rescan_s=0)
    assert book.pod_for_address("10.244.1.5") == POD_A
    assert book.pod_for_address("::ffff:10.244.1.6") == POD_B
    assert book.pod_for_address("192.168.1.10") is None  # the node's address: every host-network pod's
    assert book.pod_for_address("127.0.0.1") is None
    proc.put(401, POD_C, ("10.244.1.7",))  # a new pod: found on the next miss
    assert book.pod_for_address("10.244.1.7") == POD_C


# --------------------------------------------------------------------------- bad input, bounded


def test_bad_input_is_counted_summarised_in_the_log_and_bounded(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    registry = MetricsRegistry()
    collector = ProgressCollector(
        StaticProcessResolver({10: ContainerRef("a" * 64, POD_A, "containerd"),
                               20: ContainerRef("b" * 64, POD_B, "containerd")}),
        StaticPodAddresses({}), ProgressMetrics(registry),
        limits=ProgressLimits(max_datagram_bytes=128, rate_per_s=5), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert collector.from_unix(b"steps=10", 10) is None
        assert collector.from_unix(b"\xff\xfe", 10) is None
        assert collector.from_unix(b"steps=+1 " * 40, 20) is None
        assert collector.from_unix(b"steps=+1\nsteps=+2\n", 20) == POD_B
        for _ in range(20):  # a burst of 10 (the 4 bad datagrams spent 4 of them), then 5 per second
            collector.from_unix(b"steps=+1", 10)
        now[0] = 1.0
        for _ in range(20):
            collector.from_unix(b"steps=+1", 10)
    totals = {m.pod_uid: m.steps_total for m in collector.drain(datetime.now(UTC))}
    assert totals == {POD_A: 6 + 5, POD_B: 3}
    assert counter(registry, "agent_progress_malformed_total", path="unix", reason="bad_number") == 3
    assert counter(registry, "agent_progress_malformed_total", path="unix", reason="not_utf8") == 1
    assert counter(registry, "agent_progress_lines_total", path="unix", outcome="too_large") == 1
    assert counter(registry, "agent_progress_lines_total", path="unix", outcome="rate_limited") == 14 + 15
    rejected = [r for r in caplog.records if r.getMessage() == "progress lines rejected"]
    assert len(rejected) == 1  # the first rejection at once; the rest wait for the next interval's summary
    with caplog.at_level(logging.WARNING):
        collector.log_rejections(force=True)
    summary = [r for r in caplog.records if r.getMessage() == "progress lines rejected"][-1]
    by_reason = summary.__dict__["gpulens_fields"]["by_reason"]
    assert by_reason == {"unix/bad_number": 2, "unix/not_utf8": 1, "unix/too_large": 1, "unix/rate_limited": 29}


# --------------------------------------------------------------------------- the DaemonSet's command


def test_the_daemonset_command_reports_a_training_pods_progress_under_its_name(
        tmp_path: Path, short_dir: Path) -> None:
    """``python -m producers.agent`` on the fake NVML library: a training process in the pod that
    holds GPU 0 reports; the agent prints its progress, named from the pod's GPU processes."""
    node = standard_node(VARIANTS["r470"])
    proc_root = tmp_path / "proc"
    write_proc(proc_root, node)
    device = node.processes[0].device
    kubelet = tmp_path / "kubelet" / "kubelet.sock"
    socket_path = short_dir / "progress.sock"
    with FakePodResourcesServer(kubelet, assignments(node)):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_") and k != "NODE_NAME"}
        env |= node.environment(tmp_path / "node.conf") | {
            "GPULENS_KUBELET_SOCKET": str(kubelet), "GPULENS_PROC_ROOT": str(proc_root),
            "GPULENS_LOG_FORMAT": "text", "GPULENS_PROGRESS_SOCKET": str(socket_path),
            "GPULENS_PROGRESS_INTERVAL_S": "1", "GPULENS_CLUSTER": "gpu-farm"}
        agent = subprocess.Popen(
            [sys.executable, "-m", "producers.agent", "--stdout", "--interval", "1", "--node-name", "gpu-node-1"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        progress: list[WorkloadProgress] = []
        try:
            assert agent.stdout is not None
            assert agent.stdout.readline(), "the agent printed no sample"
            job = start_job("plain", 30, {"GPULENS_PROGRESS_SOCKET": str(socket_path)})
            FakeProc(proc_root).put(job.pid, pod_uid(device))
            trained = finish(job)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (progress and progress[-1].steps_total == trained["steps"]):
                line = agent.stdout.readline()
                if not line:
                    break
                if '"steps_total"' in line:
                    progress.append(decode(line, WorkloadProgress))
        finally:
            agent.terminate()
            agent.wait(30)
    assert progress, agent.stderr.read() if agent.stderr else ""
    last = progress[-1]
    assert (last.pod_uid, last.namespace, last.pod) == (pod_uid(device), "ml", pod_name(device))
    assert last.cluster == "gpu-farm"
    assert (last.steps_total, last.tokens_total) == (trained["steps"], trained["tokens"])


# --------------------------------------------------------------------------- Kafka and the report


@pytest.mark.kafka
def test_progress_reaches_kafka_through_the_agents_wiring(kafka_settings: KafkaSettings, topic_prefix: str,
                                                          short_dir: Path) -> None:
    ensure_topics(kafka_settings, [WORKLOAD_PROGRESS], topic_prefix)
    proc = FakeProc(short_dir / "proc")
    socket_path = short_dir / "progress.sock"
    settings = load_settings(AgentSettings, topic_prefix=topic_prefix, kafka=kafka_settings,
                             progress_socket=str(socket_path), proc_root=proc.root, progress_interval_s=1.0,
                             cluster="east")
    metrics = AgentMetrics()
    sink = AgentKafkaSink(settings, metrics)
    listener = start_progress(settings, ProcFsResolver(proc.root), metrics, sink, lambda: None)
    assert listener is not None
    try:
        job = start_job("plain", 12, {"GPULENS_PROGRESS_SOCKET": str(socket_path)})
        proc.put(job.pid, POD_A)
        trained = finish(job)
    finally:
        listener.close()
        assert sink.close(15.0) == 0
    records = read(kafka_settings, WORKLOAD_PROGRESS.name(topic_prefix), 1)
    messages = [decode(value, WorkloadProgress) for _, value in records]
    assert {key for key, _ in records} == {f"east/{POD_A}".encode()}
    assert {message.cluster for message in messages} == {"east"}
    assert messages[-1].steps_total == trained["steps"] and messages[-1].tokens_total == trained["tokens"]


SCENARIO = """
name: progress-from-a-pod
start: "2026-01-05T09:00:00Z"
duration: 20m
prices: {"NVIDIA H100 80GB HBM3": 2.5}
nodes: [{name: gpu-a, gpus: 2}]
pods:
  - {name: train, namespace: research, gpus: 2, run_for: 15m, util: 90, memory_gib: 30}
"""


def test_agent_progress_gives_cost_per_step_in_the_replay_report() -> None:
    import yaml

    scenario = parse_scenario(yaml.safe_load(SCENARIO))
    uid = FleetSimulator(scenario).pod_uids()[0]
    now = [0.0]
    collector = ProgressCollector(StaticProcessResolver({4242: ContainerRef("c" * 64, uid, "containerd")}),
                                  StaticPodAddresses({}), ProgressMetrics(MetricsRegistry()), clock=lambda: now[0])
    ticks: list[Tick] = []
    for tick in FleetSimulator(scenario).run():
        now[0] = tick.offset_s
        if 0 < tick.offset_s < 15 * 60:
            assert collector.from_unix(b"steps=+25 tokens=+102400", 4242) == uid
            tick.records.extend(SimulatedRecord(WORKLOAD_PROGRESS.suffix, m.pod_uid, encode(m))
                                for m in collector.drain(tick.ts))
        ticks.append(tick)
    fed = sum(1 for t in ticks if 0 < t.offset_s < 15 * 60)
    pod = run_in_process(scenario, ticks=ticks).report["pods"][0]
    assert pod["seen"] and pod["steps"] == 25 * fed
    assert pod["cost_usd"] and pod["cost_per_step_usd"] == pytest.approx(pod["cost_usd"] / pod["steps"], rel=1e-4)
