"""Pure translation from Kubernetes API JSON to gpulens messages.

Input is the JSON the API server serves (camelCase dicts, as a raw watch event's ``object`` or
``ApiClient.sanitize_for_serialization`` gives), so the same functions serve the live watcher, the
simulated API server and the fleet simulator, with no client library involved. Everything here is
deterministic: the observation time ``ts`` is passed in, never read from a clock.

Choices worth knowing:
- GPU requests per resource name follow the scheduler's rule: ``max(sum(app containers +
  restartable init containers), max(init containers))``; extended resources usually appear only
  as limits, and limits stand for requests when requests are absent.
- The owner chain is inferred from the pod alone (no extra API calls): a ReplicaSet owner whose
  name ends in the pod's ``pod-template-hash`` implies its Deployment; a Job named
  ``<cronjob>-<minutes>`` implies its CronJob; JobSet and Kubeflow job labels add their owner.
- Container ids drop the runtime prefix (``containerd://``) so they match what the node agent
  reads from cgroups.
- ``gang_id`` is ``<namespace>/<group name>``: gang names are namespace-scoped; the configured
  keys first, then the recognisers of ``producers.watcher.gangs`` (label sets, owner kinds).
- GPUs allocated through Dynamic Resource Allocation come from a :class:`~producers.watcher.dra.DraIndex`
  when one is given (``dra=``): a node's DRA GPU devices add to its capacity under the extended
  resource they count as and are listed in ``dra_devices``; a pod's claims add to its requests
  (docs/dra.md). Without one, nothing of DRA is read.
- Everything published is cut to the contract's bounds (``producers.watcher.bounds``): labels to
  a budget (the keys gpulens reads first), text to its field's length, lists to their item cap,
  GPU quantities clamped (``100E`` GPUs becomes ``MAX_GPU_COUNT``); such a message has
  ``truncated`` set, and the optional ``trim`` argument says what was cut. Never dropped.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, cast

from producers.watcher.bounds import MAX_GPU_QUANTITY, Trim
from producers.watcher.dra import DraIndex
from producers.watcher.gangs import RECOGNISERS, LabelGang, gang_id
from producers.watcher.kube_json import JsonDict, first_value, json_dict, json_list, parse_quantity, parse_time
from producers.watcher.vram import vram_request_bytes
from schemas.messages import (
    MAX_DNS_LABEL_CHARS,
    MAX_GANG_CHARS,
    MAX_GPU_MEMORY_BYTES,
    MAX_ID_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_NAME_CHARS,
    MAX_PROGRESS_TOTAL,
    MAX_QUALIFIED_NAME_CHARS,
    MAX_RESOURCES,
    MAX_SHORT_TEXT_CHARS,
    MAX_TAG_CHARS,
    ContainerState,
    DraDevice,
    Message,
    NodeState,
    OwnerRef,
    PodCondition,
    PodPhase,
    PodState,
    Taint,
    WorkloadProgress,
)

NVIDIA_GPU = "nvidia.com/gpu"
_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
ContainerStateKind = Literal["waiting", "running", "terminated", "unknown"]
_CONTAINER_STATES: tuple[ContainerStateKind, ...] = ("running", "waiting", "terminated")
"""The keys of a container status's ``state``, in the order one is taken when several are set."""
_CRONJOB_JOB = re.compile(r"^(?P<cron>.+)-(?P<minutes>\d{8,10})$")
_GPU_NODE_LABELS = (
    "nvidia.com/gpu.present",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.count",
    "cloud.google.com/gke-accelerator",
    "k8s.amazonaws.com/accelerator",
)


@dataclass(frozen=True)
class TranslateConfig:
    """Which label/annotation keys carry team, project and gang; which extra resources are GPUs."""

    team_keys: tuple[str, ...] = ("team", "gpulens.io/team")
    project_keys: tuple[str, ...] = ("project", "gpulens.io/project")
    gang_keys: tuple[str, ...] = (
        "scheduling.x-k8s.io/pod-group",
        "scheduling.k8s.io/group-name",
        "kueue.x-k8s.io/workload",
        "training.kubeflow.org/job-name",
        "jobset.sigs.k8s.io/jobset-name",
    )
    extra_gpu_resources: tuple[str, ...] = ()


