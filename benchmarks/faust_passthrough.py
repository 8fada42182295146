"""A faust consume -> produce passthrough on a worker's own runtime: the floor under a worker.

Run by the stream benchmark as a child process (``python -m benchmarks.faust_passthrough SOURCE
TARGET COUNT RESULT``, settings from ``GPULENS_*`` as a worker's). It builds the app a worker
builds (:func:`stream_jobs.faust_app.make_app`: the same consumer, fetch sizes, producer settings,
at-least-once acknowledgements, uvloop and GC thresholds; its topics, ``raw_topic``) with one agent
that reads SOURCE as a worker's agents read (``direct_agent``: from an ``Inbox``, not faust's
stream), sends every record to TARGET unchanged, as a worker sends (``DirectSender``), and runs no
stages. Once COUNT records are forwarded and delivered it writes ``{"per_s": ..., "per_cpu_s": ...}``
to RESULT, timed from the first record; the parent then stops it.

What a worker does per sample on top of this is the work itself: its stages, and the other records
a sample brings along (the fleet's progress records, pod windows, marks, checkpoints).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from common.settings import WorkerSettings, load_settings
from stream_jobs.faust_app import (
    WORKER_GC_THRESHOLDS,
    DirectSender,
    Inbox,
    RestartingWorker,
    direct_agent,
    make_app,
    raw_topic,
    use_uvloop,
)


def main(argv: list[str]) -> None:
    source, target, count, result = argv[0], argv[1], int(argv[2]), Path(argv[3])
    gc.set_threshold(*WORKER_GC_THRESHOLDS)
    use_uvloop()
    app = make_app(load_settings(WorkerSettings))
    target_topic = DirectSender(app, target)  # as a worker sends

    async def forward(inbox: Inbox) -> None:
        pending: list[Any] = []
        started = cpu_started = 0.0
        async for event in inbox.events():
            if not pending:
                started, cpu_started = time.perf_counter(), time.process_time()
            pending.append(await target_topic.send(key=event.message.key, value=event.value))
            await inbox.ack(event)
            if len(pending) == count:
                await asyncio.gather(*pending)
                seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
                partial = result.with_suffix(".partial")
                partial.write_bytes(orjson.dumps({"per_s": count / seconds, "per_cpu_s": count / cpu_s}))
                partial.replace(result)  # whole or absent for the parent, which polls for it

    direct_agent(app, raw_topic(app, source), "forward", forward)  # as a worker's agents read
    RestartingWorker(app, loglevel="warning", override_logging=False, quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1:])
