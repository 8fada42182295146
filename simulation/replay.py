"""``gpulens replay``: play a scenario through the pipeline and build FORMAT.md's report.

In-process by default: the simulator's records (encoded exactly as the producers would put them
on Kafka) are decoded, routed and processed by the same stages the faust workers run, with the
watermark advanced after each tick (minus the allowed lateness, so slightly late samples are
reordered like on Kafka). The report is computed only from the pipeline's *outputs* — lifecycle
records, capacity windows and alerts — never from the simulator's own bookkeeping: a pod with no
lifecycle record is reported as not seen (``"seen": false``, every figure null), named by the
scenario's pod list and uids, and ``--expect`` counts it as a difference. A report that filled the
gap from the simulator's truth would hide exactly what a test of the pipeline must catch.

The report is deterministic: the same file gives byte-identical JSON.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from schemas.messages import Message
from schemas.outputs import Alert, ClusterCapacity, DeadLetter, PodLifecycle, PodWindow
from simulation.fleet_state import Tick
from simulation.fragmentation_report import mig_report, shared_report
from simulation.scenario import Scenario
from simulation.simulator import FleetSimulator
from stream_jobs.alerts import TYPE_ORDER
from stream_jobs.config import WORKER_GC_THRESHOLDS, EngineConfig
from stream_jobs.pipeline import LocalPipeline
from stream_jobs.timeutil import epoch

DEFAULT_LATENESS_S = 30.0


def engine_config(scenario: Scenario, accept_clusters: frozenset[str] | None = None) -> EngineConfig:
    """``accept_clusters``: the workers' ``GPULENS_ACCEPT_CLUSTERS`` (None: every cluster)."""
    return EngineConfig(window_s=scenario.window_s, sample_interval_s=scenario.sample_interval_s,
                        prices_usd_per_gpu_hour=dict(scenario.prices), thresholds=scenario.thresholds,
                        accept_clusters=accept_clusters)


@dataclass
class ReplayResult:
    report: dict[str, Any]
    outputs: list[Message]
    deadletters: list[DeadLetter]


def run_in_process(scenario: Scenario, lateness_s: float = DEFAULT_LATENESS_S,
                   ticks: Iterable[Tick] | None = None, accept_clusters: frozenset[str] | None = None) -> ReplayResult:
    """``ticks``: what to feed instead of the simulator's own ticks (tests add hostile records);
    ``accept_clusters``: as the workers' ``GPULENS_ACCEPT_CLUSTERS``."""
    simulator = FleetSimulator(scenario)
    pipeline = LocalPipeline(engine_config(scenario, accept_clusters))
    with worker_gc():
        for tick in simulator.run() if ticks is None else ticks:
            feed_tick(pipeline, tick)
            pipeline.advance(epoch(tick.ts) - lateness_s)
        end = scenario.start + timedelta(seconds=scenario.end_offset_s)
        pipeline.flush(epoch(end))
        report = build_report(scenario, pipeline.outputs, simulator.pod_uids(), pipeline.stats())
    return ReplayResult(report, pipeline.outputs, pipeline.deadletters)


@contextmanager
def worker_gc() -> Iterator[None]:
    """The cyclic garbage collector's thresholds of a worker (``WORKER_GC_THRESHOLDS``) for the
    block, the caller's after it. A replay keeps every output it makes, and under Python's default
    thresholds each full collection scans them all again: a fifth of an hour-long fleet replay's CPU."""
    previous = gc.get_threshold()
    gc.set_threshold(*WORKER_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)


def feed_tick(pipeline: LocalPipeline, tick: Tick) -> None:
    for record in tick.records:
        pipeline.feed(record.topic, record.value, at=tick.ts, key=record.key)


# --------------------------------------------------------------------------- the report


def _num(value: float | None, digits: int = 4) -> float | int | None:
    if value is None:
        return None
    rounded = round(float(value), digits)
    if rounded == int(rounded) and abs(rounded) < 2**53:
        return int(rounded) if digits == 0 else float(int(rounded))
    return rounded


def _seconds(value: float) -> float | int:
    rounded = round(value, 3)
    return int(rounded) if rounded == int(rounded) else rounded


