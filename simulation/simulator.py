"""The fleet simulator: plays a scenario through the same code paths as real data.

Each tick (t = 0, dt, 2dt, ... while t < duration) follows FORMAT.md's order:

1. Kueue workloads are created, admitted and deleted at their offsets (a workload's pods are
   created ``create`` after its admission); create pods whose ``create`` <= t, delete pods whose
   ``delete`` <= t, complete pods whose ``run_for`` has elapsed, remove nodes whose
   ``ready_until`` <= t (their pods end ``Evicted``);
2. schedule pending pods in creation order (file order within a tick), first fit over Ready nodes
   in file order (a pinned pod only to its node), lowest-indexed free GPUs; a pod that does not
   fit gets a ``FailedScheduling`` event worded like kube-scheduler's;
3. every Ready node's agent samples every GPU.

Kubernetes objects are built as the API server serves them and translated by the watcher's own
``producers.watcher.translate`` (DRA objects through its ``producers.watcher.dra.DraIndex``: a
DRA node's ResourceSlice, the claims with the allocation the scheduler writes into their status);
samples are taken by the agent's own ``NodeSampler`` over
``FakeNvml``, ``StaticPodResources`` and ``StaticProcessResolver``. Every record is encoded with
``schemas.codec`` exactly as the producers would put it on Kafka, so the stream jobs see real
records. Nothing is random: uids, pids and container ids derive from the scenario's names.
"""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from producers.agent.cgroup import ContainerRef, StaticProcessResolver
from producers.agent.fake_kubelet import StaticPodResources
from producers.agent.fake_nvml import FakeGpu, FakeMigDevice, FakeNvml, FakeProcess
from producers.agent.sampler import NodeSampler
from producers.watcher.dra import DraChange, DraIndex
from producers.watcher.events import event_to_message
from producers.watcher.translate import TranslateConfig, deleted_node, deleted_state, node_to_state, pod_to_state
from producers.watcher.workloads import deleted_workload, workload_to_state
from schemas.codec import encode
from schemas.messages import DEFAULT_CLUSTER, DraAllocation, Message, PodRef, WorkloadProgress, scoped_key
from schemas.topics import GPU_SAMPLES, K8S_EVENTS, K8S_NODES, K8S_PODS, K8S_WORKLOADS, WORKLOAD_PROGRESS
from simulation.allocator_play import AllocatorPlayer
from simulation.fleet_state import SimClaim, SimNode, SimPod, SimulatedRecord, SimWorkload, Tick
from simulation.k8s_objects import (
    DRA_DRIVER,
    EXTENDED_RESOURCE,
    POD_CLAIM,
    claim_object,
    device_class_objects,
    event_object,
    node_object,
    pod_object,
    resource_slice_object,
    share_id,
    sim_uid,
    slot_devices,
    workload_object,
)
from simulation.mig_layouts import (
    MAX_INSTANCES_PER_GPU,
    fake_devices,
    relayout_slots,
    slot_resources,
)
from simulation.scenario import ClaimSpec, NodeSpec, Scenario, step_value

GIB = 2**30
EPS = 1e-6




@dataclass
class _Dressing:
    """What one tick's dressing of a node collects: the kubelet's assignments (device plugin and
    DRA) and the process map."""

    t: float
    by_index: dict[int, SimPod]
    devices: list[str | None]
    mapping: dict[str, list[PodRef]] = field(default_factory=dict)
    resolver: dict[int, ContainerRef] = field(default_factory=dict)
    dra: list[DraAllocation] = field(default_factory=list)


_IDLE_POWER_W, _POWER_W_PER_PCT = 70.0, 6.3
_IDLE_TEMPERATURE_C, _TEMPERATURE_C_PER_PCT = 35.0, 0.4
"""A simulated whole GPU's power and temperature: idle, plus so much per point of utilisation."""


