"""Whether a process still runs, for pid files and lock files (the local broker, the sink's query
endpoint) and for tests that check nothing was left behind. A zombie counts as gone: it has exited
and only waits for its parent to reap it."""

from __future__ import annotations

import os


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
