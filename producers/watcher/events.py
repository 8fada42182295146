"""Kubernetes Events to :class:`K8sEvent` messages: scheduling failures, preemptions, evictions, OOMs.

Both shapes the API server serves are read: ``core/v1`` Events (``involvedObject``, ``message``,
``lastTimestamp``) and ``events.k8s.io/v1`` Events (``regarding``, ``note``, ``series``). Pure and
deterministic like :mod:`producers.watcher.translate`, reading the JSON with the same
:mod:`producers.watcher.kube_json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from producers.watcher.bounds import Trim
from producers.watcher.kube_json import JsonDict, json_dict, parse_time
from schemas.messages import (
    MAX_DNS_LABEL_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_SHORT_TEXT_CHARS,
    EventCategory,
    K8sEvent,
)

_PREEMPTED = {"Preempted", "Preempting", "PreemptionByScheduler", "PreemptionByKubeScheduler"}
_EVICTED = {"Evicted", "Evicting", "TaintManagerEviction", "EvictionThresholdMet", "Killing-Evicted"}
_OOM = {"OOMKilling", "SystemOOM", "OOMKilled"}


def event_category(reason: str, message: str) -> EventCategory:
    if reason == "FailedScheduling":
        return "scheduling_failed"
    if reason == "Scheduled":
        return "scheduled"
    if reason in _PREEMPTED or (reason == "Killing" and "preempt" in message.lower()):
        return "preempted"
    if reason in _EVICTED:
        return "evicted"
    if reason in _OOM or "oom" in reason.lower():
        return "oom_killed"
    return "other"


def event_to_message(event: JsonDict, trim: Trim | None = None) -> K8sEvent | None:
    """A ``core/v1`` Event or an ``events.k8s.io/v1`` Event as a :class:`K8sEvent`: within the
    contract's bounds (a tenant may post an Event with a megabyte of text about its own pod: the
    text is cut and the message ``truncated``, noted in ``trim`` when given)."""
    trim = trim if trim is not None else Trim()
    meta = json_dict(event.get("metadata"))
    shape = _Shape.of(event)
    involved = json_dict(shape.get("regarding", "involvedObject"))
    reason = event.get("reason")
    uid = meta.get("uid")
    if not involved.get("name") or not involved.get("kind") or not reason or not uid:
        return None
    series = json_dict(event.get("series"))
    message = str(shape.get("note", "message") or "")
    ts = _event_time(shape, series, meta)
    if ts is None:
        return None
    source = _source(shape)
    return K8sEvent(
        uid=str(trim.text(uid, MAX_ID_CHARS)),
        ts=ts,
        category=event_category(str(reason), message),
        reason=str(trim.text(reason)),
        message=str(trim.text(message)),
        type=str(trim.text(event.get("type") or "Normal", MAX_SHORT_TEXT_CHARS)),
        count=_count(shape, series),
        involved_kind=str(trim.text(involved["kind"], MAX_SHORT_TEXT_CHARS)),
        involved_uid=trim.text(involved.get("uid") or None, MAX_ID_CHARS),
        involved_namespace=trim.text(involved.get("namespace") or None, MAX_DNS_LABEL_CHARS),
        involved_name=str(trim.text(involved["name"], MAX_NAME_CHARS)),
        source=trim.text(source, MAX_SHORT_TEXT_CHARS) if source else None,
        truncated=bool(trim),
    )


@dataclass(frozen=True)
class _Shape:
    """One Event in either shape; :meth:`get` reads a field by the name its shape gives it."""

    event: JsonDict
    events_v1: bool
    """``events.k8s.io/v1`` (else ``core/v1``)."""

    @classmethod
    def of(cls, event: JsonDict) -> _Shape:
        return cls(event, "regarding" in event or str(event.get("apiVersion", "")).startswith("events.k8s.io/"))

    def get(self, events_v1_name: str, core_name: str) -> Any:
        return self.event.get(events_v1_name if self.events_v1 else core_name)


def _event_time(shape: _Shape, series: JsonDict, meta: JsonDict) -> datetime | None:
    """The newest time the event carries (its series' last observation, last, event, first,
    creation time), None when it carries none."""
    times = [
        parse_time(series.get("lastObservedTime")),
        parse_time(shape.get("deprecatedLastTimestamp", "lastTimestamp")),
        parse_time(shape.event.get("eventTime")),
        parse_time(shape.get("deprecatedFirstTimestamp", "firstTimestamp")),
        parse_time(meta.get("creationTimestamp")),
    ]
    return max((t for t in times if t is not None), default=None)


def _count(shape: _Shape, series: JsonDict) -> int:
    """How many times it happened: the series' count, else the event's; 1 when neither is an integer."""
    count = series.get("count") or shape.get("deprecatedCount", "count") or 1
    count = count if isinstance(count, int) and not isinstance(count, bool) else 1
    return min(max(count, 1), 2**31 - 1)


def _source(shape: _Shape) -> object:
    """The component that reported it: the reporting controller, else the legacy source's component."""
    source = shape.get("reportingController", "reportingComponent") or None
    if not source:
        source = json_dict(shape.get("deprecatedSource", "source")).get("component") or None
    return source


def event_key(message: K8sEvent) -> str:
    """The Kafka key of an event: the involved object's uid, else ``kind/namespace/name``."""
    if message.involved_uid:
        return message.involved_uid
    return "/".join(p for p in (message.involved_kind, message.involved_namespace, message.involved_name) if p)
