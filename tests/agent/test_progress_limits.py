"""The progress endpoint's limits hold against many senders (issue 49, finding 8).

- the rate limit belongs to the pod, not to the PID: processes forked by one pod share one budget
  (real processes on the real socket, attributed through a fake ``/proc`` as in test_progress.py);
- any number of distinct senders makes a bounded number of log lines (one summary per interval,
  counts by reason; the metrics keep the exact counts) and holds no state per sender;
- numbers are ASCII digits (with the fraction and exponent the client writes), not whatever
  Python's ``float()`` takes: other scripts' digits, fullwidth digits, underscores are rejected.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from common.metrics import MetricsRegistry
from producers.agent.cgroup import ContainerRef, ProcFsResolver, StaticProcessResolver
from producers.agent.progress import (
    MalformedLine,
    ProgressCollector,
    ProgressDelta,
    ProgressLimits,
    ProgressListener,
    ProgressMetrics,
    StaticPodAddresses,
    parse_progress_line,
)
from schemas.messages import WorkloadProgress
from tests.agent.test_progress import POD_A, POD_B, FakeProc, counter, keep, load_client, short_dir  # noqa: F401

SUMMARY = "progress lines rejected"

SENDER = """
import socket, sys
path, count = sys.argv[1], int(sys.argv[2])
sys.stdin.readline()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
for _ in range(count):
    sock.sendto(b"steps=+1", path)
