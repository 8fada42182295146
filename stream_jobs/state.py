"""Typed records of stage state, with named fields and units, and their JSON form.

Why: stage state is checkpointed (faust tables and their changelog, ``LocalPipeline.to_dict``),
so it must stay plain JSON; it used to be dicts with short keys (``ws``, ``alloc``) that only the
code writing them explained. These dataclasses name each field with its unit and convert to and
from the same kind of plain dict (``to_dict`` / ``from_dict``: field name -> value). The JSON form
is that of this version only: a deployment upgrading to it starts from fresh state tables (see
docs/stream_jobs.md). Each record is bounded: names are cut by ``internal.kept`` before they get
here, and no field holds a list that grows with time.

``to_dict`` gives a view for a checkpoint that serialises it at once: a record's containers (a
pod's restart times, an open alert) are the record's own, not copies. ``dataclasses.asdict``
deep-copied every value at every checkpoint, about 3 % of a worker's cProfile on a 64-node fleet
(the stream benchmark); nothing keeps a view past the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from schemas.messages import MAX_USD
from schemas.outputs import ClusterCapacity, PodWindow
from stream_jobs.alerts import OpenAlert
from stream_jobs.internal import PodUsage
from stream_jobs.json_types import (
    JsonDict,
    JsonObject,
    JsonValue,
    as_array,
    as_int,
    as_object,
    optional_float,
    optional_object,
    rebuild,
)
from stream_jobs.timeutil import from_epoch, iso, stable_id


def _fields(record: object) -> JsonDict:
    """A dataclass record's fields, name -> value, as they are (see the module docstring): every
    record here holds JSON values only, except the fields its own ``to_dict`` converts."""
    return dict(vars(record))


def _open_alert_dict(alert: OpenAlert | None) -> JsonDict | None:
    return None if alert is None else alert.to_dict()


def _open_alert(data: JsonValue) -> OpenAlert | None:
    return None if data is None else OpenAlert.from_dict(as_object(data))


def window_id(pod_uid: str, gpu_uuid: str, start_iso: str) -> str:
    """A pod window's id: of its pod, GPU and start (as ``timeutil.iso`` writes it)."""
    return stable_id("window", pod_uid, gpu_uuid, start_iso)


