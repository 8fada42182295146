"""The node side of a test control plane: what kubelets, the device plugin and a DRA driver would do.

No kubelet runs beside :class:`~simulation.kube_local.LocalKube`, so the real kube-scheduler and
kube-controller-manager act on a cluster whose nodes are played here: :class:`NodeSide` registers
Nodes with GPU allocatable (as the NVIDIA device plugin advertises ``nvidia.com/gpu``) and Ready,
without the ``node.kubernetes.io/not-ready`` taint a new Node gets until its kubelet reports; it
publishes ResourceSlices as a DRA driver does (one device per GPU, NVIDIA's driver's attribute and
capacity names); and, while :meth:`NodeSide.start` runs, it does a kubelet's part for the pods the
scheduler binds: each bound pod of the watched namespaces is set Running (with its containers'
statuses), and the pods a test ends are deleted at once (no kubelet confirms a graceful deletion).
The scheduler's decisions stay its own: nothing here binds a pod.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from common import logs
from producers.watcher.fake_cluster import make_node, set_running
from simulation.kube_local import KubeApiError, LocalKube

Obj = dict[str, Any]
log = logs.get_logger(__name__)

DRA_DRIVER = "gpu.nvidia.com"
"""NVIDIA's DRA driver's name, as its ResourceSlices and DeviceClasses carry it."""


def gpu_slice(node: str, gpus: int, driver: str = DRA_DRIVER, product: str = "NVIDIA H100 80GB HBM3",
              memory: str = "80Gi") -> Obj:
    """The ResourceSlice (``resource.k8s.io/v1``) a DRA driver publishes for ``node``: one pool named
    after the node, one device per GPU (``gpu-<index>``) with the NVIDIA driver's attributes (``type``,
    ``uuid``, ``productName``, ``index``) and its ``memory`` capacity."""
    devices = [{"name": f"gpu-{index}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node}-{index:04d}"},
        "productName": {"string": product}, "index": {"int": index}},
        "capacity": {"memory": {"value": memory}}} for index in range(gpus)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def device_class(name: str = DRA_DRIVER, driver: str = DRA_DRIVER) -> Obj:
    """The DeviceClass NVIDIA's driver installs for whole GPUs: its devices of type ``gpu``."""
    expression = f"device.driver == '{driver}' && device.attributes['{driver}'].type == 'gpu'"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def claim_template(name: str, gpus: int, device_class_name: str = DRA_DRIVER) -> Obj:
    """A ResourceClaimTemplate asking ``gpus`` devices of the class (one request named ``gpus``)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": device_class_name, "allocationMode": "ExactCount", "count": gpus}}]}}}}


def with_claim_template(pod: Obj, template: str) -> Obj:
    """``pod`` asking its GPUs through a claim made from ``template`` (its first container uses it)."""
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0].setdefault("resources", {})["claims"] = [{"name": "gpus"}]
    return pod


class NodeSide:
    """Kubelets, device plugin and DRA driver for the nodes a test registers on ``kube``."""

    def __init__(self, kube: LocalKube, namespaces: tuple[str, ...], poll_s: float = 0.2) -> None:
        self.kube = kube
        self.api = kube.admin()
        self.namespaces = namespaces
        self.poll_s = poll_s
        self.nodes: list[str] = []
        self.slices: list[str] = []
        self.device_classes: list[str] = []
        self.started: dict[str, str] = {}
        """Pod uid -> the node it was set Running on."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ nodes

    def register_node(self, name: str, gpus: int, **node: Any) -> Obj:
        """A Ready node with ``gpus`` ``nvidia.com/gpu`` allocatable (0: a node without the device
        plugin's resource, e.g. one whose GPUs a DRA driver publishes), schedulable at once."""
        obj = make_node(name, gpus=gpus, **node)
        obj["metadata"].pop("uid", None)
        created = self.kube.create_node(obj, schedulable=True)
        self.nodes.append(name)
        return created

    def publish_slice(self, node: str, gpus: int, **device: Any) -> Obj:
        """The node's GPUs as a DRA driver publishes them (:func:`gpu_slice`)."""
        body = gpu_slice(node, gpus, **device)
        created = self.api.create("/apis/resource.k8s.io/v1/resourceslices", body)
        self.slices.append(created["metadata"]["name"])
        return created

    def create_device_class(self, name: str = DRA_DRIVER, driver: str = DRA_DRIVER) -> Obj:
        created = self.api.create("/apis/resource.k8s.io/v1/deviceclasses", device_class(name, driver))
        self.device_classes.append(name)
        return created

    def create_claim_template(self, namespace: str, name: str, gpus: int,
                              device_class_name: str = DRA_DRIVER) -> Obj:
        return self.api.create(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
                               claim_template(name, gpus, device_class_name))

    def claims(self, namespace: str) -> list[Obj]:
        items: list[Obj] = self.api.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")["items"]
        return items

    # ------------------------------------------------------------------ pods

    def create_pod(self, pod: Obj) -> Obj:
        return self.kube.create_pod(pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        """A pod that ended, deleted at once as a kubelet confirms it."""
        try:
            self.kube.delete_pod(namespace, name)
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    def pods(self, namespace: str) -> list[Obj]:
        items: list[Obj] = self.api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        return items

    def pod(self, namespace: str, name: str) -> Obj:
        return self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def run_bound(self) -> int:
        """One kubelet pass: every bound pod still Pending is set Running. Returns how many."""
        count = 0
        for namespace in self.namespaces:
            for pod in self.pods(namespace):
                node = pod["spec"].get("nodeName")
                meta = pod["metadata"]
                if not node or pod["status"].get("phase") != "Pending" or meta.get("deletionTimestamp"):
                    continue
                running = {"metadata": dict(meta), "spec": pod["spec"], "status": {}}
                set_running(running, node, datetime.now(UTC))
                status = {key: running["status"][key] for key in
                          ("phase", "startTime", "hostIP", "conditions", "containerStatuses")}
                try:
                    self.kube.set_pod_status(meta["namespace"], meta["name"], status)
                except KubeApiError as exc:
                    if exc.status != 404:
                        raise
                    continue
                self.started[meta["uid"]] = node
                count += 1
        return count

    def start(self) -> NodeSide:
        """Run :meth:`run_bound` every ``poll_s`` in a thread until :meth:`stop`."""
        def loop() -> None:
            while not self._stop.wait(self.poll_s):
                try:
                    self.run_bound()
                except (KubeApiError, OSError) as exc:  # the next pass tries again
                    log.warning("node side pass failed", error=str(exc)[:300])

        self._thread = threading.Thread(target=loop, name="node-side", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def remove(self) -> None:
        """Stop, then delete the pods of the namespaces, the slices, device classes and nodes registered."""
        self.stop()
        for namespace in self.namespaces:
            for pod in self.pods(namespace):
                self.delete_pod(namespace, pod["metadata"]["name"])
        for path in [*(f"resourceslices/{name}" for name in self.slices),
                     *(f"deviceclasses/{name}" for name in self.device_classes)]:
            try:
                self.api.delete(f"/apis/resource.k8s.io/v1/{path}")
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
        for name in self.nodes:
            try:
                self.kube.delete_node(name)
            except KubeApiError as exc:
                if exc.status != 404:
                    raise

    def __enter__(self) -> NodeSide:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()
