"""Kubernetes Events to :class:`K8sEvent` messages: scheduling failures, preemptions, evictions, OOMs.

Both shapes the API server serves are read: ``core/v1`` Events (``involvedObject``, ``message``,
``lastTimestamp``) and ``events.k8s.io/v1`` Events (``regarding``, ``note``, ``series``). Pure and
deterministic like :mod:`producers.watcher.translate`, whose time parsing it shares.
"""

from __future__ import annotations

from typing import Any, cast

from producers.watcher.bounds import Trim
from producers.watcher.translate import json_dict, parse_time
from schemas.messages import (
    MAX_DNS_LABEL_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_SHORT_TEXT_CHARS,
    K8sEvent,
)

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


def event_to_message(event: dict[str, Any], trim: Trim | None = None) -> K8sEvent | None:
    """A ``core/v1`` Event or an ``events.k8s.io/v1`` Event as a :class:`K8sEvent`: within the
    contract's bounds (a tenant may post an Event with a megabyte of text about its own pod: the
    text is cut and the message ``truncated``, noted in ``trim`` when given)."""
    trim = trim if trim is not None else Trim()
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
    count = count if isinstance(count, int) and not isinstance(count, bool) else 1
    return K8sEvent(
        uid=str(trim.text(uid, MAX_ID_CHARS)),
        ts=ts,
        category=cast(Any, event_category(str(reason), message)),
        reason=str(trim.text(reason)),
        message=str(trim.text(message)),
        type=str(trim.text(event.get("type") or "Normal", MAX_SHORT_TEXT_CHARS)),
        count=min(max(count, 1), 2**31 - 1),
        involved_kind=str(trim.text(involved["kind"], MAX_SHORT_TEXT_CHARS)),
        involved_uid=trim.text(involved.get("uid") or None, MAX_ID_CHARS),
        involved_namespace=trim.text(involved.get("namespace") or None, MAX_DNS_LABEL_CHARS),
        involved_name=str(trim.text(involved["name"], MAX_NAME_CHARS)),
        source=trim.text(source, MAX_SHORT_TEXT_CHARS) if source else None,
        truncated=bool(trim),
    )


def event_key(message: K8sEvent) -> str:
    """The Kafka key of an event: the involved object's uid, else ``kind/namespace/name``."""
    if message.involved_uid:
        return message.involved_uid
    return "/".join(p for p in (message.involved_kind, message.involved_namespace, message.involved_name) if p)
