"""The worker's faust runtime keeps faust's behaviour where it trims faust's per-record costs: its
outputs land on the partitions aiokafka's default partitioner picks (a consumer of ``pod.windows``
sees each pod's records in order, on one partition, across upgrades), and faust's check for a
stream that stopped processing still sees when each partition's stream last took an event; and it
compresses what it writes as the agents and the watcher do (``GPULENS_PRODUCER__COMPRESSION``).
How the agents read their records: ``test_inbox.py``."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from aiokafka.partitioner import DefaultPartitioner
from faust.types import TP
from pytest import MonkeyPatch

from common.settings import CommonSettings, WorkerSettings, load_settings
from simulation.kafka_replay import child_env
from stream_jobs.faust_app import StreamJobs
from stream_jobs.faust_runtime import KeyHashCache, LeanMonitor, make_app


def test_outputs_go_to_the_default_partitioners_partition() -> None:
    cached, default = KeyHashCache(size=64), DefaultPartitioner()
    rng = random.Random(7)
    keys = [f"prod-eu/pod-{rng.randrange(10**9)}".encode() for _ in range(500)] + [b"", b"cluster", "π".encode()]
    for key in keys * 2:  # the second round is answered from the cache (and evicts: 64 kept)
        for count in (1, 3, 12, 64):
            partitions = list(range(count))
            assert cached(key, partitions, partitions) == default(key, partitions, partitions), (key, count)
    assert cached(bytearray(b"cluster"), [0, 1, 2], [0, 1, 2]) == default(b"cluster", [0, 1, 2], [0, 1, 2])


def test_a_record_without_a_key_goes_to_an_available_partition() -> None:
    cached = KeyHashCache()
    assert {cached(None, [0, 1, 2, 3], [1, 3]) for _ in range(100)} == {1, 3}
    assert cached(None, [0, 1], []) in {0, 1}


def test_the_worker_uses_both(tmp_path: Path) -> None:
    jobs = StreamJobs(load_settings(WorkerSettings, topic_prefix="runtime", data_dir=tmp_path))
    assert isinstance(jobs.app.monitor, LeanMonitor)
    assert isinstance(jobs.app.conf.producer_partitioner, KeyHashCache)


def test_the_worker_compresses_what_it_writes_as_every_gpulens_producer_does(tmp_path: Path) -> None:
    def aiokafka_settings(**producer: str) -> dict[str, object]:
        settings = load_settings(WorkerSettings, topic_prefix="runtime", data_dir=tmp_path, producer=producer)
        return dict(make_app(settings).producer._settings_default())

    assert aiokafka_settings()["compression_type"] == "lz4"  # GPULENS_PRODUCER__COMPRESSION's default
    assert aiokafka_settings(compression="zstd")["compression_type"] == "zstd"
    assert aiokafka_settings(compression="none")["compression_type"] is None


def test_the_worker_produces_with_acks_all_and_idempotence_as_every_gpulens_producer_does(tmp_path: Path) -> None:
    """faust asks for idempotence only in transactions: a retried send after a leader moved could
    otherwise write an output or changelog batch twice."""
    producer = make_app(load_settings(WorkerSettings, topic_prefix="runtime", data_dir=tmp_path)).producer
    settings = {**producer._settings_default(), **producer._settings_extra()}
    assert settings["acks"] == "all" and settings["enable_idempotence"] is True

    async def build() -> Any:
        return producer._new_producer()  # the aiokafka producer faust builds from them

    assert asyncio.run(build())._txn_manager is not None, "aiokafka keeps a sequence per partition: idempotent"


def test_workers_started_by_a_replay_get_its_producer_settings(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    settings = load_settings(CommonSettings, producer={"compression": "zstd", "linger_ms": 5})
    monkeypatch.setenv("GPULENS_PRODUCER", child_env(settings, "runtime", tmp_path, {})["GPULENS_PRODUCER"])
    assert load_settings(WorkerSettings).producer == settings.producer


def test_the_lean_monitor_counts_nothing_per_record() -> None:
    monitor = LeanMonitor()
    tp = TP("gpulens.gpu.samples.v1", 3)
    monitor.on_message_in(tp, 41, message=None)
    monitor.on_stream_event_in(tp, 41, stream=None, event=None)
    monitor.on_stream_event_out(tp, 41, stream=None, event=None)
    monitor.on_message_out(tp, 41, message=None)
    assert monitor.events_total == 0 and monitor.messages_received_total == 0
    assert not monitor.stream_inbound_time, "the inboxes note a stream's work (test_inbox.py)"


def test_the_port_says_how_long_a_restore_has_read_nothing(tmp_path: Path) -> None:
    """What the offset guard's give-up reads (``OffsetGuard.watch``), from faust's own recovery."""
    jobs = StreamJobs(load_settings(WorkerSettings, topic_prefix="runtime", data_dir=tmp_path))
    port, recovery = jobs.consumer_port, jobs.app.tables.recovery
    assert port.recovery_idle_s() is None, "no restore"
    changelog = TP("runtime-stream-jobs-node-stages-changelog", 2)
    recovery.in_recovery, recovery._recovery_started_at = True, time.monotonic() - 300
    recovery.active_highwaters[changelog], recovery.active_offsets[changelog] = 40, 12
    assert (port.recovery_idle_s() or 0) >= 300, "nothing read since the restore began"
    state = port.unsettled_state()
    assert state["restoring"] == {"runtime-stream-jobs-node-stages-changelog:2": {
        "offset": 12, "highwater": 40, "fetching": False, "paused": False,
        "client": "unknown (ConsumerNotStarted('Consumer thread not yet started'))"}}, "what the log shows of it"
    assert state["fetcher"] == {"state": "init", "loop_ended": False} and state["full_inboxes"] == []
    recovery._active_events_received_at[changelog] = time.monotonic() - 5
    assert 5 <= (port.recovery_idle_s() or 0) < 60
    recovery.active_offsets[changelog] = 40
    assert port.recovery_idle_s() is None, "nothing remains to read"