# --------------------------------------------------------------------------- small helpers


def gpu_quantity(value: object, trim: Trim | None = None) -> int:
    """A GPU resource's count: :func:`parse_quantity` clamped to ``MAX_GPU_COUNT`` (noted in ``trim``)."""
    return (trim if trim is not None else Trim()).quantity(parse_quantity(value), MAX_GPU_QUANTITY)


def gpu_resources(amounts: Mapping[str, int], trim: Trim, zeros: bool = False) -> dict[str, int]:
    """A GPU resource map within the contract: names of Kubernetes' length, counts clamped, at most
    ``MAX_RESOURCES`` of them (in name order), zeros left out unless ``zeros`` (a node's capacity)."""
    names = sorted(name for name, amount in amounts.items() if amount > 0 or zeros)
    if any(len(name) > MAX_QUALIFIED_NAME_CHARS for name in names):
        trim.note("text")
        names = [name for name in names if len(name) <= MAX_QUALIFIED_NAME_CHARS]
    return {name: trim.quantity(amounts[name]) for name in trim.items(names, MAX_RESOURCES)}


def is_gpu_resource(name: str, config: TranslateConfig | None = None) -> bool:
    """``nvidia.com/gpu``, MIG slices (``nvidia.com/mig-1g.10gb``), shared/time-sliced variants
    (``nvidia.com/gpu.shared``, ``nvidia.com/mig-1g.10gb.shared``) and configured extras."""
    if name == NVIDIA_GPU or name.startswith(("nvidia.com/mig-", "nvidia.com/gpu.")):
        return True
    return config is not None and name in config.extra_gpu_resources


def label_keys_read(config: TranslateConfig) -> tuple[str, ...]:
    """The label keys gpulens reads from a pod or workload, kept first when labels are trimmed."""
    recognised = [key for r in RECOGNISERS if isinstance(r, LabelGang) for key in r.keys]
    return tuple(dict.fromkeys((*config.team_keys, *config.project_keys, *config.gang_keys, *recognised,
                                "pod-template-hash", "jobset.sigs.k8s.io/jobset-name", "kueue.x-k8s.io/queue-name",
                                "app.kubernetes.io/name", "app")))


NODE_LABEL_PREFIXES = ("nvidia.com/", "cloud.google.com/gke-accelerator", "k8s.amazonaws.com/accelerator",
                       "node.kubernetes.io/instance-type", "kubernetes.io/hostname", "topology.kubernetes.io/")
"""Node labels kept first when a node's labels are trimmed (GPU facts, instance type, zone)."""


# --------------------------------------------------------------------------- pods


def _container_gpus(container: JsonDict, config: TranslateConfig, trim: Trim) -> dict[str, int]:
    resources = json_dict(container.get("resources"))
    requests = json_dict(resources.get("requests"))
    limits = json_dict(resources.get("limits"))
    found: dict[str, int] = {}
    for name in set(requests) | set(limits):
        if not is_gpu_resource(name, config):
            continue
        amount = gpu_quantity(requests[name] if name in requests else limits[name], trim)
        if amount > 0:
            found[name] = amount
    return found


def gpu_requests(pod: JsonDict, config: TranslateConfig, trim: Trim | None = None) -> dict[str, int]:
    """GPU resources the pod asks for, by resource name, as the scheduler accounts them (within the
    contract's bounds: see :func:`gpu_resources`)."""
    trim = trim if trim is not None else Trim()
    spec = json_dict(pod.get("spec"))
    total: dict[str, int] = {}
    for container in json_list(spec.get("containers")):
        for name, amount in _container_gpus(json_dict(container), config, trim).items():
            total[name] = total.get(name, 0) + amount
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for container in json_list(spec.get("initContainers")):
        init = json_dict(container)
        gpus = _container_gpus(init, config, trim)
        # restartable init containers (sidecars) keep running beside the app containers
        if init.get("restartPolicy") == "Always":
            for name, amount in gpus.items():
                sidecars[name] = sidecars.get(name, 0) + amount
                total[name] = total.get(name, 0) + amount
        else:
            for name, amount in gpus.items():
                # a regular init container runs with the sidecars started before it
                init_peak[name] = max(init_peak.get(name, 0), amount + sidecars.get(name, 0))
    for name, amount in init_peak.items():
        total[name] = max(total.get(name, 0), amount)
    return gpu_resources(total, trim)


