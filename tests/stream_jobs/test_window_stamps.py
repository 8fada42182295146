"""The node stage stamps each pod window with what the windows of the same start it closes with say
about the pod's other GPUs and the GPU's other pods (schemas.outputs.PodWindow: ``pod_busy_s``,
``gpu_pods``, ``gpu_busy_s``, ``gpu_allocated_s``), so that a rollup fed one insert at a time can
tell a pod's active windows and a GPU's tenants apart.

On a replayed fleet with a two-GPU pod computing on one GPU only, two pods time-slicing one GPU (one
busy, one idle) and two splitting a GPU without per-process figures, with pods arriving and leaving
inside windows: every window's stamps equal the figures of all windows of its start, pod and GPU.
"""

from __future__ import annotations

from collections import defaultdict

from schemas.outputs import PodWindow
from simulation.replay import run_in_process
from simulation.scenario import parse_scenario

SCENARIO = parse_scenario({
    "name": "window-stamps", "start": "2026-01-05T09:00:00Z", "duration": "12m",
    "nodes": [
        {"name": "gpu-a", "gpus": 4, "model": "NVIDIA H100 80GB HBM3"},
        {"name": "gpu-ts", "gpus": 2, "model": "NVIDIA L4", "memory_gib": 24, "time_slicing": 4},
        {"name": "gpu-blind", "gpus": 1, "model": "NVIDIA L4", "memory_gib": 24, "time_slicing": 2,
         "process_stats": False},
    ],
    "pods": [
        {"name": "half-busy", "namespace": "ml", "gpus": 2, "node": "gpu-a", "util": 80, "memory_gib": 30,
         "active_gpus": 1},
        {"name": "late", "namespace": "ml", "gpus": 1, "node": "gpu-a", "create": "205s", "run_for": "5m",
         "util": 50, "memory_gib": 10},
        {"name": "chat-api", "namespace": "serve", "gpus": 1, "node": "gpu-ts", "util": 60, "memory_gib": 6},
        {"name": "batch-eval", "namespace": "serve", "gpus": 1, "node": "gpu-ts", "util": 2, "memory_gib": 4,
         "create": "155s"},
        {"name": "blind-a", "namespace": "serve", "gpus": 1, "node": "gpu-blind", "util": 45, "memory_gib": 5},
        {"name": "blind-b", "namespace": "serve", "gpus": 1, "node": "gpu-blind", "util": 45, "memory_gib": 5},
    ],
})


def test_every_window_carries_its_pods_and_gpus_figures_of_the_same_start() -> None:
    windows = [o for o in run_in_process(SCENARIO).outputs if isinstance(o, PodWindow)]
    by_pod: dict[tuple[object, str], list[PodWindow]] = defaultdict(list)
    by_gpu: dict[tuple[object, str], list[PodWindow]] = defaultdict(list)
    for w in windows:
        by_pod[w.window_start, w.pod_uid].append(w)
        by_gpu[w.window_start, w.gpu_uuid].append(w)
    for w in windows:
        pod, gpu = by_pod[w.window_start, w.pod_uid], by_gpu[w.window_start, w.gpu_uuid]
        assert w.pod_busy_s == max(o.busy_s for o in pod), w
        assert w.gpu_pods == len(gpu) and w.gpu_busy_s == sum(o.busy_s for o in gpu), w
        assert w.gpu_allocated_s == max(o.allocated_s for o in gpu), w
    through_another = [w for w in windows if w.pod == "half-busy" and w.busy_s == 0 and (w.pod_busy_s or 0) > 0]
    assert through_another, "the idle GPU of half-busy: its pod was busy on the other one"
    shared = {w.pod for w in windows if (w.gpu_pods or 0) > 1}
    assert shared == {"chat-api", "batch-eval", "blind-a", "blind-b"}, shared
    assert any(w.pod == "batch-eval" and w.busy_s == 0 and (w.gpu_busy_s or 0) > 0 for w in windows), \
        "an idle tenant beside a busy one"
