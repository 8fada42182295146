"""Cluster text never drives the reader's terminal: a team value carrying escape sequences (OSC
``ESC]0;... BEL``, ``ESC[2J``, the 8-bit CSI ``\\x9b``) and rich markup (``[/oops]``,
``[link=...]``) is shown escaped, as text, by every CLI text output: ``top``, ``report``, ``sql``'s
table, ``advise`` and ``replay``. The hostile value is in the data: a scenario's pod label, replayed
and stored through the sink's write path, then read back by the real commands."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console

from gpulens.cli import main
from gpulens.top import FleetView, render
from schemas import codec
from schemas.messages import K8sEvent, PodState
from schemas.outputs import Alert, AlertSubject, ClusterCapacity, PodWindow
from tests.report.loader import store_scenarios

HOSTILE = "\x1b]0;pwn\x07\x1b[2J\x9b1m\x90\x7f[/oops][link=https://evil.example]x[/link]"
"""A window title, a screen wipe, an 8-bit CSI, a DCS, DEL, a bad closing tag and a link: 59
characters, a valid length for a Kubernetes label value."""
SHOWN = r"\x1b]0;pwn\x07\x1b[2J\x9b1m\x90\x7f[/oops][link=https://evil.example]x[/link]"
"""How it must be shown: every control character as ``\\xNN``, the brackets as text."""
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""What no text output may hold (newline and tab are layout)."""

SCENARIO = r"""
name: "hostile \e]0;pwned\a\e[2J\x9b31m[/oops]"
start: "2026-01-05T08:00:00Z"
duration: 3h
sample_interval: 60s
prices: {"NVIDIA H100 80GB HBM3": 2.5}
nodes:
  - {name: gpu-a, gpus: 8}
pods:
  - {name: notebook, namespace: ml, labels: {team: "TEAM"}, gpus: 2, create: 0m, util: 0, memory_gib: 10}
  - {name: train, namespace: ml, labels: {team: "TEAM"}, gpus: 4, create: 0m, util: 90, memory_gib: 40}
  - {name: waiting, namespace: ml, labels: {team: "TEAM"}, gpus: 4, create: 10m, util: 90, memory_gib: 40}
""".replace("TEAM", r"\e]0;pwn\a\e[2J\x9b1m\x90\x7f[/oops][link=https://evil.example]x[/link]")


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    tmp = tmp_path_factory.mktemp("hostile")
    scenario = tmp / "hostile.yaml"
    scenario.write_text(SCENARIO)
    (replay,) = store_scenarios([scenario], f"chdb://{tmp / 'clickhouse'}")
    assert {p["team"] for p in replay["pods"]} == {HOSTILE}, "the hostile team reaches the pipeline as it is"
    yield tmp, scenario


