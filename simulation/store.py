"""``gpulens replay SCENARIO --store``: a replay's inputs and outputs into the history, through the
sink's own write path.

In process, the simulator's records that ``gpulens sink`` subscribes to (samples, pods, nodes,
events, progress, ...) and the pipeline's outputs (windows, capacity, lifecycle, alerts) become
Kafka-shaped records that the sink's Kafka-free half (:class:`sinks.batches.BatchWriter`) decodes
and inserts, one batch per topic, as the sink would; with ``--kafka`` the sink itself
(:func:`sinks.service.run_sink`) drains the replay's topics until idle. Either way the store is
opened, migrated and priced by :func:`sinks.service.prepare_store`, with the scenario's prices.

A scenario is dated as its file says (often in the past), so the store is given settings that keep
it whole (:func:`store_settings`):

- **TTLs**: each of the raw, state and rollup TTLs is the longer of the configured one
  (``GPULENS_RAW_SAMPLE_TTL_DAYS`` ...) and :meth:`sinks.ddl.TtlDays.keeping` of the scenario's
  start (the default period counted from the scenario's first day instead of today). Applying them
  lengthens the TTLs of an existing store too (``ALTER TABLE ... MODIFY TTL``): nothing stored is
  dropped by that. A ``gpulens sink`` started later re-applies *its* configured TTLs at start, and
  the scenario's rows older than those are then dropped at the next merge; the replay says which
  variables keep them.
- **time bounds**: the sink refuses rows dated more than ``GPULENS_MAX_FUTURE_SKEW_S`` ahead of its
  clock; a scenario dated in the future gets a skew that reaches its end.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from common.metrics import MetricsRegistry
from common.settings import SinkSettings, load_settings
from schemas.codec import encode
from schemas.messages import Message
from schemas.outputs import Alert, ClusterCapacity, PodLifecycle, PodWindow
from schemas.topics import ALERTS, CLUSTER_CAPACITY, POD_LIFECYCLE, POD_WINDOWS, by_suffix
from simulation.replay import ReplayResult
from simulation.scenario import Scenario
from simulation.simulator import FleetSimulator
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import describe_target
from sinks.ddl import TtlDays
from sinks.rows import SINK_TOPICS
from sinks.service import prepare_store, run_sink

PREFIX = "gpulens"
"""The topic prefix the in-process records are named with (the store does not keep it)."""


@dataclass(frozen=True)
class StoreOutcome:
    target: str
    """Where the rows went (credentials masked)."""
    rows_by_table: dict[str, int]
    rejected: int
    """Records the sink's write path refused (dead letters in ``gpulens sink``; none expected)."""
    ttl: TtlDays
    lengthened: bool
    """Whether the TTLs are longer than the configured ones (a later ``gpulens sink`` shortens them)."""


def _scenario_end(scenario: Scenario) -> datetime:
    return scenario.start + timedelta(seconds=scenario.duration_s)


def store_settings(scenario: Scenario, base: SinkSettings | None = None,
                   now: datetime | None = None) -> tuple[SinkSettings, bool]:
    """The sink settings that store ``scenario`` whole, and whether its TTLs are longer than the
    configured ones (see the module's docstring)."""
    base = base or load_settings(SinkSettings)
    now = now or datetime.now(UTC)
    configured = TtlDays.from_settings(base)
    keeping = TtlDays.keeping(scenario.start, now)
    ttl = TtlDays(raw=max(configured.raw, keeping.raw), state=max(configured.state, keeping.state),
                  rollup=max(configured.rollup, keeping.rollup))
    ahead_s = (_scenario_end(scenario) - now).total_seconds() + 3600.0  # a future-dated scenario: its end
    prices = {**base.prices_usd_per_gpu_hour, **scenario.prices}  # the scenario's list prices win
    settings = base.model_copy(update={
        "raw_sample_ttl_days": ttl.raw, "state_ttl_days": ttl.state, "rollup_ttl_days": ttl.rollup,
        "max_future_skew_s": max(base.max_future_skew_s, ahead_s),
        "prices_usd_per_gpu_hour": prices,
    })
    return settings, ttl != configured


def _output_record(message: Message) -> tuple[str, str]:
    if isinstance(message, PodWindow):
        return POD_WINDOWS.name(PREFIX), message.pod_uid
    if isinstance(message, ClusterCapacity):
        return CLUSTER_CAPACITY.name(PREFIX), "cluster"
    if isinstance(message, PodLifecycle):
        return POD_LIFECYCLE.name(PREFIX), message.pod_uid
    if isinstance(message, Alert):
        return ALERTS.name(PREFIX), message.id
    raise TypeError(f"unexpected replay output {type(message).__name__}")