@dataclass
class PodGpuWindow:
    """What one pod did with one GPU during one window (node stage), until the window closes.

    ``*_s`` fields are seconds of the window; ``util_pct_s`` and ``mem_byte_s`` integrate the
    percentage and bytes over the seconds with data (``util_data_s``, ``mem_data_s``)."""

    pod_uid: str
    namespace: str
    pod: str
    team: str | None
    project: str | None
    gpu_uuid: str
    gpu_model: str
    gpu_index: int | None
    container: str | None
    window_start: float
    """Epoch seconds."""
    allocated_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    gap_s: float = 0.0
    samples: int = 0
    util_pct_s: float = 0.0
    util_data_s: float = 0.0
    util_max_pct: float | None = None
    mem_byte_s: float = 0.0
    mem_data_s: float = 0.0
    mem_max_bytes: int | None = None
    energy_j: float | None = None
    power_w_s: float = 0.0
    power_data_s: float = 0.0
    mem_total_bytes: int | None = None
    share_s: float = 0.0
    share_estimated: bool = False
    cost_usd: float = 0.0

    def add(self, seg_s: float, first: bool, idle: bool, util_pct: float | None, mem_bytes: int | None,
            power_w: float | None, share: float, share_estimated: bool, cost_usd: float,
            mem_total_bytes: int | None) -> None:
        """Add ``seg_s`` seconds of one sample (``first``: the segment holding the sample's time)."""
        self.allocated_s += seg_s
        if first:
            self.samples += 1
        if util_pct is not None:
            self.util_pct_s += util_pct * seg_s
            self.util_data_s += seg_s
            if idle:
                self.idle_s += seg_s
            else:
                self.busy_s += seg_s
            self.util_max_pct = util_pct if self.util_max_pct is None else max(self.util_max_pct, util_pct)
        if mem_bytes is not None:
            self.mem_byte_s += mem_bytes * seg_s
            self.mem_data_s += seg_s
            self.mem_max_bytes = mem_bytes if self.mem_max_bytes is None else max(self.mem_max_bytes, mem_bytes)
        if power_w is not None:
            self.energy_j = (self.energy_j or 0.0) + power_w * seg_s * share
            self.power_w_s += power_w * seg_s
            self.power_data_s += seg_s
        if mem_total_bytes is not None:
            self.mem_total_bytes = mem_total_bytes
        self.share_s += share * seg_s
        self.share_estimated = self.share_estimated or share_estimated
        self.cost_usd += cost_usd

    def add_gap(self, seg_s: float) -> None:
        self.allocated_s += seg_s
        self.gap_s += seg_s

    def message(self, node: str, stamps: WindowStamps) -> PodWindow:
        """The window's output; ``stamps``: those of the windows of its start closed with it (its
        start and end times, its pod's and its GPU's figures)."""
        share = self.share_s / self.allocated_s if self.allocated_s > 0 else 1.0
        gpu = self.gpu_uuid
        return PodWindow(
            window_id=window_id(self.pod_uid, gpu, stamps.start_iso), pod_uid=self.pod_uid,
            namespace=self.namespace, pod=self.pod, node=node, gpu_uuid=gpu, gpu_model=self.gpu_model,
            window_start=stamps.start, window_end=stamps.end,
            team=self.team, project=self.project, allocated_s=self.allocated_s, busy_s=self.busy_s,
            idle_s=self.idle_s, gap_s=self.gap_s, samples=self.samples,
            avg_sm_util_pct=min(100.0, self.util_pct_s / self.util_data_s) if self.util_data_s > 0 else None,
            max_sm_util_pct=self.util_max_pct,
            avg_mem_used_bytes=self.mem_byte_s / self.mem_data_s if self.mem_data_s > 0 else None,
            max_mem_used_bytes=self.mem_max_bytes, energy_j=self.energy_j,
            share_fraction=min(1.0, max(0.0, share)), share_estimated=self.share_estimated,
            cost_usd=min(self.cost_usd, MAX_USD),
            gpu_index=self.gpu_index, container=self.container, mem_total_bytes=self.mem_total_bytes,
            avg_power_w=self.power_w_s / self.power_data_s if self.power_data_s else None,
            pod_busy_s=stamps.pod_busy_s[self.pod_uid], gpu_pods=stamps.gpu_pods[gpu],
            gpu_busy_s=stamps.gpu_busy_s[gpu], gpu_allocated_s=stamps.gpu_allocated_s[gpu],
        )

    def to_dict(self) -> JsonDict:
        return _fields(self)

    @classmethod
    def from_dict(cls, data: JsonObject) -> PodGpuWindow:
        return rebuild(cls, data)


@dataclass
class WindowStamps:
    """The windows of one start a node stage closes together, by pod and by GPU: what each window's
    message says about its pod's other GPUs and its GPU's other pods (a pod's GPUs and a GPU's pods
    are all on the stage's node), and the start and end every one of them has. Worked out once for
    all of them (:meth:`of`), not again for each window's message."""

    start: datetime
    end: datetime
    start_iso: str
    """``start`` as ``timeutil.iso`` writes it (what a window's id hashes)."""
    pod_busy_s: dict[str, float] = field(default_factory=dict)
    """Pod uid -> the most busy seconds of any of its GPUs."""
    gpu_pods: dict[str, int] = field(default_factory=dict)
    """GPU uuid -> how many windows (pods) held it."""
    gpu_busy_s: dict[str, float] = field(default_factory=dict)
    """GPU uuid -> the busy seconds of its windows, added up in the windows' order."""
    gpu_allocated_s: dict[str, float] = field(default_factory=dict)
    """GPU uuid -> the most allocated seconds of any of its windows (the first of equals)."""

    @classmethod
    def of(cls, windows: list[PodGpuWindow], start: float, width_s: float) -> WindowStamps:
        """``windows``: every window of ``start`` (epoch seconds) the stage closes, in their order."""
        stamps = cls(start=from_epoch(start), end=from_epoch(start + width_s), start_iso=iso(start))
        pod_busy, pods, busy, allocated = stamps.pod_busy_s, stamps.gpu_pods, stamps.gpu_busy_s, stamps.gpu_allocated_s
        for w in windows:
            pod_busy[w.pod_uid] = max(pod_busy.get(w.pod_uid, 0.0), w.busy_s)
            gpu = w.gpu_uuid
            if gpu in pods:
                pods[gpu] += 1
                busy[gpu] += w.busy_s
                if w.allocated_s > allocated[gpu]:
                    allocated[gpu] = w.allocated_s
            else:  # as ``sum`` and ``max`` over the GPU's windows would start
                pods[gpu], busy[gpu], allocated[gpu] = 1, 0 + w.busy_s, w.allocated_s
        return stamps


