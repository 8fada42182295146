"""Replayed scenarios stored in a private embedded ClickHouse and reported with ``gpulens report --html``.

Built once per scenario and session: the integration test checks the figures, the browser test
renders the very same file.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpulens.cli import main
from tests.report.loader import store_scenarios


@dataclass
class StoredReport:
    html_path: Path
    replay: dict[str, Any]
    """``gpulens replay``'s own report of the scenario."""
    stdout: str


@pytest.fixture(scope="session")
def stored_report(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], StoredReport]:
    cache: dict[Path, StoredReport] = {}

    def make(path: Path) -> StoredReport:
        if path not in cache:
            tmp = tmp_path_factory.mktemp(path.stem)
            url = f"chdb://{tmp / 'clickhouse'}"
            (replay,) = store_scenarios([path], url)
            html_path = tmp / "out" / "report.html"
            out = io.StringIO()
            with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(out):
                env.setenv("GPULENS_CLICKHOUSE__URL", url)
                status = main(["report", "--html", str(html_path), "--data-dir", str(tmp)])
            assert status == 0, out.getvalue()
            cache[path] = StoredReport(html_path, replay, out.getvalue())
        return cache[path]

    return make
