"""The demo fleet tells every story it promises (checked through the in-process pipeline), and the
live view folds the pipeline's outputs into the figures an operator reads."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from gpulens.top import FleetView, render
from schemas.messages import K8sEvent, PodState
from schemas.outputs import Alert, AlertSubject, ClusterCapacity, PodWindow
from simulation.demo_fleet import demo_scenario
from simulation.replay import run_in_process
from simulation.scenario import parse_scenario

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def demo_report() -> dict:  # type: ignore[type-arg]
    return run_in_process(parse_scenario(demo_scenario(duration_m=20), source="demo")).report


def test_demo_fleet_is_deterministic_for_a_seed() -> None:
    assert demo_scenario(seed=3) == demo_scenario(seed=3)
    assert demo_scenario(seed=3) != demo_scenario(seed=4)
    with pytest.raises(ValueError, match="at least 4 nodes"):
        demo_scenario(nodes=3)


def test_demo_fleet_shows_every_story_within_ten_simulated_minutes(demo_report: dict) -> None:  # type: ignore[type-arg]
    first_firing: dict[str, str] = {}
    for alert in demo_report["alerts"]:
        if alert["state"] == "firing":
            first_firing.setdefault(alert["type"], alert["at"])
    for kind in ("idle_gpu", "vram_pressure", "pending_gpu", "fragmentation", "gang_partial", "crashloop_gpu"):
        assert kind in first_firing, f"the demo fleet never raises {kind}"
        assert first_firing[kind] <= "2026-01-05T09:10:00Z", f"{kind} first fires at {first_firing[kind]}"
    idle_classes = {a["details"].get("idle_class") for a in demo_report["alerts"] if a["type"] == "idle_gpu"}
    assert idle_classes == {"vram_held", "no_process"}
    ends = Counter(p["end_reason"] for p in demo_report["pods"])
    assert ends["Evicted"] == 1 and ends["Succeeded"] == 1 and ends["Pending"] >= 1
    assert demo_report["cluster"]["max_stranded_gpus"] > 0


def _window(pod: str, team: str, busy_s: float, minute: int = 0) -> PodWindow:
    start = T0 + timedelta(minutes=minute)
    return PodWindow(window_id=f"{pod}-{minute}", pod_uid=f"uid-{pod}", namespace="ns", pod=pod, node="gpu-a",
                     gpu_uuid=f"GPU-{pod}", gpu_model="H100", window_start=start,
                     window_end=start + timedelta(minutes=1),
                     team=team, allocated_s=60, busy_s=busy_s, idle_s=60 - busy_s, samples=6,
                     avg_sm_util_pct=90 if busy_s else 1)


def _pod(name: str, phase: str = "Running", node: str | None = "gpu-a") -> PodState:
    return PodState(uid=f"uid-{name}", namespace="ns", name=name, ts=T0, node=node, phase=phase,  # type: ignore[arg-type]
                    gpu_requests={"nvidia.com/gpu": 1}, created_at=T0)


def test_fleet_view_folds_outputs_into_operator_figures() -> None:
    view = FleetView()
    view.apply(ClusterCapacity(window_id="c1", window_start=T0, window_end=T0 + timedelta(minutes=1), gpus_total=16,
                               gpus_allocated=10, gpus_busy=7, gpus_idle_allocated=3, gpus_free=6, stranded_gpus=4,
                               pending_pods=1, pending_gpu_demand=8))
    for pod in ("train", "notebook", "waiting"):
        waiting = pod == "waiting"
        view.apply(_pod(pod, node=None if waiting else "gpu-a", phase="Pending" if waiting else "Running"))
    for minute in range(3):
        view.apply(_window("train", "nlp", 60, minute))
        view.apply(_window("notebook", "vision", 0, minute))
    view.apply(K8sEvent(uid="e1", ts=T0, category="scheduling_failed", reason="FailedScheduling",
                        message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", involved_kind="Pod",
                        involved_uid="uid-waiting", involved_name="waiting"))
    subject = AlertSubject(kind="pod", namespace="ns", name="notebook")
    fired = Alert(id="a1", type="idle_gpu", severity="warning", state="firing", at=T0, started_at=T0,
                  subject=subject, summary="notebook idle")
    view.apply(fired)

    assert view.gpus_by_state() == {"busy": 7, "idle allocated": 3, "unallocated": 2, "stranded": 4}
    assert view.usage_by_team() == [("nlp", 1, 1.0), ("vision", 1, 0.0)]
    assert [u.pod for u in view.idlest_pods()] == ["notebook", "train"]
    assert [(p.name, reason) for p, reason in view.pending_pods()] == [
        ("waiting", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")]
    assert [a.id for a in view.active_alerts()] == ["a1"]

    console = Console(record=True, width=140)
    console.print(render(view))
    screen = console.export_text()
    for text in ("GPUs by state", "stranded", "nlp", "ns/notebook", "Insufficient nvidia.com/gpu", "notebook idle"):
        assert text in screen

    view.apply(fired.model_copy(update={"state": "resolved"}))
    view.apply(None, key="uid-notebook")
    assert view.active_alerts() == [] and "uid-notebook" not in view.pods
    assert view.alert_transitions == 2
