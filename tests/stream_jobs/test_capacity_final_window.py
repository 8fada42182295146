"""The last capacity window of a replay: when the replay ends inside a window, that window's counts
must be the state during it (as its GPU-second integrals say), not the zero-length instant at the
end, where no sample stands any more and busy/idle would read 0."""

from __future__ import annotations

from schemas.messages import Message
from schemas.outputs import ClusterCapacity
from simulation.demo_fleet import demo_scenario
from simulation.replay import run_in_process
from simulation.scenario import parse_scenario
from stream_jobs.config import EngineConfig
from stream_jobs.pipeline import LocalPipeline
from stream_jobs.timeutil import epoch
from tests.stream_jobs.helpers import T0, at, node, pod, reading, sample

BASE = epoch(T0)


def _capacity(messages: list[Message]) -> list[ClusterCapacity]:
    return sorted((m for m in messages if isinstance(m, ClusterCapacity)), key=lambda c: c.window_start)


def _pipeline_run(end: float, state_at_end: bool = False) -> list[ClusterCapacity]:
    """Node n1 with 4 GPUs: pod a holds GPU 0 (busy) and GPU 1 (idle); pod b holds GPU 2 (busy)."""
    pipeline = LocalPipeline(EngineConfig())
    pipeline.submit(node(gpus=4))
    pipeline.submit(pod("a", gpus=2))
    pipeline.submit(pod("b", gpus=1))
    for t in range(0, int(end), 10):
        pipeline.submit(sample(t, [reading(0, 80.0, ["a"]), reading(1, 0.0, ["a"]), reading(2, 60.0, ["b"]),
                                   reading(3, None, [])]))
        pipeline.advance(BASE + t - 30)
    if state_at_end:  # an input exactly at the end (e.g. a final pod state): an instant evaluated at end
        pipeline.submit(pod("b", t=end, gpus=1))
    pipeline.flush(BASE + end)
    return _capacity(pipeline.outputs)


def _assert_counts_match_integrals(cap: ClusterCapacity, seconds: float) -> None:
    assert cap.gpu_s_allocated == 3 * seconds
    assert (cap.gpus_total, cap.gpus_allocated, cap.gpus_free) == (4, 3, 1)
    assert (cap.gpus_busy, cap.gpus_idle_allocated) == (2, 1)
    assert (cap.gpu_s_busy, cap.gpu_s_idle_allocated) == (2 * seconds, 1 * seconds)


def test_replay_ending_inside_a_window_keeps_its_busy_and_idle_counts() -> None:
    caps = _pipeline_run(100.0)
    assert [epoch(c.window_start) - BASE for c in caps] == [0.0, 60.0]
    _assert_counts_match_integrals(caps[0], 60.0)
    _assert_counts_match_integrals(caps[1], 40.0)  # 09:01:00-09:01:40 of the replay


def test_an_input_exactly_at_the_end_does_not_zero_the_last_window() -> None:
    caps = _pipeline_run(100.0, state_at_end=True)
    assert epoch(caps[-1].window_start) - BASE == 60.0
    _assert_counts_match_integrals(caps[-1], 40.0)


def test_replay_ending_on_a_window_boundary_emits_no_empty_window() -> None:
    caps = _pipeline_run(120.0)
    assert [epoch(c.window_start) - BASE for c in caps] == [0.0, 60.0]
    _assert_counts_match_integrals(caps[-1], 60.0)


def test_demo_fleet_last_window_matches_the_one_before() -> None:
    # 5 min 3 s: the end (rounded up to the 10 s grid, 09:05:10) lies inside the 09:05-09:06 window
    result = run_in_process(parse_scenario(demo_scenario(nodes=4, gpus_per_node=4, duration_m=5.05)))
    caps = _capacity(result.outputs)
    last, before = caps[-1], caps[-2]
    assert last.window_start == at(300) and before.window_start == at(240)
    assert last.gpus_allocated > 0 and last.gpus_busy > 0
    assert last.gpu_s_total and last.gpu_s_busy and last.gpu_s_idle_allocated is not None and last.gpu_s_allocated
    seconds = last.gpu_s_total / last.gpus_total
    assert 0 < seconds < 60
    # the state held steady over the last seconds: counts equal the integrals' averages
    assert last.gpus_busy == round(last.gpu_s_busy / seconds)
    assert last.gpus_idle_allocated == round(last.gpu_s_idle_allocated / seconds)
    assert last.gpus_allocated == round(last.gpu_s_allocated / seconds)
    assert last.gpus_busy + last.gpus_idle_allocated <= last.gpus_allocated
