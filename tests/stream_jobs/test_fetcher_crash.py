"""A crash of faust's fetcher ends the worker with status 70 (restart from the checkpoints), never a
worker that stops half-way and hangs: seen in CI, a ``KeyError(TopicPartition(...))`` raised in
faust's "Drain messages" right after a seek left a worker that no supervisor restarted. So does an
error while the worker starts, which mode's worker ended with status 1 (not restarted by
``gpulens replay --kafka`` outside a chaos run)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from stream_jobs.offsets import EXIT_STALLED

_CRASH = textwrap.dedent("""
    import asyncio, sys
    from common.settings import WorkerSettings, load_settings
    from stream_jobs.faust_app import StreamJobs

    async def main() -> None:
        jobs = StreamJobs(load_settings(WorkerSettings, topic_prefix="fetcher", data_dir=sys.argv[1]))
        fetcher = jobs.app._fetcher
        print(type(fetcher).__name__, flush=True)
        await fetcher.crash(KeyError(sys.argv[2]))
        print("still running", flush=True)

    asyncio.run(main())
""")


def _python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by this interpreter in a process of its own (what ends it ends only that)."""
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_crashed_fetcher_ends_the_worker_for_a_restart(tmp_path: Path) -> None:
    done = _python(_CRASH, str(tmp_path), "TopicPartition(topic='x.internal.node-inputs.v1', partition=3)")
    assert done.returncode == EXIT_STALLED, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["ExitingFetcher"], "the process ended inside the crash"
    assert "stream jobs exiting to restart from their checkpoints" in done.stderr


_START_UP_FAILS = textwrap.dedent("""
    import sys
    import faust
    from common import logs
    from common.settings import WorkerSettings, load_settings
    from stream_jobs.faust_app import run_stream_jobs

    async def refuse_to_start(self) -> None:
        raise RuntimeError("the broker went away while the worker joined its group")

    faust.App.on_start = refuse_to_start
    logs.configure(fmt="json")
    run_stream_jobs(load_settings(WorkerSettings, topic_prefix="startup", data_dir=sys.argv[1],
                             kafka={"bootstrap_servers": "127.0.0.1:1"}))
""")


def test_an_error_while_the_worker_starts_ends_it_for_a_restart(tmp_path: Path) -> None:
    done = _python(_START_UP_FAILS, str(tmp_path))
    assert done.returncode == EXIT_STALLED, done.stdout + done.stderr
    exit_line = next(line for line in done.stderr.splitlines() if "exiting to restart" in line)
    assert "the broker went away while the worker joined its group" in exit_line


_LOOP_ENDS = textwrap.dedent("""
    import asyncio, sys
    from common import logs
    from common.settings import WorkerSettings, load_settings
    from stream_jobs.faust_app import StreamJobs

    async def main() -> None:
        logs.configure(fmt="json")
        jobs = StreamJobs(load_settings(WorkerSettings, topic_prefix="fetcher", data_dir=sys.argv[1]))
        fetcher = jobs.app._fetcher
        if sys.argv[2] == "stopped":
            await fetcher.stop()
        fetcher.set_shutdown()  # what faust's fetch task does as it ends, stopped or not
        print("still running", flush=True)

    asyncio.run(main())
""")


def test_a_fetch_loop_that_ends_unstopped_ends_the_worker_for_a_restart(tmp_path: Path) -> None:
    """faust ends its fetch loop without a word on a cancellation outside a rebalance, and takes
    the fetcher for running afterwards: a worker that would fetch nothing again."""
    ended = _python(_LOOP_ENDS, str(tmp_path), "running")
    assert ended.returncode == EXIT_STALLED, ended.stdout + ended.stderr
    assert "fetch loop ended without the fetcher being stopped" in ended.stderr
    stopped = _python(_LOOP_ENDS, str(tmp_path), "stopped")
    assert (stopped.returncode, stopped.stdout) == (0, "still running\n"), "a stopped fetcher ends as before"


_WATCH_FAILS = textwrap.dedent("""
    import asyncio, sys
    from common import logs
    from common.settings import WorkerSettings, load_settings
    from stream_jobs.faust_app import StreamJobs

    async def main() -> None:
        logs.configure(fmt="json")
        jobs = StreamJobs(load_settings(WorkerSettings, topic_prefix="watch", data_dir=sys.argv[1]))

        async def broken() -> None:
            raise RuntimeError("a bug in the watch")

        jobs.offsets.watch = broken
        await jobs._watch_partitions()
        print("still running", flush=True)

    asyncio.run(main())
""")


def test_a_partition_watch_that_fails_ends_the_worker_for_a_restart(tmp_path: Path) -> None:
    """Unwatched, a stalled partition or a restore that reads nothing would hang the worker unseen."""
    done = _python(_WATCH_FAILS, str(tmp_path))
    assert done.returncode == EXIT_STALLED, done.stdout + done.stderr
    assert "the partition watch failed: RuntimeError('a bug in the watch')" in done.stderr
