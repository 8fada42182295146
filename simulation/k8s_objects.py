"""Kubernetes objects of the simulated fleet, built as the API server serves them.

DRA objects (``resource.k8s.io/v1``) are NVIDIA's DRA driver's: its DeviceClasses, one
ResourceSlice per DRA node (pool = the node's name; a device per GPU, or per MIG device, named and
attributed as the driver does: ``type``, ``uuid``, ``productName``, ``profile``, ``parentUUID``, a
``memory`` capacity), ResourceClaims with the scheduler's allocation in their status, and
ResourceClaimTemplates.

Why plain functions apart from :class:`simulation.simulator.FleetSimulator`: the watcher's own
translation (``producers.watcher.translate``) reads them, and ``simulation.kube_replay`` writes the
same objects to a real kube-apiserver; what a Node, Pod, Workload or Event looks like is one
concern, when the fleet changes is another. Nothing is random: uids derive from names.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from producers.agent.fake_nvml import FakeGpu, FakeMigDevice
from producers.watcher.vram import VRAM_ANNOTATION
from producers.watcher.workloads import QUEUE_LABEL
from simulation.fleet_state import SimClaim, SimNode, SimPod, SimWorkload
from simulation.scenario import ClaimSpec
from simulation.scenario_file import OWNER_API_VERSIONS

GIB = 2**30
GANG_LABEL = "scheduling.x-k8s.io/pod-group"
DRA_API = "resource.k8s.io/v1"
DRA_DRIVER = "gpu.nvidia.com"
"""NVIDIA's DRA driver: the name of its driver, and of its DeviceClass for whole GPUs."""
POD_CLAIM = "gpus"
"""The name a simulated pod gives its claim (``spec.resourceClaims[].name``), and the claim's request."""
EXTENDED_RESOURCE = "nvidia.com/gpu"
EXTENDED_REQUEST = "container-0-request-0"
"""The request of the claim kube-scheduler makes for a container's extended resource (its first)."""
_NS = uuidlib.UUID("6f1c2a55-0d7e-4c83-9a7e-3b2f5c1d9e40")


def sim_uid(*parts: str) -> str:
    """A stable uid for a simulated object, from its names."""
    return str(uuidlib.uuid5(_NS, "/".join(parts)))


def iso_z(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


def node_object(node: SimNode, start: datetime) -> dict[str, Any]:
    spec = node.spec
    labels = {
        "kubernetes.io/hostname": spec.name,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": spec.model.replace(" ", "-"),
        "nvidia.com/gpu.memory": str(int(spec.memory_gib * 1024)),
        "nvidia.com/gpu.count": str(spec.gpus),
        "nvidia.com/cuda.driver-version.full": spec.driver,
        "nvidia.com/cuda.runtime-version.full": spec.cuda,
    } | spec.labels
    if spec.mig or node.slot_res is not None:
        labels["nvidia.com/mig.strategy"] = "mixed"
    amount = {spec.resource: str(spec.units)}
    if node.slot_res is not None:
        amount = {res: str(node.slot_res.count(res)) for res in sorted({r for r in node.slot_res if r})}
    if spec.dra:  # the DRA driver publishes the GPUs: no device plugin advertises them
        amount = {}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name, "uid": node.uid, "labels": labels,
                     "creationTimestamp": iso_z(start)},
        "spec": {"unschedulable": spec.unschedulable} if spec.unschedulable else {},
        "status": {
            "capacity": amount, "allocatable": amount,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastTransitionTime": iso_z(start)}],
        },
    }


_EXIT = {"Succeeded": (0, "Completed"), "Failed": (1, "Error"), "OOMKilled": (137, "OOMKilled"),
         "Evicted": (137, "Error")}
"""A finished container's exit code and reason by the pod's end."""


