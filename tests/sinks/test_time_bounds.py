"""Time bounds of the sink, through the real broker into the real engine: a record dated too far
ahead of the sink's clock, or past the TTL its table has in the store, is a dead letter with its
reason code, never a stored row that moves every report's period (or one that the engine's TTL
silently drops); and no record stops the sink, whatever its times or however its rows fail.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from common.errors import UserError
from common.logs import _FIELDS
from common.metrics import MetricsRegistry
from common.settings import KafkaSettings, SinkSettings
from gpulens.cli import main
from schemas.codec import encode
from schemas.messages import Message
from schemas.outputs import ClusterCapacity
from schemas.topics import (
    CLUSTER_CAPACITY,
    GPU_SAMPLES,
    K8S_PODS,
)
from simulation.scenario import load_scenario
from sinks import rows
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import open_store
from sinks.ddl import TtlDays
from sinks.migrations import TTL_TABLES, migrate
from sinks.service import run_sink
from tests.advise.test_advise import differences
from tests.sinks import factories as f
from tests.sinks.conftest import Item, dead_letters, make_sink_settings, produce, replayed_items

pytestmark = pytest.mark.kafka

ADVISE = Path(__file__).parents[1] / "advise" / "scenarios"
YEAR_2100 = datetime(2100, 1, 1, tzinfo=UTC)
DATETIME_MAX = datetime(2106, 2, 7, 6, 28, 15, tzinfo=UTC)
"""The last second of ClickHouse's ``DateTime``, in which the tables' TTLs are counted."""


def _capacity(window_id: str, start: datetime) -> ClusterCapacity:
    return f.capacity(0).model_copy(update={"window_id": window_id, "window_start": start,
                                            "window_end": start + timedelta(minutes=1)})


def _code(letter: dict[str, Any]) -> str:
    """A dead letter's reason code: its header, which the body repeats (left out there when it is
    the default, ``invalid``)."""
    code = str(letter["value"].get("reason", "invalid"))
    header = letter["headers"].get("reason")
    return code if header == code else f"{code} (header: {header})"


def _codes_by_marker(letters: list[dict[str, Any]], markers: Iterable[str]) -> dict[str, str | None]:
    """The reason code of the dead letter whose record holds each marker (None: no such letter)."""
    codes: dict[str, str | None] = {}
    for marker in markers:
        mine = [letter for letter in letters if marker in (letter["value"].get("payload_text") or "")]
        assert len(mine) <= 1, (marker, mine)
        codes[marker] = _code(mine[0]) if mine else None
    return codes


def _stored_windows(settings: SinkSettings) -> set[str]:
    store = open_store(settings.clickhouse_url())
    try:
        store.command("OPTIMIZE TABLE cluster_capacity FINAL")  # a merge applies the table's TTL
        return {str(r[0]) for r in store.query("SELECT window_id FROM cluster_capacity").rows}
    finally:
        store.close()


def test_a_capacity_row_dated_2100_is_a_dead_letter_and_leaves_the_advisors_period_alone(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path,
    producer: Callable[[Iterable[Item]], int],
) -> None:
    """Finding 5: one ``cluster.capacity`` row dated 2100 moved ``advise``'s period to 2099 and every
    recommendation disappeared. Stored through the broker and the sink beside a replayed fleet, it
    is a dead letter ``too_far_ahead``; a row older than the table's TTL is one ``too_old``."""
    golden = orjson.loads((ADVISE / "advise-fleet.advise.json").read_bytes())
    scenario = load_scenario(ADVISE / "advise-fleet.yaml")
    far = _capacity("cap-far-2100", YEAR_2100)
    old = _capacity("cap-too-old", datetime.now(UTC) - timedelta(days=500))  # the state TTL is 400 days
    producer([*replayed_items(ADVISE / "advise-fleet.yaml")[1],
              (CLUSTER_CAPACITY, "cluster", far), (CLUSTER_CAPACITY, "cluster", old)])
    settings = make_sink_settings(kafka_settings, topic_prefix, tmp_path, batch_max_rows=2000,
                                  batch_max_age_s=0.3, raw_sample_ttl_days=3650,
                                  prices_usd_per_gpu_hour=dict(scenario.prices))
    totals = run_sink(settings, exit_when_idle_s=1.0)

    assert _codes_by_marker(dead_letters(settings, 2), ["cap-far-2100", "cap-too-old"]) == {
        "cap-far-2100": "too_far_ahead", "cap-too-old": "too_old"}
    assert totals.dead_letters == 2
    assert not {"cap-far-2100", "cap-too-old"} & _stored_windows(settings)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPULENS_CLICKHOUSE__URL", settings.clickhouse_url())
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["advise", "--json", "--data-dir", str(tmp_path), *golden["args"]])
    assert status == 0, err.getvalue()
    advice = orjson.loads(out.getvalue())
    assert advice["period"]["end"].startswith(scenario.start.date().isoformat()), advice["period"]
    problems = differences(advice, golden["expected"])
    assert problems == [], "\n".join(problems)