def run(data_dir: Path | None, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if data_dir is not None:
            mp.setenv("GPULENS_CLICKHOUSE__URL", f"chdb://{data_dir / 'clickhouse'}")
        status = main([*args] if data_dir is None else [*args, "--data-dir", str(data_dir)])
    assert status == 0, err.getvalue()
    return out.getvalue()


def assert_safe(output: str) -> None:
    assert SHOWN[:50] in output, "the hostile value is shown, escaped (a table cuts it at 60 characters)"
    assert not CONTROL.findall(output), sorted(set(CONTROL.findall(output)))


def test_printable_shows_every_c0_del_and_c1_character_escaped() -> None:
    from common.text import printable  # here: the command tests run on older trees too

    assert printable(HOSTILE) == SHOWN
    assert printable("a\tb\nc\rd") == r"a\x09b\x0ac\x0dd", "one cell: one line"
    assert printable("a\tb\nc\rd", multiline=True) == "a\tb\nc\\x0dd", "a whole output keeps its layout"
    assert printable("GPU 0 on gpu-a: 5 % — ünïcode ✓") == "GPU 0 on gpu-a: 5 % — ünïcode ✓"
    assert printable(printable(HOSTILE)) == SHOWN, "idempotent"


def test_report_text_shows_hostile_cluster_text_escaped(hostile_store: tuple[Path, Path]) -> None:
    assert_safe(run(hostile_store[0], "report"))


def test_sql_table_shows_hostile_cluster_text_escaped(hostile_store: tuple[Path, Path]) -> None:
    output = run(hostile_store[0], "sql", "SELECT DISTINCT team, 'a' || char(10) || 'b' AS two_lines FROM pod_windows")
    assert_safe(output)
    assert r"a\x0ab" in output and len(output.strip().splitlines()) == 3, "a cell stays on its line"


def test_advise_text_shows_hostile_cluster_text_escaped(hostile_store: tuple[Path, Path]) -> None:
    output = run(hostile_store[0], "advise", "--idle-stretch", "30m", "--min-evidence", "30m", "--bucket", "30m")
    assert "Reclaim" in output and "ml" in output
    assert_safe(output)


def test_replay_text_shows_hostile_scenario_text_escaped(hostile_store: tuple[Path, Path]) -> None:
    output = run(None, "replay", str(hostile_store[1]))
    assert r"hostile \x1b]0;pwned\x07\x1b[2J\x9b31m[/oops]" in output, "the scenario's name, escaped"
    assert "notebook" in output
    assert not CONTROL.findall(output), sorted(set(CONTROL.findall(output)))


T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _hostile_view() -> FleetView:
    """A view fed as ``top`` feeds it: each message decoded from its encoded bytes."""
    view = FleetView()
    messages = [
        ClusterCapacity(window_id="c1", window_start=T0, window_end=T0 + timedelta(minutes=1), gpus_total=8,
                        gpus_allocated=2, gpus_busy=0, gpus_idle_allocated=2, gpus_free=6, stranded_gpus=0,
                        pending_pods=1, pending_gpu_demand=8),
        PodState(uid="u1", namespace="ml", name="notebook", ts=T0, node="gpu-a", phase="Running",
                 gpu_requests={"nvidia.com/gpu": 2}, created_at=T0, team=HOSTILE),
        PodState(uid="u2", namespace="ml", name="waiting", ts=T0, phase="Pending",
                 gpu_requests={"nvidia.com/gpu": 8}, created_at=T0, team=HOSTILE),
        PodWindow(window_id="w1", pod_uid="u1", namespace="ml", pod="notebook", node="gpu-a", gpu_uuid="GPU-1",
                  gpu_model="H100", window_start=T0, window_end=T0 + timedelta(minutes=1), team=HOSTILE,
                  allocated_s=60, busy_s=0, idle_s=60, samples=6, avg_sm_util_pct=0),
        K8sEvent(uid="e1", ts=T0, category="scheduling_failed", reason="FailedScheduling",
                 message=f"0/1 nodes are available: {HOSTILE}", involved_kind="Pod", involved_uid="u2",
                 involved_name="waiting"),
        Alert(id="a1", type="idle_gpu", severity="warning", state="firing", at=T0, started_at=T0,
              subject=AlertSubject(kind="pod", namespace="ml", name="notebook"), summary=f"idle: {HOSTILE}"),
    ]
    for message in messages:
        view.apply(codec.decode(codec.encode(message), type(message)))
    return view


def test_top_shows_hostile_team_as_text_not_markup_links_or_escape_sequences() -> None:
    view = _hostile_view()
    console = Console(width=300, force_terminal=True, color_system="truecolor")
    segments = list(console.render(render(view)))  # a MarkupError here would end `top`
    assert not [s for s in segments if s.style is not None and s.style.link], "no link from cluster text"
    text = "".join(s.text for s in segments)
    assert text.count(SHOWN) >= 4, "team (usage, idlest pods), reason and summary, shown as text"
    assert not CONTROL.findall(text), sorted(set(CONTROL.findall(text)))

    screen = io.StringIO()
    Console(file=screen, width=300, force_terminal=True, color_system="truecolor").print(render(view))
    written = re.sub(r"\x1b\[[0-9;]*m", "", screen.getvalue())  # rich's own colours are the only sequences
    assert "\x1b]8;" not in written and not CONTROL.findall(written), sorted(set(CONTROL.findall(written)))
