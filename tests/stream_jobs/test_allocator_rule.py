"""The ``allocator_fragmentation`` rule and the allocator figures of windows and lifecycles
(:mod:`stream_jobs.allocator`), driven report by report with hand-computed expectations, and
through the node stage with a real scenario (the golden ``allocator-fragmentation``)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.messages import AllocatorDevice, GpuReading, WorkloadAllocator
from schemas.outputs import Alert, PodLifecycle, PodWindow
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from stream_jobs.allocator import AllocatorTracker, PodIdentity
from stream_jobs.config import Thresholds
from tests.conftest import REPO_ROOT

GIB = 2**30
POD = PodIdentity("p-1", "research", "train-0")
T0 = datetime(2026, 1, 5, 9, tzinfo=UTC).timestamp()


def tracker(**overrides: float) -> AllocatorTracker:
    t = AllocatorTracker("gpu-a", Thresholds.model_validate(overrides), 60.0)
    for index in (1, 0):  # seen in any order: the pod's GPUs are numbered by NVML index
        t.saw("p-1", GpuReading(uuid=f"GPU-{index}", index=index, model="H100", mem_total_bytes=80 * GIB))
    return t


def report(reserved_gib: float, allocated_gib: float, retries: int = 0, ooms: int = 0, device: int = 0,
           uuid: str | None = None) -> WorkloadAllocator:
    return WorkloadAllocator(
        pod_uid="p-1", namespace="research", pod="train-0", node="gpu-a", ts=datetime.now(UTC),
        devices=[AllocatorDevice(device=device, gpu_uuid=uuid, reserved_bytes=int(reserved_gib * GIB),
                                 allocated_bytes=int(allocated_gib * GIB), alloc_retries_total=retries,
                                 ooms_total=ooms)])


def play(t: AllocatorTracker, reports: list[tuple[float, WorkloadAllocator]]) -> list[tuple[float, Alert]]:
    out = []
    for at, message in reports:
        out += [(at, alert) for alert in t.report(T0 + at, message, POD)]
    return out


def every_10s(start: float, end: float, make: Any) -> list[tuple[float, WorkloadAllocator]]:
    return [(float(s), make(float(s))) for s in range(int(start), int(end), 10)]


def test_fires_after_five_minutes_above_the_share_with_retries_in_the_window() -> None:
    # 48 of 80 GiB reserved but unused (60 %) from 0 s; one retry every 30 s from 0 s
    transitions = play(tracker(), every_10s(0, 400, lambda s: report(60, 12, retries=int(s // 30))))
    assert [(at, a.state) for at, a in transitions] == [(300.0, "firing")]
    alert = transitions[0][1]
    assert alert.type == "allocator_fragmentation" and alert.severity == "warning"
    assert alert.subject.gpu_uuid == "GPU-0" and alert.subject.node == "gpu-a"
    assert {k: alert.details[k] for k in (
        "reserved_bytes", "allocated_bytes", "reserved_unused_bytes", "reserved_unused_pct", "gpu_mem_total_bytes",
        "alloc_retries", "alloc_ooms", "gpu_index")} == {
        "reserved_bytes": 60 * GIB, "allocated_bytes": 12 * GIB, "reserved_unused_bytes": 48 * GIB,
        "reserved_unused_pct": 60.0, "gpu_mem_total_bytes": 80 * GIB, "alloc_retries": 10, "alloc_ooms": 0,
        "gpu_index": 0}


def test_does_not_fire_without_retries_or_ooms() -> None:
    assert play(tracker(), every_10s(0, 3600, lambda s: report(60, 12))) == []


def test_does_not_fire_when_retries_come_with_little_reserved_but_unused() -> None:
    # 20 GiB unused is 25 % < 30 %
    assert play(tracker(), every_10s(0, 1200, lambda s: report(70, 50, retries=int(s)))) == []


def test_ooms_alone_fire() -> None:
    transitions = play(tracker(), every_10s(0, 400, lambda s: report(60, 12, ooms=1 if s >= 200 else 0)))
    assert [(at, a.state, a.details["alloc_ooms"]) for at, a in transitions] == [(300.0, "firing", 1)]


def test_resolves_when_reserved_but_unused_falls_below_the_share() -> None:
    reports = every_10s(0, 400, lambda s: report(60, 12, retries=int(s)))
    reports += every_10s(400, 500, lambda s: report(60, 50, retries=int(s)))  # 10 GiB unused: 12.5 %
    transitions = play(tracker(), reports)
    assert [(at, a.state) for at, a in transitions] == [(300.0, "firing"), (400.0, "resolved")]
    assert transitions[1][1].details["resolved_reason"] == "reserved but unused below 30% of the GPU"
    assert transitions[1][1].id == transitions[0][1].id


def test_resolves_when_retries_stop_for_the_window_and_fires_again_when_they_return() -> None:
    # retries until 350 s (total 35 from then), fragmented throughout
    transitions = play(tracker(), every_10s(0, 1300, lambda s: report(
        60, 12, retries=int(min(s, 350)) // 10 + (int(s) - 1000 if s >= 1000 else 0))))
    # last growth between the reports at 340 and 350 s: from t = 650 s the window's earliest report
    # (at or after t - 300 s) is the one at 350 s, so no growth is in it; the run of the condition
    # never broke, so it fires again at the next retry (1010 s), already 5 min above the share
    assert [(at, a.state) for at, a in transitions] == [(300.0, "firing"), (650.0, "resolved"), (1010.0, "firing")]
    assert transitions[1][1].details["resolved_reason"] == "no allocation retry or OOM for 5m"


def test_a_restarted_process_counts_its_retries_again() -> None:
    # totals 50 from the first report (none new), the process restarts at 200 s (totals from 0) and
    # retries once at 400 s: the drop is no retry, the window starts again at 200 s, and the one
    # retry at 400 s fires (the condition has held since 0 s)
    transitions = play(tracker(), every_10s(0, 700, lambda s: report(
        60, 12, retries=50 if s < 200 else (1 if s >= 400 else 0))))
    assert [(at, a.state, a.details["alloc_retries"]) for at, a in transitions] == [(400.0, "firing", 1)]


def test_devices_map_to_the_pods_gpus_by_uuid_else_by_index_order() -> None:
    t = tracker()
    t.report(T0, report(60, 12, retries=3, device=1), POD)  # the pod's 2nd GPU by NVML index: GPU-1
    t.report(T0, report(10, 5, device=0, uuid="GPU-1"), POD)  # by uuid: GPU-1 again (newer figures)
    t.report(T0, report(10, 5, device=2), POD)  # the pod has 2 GPUs: unmapped
    t.report(T0, report(10, 5, uuid="GPU-9"), POD)  # not one of the pod's GPUs
    t.report(T0, report(10, 5), None)  # not a pod of this node
    assert t.counters == {"allocator_reports": 5, "allocator_unmapped": 3}
    figures = t.window_figures("p-1", "GPU-1", T0 - T0 % 60)
    assert figures == {"alloc_reserved_bytes": 10 * GIB, "alloc_allocated_bytes": 5 * GIB,
                       "max_reserved_unused_bytes": 48 * GIB, "alloc_retries": 3, "alloc_ooms": 0}
    assert t.window_figures("p-1", "GPU-0", T0 - T0 % 60) == {}


def test_thresholds_are_configurable() -> None:
    reports = every_10s(0, 700, lambda s: report(60, 12, retries=int(s)))
    assert play(tracker(allocator_unused_pct=70), reports) == []
    transitions = play(tracker(allocator_fragmentation_after=120), reports)
    assert [(at, a.state) for at, a in transitions] == [(120.0, "firing")]


def test_an_ended_pod_resolves_and_its_life_is_summed() -> None:
    t = tracker()
    play(t, every_10s(0, 400, lambda s: report(60, 12, retries=int(s // 30))))
    assert t.usage("p-1") == {"max_reserved_unused_bytes": 48 * GIB, "alloc_retries": 13, "alloc_ooms": 0}
    (resolved,) = t.end_pod("p-1", T0 + 400, "pod ended")
    assert resolved.state == "resolved" and resolved.details["resolved_reason"] == "pod ended"
    assert t.usage("p-1") == {} and t.rules == {} and t.gpus == {}


def test_state_survives_a_checkpoint_mid_run() -> None:
    reports = every_10s(0, 700, lambda s: report(60, 12, retries=int(s // 30)))
    straight = play(tracker(), reports)
    first = tracker()
    half = play(first, reports[:20])
    saved = json.loads(json.dumps(first.to_dict()))
    second = AllocatorTracker.from_dict(saved, "gpu-a", Thresholds(), 60.0)
    resumed = half + play(second, reports[20:])
    assert [(at, a.id, a.state) for at, a in resumed] == [(at, a.id, a.state) for at, a in straight]


# --------------------------------------------------------------------------- through the stages


def test_windows_and_lifecycle_carry_the_allocator_figures() -> None:
    scenario = load_scenario(REPO_ROOT / "simulation" / "scenarios" / "allocator-fragmentation.yaml")
    outputs = run_in_process(scenario).outputs
    frag = [w for w in outputs if isinstance(w, PodWindow) and w.pod == "train-frag"]
    by_start = {w.window_start.strftime("%H:%M"): w for w in frag}
    assert by_start["09:04"].alloc_reserved_bytes is None  # reports start at 5m
    w = by_start["09:05"]  # reports at 300..350 s: totals 0,0,0,1,1,1
    assert (w.alloc_reserved_bytes, w.alloc_allocated_bytes, w.max_reserved_unused_bytes, w.alloc_retries,
            w.alloc_ooms) == (60 * GIB, 12 * GIB, 48 * GIB, 1, 0)
    assert by_start["09:06"].alloc_retries == 2  # totals 2..3 at 360..410 s, 1 before
    assert sum(w.alloc_retries or 0 for w in frag) == 19
    (life,) = [m for m in outputs if isinstance(m, PodLifecycle) and m.name == "train-frag"]
    assert (life.max_reserved_unused_bytes, life.alloc_retries, life.alloc_ooms) == (48 * GIB, 19, 0)


@pytest.mark.parametrize("name", ["vram-pressure", "mig", "shared-gpus"])
def test_scenarios_without_allocator_statistics_have_no_allocator_figures(name: str) -> None:
    outputs = run_in_process(load_scenario(REPO_ROOT / "simulation" / "scenarios" / f"{name}.yaml")).outputs
    assert not any(isinstance(m, WorkloadAllocator) for m in outputs)
    assert all(w.alloc_reserved_bytes is None for w in outputs if isinstance(w, PodWindow))
    assert all(m.alloc_retries is None for m in outputs if isinstance(m, PodLifecycle))
    assert not any(isinstance(m, Alert) and m.type == "allocator_fragmentation" for m in outputs)


def test_a_threshold_override_in_the_scenario_silences_the_alert() -> None:
    scenario = load_scenario(REPO_ROOT / "simulation" / "scenarios" / "allocator-fragmentation.yaml")
    quiet = replace(scenario, thresholds=scenario.thresholds.model_copy(update={"allocator_unused_pct": 61.0}))
    assert not any(a["type"] == "allocator_fragmentation" for a in run_in_process(quiet).report["alerts"])