def test_a_long_ttl_never_wraps_a_row_away_and_keeps_what_it_covers(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path,
    producer: Callable[[Iterable[Item]], int],
) -> None:
    """With 3650-day TTLs, ``toDateTime(ts) + TTL`` of a row dated 2100 wraps past 2106 to 1973 and
    the engine dropped the row without a dead letter. Even with the future bound out of the way (a
    skew of a century), such a row is a dead letter ``too_far_ahead``; a row whose TTL ends just
    before the last second of ``DateTime`` is stored and stays after a merge, one just after it is
    a dead letter; the store's longer TTL keeps a 1,000-day-old row, and a row older than it is
    ``too_old``."""
    days = 3650
    limit = DATETIME_MAX - timedelta(days=days)
    now = datetime.now(UTC)
    rows_by_id = {
        "cap-far-2100": YEAR_2100,
        "cap-near-limit": limit - timedelta(days=2),
        "cap-past-limit": limit + timedelta(days=1),
        "cap-kept-1000d": now - timedelta(days=1000),
        "cap-older-than-ttl": now - timedelta(days=days + 30),
        "cap-now": now - timedelta(minutes=5),
    }
    producer([(CLUSTER_CAPACITY, "cluster", _capacity(window_id, start)) for window_id, start in rows_by_id.items()])
    settings = make_sink_settings(kafka_settings, topic_prefix, tmp_path, raw_sample_ttl_days=days,
                                  state_ttl_days=days, rollup_ttl_days=days, max_future_skew_s=100 * 365 * 86400.0)
    totals = run_sink(settings, exit_when_idle_s=1.0)

    letters = dead_letters(settings, 3)
    assert _codes_by_marker(letters, rows_by_id) == {
        "cap-far-2100": "too_far_ahead", "cap-past-limit": "too_far_ahead", "cap-older-than-ttl": "too_old",
        "cap-near-limit": None, "cap-kept-1000d": None, "cap-now": None}
    assert totals.dead_letters == 3
    assert _stored_windows(settings) == {"cap-near-limit", "cap-kept-1000d", "cap-now"}


def test_a_ttl_reaching_past_2106_is_refused_at_start(kafka_settings: KafkaSettings, topic_prefix: str,
                                                      tmp_path: Path) -> None:
    """Every row's TTL would wrap (the engine would drop each on insert): the sink says so and stops."""
    settings = make_sink_settings(kafka_settings, topic_prefix, tmp_path, state_ttl_days=36500)
    with pytest.raises(UserError, match="GPULENS_STATE_TTL_DAYS=36500 reaches past 2106-02-07"):
        run_sink(settings, exit_when_idle_s=1.0)


@pytest.fixture
def raw_producer(kafka_settings: KafkaSettings) -> Iterator[Producer]:
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})
    yield producer
    assert producer.flush(30.0) == 0