def pod_object(pod: SimPod, ts: datetime, start: datetime,
               workloads: Mapping[tuple[str, str], SimWorkload]) -> dict[str, Any]:
    spec = pod.spec
    claim = pod.claim
    requested = claim is None or claim.extended
    amount = {pod.resource: str(spec.gpus)} if spec.gpus > 0 and requested else {}
    resources: dict[str, Any] = {"requests": amount, "limits": amount}
    pod_spec: dict[str, Any] = {
        "schedulerName": "default-scheduler",
        "containers": [{"name": "main", "image": spec.image, "resources": resources}],
    }
    if pod.claim is not None and not pod.claim.extended:
        resources["claims"] = [{"name": POD_CLAIM}]
        source = "resourceClaimTemplateName" if pod.claim.spec.template else "resourceClaimName"
        pod_spec["resourceClaims"] = [{"name": POD_CLAIM, source: pod.claim.spec.name}]
    if spec.node:
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": spec.node}
    if pod.node:
        pod_spec["nodeName"] = pod.node
    status = _pod_status(pod, ts, start)
    if claim is not None and claim.extended:  # the scheduler's record of the claim it made
        status["extendedResourceClaimStatus"] = {
            "requestMappings": [{"containerName": "main", "resourceName": EXTENDED_RESOURCE,
                                 "requestName": EXTENDED_REQUEST}],
            "resourceClaimName": claim.name}
    elif claim is not None and claim.spec.template:  # the resourceclaim controller's record
        status["resourceClaimStatuses"] = [{"name": POD_CLAIM, "resourceClaimName": claim.name}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _pod_metadata(pod, start, workloads), "spec": pod_spec,
            "status": status}


def _pod_metadata(pod: SimPod, start: datetime, workloads: Mapping[tuple[str, str], SimWorkload]) -> dict[str, Any]:
    spec = pod.spec
    labels = dict(spec.labels)
    if spec.gang:
        labels[GANG_LABEL] = spec.gang
    meta: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace, "uid": pod.uid, "labels": labels,
                            "creationTimestamp": iso_z(start + timedelta(seconds=pod.created or 0.0))}
    if spec.owner is not None:
        kind, name = spec.owner
        owner_uid = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpulens-sim/{spec.namespace}/{kind}/{name}")
        meta["ownerReferences"] = [{"apiVersion": OWNER_API_VERSIONS[kind], "kind": kind, "name": name,
                                    "uid": str(owner_uid), "controller": True}]
    elif spec.workload is not None:
        workload = workloads[(spec.namespace, spec.workload)]
        labels[QUEUE_LABEL] = workload.spec.queue
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": spec.workload,
                                    "uid": workload.job_uid, "controller": True}]
    if spec.vram_request_gib is not None:
        meta["annotations"] = {VRAM_ANNOTATION: str(int(spec.vram_request_gib * GIB))}
    if pod.deleted and pod.ended is not None:
        meta["deletionTimestamp"] = iso_z(start + timedelta(seconds=pod.ended))
    return meta