def strip_runtime(container_id: object) -> str | None:
    """``containerd://abc`` -> ``abc`` (what cgroup paths carry)."""
    if not container_id:
        return None
    text = str(container_id)
    return text.split("://", 1)[1] if "://" in text else text


def owner_chain(pod: JsonDict, trim: Trim | None = None) -> list[OwnerRef]:
    """Owners from the pod outward, inferred without API calls (see module docstring)."""
    trim = trim if trim is not None else Trim()
    meta = json_dict(pod.get("metadata"))
    labels = json_dict(meta.get("labels"))
    refs = [json_dict(ref) for ref in json_list(meta.get("ownerReferences"))]
    refs.sort(key=lambda ref: not ref.get("controller", False))
    chain: list[OwnerRef] = []
    for ref in refs:
        kind, name = ref.get("kind"), ref.get("name")
        if not kind or not name:
            continue
        chain.append(owner_ref(ref, trim))
    if not chain:
        return chain
    top = chain[0]
    if top.kind == "ReplicaSet":
        template_hash = labels.get("pod-template-hash")
        if template_hash and top.name.endswith("-" + str(template_hash)):
            chain.insert(1, OwnerRef(kind="Deployment", name=top.name[: -len(str(template_hash)) - 1],
                                     api_version="apps/v1"))
    elif top.kind == "Job" and (top.api_version or "batch/v1").startswith("batch/"):
        jobset = labels.get("jobset.sigs.k8s.io/jobset-name")
        match = _CRONJOB_JOB.match(top.name)
        if jobset:
            chain.insert(1, OwnerRef(kind="JobSet", name=str(jobset), api_version="jobset.x-k8s.io/v1alpha2"))
        elif match:
            chain.insert(1, OwnerRef(kind="CronJob", name=match.group("cron"), api_version="batch/v1"))
    return trim.items(chain)


def owner_ref(ref: JsonDict, trim: Trim) -> OwnerRef:
    """One ownerReference within the contract's bounds (texts cut, noted in ``trim``)."""
    return OwnerRef(kind=str(trim.text(ref.get("kind"), MAX_SHORT_TEXT_CHARS)),
                    name=str(trim.text(ref.get("name"), MAX_NAME_CHARS)),
                    uid=trim.text(ref.get("uid"), MAX_ID_CHARS),
                    api_version=trim.text(ref.get("apiVersion"), MAX_QUALIFIED_NAME_CHARS))


def _container_state(status: JsonDict, spec_images: Mapping[str, str], trim: Trim) -> ContainerState:
    name = str(status.get("name", ""))
    state = json_dict(status.get("state"))
    last = json_dict(json_dict(status.get("lastState")).get("terminated"))
    kind: ContainerStateKind = "unknown"
    reason: str | None = None
    for candidate in _CONTAINER_STATES:
        if candidate in state and state[candidate] is not None:
            kind = candidate
            reason = json_dict(state[candidate]).get("reason")
            break
    terminated = json_dict(state.get("terminated"))
    ended = terminated or last
    return ContainerState(
        name=str(trim.text(name, MAX_DNS_LABEL_CHARS)),
        container_id=trim.text(strip_runtime(status.get("containerID") or terminated.get("containerID")),
                               MAX_SHORT_TEXT_CHARS),
        image=trim.text(spec_images.get(name) or status.get("image")),
        ready=bool(status.get("ready", False)),
        state=kind,
        state_reason=trim.text(reason),
        restart_count=max(trim.int32(status.get("restartCount")) or 0, 0),
        last_termination_reason=trim.text(ended.get("reason")),
        last_exit_code=trim.int32(ended.get("exitCode")),
        last_finished_at=parse_time(ended.get("finishedAt")),
    )


def _start_times(status: JsonDict) -> list[datetime]:
    times = []
    state = json_dict(status.get("state"))
    for part in (json_dict(state.get("running")), json_dict(state.get("terminated")),
                 json_dict(json_dict(status.get("lastState")).get("terminated"))):
        started = parse_time(part.get("startedAt"))
        if started:
            times.append(started)
    return times


