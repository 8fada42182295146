"""``gpulens replay SCENARIO --store``: a past-dated scenario lands whole in the history, through
the sink's own write path, in process and through Kafka; ``advise`` over it equals the advisor over
the store the advisor's tests build (tests/report/loader.py)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.settings import KafkaSettings, SinkSettings
from gpulens.cli import main
from schemas.codec import decode
from schemas.messages import GpuSample
from schemas.topics import GPU_SAMPLES, by_suffix
from simulation.scenario import load_scenario
from simulation.simulator import FleetSimulator
from simulation.store import store_settings
from sinks.clickhouse import open_store
from sinks.ddl import TtlDays
from tests.report.loader import store_scenarios

FLEET = Path(__file__).parent.parent / "advise" / "scenarios" / "advise-fleet.yaml"


@pytest.fixture(scope="module")
def past_dated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The advisor's fleet moved to 2025-01-01: older than every default TTL allows for raw samples."""
    path = tmp_path_factory.mktemp("scenario") / "advise-fleet-2025.yaml"
    text = FLEET.read_text()
    assert 'start: "2026-01-05T09:00:00Z"' in text
    path.write_text(text.replace('start: "2026-01-05T09:00:00Z"', 'start: "2025-01-01T09:00:00Z"'))
    return path


@contextlib.contextmanager
def store_env(data_dir: Path) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPULENS_DATA_DIR", str(data_dir))
        mp.setenv("GPULENS_CLICKHOUSE__URL", f"chdb://{data_dir / 'clickhouse'}")
        for variable in ("GPULENS_RAW_SAMPLE_TTL_DAYS", "GPULENS_STATE_TTL_DAYS", "GPULENS_ROLLUP_TTL_DAYS",
                         "GPULENS_PRICES_USD_PER_GPU_HOUR"):
            mp.delenv(variable, raising=False)
        yield


def cli(data_dir: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with store_env(data_dir), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    return status, out.getvalue(), err.getvalue()


def simulated_gpu_samples(path: Path) -> int:
    """Rows of gpu_samples the simulator's records make: one per GPU of each sample."""
    total = 0
    for tick in FleetSimulator(load_scenario(path)).run():
        for record in tick.records:
            if by_suffix(record.topic) is GPU_SAMPLES and record.value is not None:
                total += len(decode(record.value, GpuSample).gpus)
    return total


def stored_count(data_dir: Path, table: str) -> int:
    store = open_store(f"chdb://{data_dir / 'clickhouse'}")
    try:
        return int(store.query(f"SELECT count() FROM {table}").rows[0][0])
    finally:
        store.close()


def advise(data_dir: Path) -> dict[str, Any]:
    status, out, err = cli(data_dir, "advise", "--json")
    assert status == 0, err
    return orjson.loads(out)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def expected_advice(past_dated: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data_dir = tmp_path_factory.mktemp("expected")
    store_scenarios([past_dated], f"chdb://{data_dir / 'clickhouse'}")
    return advise(data_dir)


def check_store(data_dir: Path, past_dated: Path, expected_advice: dict[str, Any]) -> None:
    samples = simulated_gpu_samples(past_dated)
    assert samples > 1000
    assert stored_count(data_dir, "gpu_samples") == samples  # every raw sample, none to the TTL or bounds
    advice = advise(data_dir)
    assert advice == expected_advice
    assert advice["headline"]["usd_per_month"] > 0  # the scenario's prices came with it


def test_in_process_store_keeps_a_past_dated_scenario_whole(past_dated: Path, expected_advice: dict[str, Any],
                                                            tmp_path: Path) -> None:
    status, out, err = cli(tmp_path, "replay", str(past_dated), "--store", "--json")
    assert status == 0, err
    assert orjson.loads(out)["scenario"]  # the report is printed as without --store
    assert f"stored in chdb://{tmp_path / 'clickhouse'}" in err
    assert "GPULENS_RAW_SAMPLE_TTL_DAYS=" in err  # says how a later sink keeps these rows
    assert "refused" not in err
    check_store(tmp_path, past_dated, expected_advice)
    # a second --store on the same store: exactly once, nothing doubled
    status, _, err = cli(tmp_path, "replay", str(past_dated), "--store", "--json")
    assert status == 0, err
    assert stored_count(tmp_path, "gpu_samples") == simulated_gpu_samples(past_dated)


def test_kafka_store_drains_the_replay_into_the_store(past_dated: Path, expected_advice: dict[str, Any],
                                                      kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    status, _, err = cli(tmp_path, "replay", str(past_dated), "--kafka", kafka_settings.bootstrap_servers,
                         "--store", "--json")
    assert status == 0, err
    assert "the sink drains the topics" in err and "stored in" in err and "refused" not in err
    check_store(tmp_path, past_dated, expected_advice)


def test_store_settings_keep_the_scenario_and_accept_a_future_one(past_dated: Path) -> None:
    now = datetime(2026, 12, 5, tzinfo=UTC)
    scenario = load_scenario(past_dated)
    settings, lengthened = store_settings(scenario, SinkSettings(), now=now)
    assert lengthened and TtlDays.from_settings(settings) == TtlDays.keeping(scenario.start, now)
    assert settings.prices_usd_per_gpu_hour == scenario.prices
    # TTLs configured longer than needed are kept as they are
    longer = SinkSettings(raw_sample_ttl_days=5000, state_ttl_days=5000, rollup_ttl_days=5000)
    settings, lengthened = store_settings(scenario, longer, now=now)
    assert not lengthened and settings.raw_sample_ttl_days == 5000
    # a scenario dated after the clock: the sink's future bound reaches its end
    settings, _ = store_settings(scenario, SinkSettings(), now=datetime(2024, 12, 31, tzinfo=UTC))
    assert settings.max_future_skew_s > 24 * 3600 + scenario.duration_s
