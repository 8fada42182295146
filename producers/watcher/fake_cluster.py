"""Realistic pod, node and event JSON, and a small GPU cluster that changes over time.

``gpulens watch --simulate`` and the watcher's tests need Kubernetes objects shaped like the real
ones (GPU feature discovery labels, device-plugin resources, owner references, container statuses,
scheduler events), and a cluster that does what clusters do: pods wait, get scheduled, run, crash,
finish and are deleted. The builders here return plain dicts in the API server's camelCase JSON;
:class:`SimulatedCluster` plays a scripted, seeded churn against a :class:`FakeApiServer`.
kube-scheduler's part is shaped and worded as the real one writes it (its events through
``events.k8s.io/v1``, its ``Unschedulable`` condition, :func:`no_fit_message`):
``tests/watcher/test_real_scheduler.py`` holds them to what the real scheduler writes.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.kube_json import JsonObject


def iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_node(name: str, gpus: int = 8, product: str = "NVIDIA-A100-SXM4-80GB", memory_mib: int = 81920,
              ready: bool = True, mig_strategy: str = "none", extra_resources: dict[str, int] | None = None,
              taints: list[JsonObject] | None = None, unschedulable: bool = False) -> JsonObject:
    resources = {"cpu": "96", "memory": "1056742976Ki", "pods": "110", "ephemeral-storage": "1844Gi"}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    for resource, amount in (extra_resources or {}).items():
        resources[resource] = str(amount)
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "p4d"}
    if gpus or extra_resources:
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.memory": str(memory_mib),
            "nvidia.com/gpu.count": str(gpus or 1),
            "nvidia.com/cuda.driver-version.full": "550.54.15",
            "nvidia.com/cuda.runtime-version.full": "12.4",
            "nvidia.com/mig.strategy": mig_strategy,
        }
    return {
        "metadata": {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)), "labels": labels},
        "spec": {"taints": taints or [], "unschedulable": unschedulable} if taints or unschedulable else {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "Ready", "status": "True" if ready else "False",
                 "reason": "KubeletReady" if ready else "KubeletNotReady"},
            ],
            "nodeInfo": {"kubeletVersion": "v1.30.2", "containerRuntimeVersion": "containerd://1.7.13"},
        },
    }


def make_pod(name: str, namespace: str = "ml", gpus: int = 1, resource: str = "nvidia.com/gpu",
             created: datetime | None = None, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, owner: tuple[str, str, str] | None = None,
             image: str = "nvcr.io/nvidia/pytorch:24.03-py3", uid: str | None = None) -> JsonObject:
    """A pending, unscheduled pod; ``owner`` is (apiVersion, kind, name)."""
    created = created or datetime.now(UTC)
    resources = {"limits": {resource: str(gpus), "cpu": "8", "memory": "64Gi"},
                 "requests": {resource: str(gpus), "cpu": "8", "memory": "64Gi"}} if gpus else {
        "requests": {"cpu": "1"}}
    meta: JsonObject = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                 "creationTimestamp": iso(created), "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner:
        meta["ownerReferences"] = [{"apiVersion": owner[0], "kind": owner[1], "name": owner[2],
                                    "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, owner[2])),
                                    "controller": True, "blockOwnerDeletion": True}]
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "image": image, "resources": resources}],
                 "restartPolicy": "Never", "schedulerName": "default-scheduler"},
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def set_unschedulable(pod: JsonObject, message: str, at: datetime) -> None:
    """The condition kube-scheduler writes on a pod no node fits (``message`` its FailedScheduling text)."""
    pod["status"]["conditions"] = [{"type": "PodScheduled", "observedGeneration": 1, "status": "False",
                                    "lastProbeTime": None, "lastTransitionTime": iso(at), "reason": "Unschedulable",
                                    "message": message}]


def set_running(pod: JsonObject, node: str, at: datetime) -> None:
    pod["spec"]["nodeName"] = node
    status = pod["status"]
    status["phase"] = "Running"
    status["startTime"] = iso(at)
    status["hostIP"] = "10.0.0.10"
    status["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(at)},
        {"type": "Initialized", "status": "True", "lastTransitionTime": iso(at)},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": iso(at)},
        {"type": "Ready", "status": "True", "lastTransitionTime": iso(at)},
    ]
    container = pod["spec"]["containers"][0]
    status["containerStatuses"] = [{
        "name": container["name"], "image": container["image"], "imageID": container["image"] + "@sha256:0",
        "containerID": "containerd://" + uuid.uuid4().hex + uuid.uuid4().hex, "ready": True, "restartCount": 0,
        "started": True, "state": {"running": {"startedAt": iso(at)}}, "lastState": {},
    }]


def set_finished(pod: JsonObject, at: datetime, exit_code: int = 0, reason: str = "Completed") -> None:
    status = pod["status"]
    status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
    for container in status.get("containerStatuses", []):
        started = container.get("state", {}).get("running", {}).get("startedAt", iso(at))
        container["ready"] = False
        container["state"] = {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": started,
                                             "finishedAt": iso(at), "containerID": container.get("containerID")}}
    for condition in status.get("conditions", []):
        if condition["type"] in ("Ready", "ContainersReady"):
            condition["status"] = "False"
            condition["reason"] = "PodCompleted"
            condition["lastTransitionTime"] = iso(at)


SCHEDULER = "default-scheduler"
SCHEDULER_ACTIONS = {"FailedScheduling": "Scheduling", "Scheduled": "Binding"}
"""kube-scheduler's event reasons and the ``action`` it writes with each."""


