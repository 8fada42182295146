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

from typing import TYPE_CHECKING, Any

from schemas.messages import MAX_GPU_MEMORY_BYTES

if TYPE_CHECKING:
    from producers.watcher.bounds import Trim

HAMI_GPUMEM = "nvidia.com/gpumem"
VRAM_ANNOTATION = "gpulens.io/vram-request"
_MIB = 2**20


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def vram_request_bytes(pod: dict[str, Any], trim: Trim | None = None) -> int | None:
    total = _vram_request_bytes(pod)
    if total is not None and total > MAX_GPU_MEMORY_BYTES:
        if trim is not None:
            trim.note("quantity")
        return MAX_GPU_MEMORY_BYTES
    return total


def _vram_request_bytes(pod: dict[str, Any]) -> int | None:
    from producers.watcher.translate import parse_quantity

    spec = _dict(pod.get("spec"))
    total = 0
    for container in spec.get("containers") or []:
        resources = _dict(_dict(container).get("resources"))
        for source in (_dict(resources.get("requests")), _dict(resources.get("limits"))):
            if HAMI_GPUMEM in source:
                total += parse_quantity(source[HAMI_GPUMEM]) * _MIB
                break
    if total > 0:
        return total
    annotation = _dict(_dict(pod.get("metadata")).get("annotations")).get(VRAM_ANNOTATION)
    if annotation is None:
        return None
    amount = parse_quantity(str(annotation))
    return amount if amount > 0 else None
