"""A ``gpulens`` command as a child process whose log lines are collected (sink, alert forwarder, ...).

The crash tests SIGKILL and restart such children and read what they logged; one helper serves
them all, so "assigned" means the same thing in every test: the consumer logged its partitions.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading

from tests.conftest import REPO_ROOT


def free_port() -> int:
    """A loopback port nothing listens on now, for a child (or a test server) to listen on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GpulensChild:
    """``python -m gpulens ARGS`` with ``env``; stderr lines in ``lines``, ``assigned`` set on assignment."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.command = " ".join(("gpulens", *args))
        self.proc = subprocess.Popen([sys.executable, "-m", "gpulens", *args], cwd=REPO_ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.assigned = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "partitions assigned" in line:
                self.assigned.set()

    def wait_assigned(self, timeout_s: float = 60) -> None:
        if not self.assigned.wait(timeout_s):
            raise AssertionError(f"{self.command} got no partitions:\n" + self.log())

    def log(self, last: int = 60) -> str:
        return "".join(self.lines[-last:])

    def logged(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.wait(20)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.wait(30)
