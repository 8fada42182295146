"""Kubernetes Events to :class:`K8sEvent` messages: scheduling failures, preemptions, evictions, OOMs.

Both shapes the API server serves are read: ``core/v1`` Events (``involvedObject``, ``message``,
``lastTimestamp``) and ``events.k8s.io/v1`` Events (``regarding``, ``note``, ``series``). Pure and
deterministic like :mod:`producers.watcher.translate`, whose time parsing it shares.
"""

from __future__ import annotations

from typing import Any, cast

from producers.watcher.translate import json_dict, parse_time
from schemas.messages import K8sEvent

_PREEMPTED = {"Preempted", "Preempting", "PreemptionByScheduler", "PreemptionByKubeScheduler"}
_EVICTED = {"Evicted", "Evicting", "TaintManagerEviction", "EvictionThresholdMet", "Killing-Evicted"}
_OOM = {"OOMKilling", "SystemOOM", "OOMKilled"}


def event_category(reason: str, message: str) -> str:
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


def event_to_message(event: dict[str, Any]) -> K8sEvent | None:
    """A ``core/v1`` Event or an ``events.k8s.io/v1`` Event as a :class:`K8sEvent`."""
    meta = json_dict(event.get("metadata"))
    new_shape = "regarding" in event or str(event.get("apiVersion", "")).startswith("events.k8s.io/")
    involved = json_dict(event.get("regarding") if new_shape else event.get("involvedObject"))
    reason = event.get("reason")
    uid = meta.get("uid")
    if not involved.get("name") or not involved.get("kind") or not reason or not uid:
        return None
    series = json_dict(event.get("series"))
    message = str((event.get("note") if new_shape else event.get("message")) or "")
    times = [
        parse_time(series.get("lastObservedTime")),
        parse_time(event.get("deprecatedLastTimestamp") if new_shape else event.get("lastTimestamp")),
        parse_time(event.get("eventTime")),
        parse_time(event.get("deprecatedFirstTimestamp") if new_shape else event.get("firstTimestamp")),
        parse_time(meta.get("creationTimestamp")),
    ]
    ts = max((t for t in times if t is not None), default=None)
    if ts is None:
        return None
    count = series.get("count") or (event.get("deprecatedCount") if new_shape else event.get("count")) or 1
    source = (event.get("reportingController") if new_shape else event.get("reportingComponent")) or None
    if not source:
        legacy = json_dict(event.get("deprecatedSource") if new_shape else event.get("source"))
        source = legacy.get("component") or None
    return K8sEvent(
        uid=str(uid),
        ts=ts,
        category=cast(Any, event_category(str(reason), message)),
        reason=str(reason),
        message=message,
        type=str(event.get("type") or "Normal"),
        count=max(int(count), 1),
        involved_kind=str(involved["kind"]),
        involved_uid=involved.get("uid") or None,
        involved_namespace=involved.get("namespace") or None,
        involved_name=str(involved["name"]),
        source=str(source) if source else None,
    )


def event_key(message: K8sEvent) -> str:
    """The Kafka key of an event: the involved object's uid, else ``kind/namespace/name``."""
    if message.involved_uid:
        return message.involved_uid
    return "/".join(p for p in (message.involved_kind, message.involved_namespace, message.involved_name) if p)
