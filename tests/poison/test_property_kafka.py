"""Issue 49's hostile-input property test through the real broker: a few seeded sets of generated
records (``tests/poison/generate.py``) mixed into the canary fleet, produced to the input topics,
read by a ``gpulens worker`` process (allow-list ``default,east``) and then by a ``gpulens sink``
into the embedded ClickHouse: neither exits, every record gets the verdict of the bounds table
(dead letters read back from the dead-letter topic, matched by source topic/partition/offset; the
sink's checked where the contract decides it: it has no allow-list and its own clock), and every
canary is stored exactly once. ``GPULENS_FUZZ=1`` draws more seeds."""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from common.kafka import ReadRecord, read_to_end
from common.settings import CommonSettings, KafkaSettings, load_settings
from schemas.codec import decode
from schemas.outputs import DeadLetter, PodLifecycle, PodWindow
from schemas.topics import DEADLETTER, GPU_SAMPLES
from simulation.fleet_state import SimulatedRecord, Tick
from simulation.kafka_replay import KafkaReplay, child_env
from simulation.simulator import FleetSimulator
from sinks.clickhouse import open_store
from sinks.rows import SINK_TOPICS
from stream_jobs.pipeline import COMPACTED_SUFFIXES, INPUT_TOPICS
from tests.child_process import GpulensChild
from tests.poison.generate import CATALOGUE, Case, seeded_cases
from tests.poison.harness import Fed, canary_scenario, verdict_errors

pytestmark = pytest.mark.kafka

FUZZ = os.environ.get("GPULENS_FUZZ") == "1"
SEEDS = tuple(range(4900, 4900 + (20 if FUZZ else 3)))
CASES_PER_SEED = 15
MAX_PRODUCIBLE_BYTES = 900_000
"""A default Kafka producer refuses a record near 1 MB (librdkafka's ``message.max.bytes``): larger
cases (the message cap and lists at theirs) are the in-process test's."""
SINK_SUFFIXES = {spec.suffix for spec in SINK_TOPICS} & {spec.suffix for spec in INPUT_TOPICS}
POOL = list(CATALOGUE)


def _letters(records: list[ReadRecord], prefix: str) -> dict[tuple[str, int, int], list[str]]:
    letters: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    for record in records:
        letter = decode(record.value, DeadLetter)
        assert record.headers["reason"].decode() == letter.reason.value
        assert letter.source_partition is not None and letter.source_offset is not None, letter.error
        letters[(letter.source_topic.removeprefix(f"{prefix}."), letter.source_partition,
                 letter.source_offset)].append(letter.reason.value)
    return letters


def _sent_key(suffix: str, key: str | None) -> bytes | None:
    """The key a record has in Kafka: the driver keys a keyless record on a compacted topic "unkeyed"."""
    if key is None and suffix in COMPACTED_SUFFIXES:
        key = "unkeyed"
    return None if key is None else key.encode()


def _fed(kafka: KafkaSettings, prefix: str, canary: list[Tick], poison: list[tuple[int, Case]]) -> Fed:
    """Every input record now in Kafka, by (suffix, partition, offset): the poison case it is, or a canary."""
    wanted = {(case.suffix, _sent_key(case.suffix, case.key), case.value): case for _t, case in poison}
    canaries = {(r.topic, _sent_key(r.topic, r.key), r.value) for tick in canary for r in tick.records}
    fed = Fed({}, set())
    for spec in INPUT_TOPICS:
        for record in read_to_end(kafka, spec.name(prefix)):
            where = (spec.suffix, record.partition, record.offset)
            sent = (spec.suffix, record.key, record.value)
            case = wanted.get(sent)
            if case is not None:
                fed.poison[where] = case
            else:
                assert sent in canaries, f"a record nobody sent at {where}"
                fed.canaries.add(where)
    return fed


