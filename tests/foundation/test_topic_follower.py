"""Reading a topic back (``common.kafka.TopicFollower``, what ``replay --kafka`` reads its outputs
with): a partition the client does not know yet right after its assignment ("Local: Unknown
partition", seen on a busy broker in a `make chaos` run, which then failed) is asked again until
the deadline; any other error, or one that lasts past the deadline, is raised."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from common.kafka import TopicFollower


class _Consumer:
    def __init__(self, unknown_for: int) -> None:
        self.unknown_for = unknown_for
        self.asked = 0

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self.asked += 1
        if self.asked <= self.unknown_for:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, "Failed to get watermark offsets"))
        return 0, 7


def _follower(consumer: _Consumer) -> TopicFollower:
    follower = object.__new__(TopicFollower)
    follower.topic, follower.partitions, follower._consumer = "t", [0], consumer  # type: ignore[assignment]
    return follower


def test_an_unknown_partition_is_asked_again_until_the_deadline() -> None:
    consumer = _Consumer(unknown_for=3)
    assert _follower(consumer)._high_watermark(0, time.monotonic() + 5) == 7
    assert consumer.asked == 4
    consumer = _Consumer(unknown_for=1000)
    started = time.monotonic()
    with pytest.raises(KafkaException):
        _follower(consumer)._high_watermark(0, started + 0.5)
    assert time.monotonic() - started < 2


def test_other_errors_are_raised_at_once() -> None:
    class Failing(_Consumer):
        def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
            self.asked += 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    consumer = Failing(0)
    with pytest.raises(KafkaException):
        _follower(consumer)._high_watermark(0, time.monotonic() + 5)
    assert consumer.asked == 1
