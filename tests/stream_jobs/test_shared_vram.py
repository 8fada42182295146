"""noisy_neighbour and vram_fragmentation rules on hand-made readings (24 GiB GPUs, 95 % threshold).

24 GiB = 25769803776 bytes; 95 % of it is 22.8 GiB.
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.messages import GpuReading, NodeState
from schemas.outputs import Alert, SharedGpuState, SharedPodVram
from stream_jobs import rules
from stream_jobs.config import Thresholds
from stream_jobs.shared_vram import NoisyNeighbours, VramTracker, replicas_per_gpu
from stream_jobs.state import ClusterPod

GIB = 2**30
TH = Thresholds(vram_pressure_after=60.0, vram_fragmentation_after=120.0)


def _reading(used_gib: float) -> GpuReading:
    return GpuReading(uuid="GPU-0", index=0, model="NVIDIA L4", mem_total_bytes=24 * GIB,
                      mem_used_bytes=int(used_gib * GIB), shared=True)


def _run(steps: Sequence[tuple[float, Sequence[tuple[str, float]]]]) -> list[tuple[str, float, str | None]]:
    tracker = NoisyNeighbours()
    table: rules.RuleTable = {}
    out: list[tuple[str, float, str | None]] = []
    for t, tenants in steps:
        used = sum(mem for _, mem in tenants)
        _state, alerts = tracker.observe(t, "n1", _reading(used), [(u, "ns", u, int(m * GIB)) for u, m in tenants], TH,
                                        table)
        out += [(a.state, t, a.subject.name) for a in alerts]
    return out


def test_the_pod_that_grew_is_named_after_vram_pressure_after() -> None:
    # a 10 + b 8 = 18 GiB (75 %); b grows to 13 -> 23 GiB (95.8 %) at 10 s; held 60 s -> fires at 70 s
    steps = [(0.0, [("a", 10), ("b", 8)])] + [(t, [("a", 10), ("b", 13)]) for t in range(10, 80, 10)]
    assert _run(steps) == [("firing", 70, "b")]


def test_one_tenant_or_nobody_growing_is_not_a_noisy_neighbour() -> None:
    assert _run([(t, [("a", 23.5)]) for t in range(0, 200, 10)]) == []  # alone: vram_pressure's business
    # both at 11.5 GiB (23 GiB, 95.8 %) from the first sample: never seen below the threshold, so
    # nobody is known to have grown
    assert _run([(t, [("a", 11.5), ("b", 11.5)]) for t in range(0, 100, 10)]) == []
    # a newcomer that pushes the GPU over counts as growth from nothing: c (5 GiB) is named
    steps = [(0.0, [("a", 10), ("b", 8)])] + [(t, [("a", 10), ("b", 8), ("c", 5)]) for t in range(10, 80, 10)]
    assert _run(steps) == [("firing", 70, "c")]


def test_resolves_when_the_noisy_pod_leaves_or_memory_drops() -> None:
    steps: list[tuple[float, Sequence[tuple[str, float]]]] = [(0.0, [("a", 10.0), ("b", 8.0)])]
    steps += [(t, [("a", 10.0), ("b", 13.0)]) for t in range(10, 80, 10)]
    left = _run([*steps, (80.0, [("a", 10.0), ("c", 13.0)])])
    assert left[-1] == ("resolved", 80.0, "b")
    dropped = _run([*steps, (80.0, [("a", 10.0), ("b", 8.0)])])
    assert dropped[-1] == ("resolved", 80.0, "b")


def _gpu(index: int, free_gib: float) -> SharedGpuState:
    return SharedGpuState(gpu_uuid=f"GPU-{index}", gpu_index=index, model="NVIDIA L4", mem_total_bytes=24 * GIB,
                          mem_used_bytes=int((24 - free_gib) * GIB),
                          pods=[SharedPodVram(namespace="ns", name=f"t{index}", mem_bytes=int((24 - free_gib) * GIB))])


def _pending(need_gib: float | None) -> ClusterPod:
    return ClusterPod(uid="u1", namespace="ns", name="big", requests={"nvidia.com/gpu": 1}, gpus=1,
                      vram_need_bytes=None if need_gib is None else int(need_gib * GIB))


def _why(uid: str) -> str:
    return "no longer pending"


def test_vram_fragmentation_only_when_the_total_fits_and_no_single_gpu_does() -> None:
    for need, fires in ((20, True), (10, False), (41, False)):
        tracker = VramTracker()
        tracker.on_summary("n1", [_gpu(0, 10), _gpu(1, 10)])
        tracker.on_summary("n2", [_gpu(0, 10), _gpu(1, 10)])
        out: list[Alert] = []
        table: rules.RuleTable = {}
        for t in range(0, 130, 10):
            out += tracker.evaluate(float(t), {"n1", "n2"}, {"n1", "n2"}, [_pending(need)], TH, table, _why)
        assert [a.type for a in out] == (["vram_fragmentation"] if fires else []), need
        snap = tracker.snapshot
        assert snap is not None and snap["shared_vram_free_bytes"] == 40 * GIB
        # stranded: free VRAM on GPUs with less than the smallest pending need
        assert snap["shared_vram_stranded_bytes"] == (40 * GIB if need > 10 else 0)


def test_an_unschedulable_node_does_not_count_and_no_need_no_alert() -> None:
    tracker = VramTracker()
    tracker.on_summary("n1", [_gpu(0, 10), _gpu(1, 10)])
    tracker.on_summary("n2", [_gpu(0, 10), _gpu(1, 10)])
    out: list[Alert] = []
    table: rules.RuleTable = {}
    for t in range(0, 200, 10):  # only n1 takes pods: 20 GiB free there, 25 needed
        out += tracker.evaluate(float(t), {"n1", "n2"}, {"n1"}, [_pending(25)], TH, table, _why)
        out += tracker.evaluate(float(t), {"n1", "n2"}, {"n1", "n2"}, [_pending(None)], TH, table, _why)
    assert out == []


def test_replicas_per_gpu() -> None:
    from datetime import UTC, datetime

    state = NodeState(node="n", ts=datetime(2026, 1, 1, tzinfo=UTC), ready=True,
                      gpu_allocatable={"nvidia.com/gpu": 8}, gpu_count_label=2)
    assert replicas_per_gpu(state) == 4.0
    assert replicas_per_gpu(state.model_copy(update={"gpu_count_label": None})) == 1.0