class FleetSimulator:
    def __init__(self, scenario: Scenario, translate_config: TranslateConfig | None = None) -> None:
        self.scenario = scenario
        self.config = translate_config or TranslateConfig()
        self.start_id = uuidlib.uuid4().hex
        """Fresh per start, like a real agent's boot id: two runs into one store never share a sample key."""
        self.dt = scenario.sample_interval_s
        self.allocator = AllocatorPlayer(scenario)
        self.nodes: dict[str, SimNode] = {spec.name: self._make_node(spec) for spec in scenario.nodes}
        self.pods: list[SimPod] = [
            SimPod(spec, index, sim_uid(scenario.name, "pod", spec.namespace, spec.name),
                   hashlib.sha256(f"{scenario.name}/{spec.namespace}/{spec.name}".encode()).hexdigest())
            for index, spec in enumerate(scenario.pods)
        ]
        self._by_index: dict[int, SimPod] = {pod.index: pod for pod in self.pods}
        self._refs: dict[int, PodRef] = {}
        """Each pod's PodRef as the kubelet names it, by pod index (built once per uid: the same for every GPU
        and tick)."""
        self._containers: dict[int, ContainerRef] = {}
        """Each pod's container as its processes' cgroups name it (built once, like ``_refs``)."""
        self.workloads: dict[tuple[str, str], SimWorkload] = {
            (spec.namespace, spec.name): SimWorkload(
                spec, sim_uid(scenario.name, "workload", spec.namespace, spec.name),
                sim_uid(scenario.name, "job", spec.namespace, spec.name))
            for spec in scenario.workloads
        }
        self._late: list[tuple[float, SimulatedRecord]] = []
        self._fired_xids: set[int] = set()
        self.dra: DraIndex | None = DraIndex() if scenario.claims or any(n.dra for n in scenario.nodes) else None
        """The watcher's view of the DRA objects (None: the scenario has none, and nothing reads it)."""
        self.claims: dict[tuple[str, str], SimClaim] = {
            (spec.namespace, spec.name): SimClaim(spec, spec.name, sim_uid(scenario.name, "claim", spec.namespace,
                                                                             spec.name))
            for spec in scenario.claims if not spec.template
        }
        for pod in self.pods:
            spec = scenario.claim(pod.spec)
            if spec is None:
                continue
            if not spec.template:
                pod.claim = self.claims[(spec.namespace, spec.name)]
                continue
            uid = sim_uid(scenario.name, "claim", pod.uid)
            pod.claim = SimClaim(spec, f"{pod.spec.name}-{POD_CLAIM}-{uid[:5]}", uid, for_pod=pod)
        self._dirty_claims: list[SimClaim] = []
        """Claims created or allocated this tick: the watcher sees them before the pods' messages."""
        self._released_claims: list[SimClaim] = []
        """Claims their pods' ends released or deleted: the watcher sees them after the pods' messages."""
        self._dra_touched: set[str] = set()
        """Pods (by uid) whose GPU demand the DRA objects applied this tick may have changed."""
        self._dressed: dict[str, tuple[Any, ...]] = {}
        """Node name -> what its last dressing depended on (:meth:`_dress_key`)."""

    # ------------------------------------------------------------------ set-up

    def _make_node(self, spec: NodeSpec) -> SimNode:
        name = self.scenario.name
        gpus = []
        mem_total = int(spec.memory_gib * GIB)
        for index in range(spec.gpus):
            gpu = FakeGpu(uuid="GPU-" + sim_uid(name, "gpu", spec.name, str(index)), index=index, model=spec.model,
                          mem_total_bytes=mem_total)
            if spec.mig:
                slices = int(spec.mig.split("g")[0])
                mig_mem = int(float(spec.mig.split(".")[1][:-2]) * GIB)
                gpu.mig_devices = [
                    FakeMigDevice(uuid="MIG-" + sim_uid(name, "mig", spec.name, str(index), str(j)), profile=spec.mig,
                                  gpu_instance_id=j * slices, compute_instance_id=0, mem_total_bytes=mig_mem)
                    for j in range(spec.mig_per_gpu)
                ]
            if spec.mig_layout is not None:
                gpu.mig_devices = fake_devices(name, spec.name, index, spec.mig_layout[index], spec.memory_gib)
            if not spec.process_stats:
                gpu.unsupported.add("process_utilization")
            gpus.append(gpu)
        nvml = FakeNvml(gpus, driver_version=spec.driver, cuda_driver_version=spec.cuda)
        nvml.init()
        resources = StaticPodResources()
        sampler = NodeSampler(spec.name, nvml, resources, StaticProcessResolver({}),
                              boot_id=sim_uid(name, "boot", spec.name, self.start_id), sample_interval_s=self.dt)
        node = SimNode(spec, sim_uid(name, "node", spec.name), nvml, gpus, resources, sampler, [None] * spec.units)
        if spec.mig_layout is not None:
            node.slot_res = slot_resources([g.mig_devices for g in gpus])
        if spec.dra:
            node.slice_uid = sim_uid(name, "slice", spec.name)
        return node

    # ------------------------------------------------------------------ Kubernetes objects

    def _node_object(self, node: SimNode, ts: datetime) -> dict[str, Any]:
        return node_object(node, self.scenario.start)

    def _node_state(self, node: SimNode, ts: datetime) -> Any:
        return node_to_state(self._node_object(node, ts), ts, dra=self.dra)

    # ------------------------------------------------------------------ DRA objects

    def _publish_dra(self, ts: datetime) -> None:
        """At t = 0: the driver's DeviceClasses, every DRA node's ResourceSlice and the users' claims."""
        if self.dra is None:
            return
        for obj in device_class_objects(self.scenario.start, self.scenario.dra_extended_resources):
            self.dra.apply("deviceclasses", obj)
        for node in self.nodes.values():
            if node.spec.dra:
                self.dra.apply("resourceslices", resource_slice_object(node, self.scenario.start))
        for claim in self.claims.values():
            claim.created = 0.0
            self._dirty_claims.append(claim)
        self._flush_claims(ts, self._dirty_claims)

    def _flush_claims(self, ts: datetime, dirty: list[SimClaim]) -> None:
        """The claims in ``dirty`` as the watcher now sees them (``dirty`` is emptied)."""
        if self.dra is None:
            return
        by_index = self._by_index
        change = DraChange()
        for claim in {c.uid: c for c in dirty}.values():
            devices = slot_devices(self.nodes[claim.node]) if claim.node is not None else []
            obj = claim_object(claim, ts, self.scenario.start, devices, by_index)
            change = change | self.dra.apply("resourceclaims", obj, deleted=claim.deleted)
        dirty.clear()
        self._dra_touched |= change.pods

    def _emit_pods(self, ts: datetime, changed: list[SimPod], records: list[SimulatedRecord]) -> None:
        """The pods' messages: those in ``changed``, and live pods whose GPU demand the claims applied
        since changed (a shared claim's next consumer counts it once its first is gone)."""
        gpu_nodes = set(self.nodes)
        emitted = {p.index: p for p in changed}
        touched = [p for p in self.pods if p.uid in self._dra_touched and p.index not in emitted
                   and p.phase in ("pending", "running")]
        self._dra_touched.clear()
        for pod in sorted([*emitted.values(), *touched], key=lambda p: p.index):
            obj = self._pod_object(pod, ts)
            if self.dra is not None:
                self.dra.track_pod(obj)
            state = pod_to_state(obj, ts, self.config, gpu_nodes, dra=self.dra)
            if state is None:
                continue
            if pod.index not in emitted and pod.state is not None and state.gpu_requests == pod.state.gpu_requests:
                continue  # another pod's claim changed, this one's demand did not
            if pod.deleted:
                state = deleted_state(state, ts)
                if self.dra is not None:
                    self.dra.forget_pod(pod.uid)
            pod.state = state
            records.append(self._encode(K8S_PODS.suffix, pod.uid, state))
            if pod.deleted:
                records.append(SimulatedRecord(K8S_PODS.suffix, self._key(pod.uid), None))

    def _pod_object(self, pod: SimPod, ts: datetime) -> dict[str, Any]:
        return pod_object(pod, ts, self.scenario.start, self.workloads)

    def _workload_object(self, workload: SimWorkload, ts: datetime) -> dict[str, Any]:
        return workload_object(workload, ts, self.scenario.start)

    def _workload_records(self, t: float, ts: datetime) -> list[SimulatedRecord]:
        out: list[SimulatedRecord] = []
        for workload in self.workloads.values():
            spec = workload.spec
            before = workload.phase
            if workload.phase == "new" and spec.create <= t + EPS:
                workload.phase = "queued"
            if workload.phase == "queued" and spec.admit is not None and spec.admit <= t + EPS:
                workload.phase = "admitted"
            if workload.phase in ("queued", "admitted") and spec.delete is not None and spec.delete <= t + EPS:
                workload.phase = "deleted"
            if workload.phase == before or (before == "new" and workload.phase == "deleted"):
                continue
            state = workload_to_state(self._workload_object(workload, ts), ts, self.config)
            if state is None:
                continue
            if workload.phase == "deleted":
                out.append(self._encode(K8S_WORKLOADS.suffix, workload.uid, deleted_workload(state, ts)))
                out.append(SimulatedRecord(K8S_WORKLOADS.suffix, self._key(workload.uid), None))
            else:
                out.append(self._encode(K8S_WORKLOADS.suffix, workload.uid, state))
        return out

    def _create_at(self, pod: SimPod) -> float | None:
        """When a pod is created: its ``create``, counted from its workload's admission if it has one."""
        if pod.spec.workload is None:
            return pod.spec.create
        admit = self.workloads[(pod.spec.namespace, pod.spec.workload)].spec.admit
        return None if admit is None else admit + pod.spec.create

    def _event_object(self, pod: SimPod, ts: datetime) -> dict[str, Any]:
        return event_object(pod, ts, self.scenario.start, self.scenario.name)

    # ------------------------------------------------------------------ the run

    def run(self) -> Iterator[Tick]:
        sc = self.scenario
        poison = sorted(sc.poison, key=lambda p: p.at)
        for i in range(sc.ticks):
            t = i * self.dt
            ts = sc.start + timedelta(seconds=t)
            records: list[SimulatedRecord] = []
            changed: list[SimPod] = []
            if i == 0:
                self._publish_dra(ts)
                for node in self.nodes.values():
                    node_state = self._node_state(node, ts)
                    node.state = node_state
                    if node_state is not None:
                        records.append(self._encode(K8S_NODES.suffix, node.spec.name, node_state))
            records.extend(self._workload_records(t, ts))
            self._lifecycle(t, ts, changed, records)
            records.extend(self._relayouts(t, ts))
            failed = self._schedule(t, changed)
            self._crashloops(t, changed)
            self._flush_claims(ts, self._dirty_claims)
            self._emit_pods(ts, changed, records)
            if self._released_claims:  # the controller acts on the pods' ends after they are seen
                self._flush_claims(ts, self._released_claims)
                self._emit_pods(ts, [], records)
            for pod in failed:
                event = event_to_message(self._event_object(pod, ts))
                if event is not None:
                    records.append(self._encode(K8S_EVENTS.suffix, pod.uid, event))
            records.extend(self._progress(t, ts))
            records.extend(self._samples(t, ts))
            records.extend(self.allocator.records(t, ts, self.pods, self._encode))
            due = [rec for at, rec in self._late if at <= t + EPS]
            self._late = [(at, rec) for at, rec in self._late if at > t + EPS]
            records.extend(due)
            while poison and poison[0].at <= t + EPS:
                bad = poison.pop(0)
                records.append(SimulatedRecord(bad.topic, bad.key, None if bad.value is None else bad.value.encode()))
            yield Tick(t, ts, records)

    def _relayouts(self, t: float, ts: datetime) -> list[SimulatedRecord]:
        """Apply the ``mig_relayout`` changes due at ``t``; a changed node's state is sent again."""
        out = []
        for node in self.nodes.values():
            due = [c for c in node.spec.mig_relayout if t - self.dt < c.at <= t + EPS]
            if node.removed or not due:
                continue
            for change in due:
                gpu = node.gpus[change.gpu]
                new = fake_devices(self.scenario.name, node.spec.name, change.gpu, change.layout, node.spec.memory_gib)
                base = change.gpu * MAX_INSTANCES_PER_GPU
                owners = node.slots[base:base + MAX_INSTANCES_PER_GPU]
                where = f"{node.spec.name}: mig_relayout at {t:g}s on GPU {change.gpu}"
                node.slots[base:base + MAX_INSTANCES_PER_GPU] = relayout_slots(gpu.mig_devices, new, owners, where)
                for pod in self.pods:  # a kept device may move to another slot index
                    if pod.node == node.spec.name and pod.phase == "running":
                        pod.slots = [i for i, owner in enumerate(node.slots) if owner == pod.index]
                gpu.mig_devices = new
                for device in new:
                    device.parent = gpu
            node.slot_res = slot_resources([g.mig_devices for g in node.gpus])
            if node.spec.dra and self.dra is not None:  # the driver publishes the new devices
                node.slice_generation += 1
                self.dra.apply("resourceslices", resource_slice_object(node, self.scenario.start,
                                                                       node.slice_generation))
            node.state = self._node_state(node, ts)
            if node.state is not None:
                out.append(self._encode(K8S_NODES.suffix, node.spec.name, node.state))
        return out

    def _key(self, key: str) -> str:
        return scoped_key(self.scenario.cluster, key)

    def _encode(self, topic: str, key: str, message: Message) -> SimulatedRecord:
        """The record of ``message`` as the scenario's cluster's agent or watcher produces it."""
        if self.scenario.cluster != DEFAULT_CLUSTER:
            message = message.model_copy(update={"cluster": self.scenario.cluster})
        return SimulatedRecord(topic, self._key(key), encode(message))

    def _release(self, pod: SimPod) -> None:
        claim = pod.claim
        if claim is not None and pod.index in claim.reserved and claim.node is not None:
            claim.reserved.remove(pod.index)
            node = self.nodes[claim.node]
            for slot in claim.slots:  # a shared claim's devices stay with its next consumer
                if slot in node.shares:  # a share: the device stays with the other claims' pods
                    if not claim.reserved:
                        node.shares[slot].remove(claim)
                        if not node.shares[slot]:
                            del node.shares[slot]
                    node.slots[slot] = self._share_owner(node, slot)
                else:
                    node.slots[slot] = claim.reserved[0] if claim.reserved else None
            if not claim.reserved:  # the resourceclaim controller deallocates an unused claim
                claim.node, claim.slots = None, []
            self._released_claims.append(claim)
            return
        if pod.node is not None:
            node = self.nodes[pod.node]
            for slot in pod.slots:
                if node.slots[slot] == pod.index:
                    node.slots[slot] = None

    def _end(self, pod: SimPod, t: float, reason: str, changed: list[SimPod], deleted: bool = False) -> None:
        self._release(pod)
        pod.phase, pod.end_reason, pod.ended, pod.deleted = "ended", reason, t, deleted
        changed.append(pod)
        claim = pod.claim
        if claim is not None and claim.for_pod is pod and claim.created is not None and not claim.deleted:
            claim.deleted = True  # the resourceclaim controller deletes a finished pod's generated claim
            self._released_claims.append(claim)

    def _lifecycle(self, t: float, ts: datetime, changed: list[SimPod], records: list[SimulatedRecord]) -> None:
        """Pods created, deleted and finished at ``t``, then nodes removed (their pods evicted)."""
        for pod in self.pods:
            create = self._create_at(pod)
            if pod.phase == "new" and create is not None and create <= t + EPS:
                pod.phase, pod.created = "pending", t
                changed.append(pod)
                if pod.claim is not None and pod.claim.for_pod is pod:  # made from its template
                    pod.claim.created = t
                    self._dirty_claims.append(pod.claim)
        for pod in self.pods:
            if pod.phase in ("pending", "running") and pod.spec.delete is not None and pod.spec.delete <= t + EPS:
                self._end(pod, t, "Deleted", changed, deleted=True)
        for pod in self.pods:
            if (pod.phase == "running" and pod.spec.run_for is not None and pod.scheduled is not None
                    and t - pod.scheduled >= pod.spec.run_for - EPS):
                self._end(pod, t, pod.spec.end, changed)
        for node in self.nodes.values():
            if not node.removed and node.spec.ready_until is not None and node.spec.ready_until <= t + EPS:
                self._remove_node(node, t, ts, changed, records)

    def _remove_node(self, node: SimNode, t: float, ts: datetime, changed: list[SimPod],
                     records: list[SimulatedRecord]) -> None:
        node.removed = True
        if node.spec.dra and self.dra is not None:  # its slice goes with it (owned by the Node)
            self.dra.apply("resourceslices", resource_slice_object(node, self.scenario.start, node.slice_generation),
                           deleted=True)
        if node.state is not None:
            records.append(self._encode(K8S_NODES.suffix, node.spec.name, deleted_node(node.state, ts)))
            records.append(SimulatedRecord(K8S_NODES.suffix, self._key(node.spec.name), None))
        for pod in self.pods:
            if pod.phase == "running" and pod.node == node.spec.name:
                self._end(pod, t, "Evicted", changed)

    def _schedule(self, t: float, changed: list[SimPod]) -> list[SimPod]:
        failed = []
        pending = sorted((p for p in self.pods if p.phase == "pending"), key=lambda p: (p.created, p.index))
        live = [n for n in self.nodes.values() if not n.removed]
        for pod in pending:
            reasons: dict[str, int] = {}
            for node in live:
                why = self._misfit(pod, node, t)
                if why is None:
                    self._place(pod, node, t)
                    changed.append(pod)
                    break
                reasons[why] = reasons.get(why, 0) + 1
            else:
                message = self._unschedulable(live, reasons)
                if message != pod.last_message:
                    pod.last_message = message
                    changed.append(pod)
                    failed.append(pod)
        return failed

    @staticmethod
    def _unschedulable(live: list[SimNode], reasons: dict[str, int]) -> str:
        """kube-scheduler's ``FailedScheduling`` message: each reason with the nodes it rejected."""
        if not live:
            return "no nodes available to schedule pods"
        detail = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
        return f"0/{len(live)} nodes are available: {detail}."

    def _place(self, pod: SimPod, node: SimNode, t: float) -> None:
        """Bind ``pod`` to ``node`` (which fits it): its devices, and its claim's allocation."""
        if pod.claim is None and node.spec.dra and pod.devices > 0:
            pod.claim = self._extended_claim(pod, t)
        claim = pod.claim
        if claim is not None and claim.node is not None:  # a shared claim, already allocated
            taken = list(claim.slots)
        elif claim is not None and claim.spec.memory_gib is not None:  # shares of devices
            taken = self._share_slots(node, claim)[: pod.devices]
            for slot in taken:
                node.shares.setdefault(slot, []).append(claim)
                if node.slots[slot] is None:
                    node.slots[slot] = pod.index
        else:
            free = [i for i, owner in enumerate(node.slots)
                    if owner is None and (node.slot_res is None or node.slot_res[i] == pod.resource)
                    and self._vram_fits(pod, node, i, t)]
            taken = free[: pod.devices]
            for slot in taken:
                node.slots[slot] = pod.index
        if claim is not None:  # the scheduler allocates the claim and reserves it for the pod
            claim.node, claim.slots = node.spec.name, taken
            claim.reserved.append(pod.index)
            self._dirty_claims.append(claim)
        pod.phase, pod.scheduled, pod.node, pod.slots = "running", t, node.spec.name, taken

    def _misfit(self, pod: SimPod, node: SimNode, t: float) -> str | None:
        if pod.spec.node is not None and pod.spec.node != node.spec.name:
            return "node(s) didn't match Pod's node affinity/selector"
        if node.spec.unschedulable:
            return "node(s) were unschedulable"
        if pod.claim is not None:
            return self._claim_misfit(pod, pod.claim, node)
        if pod.spec.gpus == 0:
            return None
        if node.spec.dra:  # its GPUs are published as devices, not as an extended resource
            return self._extended_misfit(pod, node)
        return self._plugin_misfit(pod, node, t)

    def _plugin_misfit(self, pod: SimPod, node: SimNode, t: float) -> str | None:
        """Why a device-plugin node does not fit a pod's extended-resource request."""
        if node.slot_res is not None:
            free = sum(1 for owner, res in zip(node.slots, node.slot_res, strict=True)
                       if owner is None and res == pod.resource)
            return None if free >= pod.spec.gpus else f"Insufficient {pod.resource}"
        if node.spec.resource != pod.resource:
            return f"Insufficient {pod.resource}"
        if pod.spec.vram_request_gib is not None and node.spec.time_slicing > 1:
            roomy = sum(1 for i, owner in enumerate(node.slots) if owner is None and self._vram_fits(pod, node, i, t))
            return None if roomy >= pod.spec.gpus else "Insufficient nvidia.com/gpumem"
        free = sum(1 for owner in node.slots if owner is None)
        return None if free >= pod.spec.gpus else f"Insufficient {pod.resource}"

    def _extended_misfit(self, pod: SimPod, node: SimNode) -> str | None:
        """A DRA node for a pod asking an extended resource: it serves ``nvidia.com/gpu`` through the
        DeviceClass that names it (DRAExtendedResource), if the scenario's class does, from whole GPUs."""
        mig_mode = bool(node.spec.mig) or node.spec.mig_layout is not None
        if not self.scenario.dra_extended_resources or pod.resource != EXTENDED_RESOURCE or mig_mode:
            return f"Insufficient {pod.resource}"
        free = sum(1 for owner in node.slots if owner is None)
        return None if free >= pod.devices else "cannot allocate all claims"

    def _extended_claim(self, pod: SimPod, t: float) -> SimClaim:
        """The claim kube-scheduler makes for a pod's ``nvidia.com/gpu`` served by a DRA node."""
        uid = sim_uid(self.scenario.name, "extended-claim", pod.uid)
        spec = ClaimSpec(name=f"{pod.spec.name}-extended-resources", namespace=pod.spec.namespace,
                         count=pod.spec.gpus)
        return SimClaim(spec, f"{pod.spec.name}-extended-resources-{uid[:5]}", uid, created=t, for_pod=pod,
                        extended=True)

    def _claim_misfit(self, pod: SimPod, claim: SimClaim, node: SimNode) -> str | None:
        """Why the DynamicResources plugin rejects ``node`` for the pod's claim, in its words."""
        if claim.node is not None:
            return None if claim.node == node.spec.name else "resourceclaim not available on the node"
        if not node.spec.dra:
            return "cannot allocate all claims"
        if claim.spec.memory_gib is not None:
            room = len(self._share_slots(node, claim)) if node.spec.dra_shared else 0
            return None if room >= pod.devices else "cannot allocate all claims"
        if node.slot_res is not None:
            free = sum(1 for owner, res in zip(node.slots, node.slot_res, strict=True)
                       if owner is None and res == pod.resource)
        else:
            free = sum(1 for owner in node.slots if owner is None) if node.spec.resource == pod.resource else 0
        return None if free >= pod.devices else "cannot allocate all claims"

    @staticmethod
    def _share_slots(node: SimNode, claim: SimClaim) -> list[int]:
        """A ``dra_shared`` node's units with room for a share of ``claim``'s memory: free ones and
        ones other claims share, lowest-indexed first."""
        need = claim.spec.memory_gib or 0.0
        out = []
        for slot, owner in enumerate(node.slots):
            if slot in node.shares:
                used = sum(c.spec.memory_gib or 0.0 for c in node.shares[slot])
                if used + need <= node.spec.memory_gib + 1e-9:
                    out.append(slot)
            elif owner is None and need <= node.spec.memory_gib + 1e-9:
                out.append(slot)
        return out

    @staticmethod
    def _share_owner(node: SimNode, slot: int) -> int | None:
        """The pod a shared unit is booked to: the first consumer of its first claim still in use."""
        return next((c.reserved[0] for c in node.shares.get(slot, ()) if c.reserved), None)

    def _vram_fits(self, pod: SimPod, node: SimNode, slot: int, t: float) -> bool:
        """On a time-sliced node, whether ``slot``'s GPU has ``pod``'s declared memory free: its size
        minus its tenants' declared needs (their use where they declare none), as HAMi accounts."""
        need = pod.spec.vram_request_gib
        if need is None or node.spec.time_slicing <= 1:
            return True
        per_gpu = node.spec.time_slicing
        gpu = slot // per_gpu
        by_index = self._by_index
        held = 0.0
        for owner in node.slots[gpu * per_gpu:(gpu + 1) * per_gpu]:
            if owner is None or owner == pod.index:
                continue
            tenant = by_index[owner]
            declared = tenant.spec.vram_request_gib
            used = step_value(tenant.spec.memory_gib, t - (tenant.scheduled or t))
            held += declared if declared is not None else used
        return node.spec.memory_gib - held >= need - 1e-9

    def _crashloops(self, t: float, changed: list[SimPod]) -> None:
        for pod in self.pods:
            if pod.phase == "running" and pod.spec.crashloop and pod.scheduled is not None:
                restarts = int((t - pod.scheduled + EPS) // 60.0)
                if restarts != pod.restarts:
                    pod.restarts = restarts
                    changed.append(pod)

    def _progress(self, t: float, ts: datetime) -> list[SimulatedRecord]:
        out = []
        for pod in self.pods:
            if pod.spec.steps_per_s is None or pod.scheduled is None:
                continue
            if pod.phase == "running" or (pod.phase == "ended" and pod.ended is not None and abs(pod.ended - t) < EPS):
                end = t if pod.phase == "running" else (pod.ended or t)
                # a training loop reports whole steps
                steps = 0.0 if pod.spec.crashloop else float(int(pod.spec.steps_per_s * max(end - pod.scheduled, 0.0)
                                                                 + EPS))
                message = WorkloadProgress(pod_uid=pod.uid, namespace=pod.spec.namespace, pod=pod.spec.name, ts=ts,
                                           steps_total=steps)
                out.append(self._encode(WORKLOAD_PROGRESS.suffix, pod.uid, message))
        return out

    # ------------------------------------------------------------------ samples

    def _samples(self, t: float, ts: datetime) -> list[SimulatedRecord]:
        sc = self.scenario
        faults, gaps, late = sc.faults, sc.agent_gaps, sc.late_samples  # a fleet scenario has none
        out = []
        for node in self.nodes.values():
            if node.removed:
                continue
            if faults:
                self._apply_faults(node, t)
            if gaps and any(g.node == node.spec.name and g.start <= t + EPS < g.end for g in gaps):
                continue
            self._dress(node, t)
            sample = node.sampler.sample(ts)
            record = self._encode(GPU_SAMPLES.suffix, node.spec.name, sample)
            delay = next((spec.by for spec in late
                          if spec.node == node.spec.name and abs(spec.at - t) < self.dt / 2), None) if late else None
            if delay is not None:
                self._late.append((t + delay, record))
            else:
                out.append(record)
        return out

    def _apply_faults(self, node: SimNode, t: float) -> None:
        for i, fault in enumerate(self.scenario.faults):
            if fault.node != node.spec.name:
                continue
            gpu = node.gpus[fault.gpu]
            if fault.xid is not None and i not in self._fired_xids and fault.at <= t + EPS:
                self._fired_xids.add(i)
                node.nvml.inject_xid(gpu.uuid, fault.xid)
            if fault.lost:
                gpu.lost = fault.at <= t + EPS and (fault.until is None or t + EPS < fault.until)

    def _load(self, pod: SimPod, t: float, capacity: int, ordinal: int) -> tuple[float, int, int]:
        """(util %, memory bytes, processes) of the pod's ``ordinal``-th device at ``t``."""
        spec = pod.spec
        idle_device = spec.active_gpus is not None and ordinal >= spec.active_gpus
        if spec.crashloop or spec.processes == 0 or pod.scheduled is None or idle_device:
            return 0.0, 0, 0
        offset = t - pod.scheduled
        util = step_value(spec.util, offset)
        mem = min(int(step_value(spec.memory_gib, offset) * GIB), capacity)
        return util, mem, spec.processes

    def _procs(self, pod: SimPod, ordinal: int, util: float, mem: int, count: int, stats: bool,
               resolver: dict[int, ContainerRef]) -> list[FakeProcess]:
        if count == 0:
            return []
        container = self._containers.get(pod.index)
        if container is None or container.pod_uid != pod.uid:
            container = self._containers[pod.index] = ContainerRef(pod.container_id, pod.uid, "containerd")
        first_pid = 100_000 + pod.index * 10_000 + ordinal * 100
        share_util = util / count if stats else None
        procs = []
        for j in range(count):
            pid = first_pid + j
            share_mem = mem // count + (mem % count if j == 0 else 0)
            procs.append(FakeProcess(pid, share_mem if stats else None, share_util))
            resolver[pid] = container
        return procs

    def _dress_key(self, node: SimNode, t: float) -> tuple[Any, ...] | None:
        """Everything a device-plugin node's dressing at ``t`` depends on: which pod holds each unit,
        and each holder's uid, start, units and load steps in force. Equal keys, equal dressings (what
        ``_dress_gpu``, ``_load``, ``_procs`` and ``_pod_ref`` read: the node's spec and GPUs do not
        change while it runs). None where a dressing depends on more (DRA devices and claims, MIG
        layouts, shared units): such a node is dressed at every tick."""
        spec = node.spec
        if spec.dra or spec.mig or spec.mig_layout is not None or node.shares:
            return None
        by_index = self._by_index
        holders: list[tuple[Any, ...]] = []
        for owner in dict.fromkeys(node.slots):
            if owner is None:
                continue
            pod = by_index[owner]
            if pod.claim is not None:
                return None
            if pod.scheduled is None:
                holders.append((owner, pod.uid, None, tuple(pod.slots)))
                continue
            offset = t - pod.scheduled
            holders.append((owner, pod.uid, pod.scheduled, tuple(pod.slots), step_value(pod.spec.util, offset),
                            step_value(pod.spec.memory_gib, offset)))
        return (tuple(node.slots), *holders)

    def _dress(self, node: SimNode, t: float) -> None:
        """Set the fake GPUs, the kubelet's assignments and the process map for this tick (unless they
        stand as the last tick set them: nothing they depend on changed since, see :meth:`_dress_key`;
        nothing else sets them, and the fake NVML, the kubelet and the sampler only read them)."""
        key = self._dress_key(node, t)
        if key is not None and self._dressed.get(node.spec.name) == key:
            return
        self._dressed.pop(node.spec.name, None)
        self._dress_all(node, t)
        if key is not None:
            self._dressed[node.spec.name] = key

    def _dress_all(self, node: SimNode, t: float) -> None:
        spec = node.spec
        mig_mode = bool(spec.mig) or spec.mig_layout is not None
        per_gpu = spec.mig_per_gpu if mig_mode else spec.time_slicing
        tick = _Dressing(t=t, by_index=self._by_index,
                         devices=slot_devices(node) if spec.dra else [])
        slots = node.slots
        for gpu in node.gpus:
            first = gpu.index * per_gpu
            owners = slots[first:first + per_gpu]
            if not mig_mode and per_gpu == 1 and owners[0] is None:  # an idle whole GPU
                gpu.gpu_util_pct = gpu.mem_util_pct = 0.0
                gpu.mem_used_bytes = 0
                gpu.processes = []
                gpu.power_w, gpu.temperature_c = _IDLE_POWER_W, _IDLE_TEMPERATURE_C
                continue
            if mig_mode:
                self._dress_mig(node, gpu, owners, per_gpu, tick)
            else:
                self._dress_gpu(node, gpu, owners, per_gpu, tick)
        node.resources.set(tick.mapping)
        if spec.dra:
            node.resources.set_dra(tick.dra)
        node.sampler.processes = StaticProcessResolver(tick.resolver)

    def _dress_mig(self, node: SimNode, gpu: FakeGpu, owners: list[int | None], per_gpu: int,
                   tick: _Dressing) -> None:
        """A MIG-mode GPU's devices: each one's pods, memory and processes."""
        spec = node.spec
        for k, mig in enumerate(gpu.mig_devices):
            owner = owners[k]
            mig.processes, mig.mem_used_bytes = [], 0
            if owner is None:
                continue
            slot = gpu.index * per_gpu + k
            mig_refs = []
            for pod in self._holders(node, slot, owner, tick.by_index):
                ordinal = pod.slots.index(slot)
                _util, mem, count = self._load(pod, tick.t, mig.mem_total_bytes - mig.mem_used_bytes, ordinal)
                mig.mem_used_bytes += mem
                mig.processes += self._procs(pod, ordinal, 0.0, mem, count, spec.process_stats, tick.resolver)
                mig_refs.append(self._pod_ref(pod))
                if spec.dra:
                    tick.dra.append(self._allocation(node, pod, slot, tick.devices[slot]))
            if not spec.dra:
                tick.mapping[mig.uuid] = mig_refs

    def _dress_gpu(self, node: SimNode, gpu: FakeGpu, owners: list[int | None], per_gpu: int,
                   tick: _Dressing) -> None:
        """A whole (or time-sliced) GPU: its pods, their load, its processes and readings."""
        spec = node.spec
        dra, stats, t, resolver, by_index = spec.dra, spec.process_stats, tick.t, tick.resolver, tick.by_index
        util_sum, mem_sum = 0.0, 0
        procs: list[FakeProcess] = []
        refs: list[PodRef] = []
        first = gpu.index * per_gpu
        for k, owner in enumerate(owners):
            if owner is None:
                continue
            slot = first + k
            for pod in self._holders(node, slot, owner, by_index):
                ordinal = pod.slots.index(slot)
                util, mem, count = self._load(pod, t, gpu.mem_total_bytes - mem_sum, ordinal)
                util_sum += util
                mem_sum += mem
                if count:
                    procs += self._procs(pod, ordinal, util, mem, count, stats, resolver)
                ref = self._pod_ref(pod)
                if not refs or ref not in refs:
                    refs.append(ref)
                if dra:
                    tick.dra.append(self._allocation(node, pod, slot, tick.devices[slot]))
        gpu_util = gpu.gpu_util_pct = util_sum if util_sum < 100.0 else 100.0  # min(100.0, util_sum)
        mem_util = util_sum * 0.6
        gpu.mem_util_pct = mem_util if mem_util < 100.0 else 100.0
        gpu.mem_used_bytes = mem_sum
        gpu.processes = procs
        gpu.power_w = _IDLE_POWER_W + _POWER_W_PER_PCT * gpu_util
        gpu.temperature_c = _IDLE_TEMPERATURE_C + _TEMPERATURE_C_PER_PCT * gpu_util
        if refs and not dra:  # a DRA device is reported as the claim's, not the device plugin's
            tick.mapping[gpu.uuid] = refs

    def _pod_ref(self, pod: SimPod) -> PodRef:
        ref = self._refs.get(pod.index)
        if ref is None or ref.pod_uid != pod.uid:  # the API server simulator gives a pod the server's uid
            ref = self._refs[pod.index] = PodRef(namespace=pod.spec.namespace, pod=pod.spec.name, container="main",
                                                 pod_uid=pod.uid)
        return ref

    @staticmethod
    def _holders(node: SimNode, slot: int, owner: int, by_index: dict[int, SimPod]) -> list[SimPod]:
        """The pods using a unit held by pod ``owner``: every consumer of the claims holding shares of
        it, or of a shared claim; else the pod."""
        if slot in node.shares:
            return [by_index[i] for claim in node.shares[slot] for i in claim.reserved]
        claim = by_index[owner].claim
        if claim is not None and owner in claim.reserved:
            return [by_index[i] for i in claim.reserved]
        return [by_index[owner]]

    @staticmethod
    def _allocation(node: SimNode, pod: SimPod, slot: int, device: str | None) -> DraAllocation:
        """A DRA device of the pod's claim as the kubelet reports it (PodResources ``dynamic_resources``)."""
        claim = pod.claim
        assert claim is not None and device is not None, "a DRA node's unit is held through a claim"
        return DraAllocation(driver=DRA_DRIVER, pool=node.spec.name, device=device, namespace=pod.spec.namespace,
                             pod=pod.spec.name, container="main", claim_namespace=claim.spec.namespace,
                             claim_name=claim.name, cdi_ids=[f"k8s.{DRA_DRIVER}/claim={claim.uid}-{device}"],
                             share_id=share_id(claim, slot) if claim.spec.memory_gib is not None else None)

    def pod_uids(self) -> dict[int, str]:
        """Scenario pod index -> the uid its records carry (what names a report row)."""
        return {pod.index: pod.uid for pod in self.pods}
