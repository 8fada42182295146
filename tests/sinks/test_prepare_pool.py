"""The sink's preparing process: it builds exactly the columns and dead-letter reasons the sink's own
process builds, and when it dies (SIGKILL) the batch is prepared in the sink's process and a new
child takes the next one: nothing is lost or doubled."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from schemas.codec import encode
from schemas.topics import GPU_SAMPLES, K8S_PODS, POD_WINDOWS
from sinks.ddl import TtlDays
from sinks.prepare import Batch, BatchPreparer, ConsumedRecord, PreparedBatch
from sinks.prepare_pool import PreparePool
from tests.conftest import REPO_ROOT
from tests.sinks import factories as f

PREFIX = "pool"


def _batch(first: int = 0) -> Batch:
    samples = GPU_SAMPLES.name(PREFIX)
    old = f.sample("node-old", 1, gpus=2).model_copy(update={"ts": datetime(1970, 1, 2, tzinfo=UTC)})
    values: list[bytes | None] = [encode(f.sample(f"node-{i % 3}", i, with_xid=i == 4)) for i in range(6)]
    values[2] = b'{"schema_version": 1, "node": "n", "gpus": "not a list"}'
    values[5] = encode(old)
    records = [ConsumedRecord(samples, 0, first + i, b"k", v, 1_700_000_000_000) for i, v in enumerate(values)]
    return Batch(samples, 0, records, first, first + len(records) - 1)


def _same(a: PreparedBatch, b: PreparedBatch) -> None:
    assert a.batch is b.batch
    assert [r.offset for r in a.kept] == [r.offset for r in b.kept]
    assert [(r.offset, reason) for r, reason in a.rejected] == [(r.offset, reason) for r, reason in b.rejected]
    assert sorted(a.tables) == sorted(b.tables)
    for table, columns in a.tables.items():
        assert columns.names == b.tables[table].names
        assert columns.data == b.tables[table].data, table


def test_the_child_prepares_what_the_sink_would() -> None:
    now = datetime.now(UTC)
    preparer = BatchPreparer(TtlDays(), now=lambda: now)
    pool = PreparePool(preparer, TtlDays())
    try:
        batch = _batch()
        here, there = preparer.prepare(batch), pool.prepare(batch)
        _same(there, here)
        assert [r.offset for r, _ in there.rejected] == [2, 5]
        assert "invalid gpu.samples.v1 message" in there.rejected[0][1]
        assert "14-day TTL" in there.rejected[1][1]
        assert set(there.tables) == {"gpu_samples", "gpu_processes", "gpu_xids"}
        assert there.tables["gpu_samples"].n_rows == 4 * 8

        # other topics, tombstones and records with neither key nor value go the same way
        pods, windows = K8S_PODS.name(PREFIX), POD_WINDOWS.name(PREFIX)
        mixed = [ConsumedRecord(pods, 1, 10, b"research/pod-a", encode(f.pod("a"))),
                 ConsumedRecord(pods, 1, 11, b"research/pod-a", None, 1_700_000_000_000),
                 ConsumedRecord(windows, 1, 12, None, None)]
        for record in mixed:
            single = Batch(record.topic, 1, [record], record.offset, record.offset)
            _same(pool.prepare(single), preparer.prepare(single))
    finally:
        pool.close()


def test_a_killed_child_costs_time_not_records() -> None:
    now = datetime.now(UTC) - timedelta(seconds=1)
    preparer = BatchPreparer(TtlDays(), now=lambda: now)
    fallbacks: list[int] = []
    pool = PreparePool(preparer, TtlDays(), on_fallback=lambda: fallbacks.append(1))
    try:
        first = pool.prepare(_batch())
        children = multiprocessing.active_children()
        assert len(children) == 1 and children[0].pid != os.getpid()
        assert children[0].pid is not None
        os.kill(children[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while children[0].is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

        second = pool.prepare(_batch(100))  # the child is gone: prepared here instead
        assert fallbacks == [1]
        _same(second, preparer.prepare(second.batch))
        assert second.tables["gpu_samples"].column("kafka_offset")[0] == 100

        third = pool.prepare(_batch(200))  # and a new child takes the next one
        assert fallbacks == [1]
        assert [c.pid for c in multiprocessing.active_children()] not in ([], [children[0].pid])
        _same(third, preparer.prepare(third.batch))
        assert first.tables["gpu_samples"].n_rows == third.tables["gpu_samples"].n_rows
    finally:
        pool.close()


def test_the_child_ends_with_a_killed_sink() -> None:
    script = (
        "import multiprocessing, sys, time\n"
        "from sinks.ddl import TtlDays\n"
        "from sinks.prepare import BatchPreparer\n"
        "from sinks.prepare_pool import PreparePool\n"
        "if __name__ == '__main__':\n"
        "    pool = PreparePool(BatchPreparer(), TtlDays())\n"
        "    pool.start()\n"
        "    while not multiprocessing.active_children():\n"
        "        time.sleep(0.05)\n"
        "    print(multiprocessing.active_children()[0].pid, flush=True)\n"
        "    time.sleep(60)\n"
    )
    sink = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        assert sink.stdout is not None
        child = int(sink.stdout.readline())
        sink.kill()
        sink.wait(10)
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the preparing process outlived its sink"
    finally:
        sink.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