def pod_to_state(
    pod: JsonDict,
    ts: datetime,
    config: TranslateConfig,
    gpu_nodes: Collection[str] = (),
    trim: Trim | None = None,
    dra: DraIndex | None = None,
) -> PodState | None:
    """The pod's message, or None when it neither requests a GPU nor runs on a GPU node. Within the
    contract's bounds, ``truncated`` when something was cut (named in ``trim`` when given). With
    ``dra``, the GPUs its ResourceClaims ask for or hold count in its requests, and a pod whose claims
    ask for GPU devices is a GPU pod even where another pod's demand counts them (a shared claim)."""
    trim = trim if trim is not None else Trim()
    meta = json_dict(pod.get("metadata"))
    spec = json_dict(pod.get("spec"))
    status = json_dict(pod.get("status"))
    uid = meta.get("uid")
    if not uid or not meta.get("name"):
        return None
    node = spec.get("nodeName") or None
    requests = gpu_requests(pod, config, trim)
    if dra is not None:
        requests = _merged(requests, dra.pod_demand(pod), trim)
    if not requests and (node is None or node not in gpu_nodes) and not (dra is not None and dra.uses_gpus(pod)):
        return None
    namespace = str(trim.text(meta.get("namespace") or "default", MAX_DNS_LABEL_CHARS))
    conditions = _conditions(status, trim)
    containers, starts = _containers(spec, status, trim)
    phase = _phase(status)
    status_reason = status.get("reason")
    last_reason, last_code = _last_termination(containers, phase, status_reason)
    return PodState(
        uid=str(trim.text(uid, MAX_ID_CHARS)),
        namespace=namespace,
        name=str(trim.text(meta["name"], MAX_NAME_CHARS)),
        ts=ts,
        node=trim.text(node, MAX_NAME_CHARS),
        phase=phase,
        conditions=trim.items(conditions.items),
        gpu_requests=requests,
        vram_request_bytes=vram_request_bytes(pod, trim),
        owners=owner_chain(pod, trim),
        team=trim.text(first_value(meta, config.team_keys) or namespace, MAX_TAG_CHARS),
        project=trim.text(first_value(meta, config.project_keys) or namespace, MAX_TAG_CHARS),
        gang_id=trim.text(_gang(meta, namespace, config), MAX_GANG_CHARS),
        labels=trim.labels(json_dict(meta.get("labels")), label_keys_read(config)),
        containers=containers,
        restarts=min(sum(c.restart_count for c in containers), 2**31 - 1),
        last_termination_reason=trim.text(last_reason),
        last_exit_code=last_code,
        status_reason=trim.text(status_reason) if status_reason else None,
        deleted=False,
        created_at=parse_time(meta.get("creationTimestamp")) or ts,
        scheduled_at=conditions.scheduled_at,
        started_at=min(starts) if starts else None,
        finished_at=_finished_at(phase, containers, conditions.latest_transition or ts),
        deleted_at=parse_time(meta.get("deletionTimestamp")),
        priority_class=trim.text(spec.get("priorityClassName"), MAX_NAME_CHARS),
        truncated=bool(trim),
    )


@dataclass(frozen=True)
class _Conditions:
    items: list[PodCondition]
    scheduled_at: datetime | None
    """When ``PodScheduled`` turned True."""
    latest_transition: datetime | None
    """The newest transition of any condition."""


def _conditions(status: JsonDict, trim: Trim) -> _Conditions:
    items = []
    scheduled_at: datetime | None = None
    latest_transition: datetime | None = None
    for raw in json_list(status.get("conditions")):
        cond = json_dict(raw)
        at = parse_time(cond.get("lastTransitionTime"))
        items.append(PodCondition(type=str(trim.text(cond.get("type", ""), MAX_QUALIFIED_NAME_CHARS)),
                                  status=str(trim.text(cond.get("status", ""), MAX_SHORT_TEXT_CHARS)),
                                  reason=trim.text(cond.get("reason")), message=trim.text(cond.get("message")),
                                  last_transition_at=at))
        if cond.get("type") == "PodScheduled" and cond.get("status") == "True":
            scheduled_at = at
        if at and (latest_transition is None or at > latest_transition):
            latest_transition = at
    return _Conditions(items, scheduled_at, latest_transition)


