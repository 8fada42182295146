"""Kueue ``Workload`` objects (``kueue.x-k8s.io/v1beta1``) -> :class:`WorkloadState`.

With Kueue, a job waits suspended, with no pods, until its queue admits it: counting pending pods
sees none of that demand. Kueue's Workload object carries it: one pod set per role, each a pod
template and a ``count``. This module turns one into the demand gpulens counts, as pure functions
of the JSON the API server serves (the same input from the real server, the simulated one and the
fleet simulator), with the observation time passed in:

- ``phase`` from the conditions: ``Finished`` wins, then ``Admitted``, then ``QuotaReserved``,
  else ``queued``; an evicted or requeued workload drops back to ``queued`` because Kueue sets
  those conditions to False; ``spec.active: false`` (deactivated) is ``inactive``, no demand;
- GPU demand per pod set: the pod template's request by the scheduler's rule (the watcher's
  ``gpu_requests``) times ``count``; only workloads asking for a GPU resource are reported;
- ``wait_s`` = admission time minus creation, once admitted (a queued workload's wait grows with
  the clock, so it is not part of the message that the change filter compares);
- ``gang_id`` by the gang recognisers of ``producers.watcher.gangs`` on the Workload's own
  labels and owners (a JobSet's workload gets the JobSet's gang, like its pods), else
  ``<namespace>/<workload name>``: a workload is admitted all or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from producers.watcher.gangs import gang_id
from producers.watcher.translate import TranslateConfig, first_value, gpu_requests, parse_time
from schemas.messages import OwnerRef, PodSetDemand, WorkloadPhase, WorkloadState

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for raw in _list(status.get("conditions")):
        cond = dict(_dict(raw))
        if cond.get("type") == kind:
            return cond
    return None


def _true_at(status: dict[str, Any], kind: str) -> datetime | None:
    """When condition ``kind`` became True (its transition time; creation order otherwise unknown)."""
    cond = _condition(status, kind)
    if cond is None or cond.get("status") != "True":
        return None
    return parse_time(cond.get("lastTransitionTime"))


def _is_true(status: dict[str, Any], kind: str) -> bool:
    cond = _condition(status, kind)
    return cond is not None and cond.get("status") == "True"


def _phase(spec: dict[str, Any], status: dict[str, Any]) -> WorkloadPhase:
    if _is_true(status, "Finished"):
        return "finished"
    if spec.get("active") is False:
        return "inactive"
    if _is_true(status, "Admitted"):
        return "admitted"
    if _is_true(status, "QuotaReserved"):
        return "quota_reserved"
    return "queued"


def _pending_reason(status: dict[str, Any]) -> str | None:
    for kind in ("QuotaReserved", "Evicted", "Requeued"):
        cond = _condition(status, kind)
        if cond is not None and cond.get("status") == "False" and cond.get("message"):
            return str(cond["message"])
    return None


def pod_sets(spec: dict[str, Any], config: TranslateConfig) -> list[PodSetDemand]:
    sets = []
    for raw in _list(spec.get("podSets")):
        pod_set = _dict(raw)
        template = dict(_dict(pod_set.get("template")))
        count = pod_set.get("count")
        sets.append(PodSetDemand(
            name=str(pod_set.get("name") or "main"),
            count=count if isinstance(count, int) and count >= 0 else 1,
            gpu_requests_per_pod=gpu_requests(template, config),
        ))
    return sets


def workload_to_state(obj: dict[str, Any], ts: datetime, config: TranslateConfig | None = None) -> WorkloadState | None:
    """The message for one Workload, or None when it asks for no GPU (or lacks identity)."""
    config = config or TranslateConfig()
    meta = _dict(obj.get("metadata"))
    spec = dict(_dict(obj.get("spec")))
    status = dict(_dict(obj.get("status")))
    uid, name, namespace = meta.get("uid"), meta.get("name"), meta.get("namespace")
    created = parse_time(meta.get("creationTimestamp"))
    if not uid or not name or not namespace or created is None:
        return None
    sets = pod_sets(spec, config)
    total: dict[str, int] = {}
    for pod_set in sets:
        for resource, amount in pod_set.gpu_requests_per_pod.items():
            total[resource] = total.get(resource, 0) + amount * pod_set.count
    total = {resource: total[resource] for resource in sorted(total) if total[resource] > 0}
    if not total:
        return None
    phase = _phase(spec, status)
    admitted_at = _true_at(status, "Admitted") if phase in ("admitted", "finished") else None
    owners = [OwnerRef(kind=str(ref.get("kind")), name=str(ref.get("name")), uid=ref.get("uid"),
                       api_version=ref.get("apiVersion"))
              for ref in (_dict(r) for r in _list(meta.get("ownerReferences"))) if ref.get("kind") and ref.get("name")]
    admission = _dict(status.get("admission"))
    priority = spec.get("priority")
    return WorkloadState(
        uid=str(uid), namespace=str(namespace), name=str(name), ts=ts, phase=phase,
        queue_name=spec.get("queueName") or _dict(meta.get("labels")).get(QUEUE_LABEL),
        cluster_queue=admission.get("clusterQueue"),
        priority_class=spec.get("priorityClassName"),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else None,
        pod_sets=sets, gpu_requests=total, gpus=sum(total.values()), owners=owners,
        team=first_value(meta, config.team_keys) or str(namespace),
        project=first_value(meta, config.project_keys) or str(namespace),
        gang_id=gang_id(meta, str(namespace), config.gang_keys) or f"{namespace}/{name}",
        pending_reason=_pending_reason(status) if phase in ("queued", "quota_reserved") else None,
        created_at=created,
        quota_reserved_at=_true_at(status, "QuotaReserved"),
        admitted_at=admitted_at,
        finished_at=_true_at(status, "Finished"),
        wait_s=max((admitted_at - created).total_seconds(), 0.0) if admitted_at is not None else None,
        deleted_at=parse_time(meta.get("deletionTimestamp")),
    )


def deleted_workload(state: WorkloadState, ts: datetime) -> WorkloadState:
    """The final message of a workload that is gone."""
    return state.model_copy(update={"deleted": True, "deleted_at": state.deleted_at or ts, "ts": ts})