@dataclass(frozen=True)
class SamplePart:
    """One node's last sample as the cluster sees it: busy and idle allocated GPUs until ``until``."""

    busy_gpus: int
    idle_gpus: int
    until: float
    """Epoch seconds: the end of the sample's interval."""


@dataclass(frozen=True)
class CapacitySnapshot:
    """The cluster's GPUs at one instant (cluster stage); counts of GPUs, pods and workloads."""

    total: int = 0
    allocated: int = 0
    busy: int = 0
    idle: int = 0
    free: int = 0
    free_by_node: Mapping[str, int] = field(default_factory=dict)
    largest_free_block: int = 0
    stranded: int = 0
    pending_pods: int = 0
    pending_demand: int = 0
    queued_workloads: int = 0
    queued_demand: int = 0
    parts: tuple[SamplePart, ...] = ()
    fragmentation: JsonObject = field(default_factory=dict)
    """The MIG and shared-VRAM figures (``ClusterCapacity``'s ``mig_*`` and ``shared_*`` fields, from
    ``mig_rules`` and ``shared_vram``); empty on a fleet without MIG or shared GPUs."""

    def to_dict(self) -> JsonDict:
        return _fields(self) | {"free_by_node": dict(self.free_by_node), "parts": [_fields(p) for p in self.parts]}

    @classmethod
    def from_dict(cls, data: JsonObject) -> CapacitySnapshot:
        parts = tuple(rebuild(SamplePart, as_object(part)) for part in as_array(data["parts"]))
        free_by_node = {node: as_int(free) for node, free in as_object(data["free_by_node"]).items()}
        return rebuild(cls, data, free_by_node=free_by_node, parts=parts)


@dataclass
class CapacityWindow:
    """GPU-seconds integrated over one capacity window, and the snapshot that closes it."""

    window_start: float
    """Epoch seconds."""
    gpu_s_total: float = 0.0
    gpu_s_allocated: float = 0.0
    gpu_s_busy: float = 0.0
    gpu_s_idle: float = 0.0
    gpu_s_free: float = 0.0
    stranded_max: int = 0
    last: CapacitySnapshot | None = None

    def add(self, snap: CapacitySnapshot, start: float, seg_s: float) -> None:
        """Integrate ``snap`` over ``[start, start + seg_s)``."""
        self.gpu_s_total += snap.total * seg_s
        self.gpu_s_allocated += snap.allocated * seg_s
        self.gpu_s_free += snap.free * seg_s
        for part in snap.parts:
            covered = max(0.0, min(start + seg_s, part.until) - start)
            self.gpu_s_busy += part.busy_gpus * covered
            self.gpu_s_idle += part.idle_gpus * covered
        self.stranded_max = max(self.stranded_max, snap.stranded)
        if self.last is None:
            self.last = snap

    def message(self, width_s: float) -> ClusterCapacity:
        snap = self.last or CapacitySnapshot()
        # validated as a whole: the fragmentation figures are JSON (kept in state) that the contract
        # reads into its MIG and shared-GPU fields
        return ClusterCapacity.model_validate(dict(
            window_id=stable_id("capacity", self.window_start), window_start=from_epoch(self.window_start),
            window_end=from_epoch(self.window_start + width_s), gpus_total=snap.total,
            gpus_allocated=snap.allocated, gpus_busy=snap.busy, gpus_idle_allocated=snap.idle,
            gpus_free=snap.free, free_gpus_by_node=dict(snap.free_by_node), largest_free_block=snap.largest_free_block,
            stranded_gpus=snap.stranded, pending_pods=snap.pending_pods, pending_gpu_demand=snap.pending_demand,
            gpu_s_total=self.gpu_s_total, gpu_s_allocated=self.gpu_s_allocated, gpu_s_busy=self.gpu_s_busy,
            gpu_s_idle_allocated=self.gpu_s_idle, gpu_s_free=self.gpu_s_free, stranded_gpus_max=self.stranded_max,
            queued_workloads=snap.queued_workloads, queued_gpu_demand=snap.queued_demand,
            **snap.fragmentation,
        ))

    def to_dict(self) -> JsonDict:
        return _fields(self) | {"last": None if self.last is None else self.last.to_dict()}

    @classmethod
    def from_dict(cls, data: JsonObject) -> CapacityWindow:
        last = optional_object(data["last"])
        return rebuild(cls, data, last=None if last is None else CapacitySnapshot.from_dict(last))