def _pod_status(pod: SimPod, ts: datetime, start: datetime) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending", "conditions": []}
    if pod.scheduled is None:
        if pod.last_message:
            status["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                         "message": pod.last_message, "lastTransitionTime": iso_z(ts)})
        return status
    sched = start + timedelta(seconds=pod.scheduled)
    status["startTime"] = iso_z(sched)
    status["conditions"].append({"type": "PodScheduled", "status": "True", "lastTransitionTime": iso_z(sched)})
    finished = pod.end_reason if pod.phase == "ended" and not pod.deleted else None
    if finished is None:
        status["phase"] = "Running"
    else:
        status["phase"] = "Succeeded" if finished == "Succeeded" else "Failed"
        if finished == "Evicted":
            status["reason"] = "Evicted"
            status["message"] = "The node was removed."
    status["containerStatuses"] = [_container_status(pod, start, sched, finished)]
    return status


def _container_status(pod: SimPod, start: datetime, sched: datetime, finished: str | None) -> dict[str, Any]:
    image = pod.spec.image
    cstatus: dict[str, Any] = {"name": "main", "image": image, "imageID": image,
                               "containerID": f"containerd://{pod.container_id}", "restartCount": pod.restarts}
    if finished is not None:
        code, reason = _EXIT[finished]
        return cstatus | {"ready": False, "state": {"terminated": {
            "reason": reason, "exitCode": code, "startedAt": iso_z(sched),
            "finishedAt": iso_z(start + timedelta(seconds=pod.ended or 0.0))}}}
    if pod.spec.crashloop:
        cstatus |= {"ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
        if pod.restarts:
            last = sched + timedelta(seconds=60.0 * pod.restarts)
            cstatus["lastState"] = {"terminated": {"reason": "Error", "exitCode": 1,
                                                   "startedAt": iso_z(last - timedelta(seconds=50)),
                                                   "finishedAt": iso_z(last)}}
        return cstatus
    return cstatus | {"ready": True, "state": {"running": {"startedAt": iso_z(sched)}}}


def workload_object(workload: SimWorkload, ts: datetime, start: datetime) -> dict[str, Any]:
    """The Workload Kueue creates for a suspended Job, as the API server serves it."""
    spec = workload.spec
    meta: dict[str, Any] = {
        "name": spec.name, "namespace": spec.namespace, "uid": workload.uid, "labels": dict(spec.labels),
        "creationTimestamp": iso_z(start + timedelta(seconds=spec.create)),
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": spec.name, "uid": workload.job_uid,
                             "controller": True, "blockOwnerDeletion": True}],
    }
    if workload.phase == "deleted":
        meta["deletionTimestamp"] = iso_z(ts)
    pod_sets = [{"name": s.name, "count": s.count, "template": {"spec": {"containers": [{
        "name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "resources": {"requests": {s.resource: str(s.gpus)}, "limits": {s.resource: str(s.gpus)}}}]}}}
        for s in spec.pod_sets]
    status: dict[str, Any] = {}
    if spec.admit is not None and workload.phase in ("admitted", "deleted") and ts >= start + timedelta(
            seconds=spec.admit):
        admitted = iso_z(start + timedelta(seconds=spec.admit))
        status["admission"] = {"clusterQueue": "cluster-queue", "podSetAssignments": [
            {"name": s.name, "count": s.count, "flavors": {s.resource: "default-flavor"}} for s in spec.pod_sets]}
        status["conditions"] = [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "lastTransitionTime": admitted,
             "message": "Quota reserved in ClusterQueue cluster-queue"},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "lastTransitionTime": admitted,
             "message": "The workload is admitted"}]
    else:
        first = spec.pod_sets[0]
        reason = spec.reason or (f"couldn't assign flavors to pod set {first.name}: insufficient unused quota "
                                 f"for {first.resource} in flavor default-flavor, {spec.gpus} more needed")
        status["conditions"] = [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                 "message": reason, "lastTransitionTime": meta["creationTimestamp"]}]
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "metadata": meta,
            "spec": {"queueName": spec.queue, "podSets": pod_sets, "active": True}, "status": status}


def event_object(pod: SimPod, ts: datetime, start: datetime, scenario_name: str) -> dict[str, Any]:
    pod.event_count += 1
    spec = pod.spec
    first = start + timedelta(seconds=pod.created or 0.0)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{spec.name}.{pod.event_count:x}", "namespace": spec.namespace,
                     "uid": sim_uid(scenario_name, "event", pod.uid, str(pod.event_count)),
                     "creationTimestamp": iso_z(ts)},
        "involvedObject": {"kind": "Pod", "name": spec.name, "namespace": spec.namespace, "uid": pod.uid,
                           "apiVersion": "v1"},
        "reason": "FailedScheduling", "message": pod.last_message, "type": "Warning",
        "firstTimestamp": iso_z(first), "lastTimestamp": iso_z(ts), "count": pod.event_count,
        "source": {"component": "default-scheduler"}, "reportingComponent": "default-scheduler",
    }


# --------------------------------------------------------------------------- DRA (resource.k8s.io/v1)

_ARCHITECTURES = {"H100": "Hopper", "H200": "Hopper", "A100": "Ampere", "A30": "Ampere", "L40": "Ada Lovelace",
                  "B200": "Blackwell"}


def _quantity(nbytes: int) -> str:
    return f"{nbytes // GIB}Gi" if nbytes % GIB == 0 else str(nbytes)


def _semver(version: str) -> str:
    """A driver attribute of type version is semver: ``12.4`` is published as ``12.4.0``."""
    parts = version.split(".")
    return ".".join([*parts, "0", "0"][:3]) if all(p.isdigit() for p in parts) else version