def test_seeded_hostile_records_through_the_broker_a_worker_and_the_sink(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> None:
    start = (datetime.now(UTC) - timedelta(minutes=10)).replace(second=0, microsecond=0)
    scenario = canary_scenario(start)
    canary = list(FleetSimulator(scenario).run())
    ticks = [Tick(t.offset_s, t.ts, list(t.records)) for t in canary]
    poison: list[tuple[int, Case]] = []
    for seed in SEEDS:
        cases = seeded_cases(seed, CASES_PER_SEED, lambda i: ticks[i].ts, len(ticks), POOL)
        poison += [(tick, case) for tick, case in cases
                   if case.value is None or len(case.value) <= MAX_PRODUCIBLE_BYTES]
    for tick, case in poison:
        ticks[tick].records.append(SimulatedRecord(case.suffix, case.key, case.value))
    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump(), data_dir=tmp_path)
    replay = KafkaReplay(scenario, settings, topic_prefix=topic_prefix, work_dir=tmp_path / "replay",
                         worker_settings={"GPULENS_ACCEPT_CLUSTERS": "default,east"})
    try:
        replay.create_topics()
        replay.worker.start()
        replay.send(ticks)
        replay.finish()
        done = replay.wait_done(timeout_s=120)
        outputs = replay.read_outputs(done)
        assert replay.worker.alive() and replay.worker.starts == 1, replay.worker.tail()
    finally:
        replay.close(keep_work_dir=True)
    fed = _fed(kafka_settings, topic_prefix, canary, poison)
    assert len(fed.poison) == len(poison) > 0, "every poison record read back"
    worker_letters = read_to_end(kafka_settings, DEADLETTER.name(topic_prefix))
    errors = verdict_errors(_letters(worker_letters, topic_prefix), fed, "worker")

    # the sink: everything the worker read and wrote, into the embedded ClickHouse
    before = {(r.partition, r.offset) for r in worker_letters}
    env = child_env(settings, topic_prefix, tmp_path / "sink", {
        "GPULENS_GROUP_ID": f"{topic_prefix}-sink", "GPULENS_LOG_FORMAT": "text",
        "GPULENS_BATCH_MAX_AGE_S": "0.2", "GPULENS_PRICES_USD_PER_GPU_HOUR": '{"NVIDIA H100 80GB HBM3": 2.5}'})
    sink = GpulensChild(env, "sink", "--exit-when-idle", "5")
    assert sink.wait(120) == 0, sink.log()
    sink_letters = [r for r in read_to_end(kafka_settings, DEADLETTER.name(topic_prefix))
                    if (r.partition, r.offset) not in before]
    sink_fed = Fed({where: case for where, case in fed.poison.items()
                    if where[0] in SINK_SUFFIXES and not case.stream_only},
                   {where for where in fed.canaries if where[0] in SINK_SUFFIXES})
    errors += verdict_errors(_letters(sink_letters, topic_prefix), sink_fed, "sink")
    assert not errors, "\n".join(errors)

    uids = set(FleetSimulator(scenario).pod_uids().values())
    windows = {m.window_id for m in outputs.outputs if isinstance(m, PodWindow) and m.pod_uid in uids}
    lifecycles = {m.pod_uid for m in outputs.outputs if isinstance(m, PodLifecycle) and m.pod_uid in uids}
    samples = {(r.key, r.value) for t in canary for r in t.records if r.topic == GPU_SAMPLES.suffix}
    assert windows and lifecycles and samples
    store = open_store(f"chdb://{tmp_path / 'sink' / 'clickhouse'}")
    try:
        in_list = ", ".join(f"'{uid}'" for uid in sorted(uids))
        stored = store.query(f"SELECT window_id, count() FROM pod_windows WHERE pod_uid IN ({in_list}) "
                             "GROUP BY window_id").rows
        assert {row[0]: row[1] for row in stored} == dict.fromkeys(windows, 1), "every canary window stored once"
        stored = store.query(f"SELECT pod_uid, count() FROM pod_lifecycle WHERE pod_uid IN ({in_list}) "
                             "GROUP BY pod_uid").rows
        assert {row[0]: row[1] for row in stored} == dict.fromkeys(lifecycles, 1)
        stored = store.query("SELECT node, ts, gpu_uuid, count() AS n FROM gpu_samples "
                             "WHERE node IN ('canary-a', 'canary-b') GROUP BY node, ts, gpu_uuid").rows
        assert stored and all(row[3] == 1 for row in stored), "every canary GPU reading stored once"
        assert len({(row[0], row[1]) for row in stored}) == len(samples), "every canary sample stored"
    finally:
        store.close()
