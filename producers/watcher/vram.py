"""A shared-GPU pod's memory need, from what the sharing layer or the pod's owner declares.

Time-slicing and MPS give no memory isolation and Kubernetes no memory resource for a GPU, so the
need comes from, in this order:

- HAMi's ``nvidia.com/gpumem`` resource (MiB of device memory per GPU, which HAMi's scheduler
  enforces): the containers' values add up;
- the annotation ``gpulens.io/vram-request``: a Kubernetes quantity (``20Gi``, ``16G``) or a bare
  number of bytes, per GPU.

None when neither is there or the value is unreadable (the pod then has no known need); at most
``MAX_GPU_MEMORY_BYTES`` (a larger value is clamped to it and noted in the caller's ``Trim``).
"""

from __future__ import annotations

from producers.watcher.bounds import Trim
from producers.watcher.kube_json import JsonDict, json_dict, json_list, parse_quantity
from schemas.messages import MAX_GPU_MEMORY_BYTES

HAMI_GPUMEM = "nvidia.com/gpumem"
VRAM_ANNOTATION = "gpulens.io/vram-request"
_MIB = 2**20


def vram_request_bytes(pod: JsonDict, trim: Trim | None = None) -> int | None:
    total = _vram_request_bytes(pod)
    if total is not None and total > MAX_GPU_MEMORY_BYTES:
        if trim is not None:
            trim.note("quantity")
        return MAX_GPU_MEMORY_BYTES
    return total


def _vram_request_bytes(pod: JsonDict) -> int | None:
    spec = json_dict(pod.get("spec"))
    total = 0
    for container in json_list(spec.get("containers")):
        resources = json_dict(json_dict(container).get("resources"))
        for source in (json_dict(resources.get("requests")), json_dict(resources.get("limits"))):
            if HAMI_GPUMEM in source:
                total += parse_quantity(source[HAMI_GPUMEM]) * _MIB
                break
    if total > 0:
        return total
    annotation = json_dict(json_dict(pod.get("metadata")).get("annotations")).get(VRAM_ANNOTATION)
    if annotation is None:
        return None
    amount = parse_quantity(str(annotation))
    return amount if amount > 0 else None
