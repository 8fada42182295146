"""``python -m benchmarks``: a mistyped option or name is refused in one line before anything runs
(the whole suite takes minutes and starts a broker; ``--help`` once ran all of it)."""

from __future__ import annotations

import pytest

from benchmarks.harness import main


@pytest.mark.parametrize(("argv", "said"), [
    (["--bogus"], "unknown option --bogus"),
    (["stream", "nosuch"], "no benchmark named like 'nosuch'"),
])
def test_a_wrong_argument_exits_2_with_one_line(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert said in err and "bench_stream" in err


def test_help_prints_the_usage_and_runs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m benchmarks") and "==" not in out