@dataclass
class CapacityState:
    """The cluster stage's capacity integration: up to when, the state holding since, open windows."""

    integrated_to: float | None = None
    """Epoch seconds up to which ``snapshot`` was integrated into ``windows``."""
    snapshot: CapacitySnapshot | None = None
    last_instant: float | None = None
    """The last instant the cluster was evaluated at (epoch seconds)."""
    windows: dict[str, CapacityWindow] = field(default_factory=dict)
    """Open windows by ``repr(window_start)``."""

    def to_dict(self) -> JsonDict:
        return {"integrated_to": self.integrated_to,
                "snapshot": None if self.snapshot is None else self.snapshot.to_dict(),
                "last_instant": self.last_instant,
                "windows": {key: w.to_dict() for key, w in self.windows.items()}}

    @classmethod
    def from_dict(cls, data: JsonObject) -> CapacityState:
        snapshot = optional_object(data["snapshot"])
        return cls(integrated_to=optional_float(data["integrated_to"]),
                   snapshot=None if snapshot is None else CapacitySnapshot.from_dict(snapshot),
                   last_instant=optional_float(data["last_instant"]),
                   windows={key: CapacityWindow.from_dict(as_object(window))
                            for key, window in as_object(data["windows"]).items()})


@dataclass
class PodGpuUsage:
    """What one pod's GPUs did while on one node (node stage), reported as a ``PodUsage`` when the
    pod leaves. Seconds count per allocation unit (a MIG device is a unit)."""

    unit_s: float = 0.0
    data_s: float = 0.0
    """Seconds with a utilisation figure."""
    idle_s: float = 0.0
    busy_s: float = 0.0
    gap_s: float = 0.0
    util_pct_s: float = 0.0
    cost_units_s: float = 0.0
    """Unit-seconds weighted by the unit's fraction of a physical GPU and the pod's share."""
    peak_mem_bytes: int | None = None
    samples: int = 0
    gpu_model: str | None = None
    share_estimated: bool = False

    def message(self, pod_uid: str, node: str, ts: float, open_: bool) -> PodUsage:
        return PodUsage(
            pod_uid=pod_uid, node=node, ts=from_epoch(ts), open=open_, gpu_model=self.gpu_model,
            unit_s=self.unit_s, data_s=self.data_s, idle_s=self.idle_s, busy_s=self.busy_s, gap_s=self.gap_s,
            util_s=self.util_pct_s, cost_units_s=self.cost_units_s, peak_mem_bytes=self.peak_mem_bytes,
            samples=self.samples, share_estimated=self.share_estimated,
        )

    def to_dict(self) -> JsonDict:
        return _fields(self)

    @classmethod
    def from_dict(cls, data: JsonObject) -> PodGpuUsage:
        return rebuild(cls, data)


@dataclass
class NodeInfo:
    """What the node stage knows of its node (from node states and samples)."""

    ready: bool | None = None
    """None until a node state says (a node whose samples come first counts as Ready)."""
    deleted: bool = False
    gpu_product: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    replicas_per_gpu: float = 1.0
    """``nvidia.com/gpu`` units the node advertises per GPU: above 1, its GPUs are shared (time-slicing)."""
    dra_devices: dict[str, dict[str, dict[str, str | None]]] = field(default_factory=dict)
    """The GPU devices the node publishes through DRA, from its latest state: driver -> pool -> device
    -> UUID (``stream_jobs.dra_join.DeviceTable``); a checkpoint without it restores as none."""

    def to_dict(self) -> JsonDict:
        return _fields(self)

    @classmethod
    def from_dict(cls, data: JsonObject) -> NodeInfo:
        return rebuild(cls, data)


@dataclass
class GpuHealth:
    """A GPU's ``gpu_health`` alert and when it was last seen unhealthy (epoch seconds)."""

    alert: OpenAlert | None = None
    bad_ts: float | None = None

    def to_dict(self) -> JsonDict:
        return {"alert": _open_alert_dict(self.alert), "bad_ts": self.bad_ts}

    @classmethod
    def from_dict(cls, data: JsonObject) -> GpuHealth:
        return cls(alert=_open_alert(data["alert"]), bad_ts=optional_float(data["bad_ts"]))


RESTARTS_KEPT = 100
"""Most restart times a pod record keeps per pod state (the crash-loop window cuts the rest)."""


