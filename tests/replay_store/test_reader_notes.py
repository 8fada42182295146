"""No silent loss in what users read: ``report`` and ``advise`` say when GPU models have no list
price and show the money that includes their GPU-hours as unknown (JSON null, "unknown" in text), not
$0; ``top`` says the dead letters by reason."""

from __future__ import annotations

import contextlib
import io
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from rich.console import Console

from common.kafka import ensure_topics
from common.settings import KafkaSettings
from gpulens.cli import main
from gpulens.top import FleetView, render
from schemas.codec import encode
from schemas.dead_letters import dead_letter, dead_letter_headers
from schemas.outputs import ClusterCapacity, DeadLetter, DeadLetterReason
from schemas.topics import DEADLETTER
from sinks.clickhouse import open_store
from sinks.service import load_prices
from tests.report.loader import store_scenarios

FLEET = Path(__file__).parent.parent / "advise" / "scenarios" / "advise-fleet.yaml"
MIXED = Path(__file__).parent.parent / "report" / "scenarios" / "report-fleet.yaml"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def unpriced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The advisor's fleet stored without its prices."""
    data_dir = tmp_path_factory.mktemp("unpriced")
    store_scenarios([FLEET], f"chdb://{data_dir / 'clickhouse'}")
    store = open_store(f"chdb://{data_dir / 'clickhouse'}")
    try:
        store.command("TRUNCATE TABLE gpu_prices")
    finally:
        store.close()
    return data_dir


@pytest.fixture(scope="module")
def priced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("priced")
    store_scenarios([FLEET], f"chdb://{data_dir / 'clickhouse'}")
    return data_dir


@pytest.fixture(scope="module")
def half_priced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[tuple[str, str]]]:
    """The mixed H100/A100 fleet stored with the H100's price only; with the pods that ran on A100s."""
    data_dir = tmp_path_factory.mktemp("half")
    store_scenarios([MIXED], f"chdb://{data_dir / 'clickhouse'}")
    store = open_store(f"chdb://{data_dir / 'clickhouse'}")
    try:
        store.command("TRUNCATE TABLE gpu_prices")
        load_prices(store, {H100: 2.5})
        a100 = {(str(ns), str(pod)) for ns, pod in store.query(
            f"SELECT DISTINCT namespace, pod FROM pod_windows WHERE gpu_model != '{H100}'").rows}
    finally:
        store.close()
    return data_dir, a100