def alert_row(alert: Alert) -> dict[str, Any]:
    data = alert.model_dump(mode="json")
    return {
        "id": data["id"], "type": data["type"], "state": data["state"], "at": data["at"],
        "severity": data["severity"], "subject": data["subject"], "summary": data["summary"],
        "details": data["details"],
    }


def _alert_key(alert: Alert) -> tuple[Any, ...]:
    s = alert.subject
    return (epoch(alert.at), alert.type, TYPE_ORDER.index(alert.type), s.kind, s.namespace or "", s.name or "",
            s.node or "", s.gpu_uuid or "", 0 if alert.state == "firing" else 1, alert.id)


POD_FIGURES = ("team", "project", "gpus", "node", "pending_s", "running_s", "gpu_hours", "idle_gpu_hours",
               "avg_sm_util_pct", "peak_mem_bytes", "cost_usd", "end_reason", "steps", "cost_per_step_usd")
ALLOCATOR_FIGURES = ("max_reserved_unused_bytes", "alloc_retries", "alloc_ooms")
"""Pod figures of the caching allocator: in the report only where the scenario has ``allocator:`` pods,
so the reports of other scenarios keep their shape."""


def build_report(scenario: Scenario, outputs: Iterable[Message], pod_uids: dict[int, str],
                 stats: dict[str, Any]) -> dict[str, Any]:
    """The report from the pipeline's outputs only; ``pod_uids`` (scenario pod index -> uid) names
    the rows, nothing else."""
    outputs = list(outputs)
    windows = [m for m in outputs if isinstance(m, ClusterCapacity)]
    pod_windows = sum(1 for m in outputs if isinstance(m, PodWindow))
    return {
        "scenario": scenario.name,
        "alerts": [alert_row(a) for a in _transitions(outputs)],
        "pods": _pod_rows(scenario, outputs, pod_uids),
        "cluster": _cluster_figures(scenario, windows),
        "stream": dict(stats) | {"pod_windows": pod_windows, "capacity_windows": len(windows)},
    }


def _transitions(outputs: list[Message]) -> list[Alert]:
    """Alert transitions in report order; at-least-once transport: the same transition twice is one."""
    seen: set[tuple[str, str]] = set()
    unique = []
    for alert in sorted((m for m in outputs if isinstance(m, Alert)), key=_alert_key):
        if (alert.id, alert.state) not in seen:
            seen.add((alert.id, alert.state))
            unique.append(alert)
    return unique


def _pod_rows(scenario: Scenario, outputs: list[Message], pod_uids: dict[int, str]) -> list[dict[str, Any]]:
    """One row per scenario pod, in the file's order; a pod the pipeline never saw has no figures."""
    lifecycle = {m.pod_uid: m for m in outputs if isinstance(m, PodLifecycle)}
    allocator = any(spec.allocator is not None for spec in scenario.pods)
    figures = POD_FIGURES + (ALLOCATOR_FIGURES if allocator else ())
    rows: list[dict[str, Any]] = []
    for index, spec in enumerate(scenario.pods):
        record = lifecycle.get(pod_uids[index])
        if record is None:
            rows.append({"namespace": spec.namespace, "name": spec.name, "seen": False} | dict.fromkeys(figures))
        else:
            rows.append(_pod_row(record, allocator))
    return rows


def _pod_row(record: PodLifecycle, allocator: bool) -> dict[str, Any]:
    return {
        "namespace": record.namespace, "name": record.name, "seen": True, "team": record.team,
        "project": record.project, "gpus": record.gpus, "node": record.node,
        "pending_s": _seconds(record.pending_s), "running_s": _seconds(record.running_s),
        "gpu_hours": _num(record.gpu_hours), "idle_gpu_hours": _num(record.idle_gpu_hours),
        "avg_sm_util_pct": _num(record.avg_sm_util_pct), "peak_mem_bytes": record.peak_mem_bytes,
        "cost_usd": _num(record.cost_usd), "end_reason": record.end_reason,
        "steps": _num(record.steps), "cost_per_step_usd": _num(record.cost_per_step_usd, 8),
    } | ({name: getattr(record, name) for name in ALLOCATOR_FIGURES} if allocator else {})