@dataclass
class NodePod:
    """A pod bound to the node (node stage): names, GPU request, restarts for ``crashloop_gpu``."""

    uid: str
    restarts: int
    namespace: str = ""
    name: str = ""
    team: str | None = None
    project: str | None = None
    gpus: int = 0
    """GPUs (all GPU resources) it requests."""
    image: str | None = None
    last_reason: str | None = None
    """Its last termination reason."""
    last_exit_code: int | None = None
    restart_times: list[float] = field(default_factory=list)
    """Epoch seconds of restarts within the crash-loop window."""
    last_restart: float | None = None
    crash: OpenAlert | None = None
    """The open ``crashloop_gpu`` alert."""

    def to_dict(self) -> JsonDict:
        return _fields(self) | {"crash": _open_alert_dict(self.crash)}

    @classmethod
    def from_dict(cls, data: JsonObject) -> NodePod:
        return rebuild(cls, data, crash=_open_alert(data.get("crash")))


# ---------------------------------------------------------------------- cluster stage records


@dataclass
class ClusterNode:
    """A node as the scheduler sees it (cluster stage)."""

    ready: bool = False
    unschedulable: bool = False
    deleted: bool = False
    allocatable: dict[str, int] = field(default_factory=dict)
    """GPUs allocatable by resource name (capacity when the node states no allocatable)."""
    gpu_product: str | None = None

    @classmethod
    def from_dict(cls, data: JsonObject) -> ClusterNode:
        return rebuild(cls, data)


@dataclass
class SideInputs:
    """What side inputs (scheduling events, usage, progress) said of a pod; kept on the pod, or
    stashed here until the pod's own state arrives."""

    reasons: list[str] = field(default_factory=list)
    """Distinct scheduler reasons, the last ``cluster_stage._MAX_REASONS``."""
    last_reason: str | None = None
    usage: JsonDict | None = None
    """The pod's ``PodUsage`` from the node stage (JSON form), once it left the node."""
    steps: float | None = None
    """Training steps reported (the largest total)."""

    @classmethod
    def from_dict(cls, data: JsonObject) -> SideInputs:
        return rebuild(cls, data)


@dataclass
class ClusterPod(SideInputs):
    """A GPU pod (cluster stage); times are epoch seconds."""

    uid: str = ""
    namespace: str = ""
    name: str = ""
    team: str | None = None
    project: str | None = None
    gang: str | None = None
    owner_uids: list[str] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)
    """GPUs requested by resource name."""
    gpus: int = 0
    vram_need_bytes: int | None = None
    """Device memory it declares per GPU for a shared GPU (``PodState.vram_request_bytes``)."""
    created: float = 0.0
    node: str | None = None
    scheduled: float | None = None
    started: float | None = None
    end: float | None = None
    end_reason: str | None = None
    end_by_node: bool = False
    """The end was inferred from its node leaving (its own state may still say otherwise)."""

    @classmethod
    def from_dict(cls, data: JsonObject) -> ClusterPod:
        return rebuild(cls, data)


@dataclass
class Workload:
    """A Kueue workload (cluster stage): queued demand until admitted or its pods exist."""

    uid: str
    namespace: str
    name: str
    queue: str | None
    team: str | None
    gang: str | None
    owner_uids: list[str]
    requests: dict[str, int]
    gpus: int
    sets: list[tuple[int, dict[str, int]]]
    """Pod sets: (pod count, GPUs per pod by resource name)."""
    pods: int
    created: float
    admitted: bool
    last_reason: str | None
    ended: str | None = None
    """``deleted`` / ``finished`` / ``inactive`` once it ended (kept until its alerts resolve)."""

    @classmethod
    def from_dict(cls, data: JsonObject) -> Workload:
        sets = []
        for entry in as_array(data["sets"]):
            count, request = as_array(entry)
            sets.append((as_int(count), {name: as_int(gpus) for name, gpus in as_object(request).items()}))
        return rebuild(cls, data, sets=sets)


@dataclass
class NodeSampleSummary:
    """A node's last sample as the cluster stage keeps it."""

    ts: float
    interval_s: float
    busy_gpus: int
    idle_gpus: int

    @classmethod
    def from_dict(cls, data: JsonObject) -> NodeSampleSummary:
        return rebuild(cls, data)


ClusterRecord = ClusterNode | SideInputs | Workload | NodeSampleSummary
"""A record the cluster stage keeps by key (a ``ClusterPod`` is a ``SideInputs``)."""


def records_to_dict(records: Mapping[str, ClusterRecord]) -> JsonDict:
    """``{key: dataclass}`` -> its JSON form."""
    return {key: _fields(record) for key, record in records.items()}