def make_event(pod: JsonObject, reason: str, message: str, at: datetime, type_: str = "Warning",
               component: str = SCHEDULER, count: int = 1) -> JsonObject:
    """A core/v1 Event about ``pod``. kube-scheduler's own (``FailedScheduling``, ``Scheduled``) are
    shaped as it writes them through ``events.k8s.io/v1`` and the server serves them as core/v1: an
    ``eventTime`` in microseconds, its ``action``, ``reportingInstance`` ``default-scheduler-<host>``,
    an empty ``source`` and no ``count`` or first/last timestamps (a repeat is a ``series``); others
    (a kubelet's) in the legacy shape, with ``source``, ``count`` and first/last timestamps."""
    meta = pod["metadata"]
    event: JsonObject = {
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta.get("namespace", "default"),
                     "uid": str(uuid.uuid4()), "creationTimestamp": iso(at)},
        "involvedObject": {"kind": "Pod", "namespace": meta.get("namespace"), "name": meta["name"],
                           "uid": meta["uid"], "apiVersion": "v1"},
        "reason": reason, "message": message, "type": type_,
    }
    if component == SCHEDULER and reason in SCHEDULER_ACTIONS:
        return event | {
            "source": {}, "firstTimestamp": None, "lastTimestamp": None,
            "eventTime": at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "action": SCHEDULER_ACTIONS[reason],
            "reportingComponent": component, "reportingInstance": f"{component}-control-plane",
            **({"series": {"count": count, "lastObservedTime": iso(at)}} if count > 1 else {}),
        }
    return event | {"count": count, "firstTimestamp": iso(at), "lastTimestamp": iso(at),
                    "source": {"component": component}, "reportingComponent": component, "reportingInstance": ""}


def _histogram(counts: Mapping[str, int]) -> str:
    """Reasons with their node counts, as kube-scheduler joins them: ``<count> <reason>`` sorted as strings."""
    return ", ".join(sorted(f"{count} {reason}" for reason, count in counts.items() if count))


def no_fit_message(resource: str, need: int, allocatable: Mapping[str, int]) -> str:
    """kube-scheduler's ``FailedScheduling`` text (also its ``PodScheduled`` condition's message) for a
    pod asking ``need`` of ``resource`` that no node has free, on nodes with ``allocatable`` of it,
    every pod of one priority: NodeResourcesFit's reason for each node, then the preemption
    plugin's verdict — a node whose allocatable is below the request is not worth preempting on,
    on the others no pod of lower priority is a victim. E.g. ``0/3 nodes are available: 3
    Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful
    for scheduling, 2 No preemption victims found for incoming pod.``"""
    nodes = len(allocatable)
    too_small = sum(1 for amount in allocatable.values() if amount < need)
    fit = _histogram({f"Insufficient {resource}": nodes})
    preemption = _histogram({"Preemption is not helpful for scheduling": too_small,
                             "No preemption victims found for incoming pod": nodes - too_small})
    return f"0/{nodes} nodes are available: {fit}. preemption: 0/{nodes} nodes are available: {preemption}."


