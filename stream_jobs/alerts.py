"""Alert transitions with deterministic ids.

An alert's id is a hash of its type, its subject and the moment it fired, so a redelivered input
that fires it again produces the same id (the sink and consumers dedupe on it), and the resolved
transition carries the id of the firing one. Open alerts are kept as plain dicts in stage state.
"""

from __future__ import annotations

from typing import Any

from schemas.outputs import Alert, AlertSubject
from stream_jobs.timeutil import from_epoch, iso, stable_id

SEVERITY: dict[str, str] = {
    "idle_gpu": "warning",
    "vram_pressure": "warning",
    "gpu_health": "critical",
    "pending_gpu": "warning",
    "fragmentation": "warning",
    "gang_partial": "warning",
    "crashloop_gpu": "critical",
    "idle_node": "info",
    "allocator_fragmentation": "warning",
    "mig_fragmentation": "warning",
    "vram_fragmentation": "warning",
    "noisy_neighbour": "warning",
}

# the order of alert types when several transitions share a timestamp (report order)
TYPE_ORDER = tuple(SEVERITY)


def subject(
    kind: str, namespace: str | None = None, name: str | None = None, node: str | None = None,
    gpu_uuid: str | None = None,
) -> dict[str, Any]:
    return {"kind": kind, "namespace": namespace, "name": name, "node": node, "gpu_uuid": gpu_uuid}


def alert_id(alert_type: str, subj: dict[str, Any], started_at: float) -> str:
    return stable_id(alert_type, subj["kind"], subj["namespace"], subj["name"], subj["node"], subj["gpu_uuid"],
                     iso(started_at))


def _message(record: dict[str, Any], state: str, at: float, summary: str, details: dict[str, Any]) -> Alert:
    return Alert(
        id=record["id"],
        type=record["type"],
        severity=record["severity"],
        state=state,  # type: ignore[arg-type]
        at=from_epoch(at),
        started_at=from_epoch(record["started_at"]),
        subject=AlertSubject(**record["subject"]),
        summary=summary,
        details=details,
    )


def fire(alert_type: str, subj: dict[str, Any], at: float, summary: str,
         details: dict[str, Any]) -> tuple[dict[str, Any], Alert]:
    """Open an alert: returns the record to keep in state and the firing transition."""
    record = {
        "id": alert_id(alert_type, subj, at),
        "type": alert_type,
        "severity": SEVERITY[alert_type],
        "subject": subj,
        "started_at": at,
        "summary": summary,
        "details": details,
    }
    return record, _message(record, "firing", at, summary, details)


def resolve(record: dict[str, Any], at: float, reason: str, **extra: Any) -> Alert:
    """The resolved transition of an open alert (same id)."""
    details = dict(record["details"]) | {"resolved_reason": reason} | extra
    return _message(record, "resolved", at, f"resolved ({reason}): {record['summary']}", details)
