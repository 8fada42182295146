"""The advisor's queue pairs a pending pod with the capacity windows of the hours its wait touches (an
equi-join on the hour) instead of with every window of the period; on every golden scenario and 40
random ones (stored as tests/advise/test_queue_property.py stores them: what the queue reads, one
cluster each) its rows equal those of every pending pod paired with every window
(:func:`tests.advise.test_advise_rollups.raw_queue_rows`), from the beginning and from a start
inside the history (a wait that began before the start counts from it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta

import pytest

from common.metrics import MetricsRegistry
from reports import advise as advisor
from reports.packing import iso_utc
from reports.reader import IN_CLUSTER, ClusterScope, query_rows
from simulation.random_scenario import random_scenario
from simulation.replay import run_in_process
from simulation.scenario import load_scenario, parse_scenario
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import ClickHouseStore, open_store
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from tests.advise import test_queue_property as queue_property
from tests.advise.test_advise_rollups import raw_queue_rows

RANDOM_SEEDS = range(40)


@pytest.fixture(scope="module")
def queue_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClickHouseStore, dict[str, str]]]:
    """What the queue reads of every golden scenario and the random ones, one cluster each."""
    scenarios = [(path.stem, load_scenario(path)) for path in queue_property.GOLDENS]
    scenarios += [(f"random seed {seed}", parse_scenario(random_scenario(seed))) for seed in RANDOM_SEEDS]
    by_topic: dict[str, list[tuple[str, bytes]]] = {}
    names: dict[str, str] = {}
    for index, (name, scenario) in enumerate(scenarios):
        names[f"p{index}"] = name
        for message in run_in_process(scenario).outputs:
            if (record := queue_property._renamed(message, index)) is not None:
                by_topic.setdefault(record[0], []).append(record[1:])
    now = max(s.start + timedelta(seconds=s.end_offset_s) for _, s in scenarios) + timedelta(days=1)
    ttl = TtlDays.keeping(min(s.start for _, s in scenarios), now)
    with closing(open_store(f"chdb://{tmp_path_factory.mktemp('queue') / 'clickhouse'}")) as store:
        migrate(store, ttl)
        store.forget_schema()
        writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), queue_property.PREFIX, ttl, now=lambda: now)
        for topic, items in sorted(by_topic.items()):
            records = [ConsumedRecord(topic, 0, offset, key.encode(), value)
                       for offset, (key, value) in enumerate(items)]
            writer.write(Batch(topic, 0, records, 0, len(records) - 1))
        yield store, names


def test_the_queue_equals_every_pod_against_every_window(
        queue_store: tuple[ClickHouseStore, dict[str, str]]) -> None:
    store, names = queue_store
    compared = 0
    for cluster, name in names.items():
        reader = ClusterScope(store, cluster)
        first, last = (advisor.utc_time(v) for v in query_rows(reader, f"""
SELECT min(window_start) AS first, max(window_end) AS last FROM cluster_capacity WHERE {IN_CLUSTER}""")[0].values())
        for start in (datetime(1970, 1, 1, tzinfo=UTC), first + (last - first) / 2 + timedelta(seconds=7.5)):
            for team in (None, "(none)"):
                raw = raw_queue_rows(reader, start, team)
                new = advisor._queue(reader, start, team)
                assert [(r["namespace"], r["pod"]) for r in new] == [(r["namespace"], r["pod"]) for r in raw], name
                for row, twin in zip(new, raw, strict=True):
                    compared += 1
                    assert row["fragmented_pending_s"] == pytest.approx(float(twin["fragmented_pending_s"])), name
                    assert row["defrag_would_place_at"] == iso_utc(advisor.utc_time(twin["first_fragmented_at"])), name
                    assert (row["free_gpus"], row["largest_free_block"]) == (
                        twin["free_gpus"], twin["largest_free_block"]), name
    assert compared > 10, "the scenarios have fragmented waits"