def replay_records(scenario: Scenario, result: ReplayResult) -> dict[str, list[tuple[str | None, bytes | None]]]:
    """Per topic, the (key, value) records ``gpulens sink`` would read of this replay: the
    simulator's inputs it subscribes to and the pipeline's outputs."""
    by_topic: dict[str, list[tuple[str | None, bytes | None]]] = {}
    for tick in FleetSimulator(scenario).run():
        for r in tick.records:
            if by_suffix(r.topic) in SINK_TOPICS:
                by_topic.setdefault(by_suffix(r.topic).name(PREFIX), []).append((r.key, r.value))
    for message in result.outputs:
        topic, key = _output_record(message)
        by_topic.setdefault(topic, []).append((key, encode(message)))
    return by_topic


def store_in_process(scenario: Scenario, result: ReplayResult, base: SinkSettings | None = None) -> StoreOutcome:
    """Write the replay ``result`` of ``scenario`` into the store of ``base`` (the configured one by
    default) through :class:`BatchWriter`, after :func:`prepare_store` with :func:`store_settings`."""
    settings, lengthened = store_settings(scenario, base)
    ttl = TtlDays.from_settings(settings)
    by_topic = replay_records(scenario, result)
    store = prepare_store(settings)
    rows: dict[str, int] = {}
    rejected = 0
    try:
        writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, ttl,
                             max_future_skew_s=settings.max_future_skew_s)
        for topic in sorted(by_topic):
            records = [ConsumedRecord(topic, 0, offset, None if key is None else key.encode(), value)
                       for offset, (key, value) in enumerate(by_topic[topic])]
            outcome, refused = writer.write(Batch(topic, 0, records, 0, len(records) - 1))
            rejected += len(refused)
            for table, n in outcome.rows_by_table.items():
                rows[table] = rows.get(table, 0) + n
    finally:
        store.close()
    return StoreOutcome(describe_target(settings.clickhouse_url()), rows, rejected, ttl, lengthened)


def store_from_kafka(scenario: Scenario, bootstrap: str, topic_prefix: str, base: SinkSettings | None = None,
                     exit_when_idle_s: float = 5.0) -> StoreOutcome:
    """Drain the topics of a ``replay --kafka`` under ``topic_prefix`` into the store with the sink
    itself (:func:`run_sink`, a fresh consumer group, until idle for ``exit_when_idle_s``)."""
    base = base or load_settings(SinkSettings)
    settings, lengthened = store_settings(scenario, base)
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": bootstrap})
    settings = settings.model_copy(update={"kafka": kafka, "topic_prefix": topic_prefix,
                                           "group_id": f"{topic_prefix}-store-{uuid.uuid4().hex[:8]}"})
    totals = run_sink(settings, exit_when_idle_s=exit_when_idle_s, create_topics=False)
    return StoreOutcome(describe_target(settings.clickhouse_url()), dict(totals.rows_by_table),
                        totals.dead_letters, TtlDays.from_settings(settings), lengthened)


def describe_outcome(scenario: Scenario, outcome: StoreOutcome) -> list[str]:
    """What ``replay --store`` tells the user (stderr)."""
    rows = ", ".join(f"{table} {n}" for table, n in sorted(outcome.rows_by_table.items())) or "no rows"
    lines = [f"stored in {outcome.target}: {rows}"]
    if outcome.rejected:
        lines.append(f"{outcome.rejected} record(s) refused by the sink's write path (dead letters): "
                     "the store misses them")
    if outcome.lengthened:
        t = outcome.ttl
        lines.append(
            f"the store's TTLs are now raw {t.raw}, state {t.state}, rollup {t.rollup} days, to keep the scenario "
            f"from {scenario.start.date().isoformat()}; a `gpulens sink` started later re-applies its own TTLs: "
            f"start it with GPULENS_RAW_SAMPLE_TTL_DAYS={t.raw} GPULENS_STATE_TTL_DAYS={t.state} "
            f"GPULENS_ROLLUP_TTL_DAYS={t.rollup} to keep these rows")
    lines.append("try: gpulens report, gpulens advise, gpulens sql \"SELECT count() FROM gpu_samples\"")
    return lines


def rows_summary(outcome: StoreOutcome) -> dict[str, Any]:
    return {"target": outcome.target, "rows": dict(sorted(outcome.rows_by_table.items())),
            "rejected": outcome.rejected, "ttl_days": vars(outcome.ttl)}
