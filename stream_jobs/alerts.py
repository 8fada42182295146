"""Alert kinds, open alerts, and their transitions with deterministic ids.

An alert's id is a hash of its type, its subject and the moment it fired, so a redelivered input
that fires it again produces the same id (the sink and consumers dedupe on it), and the resolved
transition carries the id of the firing one. An open alert is an :class:`OpenAlert` in stage state
(its JSON form: :meth:`OpenAlert.to_dict`). Each alert type is one :class:`AlertKind`, declared with
its rule in :mod:`stream_jobs.rules` (``CATALOGUE``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from schemas.outputs import KNOWN_ALERT_TYPES, Alert, AlertSubject, AlertType, Severity, SubjectKind
from stream_jobs.json_types import JsonDict, JsonObject, JsonValue, as_float, as_object, as_str
from stream_jobs.timeutil import from_epoch, iso, stable_id

Details = JsonDict
"""An alert's ``details``: JSON values by name (``schemas.outputs.Alert.details``)."""

DOCS = "docs/alerts.md"
"""The alert catalogue: one section per alert type, titled with its name."""

TYPE_ORDER: tuple[str, ...] = KNOWN_ALERT_TYPES
"""The order of alert types when several transitions share a timestamp (report order)."""


@dataclass(frozen=True)
class AlertKind:
    """What every alert of one type shares: its name on the wire (one of ``schemas.outputs.AlertType``)
    and its severity. Declared once per type, with its rule, in :mod:`stream_jobs.rules`."""

    name: AlertType
    severity: Severity

    @property
    def docs_anchor(self) -> str:
        """Its section of the alert catalogue (what it means, its details, what to do)."""
        return f"{DOCS}#{self.name}"


@dataclass(frozen=True)
class IdleCost:
    """What an idle node costs, kept with its open ``idle_node`` alert for the resolution's figure."""

    since_ts: float
    usd_per_hour: float


@dataclass(frozen=True)
class OpenAlert:
    """A firing alert as a stage keeps it until it resolves."""

    id: str
    type: str
    severity: Severity
    subject: AlertSubject
    started_at: float
    """Epoch seconds of the firing transition."""
    summary: str
    details: Details = field(default_factory=dict)
    cost: IdleCost | None = None
    """``idle_node`` only: when the node went idle and what it costs an hour."""

    def to_dict(self) -> JsonDict:
        data: JsonDict = {"id": self.id, "type": self.type, "severity": self.severity,
                          "subject": self.subject.model_dump(), "started_at": self.started_at,
                          "summary": self.summary, "details": self.details}
        if self.cost is not None:
            data |= {"idle_since_ts": self.cost.since_ts, "usd_per_hour": self.cost.usd_per_hour}
        return data

    @classmethod
    def from_dict(cls, data: JsonObject) -> OpenAlert:
        cost = (IdleCost(as_float(data["idle_since_ts"]), as_float(data["usd_per_hour"])) if "usd_per_hour" in data
                else None)
        return cls(id=as_str(data["id"]), type=as_str(data["type"]), severity=_severity(data["severity"]),
                   subject=AlertSubject.model_validate(data["subject"]), started_at=as_float(data["started_at"]),
                   summary=as_str(data["summary"]), details=dict(as_object(data["details"])), cost=cost)


_SEVERITIES: tuple[Severity, ...] = get_args(Severity)


def _severity(value: JsonValue) -> Severity:
    for severity in _SEVERITIES:
        if value == severity:
            return severity
    raise ValueError(f"state document: {value!r} is not a severity (one of {', '.join(_SEVERITIES)})")


def subject(kind: SubjectKind, namespace: str | None = None, name: str | None = None, node: str | None = None,
            gpu_uuid: str | None = None) -> AlertSubject:
    return AlertSubject(kind=kind, namespace=namespace, name=name, node=node, gpu_uuid=gpu_uuid)


def alert_id(alert_type: str, subj: AlertSubject, started_at: float) -> str:
    return stable_id(alert_type, subj.kind, subj.namespace, subj.name, subj.node, subj.gpu_uuid, iso(started_at))


def _message(record: OpenAlert, state: Literal["firing", "resolved"], at: float, summary: str,
             details: Details) -> Alert:
    return Alert(id=record.id, type=record.type, severity=record.severity, state=state, at=from_epoch(at),
                 started_at=from_epoch(record.started_at), subject=record.subject, summary=summary, details=details)


def fire(kind: AlertKind, subj: AlertSubject, at: float, summary: str, details: Details,
         cost: IdleCost | None = None) -> tuple[OpenAlert, Alert]:
    """Open an alert: returns the record to keep in state and the firing transition."""
    record = OpenAlert(id=alert_id(kind.name, subj, at), type=kind.name, severity=kind.severity, subject=subj,
                       started_at=at, summary=summary, details=details, cost=cost)
    return record, _message(record, "firing", at, summary, details)


def resolve(record: OpenAlert, at: float, reason: str, **extra: float | str | None) -> Alert:
    """The resolved transition of an open alert (same id)."""
    details = dict(record.details) | {"resolved_reason": reason} | extra
    return _message(record, "resolved", at, f"resolved ({reason}): {record.summary}", details)