def test_no_record_stops_the_sink(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path, raw_producer: Producer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU sample dated 9999-12-31 (its TTL arithmetic overflowed), a pod tombstone whose Kafka
    timestamp lies past year 9999 (any producer sets it) and a capacity window whose rows fail to
    build (a gpulens fault, simulated) each used to end the sink; now each is a dead letter with
    its code and the records around them are stored."""
    samples = [f.sample("node-a", seq, gpus=1) for seq in range(3)]
    year_9999 = f.sample("node-far", 1, gpus=1).model_copy(update={"ts": datetime(9999, 12, 31, tzinfo=UTC)})
    capacity = [_capacity(f"cap-{i}", datetime.now(UTC) - timedelta(minutes=10 - i)) for i in range(3)]
    broken = _capacity("cap-broken", datetime.now(UTC) - timedelta(minutes=2))
    items: list[tuple[Any, str, Message | bytes | None]] = [
        *[(GPU_SAMPLES, "node-a", s) for s in samples[:2]], (GPU_SAMPLES, "node-far", year_9999),
        (GPU_SAMPLES, "node-a", samples[2]), *[(CLUSTER_CAPACITY, "cluster", c) for c in capacity[:2]],
        (CLUSTER_CAPACITY, "cluster", broken), (CLUSTER_CAPACITY, "cluster", capacity[2]),
        (CLUSTER_CAPACITY, "cluster", b"{not json"),
    ]
    produce(kafka_settings, topic_prefix, items)
    # a tombstone (no value) whose Kafka timestamp is in the year 33658
    raw_producer.produce(K8S_PODS.name(topic_prefix), key=b"default/uid-far", value=None, timestamp=10**15)
    assert raw_producer.flush(30.0) == 0

    builder = rows._BUILDERS[ClusterCapacity]

    def failing(msg: ClusterCapacity, partition: int, offset: int) -> Any:
        if msg.window_id == "cap-broken":
            raise RuntimeError("a row builder's own fault")
        return builder(msg, partition, offset)

    monkeypatch.setitem(rows._BUILDERS, ClusterCapacity, failing)
    settings = make_sink_settings(kafka_settings, topic_prefix, tmp_path)
    totals = run_sink(settings, exit_when_idle_s=1.0)  # returns: no record ended it

    letters = dead_letters(settings, 4)
    by_topic = {(letter["value"]["source_topic"], _code(letter)) for letter in letters}
    assert by_topic == {(GPU_SAMPLES.name(topic_prefix), "too_far_ahead"),
                        (K8S_PODS.name(topic_prefix), "too_far_ahead"),
                        (CLUSTER_CAPACITY.name(topic_prefix), "unappliable"),
                        (CLUSTER_CAPACITY.name(topic_prefix), "invalid")}, letters
    assert totals.dead_letters == 4
    assert _codes_by_marker(letters, ["cap-broken", "node-far"]) == {"cap-broken": "unappliable",
                                                                     "node-far": "too_far_ahead"}
    store = open_store(settings.clickhouse_url())
    try:
        assert store.query("SELECT node, count() FROM gpu_samples GROUP BY node").rows == [["node-a", 3]]
        assert {str(r[0]) for r in store.query("SELECT window_id FROM cluster_capacity").rows} == {
            "cap-0", "cap-1", "cap-2"}
        assert store.query("SELECT count() FROM state_tombstones").rows == [[0]]
    finally:
        store.close()


def test_a_retried_or_replayed_batch_judges_times_at_its_first_clock(tmp_path: Path) -> None:
    """The time bounds move with the clock, but a batch's blocks share one deduplication token:
    were a retry or a replay after a crash to keep a record the first attempt left out, the tables
    the first attempt stored would drop its rows as a duplicate block. So a batch is judged at the
    clock of its first preparation, journalled with its range (``planned_at``) and read back for
    the replay."""
    first_clock = datetime.now(UTC).replace(microsecond=0)
    topic = CLUSTER_CAPACITY.name("gpulens")
    ahead = _capacity("cap-ahead", first_clock + timedelta(seconds=700))  # 100 s past the bound, at first
    records = [ConsumedRecord(topic, 0, 0, b"cluster", encode(ahead)),
               ConsumedRecord(topic, 0, 1, b"cluster", encode(_capacity("cap-ok", first_clock)))]
    store = open_store(f"chdb://{tmp_path / 'clickhouse'}")
    try:
        migrate(store)
        clock = [first_clock]
        writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), "gpulens", now=lambda: clock[0])
        prepared = writer.prepare(Batch(topic, 0, records, 0, 1))
        assert [(r.offset, reason.code) for r, reason in prepared.rejected] == [(0, "too_far_ahead")]
        writer.plan(prepared.batch)  # journalled; then the sink crashed before the batch was committed
        clock[0] = first_clock + timedelta(minutes=5)  # the record is within the bound by now
        (plan,) = writer.pending_plans({(topic, 0): 0})[(topic, 0)]
        assert plan.clock == first_clock
        again = writer.prepare(Batch(topic, 0, records, plan.first_offset, plan.last_offset, replayed=True,
                                     clock=plan.clock))
        assert [(r.offset, reason.code) for r, reason in again.rejected] == [(0, "too_far_ahead")]
        retried = Batch(topic, 0, records, 0, 1)
        writer.prepare(retried)
        assert retried.clock == clock[0]  # a new batch is judged now, and so is each retry of it
        assert writer.prepare(retried).rejected == []
    finally:
        store.close()


def test_a_flood_of_poison_writes_at_most_the_letter_budget_and_counts_the_rest(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A compromised writer's 50 garbage records: the sink writes the burst's 5 dead letters, says
    the other 45 in one summary line (by topic and code), skips all 50 and stores what follows."""
    good = _capacity("cap-after-flood", datetime.now(UTC) - timedelta(minutes=1))
    produce(kafka_settings, topic_prefix, [*[(CLUSTER_CAPACITY, "cluster", b"{garbage %d" % i) for i in range(50)],
                                           (CLUSTER_CAPACITY, "cluster", good)])
    settings = make_sink_settings(kafka_settings, topic_prefix, tmp_path).model_copy(
        update={"deadletter_burst": 5, "deadletter_rate_per_s": 0.001})
    with caplog.at_level(logging.WARNING, logger="common.letter_budget"):
        totals = run_sink(settings, exit_when_idle_s=1.0)
    assert totals.dead_letters == 50
    letters = dead_letters(settings, 5)
    assert len(letters) == 5 and {_code(letter) for letter in letters} == {"invalid"}
    said = [getattr(record, _FIELDS)["suppressed"] for record in caplog.records
            if record.getMessage().startswith("dead letters suppressed")]
    assert sum(counts[f"{CLUSTER_CAPACITY.name(topic_prefix)}/invalid"] for counts in said) == 45
    assert _stored_windows(settings) == {"cap-after-flood"}


def test_the_tables_ttls_are_counted_in_their_datetime64_columns_and_do_not_wrap(tmp_path: Path) -> None:
    """A store's TTLs are sums on the tables' DateTime64 columns (the first migrations wrote
    ``toDateTime(column)``, whose sum with 3650 days wraps past 2106 to the 1970s): a row whose TTL
    ends after 2106 is kept by a merge, one past its TTL dropped."""
    store = open_store(f"chdb://{tmp_path / 'store'}")
    try:
        migrate(store, TtlDays(raw=3650, state=3650, rollup=3650))
        engines = {str(r[0]): str(r[1]) for r in store.query(
            "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()").rows}
        for table, (column, _kind) in TTL_TABLES.items():
            assert f"TTL {column} + toIntervalDay(3650)" in engines[table], engines[table]
        store.command("INSERT INTO cluster_capacity (window_id, window_start, window_end) VALUES "
                      "('w-2100', '2100-01-01 00:00:00', '2100-01-01 00:01:00'), "
                      "('w-2000', '2000-01-01 00:00:00', '2000-01-01 00:01:00')")
        store.command("OPTIMIZE TABLE cluster_capacity FINAL")
        assert [str(r[0]) for r in store.query("SELECT window_id FROM cluster_capacity").rows] == ["w-2100"]
    finally:
        store.close()
