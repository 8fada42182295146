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


class _Termination:
    """The SIGTERM state of the main thread within :func:`terminate_as_interrupt`."""

    terminated = False
    deferred = 0
    """How many :func:`uninterrupted` blocks the main thread is in: SIGTERM waits for their end."""


_termination = _Termination()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _termination.terminated = True
    if not _termination.deferred:
        raise KeyboardInterrupt


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within, SIGTERM raises :class:`KeyboardInterrupt` as Ctrl-C does, so that the ``finally``
    blocks run. A command that starts processes in sessions of their own (the workers of ``replay
    --kafka`` and of the demo, which a Ctrl-C in the terminal does not reach) then stops them when
    it is terminated (``timeout``, a CI runner, a supervisor) instead of leaving them running with
    nobody to stop them. Only the main thread can take signals: elsewhere this does nothing.

    The interrupt is raised wherever the main thread is, also inside a C library's callback
    (librdkafka's logger, a delivery report), which may turn it into an error of its own
    (``SystemError``) or swallow it. So, once terminated, the block ends in
    :class:`KeyboardInterrupt` whatever it ended in: the command exits as interrupted (130)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _termination.terminated = False
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    except BaseException as exc:
        if _termination.terminated and not isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt from exc
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        terminated, _termination.terminated = _termination.terminated, False  # none of later code's business
    if terminated:
        raise KeyboardInterrupt


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Within (starting a child process: its handle must reach the code that stops it), a SIGTERM
    taken as Ctrl-C by :func:`terminate_as_interrupt` waits for the end of the block."""
    _termination.deferred += 1
    try:
        yield
    finally:
        _termination.deferred -= 1
    if _termination.terminated and not _termination.deferred:
        raise KeyboardInterrupt