def make_workload(name: str, namespace: str = "ml", queue: str = "default", count: int = 1, gpus: int = 1,
                  created: datetime | None = None, labels: dict[str, str] | None = None) -> JsonObject:
    """A Kueue Workload (kueue.x-k8s.io/v1beta1) still waiting for quota, as Kueue writes it for a
    suspended Job: one pod set of ``count`` pods of ``gpus`` GPUs."""
    at = iso(created or datetime.now(UTC))
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": at, "labels": dict(labels or {})},
        "spec": {"queueName": queue, "active": True, "podSets": [{"name": "main", "count": count, "template": {
            "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}]},
        "status": {"conditions": [{
            "type": "QuotaReserved", "status": "False", "reason": "Pending", "lastTransitionTime": at,
            "message": f"couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu "
                       f"in flavor default-flavor, {count * gpus} more needed"}]},
    }


class SimulatedCluster:
    """A seeded small GPU cluster on a fake API server: four GPU nodes, one CPU node, and jobs that
    arrive, wait, run, sometimes crash, finish and are cleaned up, every ``tick_s`` seconds."""

    def __init__(self, server: FakeApiServer, seed: int = 7, tick_s: float = 2.0) -> None:
        self.server = server
        self.rng = random.Random(seed)
        self.tick_s = tick_s
        self.free: dict[str, int] = {}
        self.allocatable: dict[str, int] = {}
        self._serial = 0

    def populate(self) -> None:
        for index in range(3):
            self._add_node(make_node(f"gpu-a100-{index}", gpus=8))
        self._add_node(make_node("gpu-h100-0", gpus=8, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559))
        self._add_node(make_node("cpu-0", gpus=0))
        for _ in range(6):
            self.submit()
        for _ in range(4):
            self.schedule_one()
        if self.server.kueue:  # a big job Kueue holds back: demand no pod shows
            self.server.put("workloads", make_workload("nlp-pretrain-queued", namespace="nlp", queue="nlp", count=2,
                                                       gpus=8, labels={"team": "nlp"}))

    def _add_node(self, node: JsonObject) -> None:
        self.server.put("nodes", node)
        self.free[node["metadata"]["name"]] = int(node["status"]["allocatable"].get("nvidia.com/gpu", "0"))
        self.allocatable[node["metadata"]["name"]] = self.free[node["metadata"]["name"]]

    def submit(self) -> JsonObject:
        self._serial += 1
        team = self.rng.choice(["vision", "nlp", "speech"])
        gpus = self.rng.choice([1, 1, 2, 4, 8])
        now = datetime.now(UTC)
        job = f"{team}-train-{self._serial}"
        pod = make_pod(f"{job}-worker-0", namespace=team, gpus=gpus, created=now,
                       labels={"team": team, "project": f"{team}-research", "training.kubeflow.org/job-name": job,
                               "training.kubeflow.org/replica-type": "worker"},
                       owner=("kubeflow.org/v1", "PyTorchJob", job))
        return self.server.put("pods", pod)

    def schedule_one(self) -> bool:
        now = datetime.now(UTC)
        for key in self.server.keys("pods"):
            pod = self.server.get("pods", key)
            if pod is None or pod["status"].get("phase") != "Pending":
                continue
            need = int(pod["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", "0"))
            node = next((n for n, free in sorted(self.free.items()) if free >= need), None)
            if node is None:
                message = no_fit_message("nvidia.com/gpu", need, self.allocatable)

                def pending(p: JsonObject, m: str = message) -> None:
                    set_unschedulable(p, m, now)

                self.server.patch("pods", key, pending)
                self.server.put("events", make_event(pod, "FailedScheduling", message, now))
                continue
            self.free[node] -= need
            def run(p: JsonObject, n: str = node) -> None:
                set_running(p, n, now)

            self.server.patch("pods", key, run)
            self.server.put("events", make_event(pod, "Scheduled", f"Successfully assigned {key} to {node}", now,
                                                 type_="Normal"))
            return True
        return False

    def tick(self) -> None:
        now = datetime.now(UTC)
        roll = self.rng.random()
        running = [k for k in self.server.keys("pods")
                   if (self.server.get("pods", k) or {}).get("status", {}).get("phase") == "Running"]
        finished = [k for k in self.server.keys("pods")
                    if (self.server.get("pods", k) or {}).get("status", {}).get("phase") in ("Succeeded", "Failed")]
        if roll < 0.35:
            self.submit()
        elif roll < 0.6 and running:
            key = self.rng.choice(running)
            pod = self.server.get("pods", key) or {}
            failed = self.rng.random() < 0.25
            self.server.patch("pods", key, lambda p: set_finished(p, now, 137 if failed else 0,
                                                                  "OOMKilled" if failed else "Completed"))
            node = pod.get("spec", {}).get("nodeName")
            if node in self.free:
                self.free[node] += int(pod["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", "0"))
        elif roll < 0.8 and finished:
            self.server.delete("pods", self.rng.choice(finished))
        self.schedule_one()

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.tick_s):
            self.tick()