def _containers(spec: JsonDict, status: JsonDict, trim: Trim) -> tuple[list[ContainerState], list[datetime]]:
    """The pod's containers (init ones first) and every start time their statuses carry."""
    spec_images = {str(json_dict(c).get("name")): str(json_dict(c).get("image"))
                   for c in json_list(spec.get("initContainers")) + json_list(spec.get("containers"))
                   if json_dict(c).get("image")}
    raw_statuses = [json_dict(s) for s in json_list(status.get("initContainerStatuses"))
                    + json_list(status.get("containerStatuses"))]
    containers = [_container_state(s, spec_images, trim) for s in trim.items(raw_statuses)]
    if not raw_statuses:  # not started yet: still name the images the pod will run
        containers = [ContainerState(name=str(trim.text(name, MAX_DNS_LABEL_CHARS)), image=trim.text(image))
                      for name, image in trim.items(list(spec_images.items()))]
    return containers, [t for s in raw_statuses for t in _start_times(s)]


def _phase(status: JsonDict) -> PodPhase:
    phase_text = str(status.get("phase") or "Pending")
    return cast(PodPhase, phase_text if phase_text in _PHASES else "Unknown")


def _last_termination(containers: Iterable[ContainerState], phase: PodPhase,
                      status_reason: object) -> tuple[str | None, int | None]:
    """The reason and exit code of the newest container termination; a failed pod's own reason
    (Evicted, DeadlineExceeded, NodeLost...) says more and wins."""
    last_reason: str | None = None
    last_code: int | None = None
    newest: datetime | None = None
    for container in containers:
        if container.last_termination_reason is None and container.last_exit_code is None:
            continue
        finished = container.last_finished_at or datetime.min.replace(tzinfo=UTC)
        if newest is None or finished >= newest:
            newest, last_reason, last_code = finished, container.last_termination_reason, container.last_exit_code
    if phase == "Failed" and status_reason:
        last_reason = str(status_reason)
    return last_reason, last_code


def _finished_at(phase: PodPhase, containers: Iterable[ContainerState], fallback: datetime) -> datetime | None:
    """A finished pod's end: its last container's, else ``fallback`` (its newest condition change)."""
    if phase not in ("Succeeded", "Failed"):
        return None
    ends = [c.last_finished_at for c in containers if c.state == "terminated" and c.last_finished_at]
    return max(ends) if ends else fallback


def _gang(meta: JsonDict, namespace: str, config: TranslateConfig) -> str | None:
    return gang_id(meta, namespace, config.gang_keys)


def deleted_state(state: PodState, ts: datetime) -> PodState:
    """The final message of a pod that is gone: ``deleted`` set, ``deleted_at`` kept or ``ts``."""
    return state.model_copy(update={"deleted": True, "ts": ts, "deleted_at": state.deleted_at or ts})


# --------------------------------------------------------------------------- nodes


def _int_label(labels: JsonDict, key: str, limit: int, trim: Trim) -> int | None:
    """A label's non-negative ASCII integer at most ``limit``; None when absent or not one (an out
    of range value is noted in ``trim``)."""
    text = str(labels.get(key, "")).strip()
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    if value > limit:
        trim.note("quantity")
        return None
    return value


def _version(labels: JsonDict, full: str, parts: tuple[str, ...]) -> str | None:
    if labels.get(full):
        return str(labels[full])
    values = [labels.get(p) for p in parts]
    present = [str(v) for v in values if v not in (None, "")]
    return ".".join(present) if present else None


def _merged(base: Mapping[str, int], extra: Mapping[str, int], trim: Trim, zeros: bool = False) -> dict[str, int]:
    """Two GPU resource maps added up, within the contract's bounds."""
    if not extra:
        return dict(base)
    total = dict(base)
    for name, amount in extra.items():
        total[name] = total.get(name, 0) + amount
    return gpu_resources(total, trim, zeros=zeros)