print("sent", flush=True)
"""


def test_processes_of_one_pod_share_one_rate_budget(short_dir: Path) -> None:  # noqa: F811
    """12 processes of one pod, 60 datagrams each, as fast as they can: the pod gets its burst
    plus its rate for the time it took, not 12 bursts."""
    proc = FakeProc(short_dir / "proc")
    registry = MetricsRegistry()
    rate = 20.0
    collector = ProgressCollector(ProcFsResolver(proc.root), StaticPodAddresses({}), ProgressMetrics(registry),
                                  limits=ProgressLimits(rate_per_s=rate))
    emitted: list[WorkloadProgress] = []
    socket_path = short_dir / "p.sock"
    listener = ProgressListener(collector, keep(emitted), interval_s=3600, socket_path=socket_path)
    senders = [subprocess.Popen([sys.executable, "-S", "-c", SENDER, str(socket_path), "60"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(12)]
    for sender in senders:
        proc.put(sender.pid, POD_A)
    listener.start()
    try:
        started = time.monotonic()
        for sender in senders:
            assert sender.stdin is not None
            sender.stdin.write("go\n")
            sender.stdin.flush()
        for sender in senders:
            out, _ = sender.communicate(timeout=60)
            assert sender.returncode == 0 and out.strip() == "sent"
    finally:
        listener.close()  # reads what is still queued
    elapsed = time.monotonic() - started
    accepted = counter(registry, "agent_progress_lines_total", path="unix", outcome="accepted")
    limited = counter(registry, "agent_progress_lines_total", path="unix", outcome="rate_limited")
    assert accepted + limited == 12 * 60
    assert accepted <= 2 * rate + rate * elapsed + 1, (accepted, elapsed)  # one pod: one burst, one rate
    assert [(m.pod_uid, m.steps_total) for m in emitted] == [(POD_A, accepted)]


def test_one_pods_budget_is_its_own() -> None:
    """Processes of another pod keep their full budget while one pod is rate limited."""
    resolver = StaticProcessResolver({pid: ContainerRef(f"{pid:064x}", POD_A if pid < 100 else POD_B, "containerd")
                                      for pid in (*range(10, 40), 100)})
    registry = MetricsRegistry()
    collector = ProgressCollector(resolver, StaticPodAddresses({}), ProgressMetrics(registry),
                                  limits=ProgressLimits(rate_per_s=5), clock=lambda: 0.0)
    for pid in range(10, 40):  # 30 forked PIDs of pod A, 43 datagrams each, in no time
        for _ in range(43):
            collector.from_unix(b"steps=+1", pid)
    for _ in range(10):
        assert collector.from_unix(b"steps=+1", 100) == POD_B
    totals = {m.pod_uid: m.steps_total for m in collector.drain(datetime.now(UTC))}
    assert totals == {POD_A: 10, POD_B: 10}  # each pod its burst of twice the rate
    assert counter(registry, "agent_progress_lines_total", path="unix", outcome="rate_limited") == 30 * 43 - 10
    assert collector.rate_budgets == 2


def test_distinct_senders_make_a_bounded_log_and_hold_no_state(caplog: pytest.LogCaptureFixture) -> None:
    """50,000 distinct UDP sources over 150 s (no pod owns them), and one pod sending garbage: a
    handful of summary lines with counts by reason, exact metrics, no state per sender."""
    now = [0.0]
    registry = MetricsRegistry()
    collector = ProgressCollector(StaticProcessResolver({}), StaticPodAddresses({"10.244.0.9": POD_A}),
                                  ProgressMetrics(registry), limits=ProgressLimits(),  # summaries every 60 s
                                  clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for i in range(50_000):
            now[0] = i * 0.003
            address = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}" if i % 2 else f"fd00::{i:x}"
            assert collector.from_udp(b"steps=+1", address) is None
            if i % 1000 == 0:
                collector.from_udp("steps=+\u0661\u0662".encode(), "10.244.0.9")
        assert len(caplog.records) <= 4  # at 0 s, 60 s and 120 s (on 1be27aa: one per sender)
        collector.log_rejections(force=True)
    assert counter(registry, "agent_progress_lines_total", path="udp", outcome="unattributed") == 50_000
    assert counter(registry, "agent_progress_malformed_total", path="udp", reason="bad_number") == 50
    summaries = [r for r in caplog.records if r.getMessage() == SUMMARY]
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == len(summaries) <= 5
    assert len(summaries) >= 3  # at 0 s, 60 s, 120 s, and the forced one
    fields = [r.__dict__["gpulens_fields"] for r in summaries]
    assert sum(f["by_reason"].get("udp/unattributed", 0) for f in fields) == 50_000
    assert sum(f["by_reason"].get("udp/bad_number", 0) for f in fields) == 50
    assert all(set(f["examples"]) == set(f["by_reason"]) for f in fields)  # one example per reason
    assert collector.rate_budgets == 1  # the one pod that sent; strangers leave nothing behind


@pytest.mark.parametrize("text", [
    "steps=+\u0661\u0662\u0663",  # Arabic-Indic digits
    "steps=+\uff15",  # fullwidth
    "steps=+1_000",
    "tokens=+1 steps=+\u0663",
    "steps=+inf",
    "steps=+Infinity",
    "steps=+0x10",
    "steps=+ 1",
    "steps=+1.",
    "steps=+.5",
    "steps=+1e",
    "steps=+1,5",
    "steps=+\u0661.\u0665",
    "samples=+\U0001d7d9",  # mathematical double-struck one
])
def test_numbers_are_ascii_digits_only(text: str) -> None:
    with pytest.raises(MalformedLine) as info:
        parse_progress_line(text)
    assert info.value.reason == "bad_number"


def test_non_ascii_digits_are_rejected_on_the_wire() -> None:
    registry = MetricsRegistry()
    collector = ProgressCollector(StaticProcessResolver({10: ContainerRef("a" * 64, POD_A, "containerd")}),
                                  StaticPodAddresses({}), ProgressMetrics(registry))
    for line in ("steps=+\u0661\u0662\u0663", "steps=+\uff15", "steps=+1_000"):
        assert collector.from_unix(line.encode(), 10) is None
    assert collector.from_unix(b"steps=+123 tokens=+5e3", 10) == POD_A
    assert [(m.steps_total, m.tokens_total) for m in collector.drain(datetime.now(UTC))] == [(123, 5000)]
    assert counter(registry, "agent_progress_malformed_total", path="unix", reason="bad_number") == 3


@pytest.mark.parametrize("value", [1, 0.5, 1 / 3, 1e-7, 123456789.123, 4096.0, 1e11, 999999999999.5])
def test_what_the_client_writes_the_agent_accepts(value: float) -> None:
    reporter = load_client().ProgressReporter(socket_path="", host="", min_interval_s=3600)
    reporter.pending["steps"] = float(value)
    reporter.pending["tokens"] = float(value) / 7
    assert parse_progress_line(reporter._line().decode()) == ProgressDelta(steps=value, tokens=value / 7)
