"""Whether a process still runs, for pid files and lock files (the local broker, the sink's query
endpoint) and for tests that check nothing was left behind (a zombie counts as gone: it has exited
and only waits for its parent to reap it); and SIGTERM taken as Ctrl-C by commands that start
processes of their own."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def pid_alive(pid: int) -> bool:
    if pid <= 0:  # 0 or -1 would address a process group, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within, SIGTERM raises :class:`KeyboardInterrupt` as Ctrl-C does, so that the ``finally``
    blocks run. A command that starts processes in sessions of their own (the workers of ``replay
    --kafka`` and of the demo, which a Ctrl-C in the terminal does not reach) then stops them when
    it is terminated (``timeout``, a CI runner, a supervisor) instead of leaving them running with
    nobody to stop them. Only the main thread can take signals: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
