"""The node stage's per-sample work, at the edges its shortcuts must keep: a sample whose interval
crosses a window boundary or is shorter than the stage's epsilon, a rule whose condition turns false
while only its timer runs, a node that holds GPUs and then none, the GPUs the caching-allocator
tracker remembers per pod, and the stamps a window's message carries.

Each case states what a user sees (window seconds, alert times, figures) and holds for the plain
definition the shortcuts stand in for."""

from __future__ import annotations

from schemas.messages import Message
from schemas.outputs import Alert, PodWindow
from stream_jobs.allocator import AllocatorTracker
from stream_jobs.config import EngineConfig, Thresholds
from stream_jobs.node_stage import NodeStage
from stream_jobs.state import PodGpuWindow, WindowStamps
from stream_jobs.timeutil import epoch, from_epoch, iso
from tests.stream_jobs.helpers import T0, at, node, pod, reading, sample

BASE = epoch(T0)
CONFIG = EngineConfig(window_s=60.0, thresholds=Thresholds(idle_after=60.0, idle_node_after=30.0))


def _run(inputs: list[Message], until: float, config: EngineConfig = CONFIG) -> tuple[NodeStage, list[Message]]:
    stage = NodeStage("n1", config)
    for message in inputs:
        stage.submit(message)
    return stage, stage.advance(BASE + until)


def _alerts(messages: list[Message]) -> list[tuple[str, str, float]]:
    return [(m.type, m.state, epoch(m.at) - BASE) for m in messages if isinstance(m, Alert)]


def test_a_sample_across_a_window_boundary_splits_its_seconds() -> None:
    stage, out = _run([node(), pod("a"), sample(55.0, [reading(0, 80.0, ["a"])], interval=10.0)], 200)
    windows = sorted((w for w in out if isinstance(w, PodWindow)), key=lambda w: w.window_start)
    assert [(epoch(w.window_start) - BASE, w.allocated_s, w.busy_s, w.samples) for w in windows] == [
        (0.0, 5.0, 5.0, 1), (60.0, 5.0, 5.0, 0)]
    assert sum(w.cost_usd for w in windows) == 0.0  # no price configured
    assert not stage.windows


def test_a_sample_inside_one_window_counts_whole() -> None:
    _, out = _run([node(), pod("a"), sample(10.0, [reading(0, 80.0, ["a"])], interval=10.0)], 200)
    (window,) = [w for w in out if isinstance(w, PodWindow)]
    assert (epoch(window.window_start) - BASE, window.allocated_s, window.samples) == (0.0, 10.0, 1)
    assert window.avg_sm_util_pct == 80.0 and window.max_sm_util_pct == 80.0


def test_an_interval_shorter_than_epsilon_adds_no_window_time() -> None:
    stage, out = _run([node(), pod("a"), sample(10.0, [reading(0, 80.0, ["a"])], interval=1e-7)], 15)
    assert not [w for w in out if isinstance(w, PodWindow)] and not stage.windows
    assert stage.usage["uid-a"].samples == 1  # the pod's usage still counts the sample


def test_a_busy_sample_between_idle_ones_restarts_a_timer_that_has_not_fired() -> None:
    samples = [sample(t, [reading(0, 1.0, ["a"])]) for t in (0.0, 10.0, 20.0, 30.0)]
    samples += [sample(40.0, [reading(0, 70.0, ["a"])])]
    samples += [sample(t, [reading(0, 1.0, ["a"])]) for t in range(50, 200, 10)]
    stage, out = _run([node(), pod("a"), *samples], 200)
    assert _alerts(out) == [("idle_gpu", "firing", 110.0)]  # 60 s after the idle run that started at 50
    assert list(stage.alerting["idle_gpu"]) == ["uid-a|GPU-0"]


def test_an_idle_node_fires_once_its_gpus_are_released_and_resolves_when_held_again() -> None:
    busy = [sample(t, [reading(0, 50.0, ["a"]), reading(1, 0.0, [])]) for t in (0.0, 10.0, 20.0)]
    idle = [sample(t, [reading(0, 0.0, []), reading(1, 0.0, [])]) for t in range(30, 80, 10)]
    again = [sample(t, [reading(0, 50.0, ["b"]), reading(1, 0.0, [])]) for t in (80.0, 90.0)]
    gone = pod("a", t=25.0, phase="Succeeded")
    _, out = _run([node(), pod("a"), gone, pod("b", t=75.0), *busy, *idle, *again], 100)
    assert [a for a in _alerts(out) if a[0] == "idle_node"] == [("idle_node", "firing", 60.0),
                                                                 ("idle_node", "resolved", 80.0)]


def test_the_allocator_tracker_keeps_a_gpus_memory_when_a_reading_lacks_it() -> None:
    tracker = AllocatorTracker("n1", Thresholds(), 60.0)
    first = reading(0, 50.0, ["a"])
    tracker.saw("uid-a", first)
    assert tracker.gpus == {"uid-a": {"GPU-0": [0, 80 * 2**30]}}
    tracker.saw("uid-a", first.model_copy(update={"mem_total_bytes": None}))
    assert tracker.gpus == {"uid-a": {"GPU-0": [0, 80 * 2**30]}}
    tracker.saw("uid-a", first.model_copy(update={"index": 3, "mem_total_bytes": 40 * 2**30}))
    assert tracker.gpus == {"uid-a": {"GPU-0": [3, 40 * 2**30]}}


def _window(pod_uid: str, gpu: str, busy: float, allocated: float) -> PodGpuWindow:
    return PodGpuWindow(pod_uid=pod_uid, namespace="ns", pod=pod_uid, team=None, project=None, gpu_uuid=gpu,
                        gpu_model="m", gpu_index=0, container=None, window_start=BASE, allocated_s=allocated,
                        busy_s=busy, samples=1)


def test_window_stamps_are_the_figures_of_all_windows_of_the_start() -> None:
    windows = [_window("a", "G0", 0.1, 60.0), _window("b", "G0", 0.2, 30.0), _window("a", "G1", 0.7, 60.0),
               _window("c", "G0", 0.3, 60.0), _window("c", "G2", 0.0, 12.0)]
    stamps = WindowStamps.of(windows, BASE, 60.0)
    assert (stamps.start, stamps.end, stamps.start_iso) == (from_epoch(BASE), from_epoch(BASE + 60.0), iso(BASE))
    for w in windows:
        message = w.message("n1", stamps)
        same_gpu = [o for o in windows if o.gpu_uuid == w.gpu_uuid]
        assert message.pod_busy_s == max(o.busy_s for o in windows if o.pod_uid == w.pod_uid)
        assert message.gpu_pods == len(same_gpu)
        assert message.gpu_busy_s == sum(o.busy_s for o in same_gpu)  # the same additions, in the same order
        assert message.gpu_allocated_s == max(o.allocated_s for o in same_gpu)
        assert (message.window_start, message.window_end) == (at(0), at(60))
    assert stamps.gpu_busy_s["G0"] == 0.1 + 0.2 + 0.3 != 0.1 + (0.2 + 0.3)  # float order matters, and is kept
