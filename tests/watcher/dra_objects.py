"""``resource.k8s.io/v1`` objects as the API server serves them (checked against k8s.io/api v0.37.2
``resource/v1/types.go``): DeviceClasses, ResourceSlices as NVIDIA's driver publishes them
(``cmd/gpu-kubelet-plugin/deviceinfo.go``, ``partitions.go``), ResourceClaims and their status."""

from __future__ import annotations

from typing import Any

JsonObject = dict[str, Any]
DRIVER = "gpu.nvidia.com"
H100 = "NVIDIA H100 80GB HBM3"


def device_class(name: str = "gpu.nvidia.com", device_type: str = "gpu", driver: str = DRIVER,
                 extended_resource: str | None = None) -> JsonObject:
    spec: JsonObject = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}" && '
                                               f'device.attributes["{driver}"].type == "{device_type}"'}}]}
    if extended_resource:
        spec["extendedResourceName"] = extended_resource
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def gpu_device(index: int, uuid: str | None = None, product: str = H100, memory: str = "81559Mi",
               counter_set: str | None = None, multi: bool = False) -> JsonObject:
    device: JsonObject = {
        "name": f"gpu-{index}",
        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid or gpu_uuid(index)},
                       "productName": {"string": product}, "brand": {"string": "Nvidia"},
                       "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
                       "driverVersion": {"version": "580.82.7"}, "pcieBusID": {"string": f"0000:{index:02x}:00.0"}},
        "capacity": {"memory": {"value": memory}},
    }
    if counter_set:
        device["consumesCounters"] = [{"counterSet": counter_set, "counters": {"memory": {"value": memory}}}]
    if multi:
        device["allowMultipleAllocations"] = True
    return device


def mig_device(parent_index: int, profile: str, start: int, parent_uuid: str | None = None,
               uuid: str | None = None, memory: str = "10Gi", counter_set: str | None = None) -> JsonObject:
    name = f"gpu-{parent_index}-mig-{profile.replace('.', '')}-{start}"
    attributes: JsonObject = {"type": {"string": "mig"}, "profile": {"string": profile},
                              "productName": {"string": H100},
                              "parentUUID": {"string": parent_uuid or gpu_uuid(parent_index)}}
    if uuid:
        attributes["uuid"] = {"string": uuid}
    device: JsonObject = {"name": name, "attributes": attributes,
                          "capacity": {"memory": {"value": memory}, "multiprocessors": {"value": "16"}}}
    if counter_set:
        counters = {"memory": {"value": memory}, f"memory-slice-{start}": {"value": "1"}}
        device["consumesCounters"] = [{"counterSet": counter_set, "counters": counters}]
    return device


def resource_slice(node: str, devices: list[JsonObject], driver: str = DRIVER, generation: int = 1,
                   name: str | None = None, pool: str | None = None, shared_counters: list[JsonObject] | None = None,
                   slice_count: int = 1) -> JsonObject:
    spec: JsonObject = {"driver": driver, "nodeName": node,
                        "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": slice_count},
                        "devices": devices}
    if shared_counters:
        spec["sharedCounters"] = shared_counters
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name or f"{node}-{driver}-slice"}, "spec": spec}


def counter_set(name: str, memory: str = "81559Mi", slices: int = 8) -> JsonObject:
    counters: JsonObject = {"memory": {"value": memory}}
    counters.update({f"memory-slice-{i}": {"value": "1"} for i in range(slices)})
    return {"name": name, "counters": counters}


def claim(name: str, namespace: str = "ml", device_class_name: str = "gpu.nvidia.com", count: int = 1,
          selectors: list[str] | None = None, request: str = "gpu") -> JsonObject:
    exactly: JsonObject = {"deviceClassName": device_class_name, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": text}} for text in selectors]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}}


def allocate(obj: JsonObject, node: str, devices: list[str], consumers: list[tuple[str, str]],
             pool: str | None = None, driver: str = DRIVER, request: str = "gpu",
             share_ids: list[str] | None = None) -> JsonObject:
    """The status the scheduler writes: the results, the node selector, and ``reservedFor`` (pod name, uid)."""
    results = []
    for index, device in enumerate(devices):
        result: JsonObject = {"request": request, "driver": driver, "pool": pool or node, "device": device}
        if share_ids:
            result["shareID"] = share_ids[index]
        results.append(result)
    obj["status"] = {
        "allocation": {"devices": {"results": results},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": uid} for name, uid in consumers],
    }
    return obj


def claim_pod(name: str, uid: str, claims: list[str], namespace: str = "ml", created: str = "2024-05-06T07:00:00Z",
              templates: dict[str, str] | None = None, node: str | None = None) -> JsonObject:
    """A pod using claims by name (``resourceClaimName``); ``templates``: entry name -> the claim the
    controller generated for it (``resourceClaimTemplateName`` + ``status.resourceClaimStatuses``)."""
    entries: list[JsonObject] = [{"name": f"c{i}", "resourceClaimName": name} for i, name in enumerate(claims)]
    statuses = []
    for entry, generated in (templates or {}).items():
        entries.append({"name": entry, "resourceClaimTemplateName": f"{entry}-template"})
        statuses.append({"name": entry, "resourceClaimName": generated})
    spec: JsonObject = {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.03-py3",
                                        "resources": {"claims": [{"name": e["name"]} for e in entries]}}],
                        "resourceClaims": entries}
    status: JsonObject = {"phase": "Pending"}
    if statuses:
        status["resourceClaimStatuses"] = statuses
    if node:
        spec["nodeName"] = node
        status["phase"] = "Running"
        status["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": created}]
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid, "creationTimestamp": created},
            "spec": spec, "status": status}
