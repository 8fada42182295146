"""Kueue ``Workload`` objects (``kueue.x-k8s.io/v1beta2`` or ``v1beta1``) -> :class:`WorkloadState`.

With Kueue, a job waits suspended, with no pods, until its queue admits it: counting pending pods
sees none of that demand. Kueue's Workload object carries it: one pod set per role, each a pod
template and a ``count``. This module turns one into the demand gpulens counts, as pure functions
of the JSON the API server serves (the same input from the real server, the simulated one and the
fleet simulator), with the observation time passed in. Kueue serves both versions (v1beta2 is its
storage version, v1beta1 deprecated; the watcher reads the first one served, ``producers.watcher.kube``),
and every field read here has the same path in both but the priority class: v1beta2's
``spec.priorityClassRef.name``, v1beta1's ``spec.priorityClassName``.

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

from datetime import datetime

from producers.watcher.bounds import MAX_GPU_QUANTITY, Trim
from producers.watcher.gangs import gang_id
from producers.watcher.kube_json import JsonDict, first_value, json_dict, json_list, parse_time
from producers.watcher.translate import (
    TranslateConfig,
    gpu_requests,
    gpu_resources,
    owner_ref,
)
from schemas.messages import (
    MAX_DNS_LABEL_CHARS,
    MAX_DURATION_S,
    MAX_GANG_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_POD_COUNT,
    MAX_TAG_CHARS,
    OwnerRef,
    PodSetDemand,
    WorkloadPhase,
    WorkloadState,
)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _condition(status: JsonDict, kind: str) -> JsonDict | None:
    for raw in json_list(status.get("conditions")):
        cond = json_dict(raw)
        if cond.get("type") == kind:
            return cond
    return None


def _true_at(status: JsonDict, kind: str) -> datetime | None:
    """When condition ``kind`` became True (its transition time; creation order otherwise unknown)."""
    cond = _condition(status, kind)
    if cond is None or cond.get("status") != "True":
        return None
    return parse_time(cond.get("lastTransitionTime"))


def _is_true(status: JsonDict, kind: str) -> bool:
    cond = _condition(status, kind)
    return cond is not None and cond.get("status") == "True"


def _phase(spec: JsonDict, status: JsonDict) -> WorkloadPhase:
    if _is_true(status, "Finished"):
        return "finished"
    if spec.get("active") is False:
        return "inactive"
    if _is_true(status, "Admitted"):
        return "admitted"
    if _is_true(status, "QuotaReserved"):
        return "quota_reserved"
    return "queued"


def _pending_reason(status: JsonDict, trim: Trim) -> str | None:
    for kind in ("QuotaReserved", "Evicted", "Requeued"):
        cond = _condition(status, kind)
        if cond is not None and cond.get("status") == "False" and cond.get("message"):
            return trim.text(cond["message"])
    return None


def pod_sets(spec: JsonDict, config: TranslateConfig, trim: Trim | None = None) -> list[PodSetDemand]:
    trim = trim if trim is not None else Trim()
    sets = []
    for raw in trim.items(json_list(spec.get("podSets"))):
        pod_set = json_dict(raw)
        template = json_dict(pod_set.get("template"))
        count = pod_set.get("count")
        count = count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 1
        sets.append(PodSetDemand(
            name=str(trim.text(pod_set.get("name") or "main", MAX_DNS_LABEL_CHARS)),
            count=trim.quantity(count, MAX_POD_COUNT),
            gpu_requests_per_pod=gpu_requests(template, config, trim),
        ))
    return sets


def workload_to_state(obj: JsonDict, ts: datetime, config: TranslateConfig | None = None,
                      trim: Trim | None = None) -> WorkloadState | None:
    """The message for one Workload, or None when it asks for no GPU (or lacks identity). Within
    the contract's bounds, ``truncated`` when something was cut (named in ``trim`` when given)."""
    config = config or TranslateConfig()
    trim = trim if trim is not None else Trim()
    meta = json_dict(obj.get("metadata"))
    spec = json_dict(obj.get("spec"))
    status = json_dict(obj.get("status"))
    uid, name, namespace = meta.get("uid"), meta.get("name"), meta.get("namespace")
    created = parse_time(meta.get("creationTimestamp"))
    if not uid or not name or not namespace or created is None:
        return None
    sets = pod_sets(spec, config, trim)
    total = _total_gpus(sets, trim)
    if not total:
        return None
    phase = _phase(spec, status)
    admitted_at = _true_at(status, "Admitted") if phase in ("admitted", "finished") else None
    owners = _owners(meta, trim)
    admission = json_dict(status.get("admission"))
    namespace = str(trim.text(namespace, MAX_DNS_LABEL_CHARS))
    name = str(trim.text(name, MAX_NAME_CHARS))
    return WorkloadState(
        uid=str(trim.text(uid, MAX_ID_CHARS)), namespace=namespace, name=name, ts=ts, phase=phase,
        queue_name=trim.text(spec.get("queueName") or json_dict(meta.get("labels")).get(QUEUE_LABEL), MAX_NAME_CHARS),
        cluster_queue=trim.text(admission.get("clusterQueue"), MAX_NAME_CHARS),
        priority_class=trim.text(_priority_class(spec), MAX_NAME_CHARS),
        priority=trim.int32(spec.get("priority")),
        pod_sets=sets, gpu_requests=total, gpus=sum(total.values()), owners=owners,
        team=trim.text(first_value(meta, config.team_keys) or namespace, MAX_TAG_CHARS),
        project=trim.text(first_value(meta, config.project_keys) or namespace, MAX_TAG_CHARS),
        gang_id=trim.text(gang_id(meta, namespace, config.gang_keys) or f"{namespace}/{name}", MAX_GANG_CHARS),
        pending_reason=_pending_reason(status, trim) if phase in ("queued", "quota_reserved") else None,
        created_at=created,
        quota_reserved_at=_true_at(status, "QuotaReserved"),
        admitted_at=admitted_at,
        finished_at=_true_at(status, "Finished"),
        wait_s=_wait_s(created, admitted_at),
        deleted_at=parse_time(meta.get("deletionTimestamp")),
        truncated=bool(trim),
    )


