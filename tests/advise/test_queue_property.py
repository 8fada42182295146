"""The advisor's queue figures are consistent on every golden and on 200 random scenarios: a pod's time
lost to fragmentation is part of its wait, so ``fragmented_pending_s <= pending_s`` and the delayed
GPU-hours are the request times that part.

To keep CI time bounded, each scenario is replayed in-process once and only what the queue reads
(``pod_lifecycle`` and ``cluster_capacity``) goes through the sink's write path, into one shared store
where each scenario is its own cluster (``p0``, ``p1``, ...; pod uids and window ids prefixed so that
no two scenarios' rows replace each other). The advisor's queue query then runs once per cluster.
About 40 s on two cores, most of it the 225 replays.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from common.metrics import MetricsRegistry
from reports.advise import _queue
from reports.reader import ClusterScope
from schemas.codec import encode
from schemas.messages import Message
from schemas.outputs import ClusterCapacity, PodLifecycle
from schemas.topics import CLUSTER_CAPACITY, POD_LIFECYCLE
from simulation.random_scenario import random_scenario
from simulation.replay import run_in_process
from simulation.scenario import Scenario, load_scenario, parse_scenario
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate

ROOT = Path(__file__).parents[2]
GOLDENS = sorted([*(ROOT / "simulation" / "scenarios").glob("*.yaml"),
                  *(ROOT / "tests" / "advise" / "scenarios").glob("*.yaml")])
RANDOM_SEEDS = range(200)
PREFIX = "gpulens"


def _scenarios() -> Iterator[tuple[str, Scenario]]:
    for path in GOLDENS:
        yield path.stem, load_scenario(path)
    for seed in RANDOM_SEEDS:
        yield f"random seed {seed}", parse_scenario(random_scenario(seed))


def _renamed(message: Message, index: int) -> tuple[str, str, bytes] | None:
    cluster = f"p{index}"
    if isinstance(message, PodLifecycle):
        uid = f"{index}-{message.pod_uid}"
        return POD_LIFECYCLE.name(PREFIX), uid, encode(message.model_copy(update={"cluster": cluster, "pod_uid": uid}))
    if isinstance(message, ClusterCapacity):
        wid = f"{index}-{message.window_id}"
        return CLUSTER_CAPACITY.name(PREFIX), "cluster", encode(
            message.model_copy(update={"cluster": cluster, "window_id": wid}))
    return None


@pytest.fixture(scope="module")
def queue_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClickHouseStore, dict[str, str]]]:
    by_topic: dict[str, list[tuple[str, bytes]]] = {}
    names: dict[str, str] = {}
    starts, ends = [], []
    for index, (name, scenario) in enumerate(_scenarios()):
        names[f"p{index}"] = name
        starts.append(scenario.start)
        ends.append(scenario.start + timedelta(seconds=scenario.end_offset_s))
        for message in run_in_process(scenario).outputs:
            if (record := _renamed(message, index)) is not None:
                by_topic.setdefault(record[0], []).append(record[1:])
    # random scenarios are dated up to two years ahead: the sink's clock is the latest end, and the TTLs
    # keep the earliest start from there
    now = max(ends) + timedelta(days=1)
    ttl = TtlDays.keeping(min(starts), now)
    store = open_store(f"chdb://{tmp_path_factory.mktemp('queue') / 'clickhouse'}")
    try:
        migrate(store, ttl)
        store.forget_schema()
        writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, ttl, now=lambda: now)
        for topic, items in sorted(by_topic.items()):
            records = [ConsumedRecord(topic, 0, offset, key.encode(), value)
                       for offset, (key, value) in enumerate(items)]
            _outcome, rejected = writer.write(Batch(topic, 0, records, 0, len(records) - 1))
            assert not rejected, rejected[:3]
        yield store, names
    finally:
        store.close()


def test_fragmented_pending_is_part_of_pending_on_every_golden_and_200_random_scenarios(
        queue_store: tuple[ClickHouseStore, dict[str, str]]) -> None:
    store, names = queue_store
    since = datetime(1970, 1, 1, tzinfo=UTC)
    problems, rows_seen = [], 0
    for cluster, name in names.items():
        for row in _queue(ClusterScope(store, cluster), since, None):
            rows_seen += 1
            if not 0 < row["fragmented_pending_s"] <= row["pending_s"]:
                problems.append(f"{name}: {row['namespace']}/{row['pod']} fragmented "
                                f"{row['fragmented_pending_s']} s > pending {row['pending_s']} s")
            if row["delayed_gpu_hours"] != pytest.approx(row["gpus"] * row["fragmented_pending_s"] / 3600):
                problems.append(f"{name}: {row['namespace']}/{row['pod']} delayed GPU-hours {row}")
            if not 0 <= row["largest_free_block"] < row["gpus"] <= row["free_gpus"]:
                problems.append(f"{name}: {row['namespace']}/{row['pod']} is not fragmentation: {row}")
    assert problems == [], "\n".join(problems)
    assert rows_seen > 0  # the property is not vacuous: some scenarios have fragmented waits
