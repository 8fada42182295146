"""Batches prepared in a process of their own, so decoding and pivoting get a core while the sink's
process inserts the batch before (the sink is otherwise bound by one interpreter lock).

The child runs the same :class:`sinks.prepare.BatchPreparer` on the same records with the sink's
clock, so the columns are the ones the sink would build itself and a retried batch is still the
same block. It sends back only the tables and the indices of the rejected records, pickled inside
the child while its garbage collector is paused (the batch's objects are freed by reference counting;
no collection scans them). If the child dies (killed for memory, say), the batch is prepared in the
sink's process instead and a new child is started for the next one: nothing is lost or doubled,
only time.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import datetime

from common.logs import get_logger
from sinks.ddl import TtlDays
from sinks.prepare import Batch, BatchPreparer, PreparedBatch, PreparedParts

log = get_logger(__name__)

_CHILD_PREPARER: BatchPreparer | None = None


def _start_child(ttl: TtlDays, sink_pid: int) -> None:
    global _CHILD_PREPARER
    threading.Thread(target=_exit_with_parent, args=(sink_pid,), name="parent-watch", daemon=True).start()
    _CHILD_PREPARER = BatchPreparer(ttl)


def _exit_with_parent(parent_pid: int) -> None:
    """End the child once the sink is gone: a SIGKILLed sink cannot shut its pool down, and the
    child's end of the task queue would keep it waiting for ever."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(0)


def _ready() -> bool:
    return _CHILD_PREPARER is not None


def _prepare_in_child(batch: Batch, now: datetime) -> bytes:
    assert _CHILD_PREPARER is not None
    enabled = gc.isenabled()
    gc.disable()
    try:
        return pickle.dumps(_CHILD_PREPARER.prepare_parts(batch, now), protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        if enabled:
            gc.enable()


class PreparePool:
    """One child process that prepares batches (see the module docstring)."""

    def __init__(self, preparer: BatchPreparer, ttl: TtlDays, on_fallback: Callable[[], None] = lambda: None) -> None:
        self.preparer = preparer
        self.ttl = ttl
        self.on_fallback = on_fallback
        """Called for each batch prepared in the sink's process because the child had died."""
        self._executor: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Start the child (it imports the schemas while the sink joins its group)."""
        if self._executor is None:
            # spawned, not forked: the sink's process runs librdkafka and ClickHouse threads
            self._executor = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start_child, initargs=(self.ttl, os.getpid()))
            self._executor.submit(_ready)

    def prepare(self, batch: Batch) -> PreparedBatch:
        now = self.preparer.now()
        self.start()
        assert self._executor is not None
        try:
            payload = self._executor.submit(_prepare_in_child, batch, now).result()
        except BrokenProcessPool as exc:
            self.on_fallback()
            log.warning("batch preparation process died; preparing this batch in the sink's process and "
                        "starting a new one", batch=batch.token, error=str(exc) or type(exc).__name__)
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
            return self.preparer.prepare(batch, now)
        parts: PreparedParts = pickle.loads(payload)
        return parts.assemble(batch)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