def _dra_part(node: str, dra: DraIndex | None, trim: Trim) -> tuple[list[DraDevice], dict[str, int]]:
    """The node's DRA GPU devices and the capacity they add (nothing without an index)."""
    if dra is None:
        return [], {}
    devices = dra.node_devices(node, trim)
    return devices, dra.node_capacity(node) if devices else {}


def node_to_state(node: JsonDict, ts: datetime, config: TranslateConfig | None = None,
                  trim: Trim | None = None, dra: DraIndex | None = None) -> NodeState | None:
    """The node's message, or None for a node with neither GPU resources, GPU labels nor DRA GPU
    devices. Within the contract's bounds, ``truncated`` when something was cut (named in ``trim``
    when given). With ``dra``, the GPU devices its ResourceSlices publish add to its capacity."""
    trim = trim if trim is not None else Trim()
    meta = json_dict(node.get("metadata"))
    spec = json_dict(node.get("spec"))
    status = json_dict(node.get("status"))
    name = meta.get("name")
    if not name:
        return None
    labels = {str(k): str(v) for k, v in json_dict(meta.get("labels")).items()}  # all, to read from
    capacity = {str(k): gpu_quantity(v, trim) for k, v in json_dict(status.get("capacity")).items()
                if is_gpu_resource(str(k), config)}
    allocatable = {str(k): gpu_quantity(v, trim) for k, v in json_dict(status.get("allocatable")).items()
                   if is_gpu_resource(str(k), config)}
    gpu_labelled = any(labels.get(key) not in (None, "", "false") for key in _GPU_NODE_LABELS)
    dra_devices, dra_capacity = _dra_part(str(name), dra, trim)
    if not any(capacity.values()) and not gpu_labelled and not dra_devices:
        return None
    ready = False
    for raw in json_list(status.get("conditions")):
        cond = json_dict(raw)
        if cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
    memory_mib = _int_label(labels, "nvidia.com/gpu.memory", MAX_GPU_MEMORY_BYTES // 2**20, trim)
    return NodeState(
        node=str(trim.text(name, MAX_NAME_CHARS)),
        ts=ts,
        uid=trim.text(meta.get("uid"), MAX_ID_CHARS),
        gpu_capacity=_merged(gpu_resources(capacity, trim, zeros=True), dra_capacity, trim, zeros=True),
        gpu_allocatable=_merged(gpu_resources(allocatable, trim, zeros=True), dra_capacity, trim, zeros=True),
        gpu_product=trim.text(labels.get("nvidia.com/gpu.product") or labels.get("cloud.google.com/gke-accelerator")
                              or labels.get("k8s.amazonaws.com/accelerator"), MAX_SHORT_TEXT_CHARS),
        gpu_memory_bytes=memory_mib * 1024 * 1024 if memory_mib is not None else None,
        gpu_count_label=_int_label(labels, "nvidia.com/gpu.count", MAX_GPU_QUANTITY, trim),
        driver_version=trim.text(_version(labels, "nvidia.com/cuda.driver-version.full",
                                          ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
                                           "nvidia.com/cuda.driver.rev")), MAX_SHORT_TEXT_CHARS),
        cuda_driver_version=trim.text(_version(labels, "nvidia.com/cuda.runtime-version.full",
                                               ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")),
                                      MAX_SHORT_TEXT_CHARS),
        mig_strategy=trim.text(labels.get("nvidia.com/mig.strategy"), MAX_SHORT_TEXT_CHARS),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable", False)),
        taints=[Taint(key=str(trim.text(json_dict(t).get("key", ""), MAX_QUALIFIED_NAME_CHARS)),
                      value=trim.text(json_dict(t).get("value"), MAX_LABEL_VALUE_CHARS),
                      effect=str(trim.text(json_dict(t).get("effect", ""), MAX_SHORT_TEXT_CHARS)))
                for t in trim.items(json_list(spec.get("taints")))],
        labels=trim.labels(labels, keep_prefixes=NODE_LABEL_PREFIXES),
        dra_devices=dra_devices,
        deleted=False,
        truncated=bool(trim),
    )


def deleted_node(state: NodeState, ts: datetime) -> NodeState:
    return state.model_copy(update={"deleted": True, "ts": ts})


def object_time(obj: JsonDict) -> datetime | None:
    """The newest timestamp an object carries: how recent the change we just saw is (for lag)."""
    meta = json_dict(obj.get("metadata"))
    status = json_dict(obj.get("status"))
    candidates: list[object] = [meta.get("creationTimestamp"), meta.get("deletionTimestamp"),
                             obj.get("eventTime"), obj.get("lastTimestamp"),
                             json_dict(obj.get("series")).get("lastObservedTime")]
    candidates += [json_dict(c).get("lastTransitionTime") for c in json_list(status.get("conditions"))]
    for raw in json_list(status.get("containerStatuses")):
        state = json_dict(json_dict(raw).get("state"))
        candidates += [json_dict(state.get("running")).get("startedAt"),
                       json_dict(state.get("terminated")).get("finishedAt")]
    times = [t for t in (parse_time(c) for c in candidates) if t is not None]
    return max(times) if times else None


# --------------------------------------------------------------------------- change filter


class ChangeFilter:
    """Remembers a fingerprint of the last message per key and says whether a new one differs.

    The fingerprint covers every field except ``ts`` (observation time), so a new resourceVersion,
    a node heartbeat or a re-list that changes nothing we report emits nothing. Memory is one
    16-byte digest per live key; :meth:`forget` drops a key when its object is gone.
    """

    def __init__(self) -> None:
        self._seen: dict[str, bytes] = {}

    @staticmethod
    def fingerprint(message: Message) -> bytes:
        body = message.model_dump_json(exclude={"ts"}).encode()
        return hashlib.blake2b(body, digest_size=16).digest()

    def changed(self, key: str, message: PodState | NodeState | Message) -> bool:
        digest = self.fingerprint(message)
        if self._seen.get(key) == digest:
            return False
        self._seen[key] = digest
        return True

    def forget(self, key: str) -> None:
        self._seen.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)