def _cluster_figures(scenario: Scenario, windows: list[ClusterCapacity]) -> dict[str, Any]:
    total = sum(w.gpu_s_total or 0.0 for w in windows)
    allocated = sum(w.gpu_s_allocated or 0.0 for w in windows)
    idle = sum(w.gpu_s_idle_allocated or 0.0 for w in windows)
    cluster: dict[str, Any] = {
        "gpu_hours_capacity": _num(total / 3600.0),
        "gpu_hours_allocated": _num(allocated / 3600.0),
        "gpu_hours_idle_allocated": _num(idle / 3600.0),
        "gpu_hours_unallocated": _num(max(total - allocated, 0.0) / 3600.0),
        "max_stranded_gpus": max((w.stranded_gpus_max or 0 for w in windows), default=0),
    }
    if scenario.workloads:  # queued demand: only where the file has Kueue workloads, so other reports keep their shape
        cluster |= {
            "max_pending_gpu_demand": max((w.pending_gpu_demand for w in windows), default=0),
            "max_queued_gpu_demand": max((w.queued_gpu_demand or 0 for w in windows), default=0),
            "max_queued_workloads": max((w.queued_workloads or 0 for w in windows), default=0),
        }
    cluster |= mig_report(windows, scenario.thresholds.mig_unused_after)  # empty without MIG GPUs
    cluster |= shared_report(windows)  # empty without shared GPUs
    return cluster


# --------------------------------------------------------------------------- expected results


def _close(actual: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or not isinstance(expected, int | float):
        return bool(actual == expected)
    if actual is None or isinstance(actual, bool) or not isinstance(actual, int | float):
        return False
    return abs(float(actual) - float(expected)) <= 1e-4 + 1e-9 * abs(float(expected))


def compare_report(report: dict[str, Any], expected: dict[str, Any], sample_interval_s: float) -> list[str]:
    """Differences between a report and an expected file (FORMAT.md's tolerances).

    Only fields present in ``expected`` are compared; numbers match to 4 decimals; an alert
    matches one of the same type, state and subject fields within two sample intervals. The
    expected ``alerts`` list is the complete list: an alert transition it does not name is a
    difference too (so "no alert for X" is checked).
    """
    problems = _alert_problems(report.get("alerts", []), expected, 2 * sample_interval_s)
    problems += _pod_problems(report.get("pods", []), expected.get("pods", []))
    for section in ("stream", "cluster"):
        for field, value in expected.get(section, {}).items():
            got_value = report.get(section, {}).get(field)
            if not _close(got_value, value):
                problems.append(f"{section}.{field}: expected {value!r}, got {got_value!r}")
    return problems


def _alert_matches(got: dict[str, Any], want: dict[str, Any], tolerance: float) -> bool:
    if any(got.get(k) != want[k] for k in ("type", "state", "severity", "id") if k in want):
        return False
    if any(got["subject"].get(k) != v for k, v in want.get("subject", {}).items()):
        return False
    if "at" in want and abs(epoch(_parse(got["at"])) - epoch(_parse(want["at"]))) > tolerance + 1e-6:
        return False
    return "details" not in want or all(got["details"].get(k) == v for k, v in want["details"].items())


def _alert_problems(alerts: list[dict[str, Any]], expected: dict[str, Any], tolerance: float) -> list[str]:
    problems: list[str] = []
    unused = list(alerts)
    for i, want in enumerate(expected.get("alerts", [])):
        match = next((got for got in unused if _alert_matches(got, want, tolerance)), None)
        if match is None:
            problems.append(f"alerts[{i}]: no {want.get('state', '')} {want.get('type')} alert for "
                            f"{want.get('subject')} at {want.get('at')} (+-{tolerance:g}s)")
        else:
            unused.remove(match)
    if "alerts" in expected:
        for got in unused:
            problems.append(f"unexpected alert: {got['state']} {got['type']} {got['subject']} at {got['at']}")
    return problems


def _pod_problems(pods: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    rows = {(p["namespace"], p["name"]): p for p in pods}
    for want in expected:
        key = (want.get("namespace", "default"), want["name"])
        got = rows.get(key)
        if got is None:
            problems.append(f"pods: no row for {key[0]}/{key[1]}")
        elif not got.get("seen", True) and want.get("seen", True):
            problems.append(f"pods {key[0]}/{key[1]}: not seen by the pipeline (no lifecycle record)")
        else:
            problems += [f"pods {key[0]}/{key[1]}.{field}: expected {value!r}, got {got.get(field)!r}"
                         for field, value in want.items() if not _close(got.get(field), value)]
    return problems


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