def _priority_class(spec: JsonDict) -> str | None:
    """The priority class's name: v1beta2's ``priorityClassRef`` (group, kind, name: a
    WorkloadPriorityClass or a pod PriorityClass), else v1beta1's ``priorityClassName``."""
    name = json_dict(spec.get("priorityClassRef")).get("name") or spec.get("priorityClassName")
    return name if isinstance(name, str) else None


def _total_gpus(sets: list[PodSetDemand], trim: Trim) -> dict[str, int]:
    """GPUs per resource over all pod sets (per pod times count), within the contract's bounds."""
    total: dict[str, int] = {}
    for pod_set in sets:
        for resource, amount in pod_set.gpu_requests_per_pod.items():
            total[resource] = total.get(resource, 0) + amount * pod_set.count
    return gpu_resources({resource: min(amount, MAX_GPU_QUANTITY + 1) for resource, amount in total.items()}, trim)


def _owners(meta: JsonDict, trim: Trim) -> list[OwnerRef]:
    refs = (json_dict(r) for r in json_list(meta.get("ownerReferences")))
    return trim.items([owner_ref(ref, trim) for ref in refs if ref.get("kind") and ref.get("name")])


def _wait_s(created: datetime, admitted_at: datetime | None) -> float | None:
    """Seconds from creation to admission, within the contract's bound; None while not admitted."""
    if admitted_at is None:
        return None
    return min(max((admitted_at - created).total_seconds(), 0.0), MAX_DURATION_S)


def deleted_workload(state: WorkloadState, ts: datetime) -> WorkloadState:
    """The final message of a workload that is gone."""
    return state.model_copy(update={"deleted": True, "deleted_at": state.deleted_at or ts, "ts": ts})
