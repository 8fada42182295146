"""What the live-mode broker tests share: a start that puts windows in the same place every run,
readiness of a live worker group, and the pod windows a prefix holds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from common.kafka import read_to_end
from common.settings import KafkaSettings
from schemas.codec import decode
from schemas.outputs import PodWindow
from schemas.topics import INTERNAL_CLUSTER_INPUTS, POD_WINDOWS
from simulation.kafka_replay import CONSUMING_LOG_LINE, KafkaReplay


def start_mid_window(after: datetime) -> datetime:
    """The first instant 5 s into a 10 s window after ``after``: the pods' windows then straddle
    window boundaries the same way in every run."""
    epoch_s = int(after.timestamp())
    return datetime.fromtimestamp(epoch_s - epoch_s % 10 + 15, UTC)


def live_ready(replay: KafkaReplay) -> bool:
    """Every worker has taken up a partition and a clock mark has gone through the node stage."""
    if not all(w.logged_since_start(CONSUMING_LOG_LINE) for w in replay.workers):
        return False
    return any(orjson.loads(r.value or b"{}").get("k") == "nm"
               for r in read_to_end(replay.kafka, INTERNAL_CLUSTER_INPUTS.name(replay.prefix)))


def pod_windows(kafka: KafkaSettings, prefix: str) -> dict[str, dict[str, Any]]:
    """The pod windows on ``prefix``'s topic, by id."""
    return {w.window_id: w.model_dump() for w in
            (decode(r.value, PodWindow) for r in read_to_end(kafka, POD_WINDOWS.name(prefix)))}