def cli(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setenv("GPULENS_CLICKHOUSE__URL", f"chdb://{data_dir / 'clickhouse'}")
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        status = main([*args, "--data-dir", str(data_dir)])
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command", [("report", "--section", "cost_by_team"), ("advise",)])
def test_missing_prices_are_said_not_shown_as_free(command: tuple[str, ...], unpriced: Path, priced: Path) -> None:
    status, out, _ = cli(unpriced, *command)
    assert status == 0
    note = out.strip().splitlines()[-1]
    assert note.startswith("note: no list price for GPU model(s) ") and "GPULENS_PRICES_USD_PER_GPU_HOUR" in note
    # beside --json the note goes to stderr; the JSON is the same as without it
    status, out_json, err = cli(unpriced, *command, "--json")
    assert status == 0 and "note: no list price" in err
    orjson.loads(out_json)
    # priced: no note
    status, out, err = cli(priced, *command)
    assert status == 0 and "no list price" not in out + err


def test_money_over_unpriced_gpus_is_unknown_not_zero(half_priced: tuple[Path, set[tuple[str, str]]]) -> None:
    data_dir, a100 = half_priced
    assert a100, "the scenario runs pods on its A100 node"
    status, out, _ = cli(data_dir, "report", "--json")
    assert status == 0
    data = orjson.loads(out)
    pods = data["top_pods"]
    assert {(r["namespace"], r["pod"]) for r in pods if r["cost_usd"] is None} == a100 & {
        (r["namespace"], r["pod"]) for r in pods}
    assert any(r["cost_usd"] is not None and r["cost_usd"] > 0 for r in pods), "H100 pods keep their money"
    assert data["summary"][0]["list_cost_usd"] is None and data["summary"][0]["window_cost_usd"] is None
    a100_teams = {r["team"] for r in data["top_pods"] if (r["namespace"], r["pod"]) in a100}
    for row in data["cost_by_team"]:
        assert (row["list_cost_usd"] is None) == (row["team"] in a100_teams), row
    # text: "unknown" where JSON has null, never $0.00 for those rows
    status, out, _ = cli(data_dir, "report", "--section", "top_pods")
    shown = [line for line in out.splitlines() if any(f" {pod} " in line for _, pod in a100)]
    assert shown and all(line.rstrip().endswith("unknown") for line in shown), shown
    status, out, _ = cli(data_dir, "advise", "--json")
    advice = orjson.loads(out)
    assert status == 0 and advice["totals"]["capacity_cost_usd"] is None
    assert advice["headline"]["usd_per_month"] is None and "cost unknown" in advice["headline_text"]
    status, out, _ = cli(data_dir, "advise")
    assert status == 0 and "cost unknown of unknown" in out and "$0" not in out.splitlines()[0]
    status, out, err = cli(data_dir, "report", "--html", str(data_dir / "r.html"))
    assert status == 0 and "no list price" in err


@pytest.mark.kafka
def test_report_and_advise_say_the_periods_dead_letters_by_reason(
        priced: Path, kafka_settings: KafkaSettings, topic_prefix: str) -> None:
    ensure_topics(kafka_settings, [DEADLETTER], topic_prefix)
    topic = DEADLETTER.name(topic_prefix)
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})
    for reason in (DeadLetterReason.TOO_OLD, DeadLetterReason.TOO_OLD, DeadLetterReason.INVALID):
        letter = dead_letter("x", "gpulens.gpu.samples.v1", b"{}", datetime.now(UTC), reason=reason)
        producer.produce(topic, encode(letter), headers=dead_letter_headers(letter))
    assert producer.flush(10) == 0
    env = {"GPULENS_DEAD_LETTERS_TIMEOUT_S": "5", "GPULENS_TOPIC_PREFIX": topic_prefix,
           "GPULENS_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers}
    for command in (("report", "--section", "summary"), ("advise",)):
        status, out, _ = cli(priced, *command, env=env)
        assert status == 0
        assert f"note: 3 record(s) were dead-lettered on {topic} since " in out, out
        assert "(too_old 2, invalid 1): the figures above do not include them" in out
        status, out, err = cli(priced, *command, "--json", env=env)
        assert status == 0 and "3 record(s) were dead-lettered" in err
        orjson.loads(out)
    # a fresh prefix has none: no note
    fresh = env | {"GPULENS_TOPIC_PREFIX": "none" + topic_prefix}
    status, out, _ = cli(priced, "report", "--section", "summary", env=fresh)
    assert status == 0 and "dead-lettered" not in out
    # Kafka not answering: said, not silent
    status, out, _ = cli(priced, "advise", env=env | {"GPULENS_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
                                                       "GPULENS_DEAD_LETTERS_TIMEOUT_S": "1"})
    assert status == 0 and "dead letters since" in out and "not counted: Kafka at 127.0.0.1:1 did not answer" in out


def test_top_says_the_dead_letters_by_reason() -> None:
    view = FleetView()
    at = datetime(2026, 1, 5, 9, tzinfo=UTC)
    view.apply(ClusterCapacity(window_id="w1", window_start=at, window_end=at, gpus_total=8, gpus_free=8,
                                gpus_allocated=0, gpus_busy=0, gpus_idle_allocated=0))
    console = Console(width=200, record=True)
    console.print(render(view))
    assert "dead letters" not in console.export_text()
    for reason in (DeadLetterReason.TOO_OLD, DeadLetterReason.TOO_OLD, DeadLetterReason.INVALID):
        view.apply(DeadLetter(reason=reason, error="x", source_topic="gpulens.gpu.samples.v1", at=at))
    assert view.deadletters == {"too_old": 2, "invalid": 1} and view.messages_seen == 1
    console = Console(width=200, record=True)
    console.print(render(view))
    assert "dead letters: 3 records refused (too_old 2, invalid 1)" in console.export_text()
