"""No silent loss in what users read: ``report`` and ``advise`` say when GPU models have no list
price (their cost is unknown, not $0), and ``top`` says the dead letters by reason."""

from __future__ import annotations

import contextlib
import io
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from gpulens.cli import main
from gpulens.top import FleetView, render
from schemas.outputs import ClusterCapacity, DeadLetter, DeadLetterReason
from sinks.clickhouse import open_store
from tests.report.loader import store_scenarios

FLEET = Path(__file__).parent.parent / "advise" / "scenarios" / "advise-fleet.yaml"


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


def cli(data_dir: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setenv("GPULENS_CLICKHOUSE__URL", f"chdb://{data_dir / 'clickhouse'}")
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