def device_class_objects(start: datetime, extended_resources: bool = False) -> list[dict[str, Any]]:
    """The DeviceClasses NVIDIA's DRA driver installs: whole GPUs and MIG devices; with
    ``extended_resources`` the whole GPUs' class serves ``nvidia.com/gpu`` requests (DRAExtendedResource)."""
    out = []
    for name, kind in ((DRA_DRIVER, "gpu"), ("mig.nvidia.com", "mig")):
        expression = f"device.driver == '{DRA_DRIVER}' && device.attributes['{DRA_DRIVER}'].type == '{kind}'"
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
        if extended_resources and kind == "gpu":
            spec["extendedResourceName"] = EXTENDED_RESOURCE
        out.append({"apiVersion": DRA_API, "kind": "DeviceClass",
                    "metadata": {"name": name, "uid": sim_uid("deviceclass", name), "creationTimestamp": iso_z(start)},
                    "spec": spec})
    return out


def dra_device_name(gpu: FakeGpu, mig: FakeMigDevice | None) -> str:
    """The driver's device name: ``gpu-<index>``, a MIG device ``gpu-<index>-mig-<profile>-<start>``."""
    if mig is None:
        return f"gpu-{gpu.index}"
    start = mig.placement_start if mig.placement_start is not None else mig.gpu_instance_id
    return f"gpu-{gpu.index}-mig-{mig.profile.replace('.', '')}-{start}"


def slot_devices(node: SimNode) -> list[str | None]:
    """The DRA device name of each of a node's units (the simulator's slots; None: no device there)."""
    spec = node.spec
    if not (spec.mig or spec.mig_layout is not None):
        return [dra_device_name(gpu, None) for gpu in node.gpus]
    out: list[str | None] = []
    for gpu in node.gpus:
        names: list[str | None] = [dra_device_name(gpu, mig) for mig in gpu.mig_devices]
        out += [*names, *[None] * spec.mig_per_gpu][:spec.mig_per_gpu]
    return out


def _gpu_device(node: SimNode, gpu: FakeGpu) -> dict[str, Any]:
    spec = node.spec
    attributes: dict[str, Any] = {
        "type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, "index": {"int": gpu.index},
        "minor": {"int": gpu.index}, "productName": {"string": gpu.model}, "brand": {"string": "Nvidia"},
        "driverVersion": {"version": _semver(spec.driver)}, "cudaDriverVersion": {"version": _semver(spec.cuda)},
    }
    arch = next((a for key, a in _ARCHITECTURES.items() if key in gpu.model), None)
    if arch is not None:
        attributes["architecture"] = {"string": arch}
    memory: dict[str, Any] = {"value": _quantity(gpu.mem_total_bytes)}
    device: dict[str, Any] = {"name": dra_device_name(gpu, None), "attributes": attributes,
                              "capacity": {"memory": memory}}
    if spec.dra_shared:  # consumable capacity: claims take shares of its memory
        device["allowMultipleAllocations"] = True
        memory["requestPolicy"] = {"default": memory["value"],
                                   "validRange": {"min": "1Mi", "max": memory["value"]}}
    return device


def _mig_device(node: SimNode, gpu: FakeGpu, mig: FakeMigDevice) -> dict[str, Any]:
    spec = node.spec
    attributes: dict[str, Any] = {
        "type": {"string": "mig"}, "uuid": {"string": mig.uuid}, "profile": {"string": mig.profile},
        "parentUUID": {"string": gpu.uuid}, "parentIndex": {"int": gpu.index}, "parentMinor": {"int": gpu.index},
        "productName": {"string": gpu.model}, "brand": {"string": "Nvidia"},
        "driverVersion": {"version": _semver(spec.driver)}, "cudaDriverVersion": {"version": _semver(spec.cuda)},
    }
    return {"name": dra_device_name(gpu, mig), "attributes": attributes,
            "capacity": {"memory": {"value": _quantity(mig.mem_total_bytes)}}}