# --------------------------------------------------------------------------- progress annotations

PROGRESS_ANNOTATIONS = {"steps": "gpulens.io/steps", "tokens": "gpulens.io/tokens", "samples": "gpulens.io/samples"}
"""Pod annotations a job (or its operator/sidecar) sets to running totals; see docs/progress.md."""
MAX_PROGRESS_DIGITS = 20
"""Longer values are rejected: a typo or abuse, not a training counter (and not worth parsing)."""


def pod_progress(pod: JsonDict, ts: datetime) -> tuple[WorkloadProgress | None, dict[str, str]]:
    """The ``WorkloadProgress`` a pod's ``gpulens.io/*`` annotations publish, and what was malformed.

    Returns ``(None, {})`` for a pod without them. Each malformed value (not a non-negative
    integer) is left out and named in the second item (annotation -> reason), so one bad key does
    not hide the good ones. Totals going down (a restarted job) are passed on as they are: the
    downstream cost per step uses max - min per window, like the agent's totals.
    """
    meta = json_dict(pod.get("metadata"))
    annotations = json_dict(meta.get("annotations"))
    totals: dict[str, float] = {}
    bad: dict[str, str] = {}
    for key, name in PROGRESS_ANNOTATIONS.items():
        raw = annotations.get(name)
        if raw is None:
            continue
        text = str(raw).strip()
        if not text.isascii() or not text.isdigit():
            bad[name] = "not_integer"
        elif len(text) > MAX_PROGRESS_DIGITS or int(text) > MAX_PROGRESS_TOTAL:
            bad[name] = "too_large"
        else:
            totals[f"{key}_total"] = float(int(text))
    uid = meta.get("uid")
    if not totals or not uid:
        return None, bad
    trim = Trim()  # the API server's names fit; a simulated server's might not
    message = WorkloadProgress(pod_uid=str(trim.text(uid, MAX_ID_CHARS)),
                               namespace=str(trim.text(meta.get("namespace") or "", MAX_DNS_LABEL_CHARS)),
                               pod=str(trim.text(meta.get("name") or "", MAX_NAME_CHARS)), ts=ts,
                               steps_total=totals.get("steps_total"), tokens_total=totals.get("tokens_total"),
                               samples_total=totals.get("samples_total"))
    return message, bad
