"""Issue 49 through the real broker and a ``gpulens worker``: records that once crash-looped the
workers (an integer above 2^64 on ``k8s.pods.v1``, ``1e400`` on ``workload.progress.v1``: exit 70
ten times) or were taken silently (a sample keyed by another node, a record of a cluster outside
``GPULENS_ACCEPT_CLUSTERS``) are dead-lettered with their reason code and source position; the
scenario finishes without a worker exit and its report is the in-process one, dead letters
included."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from common.kafka import read_to_end
from common.settings import CommonSettings, KafkaSettings, load_settings
from schemas.codec import decode
from schemas.outputs import DeadLetter
from schemas.topics import DEADLETTER
from simulation.kafka_replay import KafkaReplay
from simulation.replay import run_in_process
from simulation.scenario import PoisonSpec
from tests.stream_jobs.test_poison_findings import (
    BIG_INT_POD,
    INFINITE_PROGRESS,
    misattributed_sample,
    other_cluster_pod,
    scenario,
)

pytestmark = pytest.mark.kafka

BIG_INT_POD_ON_A_NODE = BIG_INT_POD.replace('"phase":"Pending"', '"phase":"Running","node":"gpu-a"')
"""Routed to the node stage too (the node agent failed on it)."""


def _settings(kafka: KafkaSettings, tmp_path: Path) -> CommonSettings:
    return load_settings(CommonSettings, kafka=kafka.model_dump(), data_dir=tmp_path)


def _letters(kafka: KafkaSettings, prefix: str) -> list[tuple[str, str]]:
    """(source topic suffix, reason) of every dead letter written, once per source."""
    letters = set()
    for record in read_to_end(kafka, DEADLETTER.name(prefix)):
        letter = decode(record.value, DeadLetter)
        assert record.headers["reason"].decode() == letter.reason.value
        assert letter.source_partition is not None and letter.source_offset is not None
        letters.add((letter.source_topic.removeprefix(f"{prefix}."), letter.reason.value))
    return sorted(letters)


def _same(report: dict[str, object], expected: dict[str, object]) -> bool:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2) == orjson.dumps(expected, option=orjson.OPT_INDENT_2)


def test_poison_that_crash_looped_the_workers_is_dead_lettered_through_kafka(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> None:
    sc = scenario(tmp_path, PoisonSpec(120.0, "k8s.pods.v1", BIG_INT_POD_ON_A_NODE, "poison-pod"),
                  PoisonSpec(180.0, "workload.progress.v1", INFINITE_PROGRESS), misattributed_sample())
    replay = KafkaReplay(sc, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix)
    report = replay.run(timeout_s=120)
    assert replay.worker.starts == 1, "no worker exit"
    wanted = [("gpu.samples.v1", "inconsistent"), ("k8s.pods.v1", "out_of_range"),
              ("workload.progress.v1", "out_of_range")]
    expected = run_in_process(sc)
    assert sorted((d.source_topic.removeprefix("gpulens."), d.reason.value) for d in expected.deadletters) == wanted
    assert _same(report, expected.report) and report["stream"]["deadletters"] == 3  # type: ignore[index]
    assert _letters(kafka_settings, topic_prefix) == wanted


def test_a_record_of_a_cluster_not_accepted_is_dead_lettered_through_kafka(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> None:
    sc = scenario(tmp_path, other_cluster_pod())
    expected = run_in_process(sc, accept_clusters=frozenset({"default"}))
    replay = KafkaReplay(sc, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix,
                         worker_settings={"GPULENS_ACCEPT_CLUSTERS": "default"})
    report = replay.run(timeout_s=120)
    assert replay.worker.starts == 1
    assert _same(report, expected.report) and report["stream"]["deadletters"] == 1  # type: ignore[index]
    assert _letters(kafka_settings, topic_prefix) == [("k8s.pods.v1", "unknown_cluster")]
