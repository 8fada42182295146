"""Kubernetes objects of the simulated fleet, built as the API server serves them.

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

from producers.watcher.vram import VRAM_ANNOTATION
from producers.watcher.workloads import QUEUE_LABEL
from simulation.fleet_state import SimNode, SimPod, SimWorkload
from simulation.scenario_file import OWNER_API_VERSIONS

GIB = 2**30
GANG_LABEL = "scheduling.x-k8s.io/pod-group"
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
    amount = {pod.resource: str(spec.gpus)} if spec.gpus > 0 else {}
    pod_spec: dict[str, Any] = {
        "schedulerName": "default-scheduler",
        "containers": [{"name": "main", "image": spec.image, "resources": {"requests": amount, "limits": amount}}],
    }
    if spec.node:
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": spec.node}
    if pod.node:
        pod_spec["nodeName"] = pod.node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _pod_metadata(pod, start, workloads), "spec": pod_spec,
            "status": _pod_status(pod, ts, start)}


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
