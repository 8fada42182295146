"""Caching-allocator statistics from the pods of this node: ``allocator device=0 reserved=N ...`` ->
``workload.allocator.v1``.

NVML sees what a process took from the driver; PyTorch's caching allocator may hold much more of
it than its tensors use, and its allocation retries and out-of-memory errors are the symptom of
that memory being fragmented. Only the process can tell, so the training job reports the figures
on the agent's progress paths (docs/progress.md), and the agent credits them to the sending pod by
the same kernel facts as progress (:class:`producers.agent.progress.ProgressCollector`); nothing in
the line names a pod.

A line holds absolute values (the allocator's gauges and totals since the process started), not
increments: ``allocator device=0 reserved=64424509440 allocated=12884901888
max_reserved=66571993088 retries=14 ooms=0 uuid=GPU-...``. The agent keeps the latest figures per
pod and device and emits them every progress interval for the pods that reported since.
Every figure is bounded (:data:`schemas.messages.MAX_ALLOCATOR_BYTES`, ``MAX_ALLOCATOR_COUNT``);
a bad line is rejected whole with a named reason, like a bad progress line.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime

from producers.agent.line_fields import key_value_fields
from schemas.messages import MAX_ALLOCATOR_BYTES, MAX_ALLOCATOR_COUNT, AllocatorDevice, WorkloadAllocator

PREFIX = "allocator"
"""The first word of an allocator line (progress lines start with ``key=+N``)."""
BYTE_KEYS = {"reserved": "reserved_bytes", "allocated": "allocated_bytes", "max_reserved": "max_reserved_bytes"}
COUNT_KEYS = {"retries": "alloc_retries_total", "ooms": "ooms_total"}
KEYS = ("device", *BYTE_KEYS, *COUNT_KEYS, "uuid")
MAX_DEVICE = 255
MAX_DEVICES_PER_POD = 64
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,76}$")
_DIGITS = re.compile(r"^[0-9]{1,20}$")


class MalformedAllocatorLine(ValueError):
    """An allocator line the agent does not accept; ``reason`` is the counter label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def is_allocator_line(line: str) -> bool:
    return line.split(maxsplit=1)[:1] == [PREFIX]


def _whole(key: str, text: str, limit: int) -> int:
    if not _DIGITS.match(text):
        raise MalformedAllocatorLine("bad_number", f"{key}={text[:40]!r}: a whole non-negative number")
    value = int(text)
    if value > limit:
        raise MalformedAllocatorLine("bad_number", f"{key}={text[:40]!r}: above {limit}")
    return value


def parse_allocator_line(line: str) -> AllocatorDevice:
    """``allocator device=0 reserved=N allocated=N [max_reserved=N] [retries=N] [ooms=N] [uuid=GPU-...]``
    -> one device's figures; raises :class:`MalformedAllocatorLine`.

    Reasons: ``bad_field`` (not key=value), ``unknown_key``, ``duplicate_key``, ``bad_number``,
    ``missing_key`` (device, reserved and allocated are required), ``bad_device`` (above 255),
    ``bad_uuid``, ``allocated_above_reserved`` (an allocator never hands out more than it holds)."""
    fields = line.split()
    if fields[:1] != [PREFIX]:
        raise MalformedAllocatorLine("bad_field", f"an allocator line starts with {PREFIX!r}")
    values: dict[str, int | str] = {}
    for key, text in key_value_fields(fields[1:], KEYS, MalformedAllocatorLine):
        if key == "uuid":
            if not _UUID.match(text):
                raise MalformedAllocatorLine("bad_uuid", f"{text[:40]!r} is not GPU-... or MIG-...")
            values[key] = text
        elif key == "device":
            values[key] = _whole(key, text, 10**6)
            if int(values[key]) > MAX_DEVICE:
                raise MalformedAllocatorLine("bad_device", f"device={text[:40]}: above {MAX_DEVICE}")
        else:
            values[key] = _whole(key, text, MAX_ALLOCATOR_BYTES if key in BYTE_KEYS else MAX_ALLOCATOR_COUNT)
    missing = [key for key in ("device", "reserved", "allocated") if key not in values]
    if missing:
        raise MalformedAllocatorLine("missing_key", ", ".join(missing))
    if int(values["allocated"]) > int(values["reserved"]):
        raise MalformedAllocatorLine("allocated_above_reserved",
                                     f"allocated={values['allocated']} > reserved={values['reserved']}")
    names = BYTE_KEYS | COUNT_KEYS | {"device": "device", "uuid": "gpu_uuid"}
    return AllocatorDevice.model_validate({names[key]: value for key, value in values.items()})


def device_key(device: AllocatorDevice) -> str:
    """One entry per device of a pod: its UUID when given (processes of one pod that each see their
    GPU as device 0 stay apart), else its index."""
    return device.gpu_uuid or f"#{device.device}"


class AllocatorLedger:
    """The latest figures per pod and device; at most ``max_pods`` pods (least recently reporting
    dropped first) and :data:`MAX_DEVICES_PER_POD` devices per pod."""

    def __init__(self, max_pods: int = 1024) -> None:
        self.max_pods = max_pods
        self._pods: OrderedDict[str, OrderedDict[str, AllocatorDevice]] = OrderedDict()
        self._dirty: set[str] = set()

    def add(self, pod_uid: str, device: AllocatorDevice) -> None:
        devices = self._pods.pop(pod_uid, None) or OrderedDict()
        key = device_key(device)
        devices.pop(key, None)
        devices[key] = device
        while len(devices) > MAX_DEVICES_PER_POD:
            devices.popitem(last=False)
        self._pods[pod_uid] = devices
        self._dirty.add(pod_uid)
        while len(self._pods) > self.max_pods:
            dropped, _ = self._pods.popitem(last=False)
            self._dirty.discard(dropped)

    def drain(self, ts: datetime, node: str,
              pod_names: Callable[[str], tuple[str, str] | None] | None = None) -> list[WorkloadAllocator]:
        """One message per pod that reported since the last drain, with its devices' latest figures."""
        out = []
        for pod_uid, devices in self._pods.items():
            if pod_uid not in self._dirty:
                continue
            names = pod_names(pod_uid) if pod_names is not None else None
            namespace, pod = names if names is not None else ("", "")
            out.append(WorkloadAllocator(pod_uid=pod_uid, namespace=namespace, pod=pod, node=node, ts=ts,
                                         devices=sorted(devices.values(), key=lambda d: (d.device, d.gpu_uuid or ""))))
        self._dirty.clear()
        return out

