"""A terminated ``gpulens replay --kafka`` (SIGTERM: ``timeout``, a CI runner, a supervisor) stops
its worker processes as an interrupted one does. They run in sessions of their own, which a
terminal's Ctrl-C does not reach, so a replay killed by SIGTERM left them running with nobody to
stop them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.processes import pid_alive
from common.settings import KafkaSettings
from tests.conftest import REPO_ROOT, SHARED_SCENARIOS

pytestmark = pytest.mark.kafka


def _workers_of(pid: int) -> list[int]:
    """The ``gpulens worker`` processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid and b"worker" in command:
            found.append(int(entry.name))
    return found


def test_a_terminated_replay_stops_its_workers(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    with (tmp_path / "stderr").open("wb") as stderr:
        replay = subprocess.Popen(
            [sys.executable, "-m", "gpulens", "replay", str(SHARED_SCENARIOS / "idle-notebook.yaml"), "--kafka",
             kafka_settings.bootstrap_servers, "--workers", "2", "--json"],
            cwd=REPO_ROOT, env=os.environ | {"GPULENS_DATA_DIR": str(tmp_path)},
            stdout=subprocess.DEVNULL, stderr=stderr)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers := _workers_of(replay.pid)) < 2:
            assert replay.poll() is None and time.monotonic() < deadline, "the replay never started 2 workers"
            time.sleep(0.2)
        replay.send_signal(signal.SIGTERM)
        code = replay.wait(90)
        assert code == 130, f"exit {code} (130 as when interrupted); its stderr:\n{(tmp_path / 'stderr').read_text()}"
        left = [pid for pid in workers if pid_alive(pid)]
        assert not left, f"workers {left} outlived their replay"
    finally:
        replay.kill()
        replay.wait()
        for pid in workers:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
