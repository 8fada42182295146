"""The join of a sample's DRA allocations with the node's ResourceSlices: DRA GPUs attributed to pods.

The agent reads PodResources without an API token, so for a GPU allocated through Dynamic
Resource Allocation it knows only ``(driver, pool, device)`` and the pod, container and claim
(:class:`schemas.messages.DraAllocation`); NVML knows the GPU by its UUID. The watcher maps the
node's ResourceSlices to :class:`schemas.messages.DraDevice` records (``NodeState.dra_devices``)
that carry both. The node stage keeps the node's latest list as a :data:`DeviceTable` and, for
each sample, adds each allocation's pod to the ``assigned_to`` of the reading with the device's
UUID (a whole GPU or a MIG device), exactly as the device plugin's assignment would have put it
there; ``shared`` is set when more than one pod then holds the reading, as the agent sets it.
Everything downstream (attribution, windows, idle classes, cost, alerts) reads the joined sample.

An allocation that does not resolve leaves the reading as it was and is counted, never raised:
``unresolved`` when the node publishes no device by that name yet (its slice has not been seen),
the device has no UUID, no reading of the sample has the UUID, or the reading already lists the
most pods a reading may; ``other_driver`` when the node publishes GPU devices but none of that
driver (a driver that is not a GPU's, e.g. NVIDIA's ComputeDomain channels).

Pure functions over the message types; the table is plain JSON (``driver -> pool -> device ->
UUID or None``) so the node stage's checkpoint carries it as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from schemas.messages import MAX_PODS_PER_GPU, DraDevice, GpuReading, GpuSample, PodRef

DeviceTable = dict[str, dict[str, dict[str, str | None]]]
"""A node's DRA GPU devices: driver -> pool -> device name -> GPU / MIG UUID (None: the driver publishes none)."""


def device_table(devices: Iterable[DraDevice]) -> DeviceTable:
    """The lookup table of a node's :class:`DraDevice` list (``NodeState.dra_devices``)."""
    table: DeviceTable = {}
    for device in devices:
        table.setdefault(device.driver, {}).setdefault(device.pool, {})[device.device] = device.uuid
    return table


@dataclass(frozen=True)
class JoinResult:
    """A sample with its DRA allocations joined into ``assigned_to``, and how the allocations fared."""

    sample: GpuSample
    resolved: int = 0
    unresolved: int = 0
    other_driver: int = 0


def join(sample: GpuSample, table: Mapping[str, Mapping[str, Mapping[str, str | None]]],
         uid_by_name: Mapping[tuple[str, str], str]) -> JoinResult:
    """``sample`` with each DRA allocation's pod on the reading of the device's UUID.

    ``uid_by_name`` ((namespace, pod) -> pod uid, the node stage's pod table) gives the added
    :class:`PodRef` its ``pod_uid`` (None for a pod the stage has not seen). A sample without
    allocations comes back as the same object."""
    if not sample.dra_allocations:
        return JoinResult(sample)
    readings = {reading.uuid: reading for reading in sample.gpus}
    added: dict[str, list[PodRef]] = {}
    resolved = unresolved = other_driver = 0
    for allocation in sample.dra_allocations:
        pools = table.get(allocation.driver)
        if pools is None and table:
            other_driver += 1
            continue
        uuid = (pools or {}).get(allocation.pool, {}).get(allocation.device)
        reading = readings.get(uuid) if uuid is not None else None
        if reading is None:
            unresolved += 1
            continue
        refs = added.setdefault(reading.uuid, list(reading.assigned_to))
        if any((r.namespace, r.pod, r.container) == (allocation.namespace, allocation.pod, allocation.container)
               for r in refs):
            resolved += 1  # the same container through another claim, or the device plugin as well
            continue
        if len(refs) >= MAX_PODS_PER_GPU:
            unresolved += 1
            continue
        refs.append(PodRef(namespace=allocation.namespace, pod=allocation.pod, container=allocation.container,
                           pod_uid=uid_by_name.get((allocation.namespace, allocation.pod))))
        resolved += 1
    if not added:
        return JoinResult(sample, resolved, unresolved, other_driver)
    gpus = [_assigned(reading, added[reading.uuid]) if reading.uuid in added else reading for reading in sample.gpus]
    return JoinResult(sample.model_copy(update={"gpus": gpus}), resolved, unresolved, other_driver)


def _assigned(reading: GpuReading, refs: list[PodRef]) -> GpuReading:
    pods = {(r.namespace, r.pod) for r in refs}
    return reading.model_copy(update={"assigned_to": refs, "shared": reading.shared or len(pods) > 1})