def resource_slice_object(node: SimNode, start: datetime, generation: int = 1) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's driver publishes for a DRA node: its GPUs, or its MIG devices."""
    spec = node.spec
    mig_mode = bool(spec.mig) or spec.mig_layout is not None
    devices = [_mig_device(node, gpu, mig) for gpu in node.gpus for mig in gpu.mig_devices] if mig_mode else [
        _gpu_device(node, gpu) for gpu in node.gpus]
    return {
        "apiVersion": DRA_API, "kind": "ResourceSlice",
        "metadata": {"name": f"{spec.name}-{DRA_DRIVER}-{(node.slice_uid or node.uid)[:5]}",
                     "uid": node.slice_uid or sim_uid("slice", node.uid), "creationTimestamp": iso_z(start),
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": node.uid,
                                          "controller": True}]},
        "spec": {"driver": DRA_DRIVER, "nodeName": spec.name,
                 "pool": {"name": spec.name, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }


def _device_requests(spec: ClaimSpec, request: str = POD_CLAIM) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": spec.device_class, "allocationMode": "ExactCount",
                               "count": spec.count}
    if spec.profile is not None:
        exactly["selectors"] = [{"cel": {"expression": f"device.attributes['{DRA_DRIVER}'].profile == "
                                                       f"'{spec.profile}'"}}]
    if spec.memory_gib is not None:
        exactly["capacity"] = {"requests": {"memory": _quantity(int(spec.memory_gib * GIB))}}
    return {"requests": [{"name": request, "exactly": exactly}]}


def share_id(claim: SimClaim, slot: int) -> str:
    """The share of a device a consumable-capacity claim holds (``shareID``; PodResources ``share_id``)."""
    return sim_uid("share", claim.uid, str(slot))


def claim_template_object(spec: ClaimSpec, scenario_name: str, start: datetime) -> dict[str, Any]:
    return {"apiVersion": DRA_API, "kind": "ResourceClaimTemplate",
            "metadata": {"name": spec.name, "namespace": spec.namespace,
                         "uid": sim_uid(scenario_name, "claimtemplate", spec.namespace, spec.name),
                         "creationTimestamp": iso_z(start)},
            "spec": {"spec": {"devices": _device_requests(spec)}}}


def claim_object(claim: SimClaim, ts: datetime, start: datetime, devices: list[str | None],
                 pods: Mapping[int, SimPod]) -> dict[str, Any]:
    """A ResourceClaim as served: the scheduler's allocation (``devices``: the device name of each
    unit of its node) and the pods it is reserved for in its status."""
    spec = claim.spec
    request = EXTENDED_REQUEST if claim.extended else POD_CLAIM
    meta: dict[str, Any] = {"name": claim.name, "namespace": spec.namespace, "uid": claim.uid,
                            "creationTimestamp": iso_z(start + timedelta(seconds=claim.created or 0.0))}
    if claim.for_pod is not None:
        pod = claim.for_pod
        meta["generateName"] = f"{pod.spec.name}-{'extended-resources' if claim.extended else POD_CLAIM}-"
        if not claim.extended:
            meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": POD_CLAIM}
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod.spec.name, "uid": pod.uid,
                                    "controller": True, "blockOwnerDeletion": True}]
    if claim.deleted:
        meta["deletionTimestamp"] = iso_z(ts)
    status: dict[str, Any] = {}
    if claim.node is not None:
        results: list[dict[str, Any]] = [
            {"request": request, "driver": DRA_DRIVER, "pool": claim.node, "device": devices[slot]}
            for slot in claim.slots]
        if spec.memory_gib is not None:  # a share of each device (consumable capacity)
            for slot, result in zip(claim.slots, results, strict=True):
                result["shareID"] = share_id(claim, slot)
                result["consumedCapacity"] = {"memory": _quantity(int(spec.memory_gib * GIB))}
        status["allocation"] = {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [claim.node]}]}]}}
    if claim.reserved:
        status["reservedFor"] = [{"resource": "pods", "name": pods[i].spec.name, "uid": pods[i].uid}
                                 for i in claim.reserved]
    return {"apiVersion": DRA_API, "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": _device_requests(spec, request)}, "status": status}
