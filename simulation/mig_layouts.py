"""Scenario extension ``nodes[].mig_layout`` / ``nodes[].mig_relayout``: per-GPU MIG layouts.

``mig_layout`` gives each GPU of a node its MIG instances, one list per GPU, each entry a profile
(``3g.40gb``: placed at its lowest free allowed start, as ``nvidia-smi mig -cgi`` does) or a
profile with an explicit placement (``3g.40gb@4``: starts at memory slice 4). ``mig_relayout``
changes one GPU's layout at a time offset (MIG manager re-partitioning it): instances that keep
their profile and start keep their device and pod; a change may not destroy an instance a pod
holds at that moment (the simulator stops with an error naming it). Layouts are checked against
NVIDIA's profile table for the node's GPU memory size (:mod:`stream_jobs.mig`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pydantic_core import PydanticCustomError

from common.errors import UserError
from producers.agent.fake_nvml import FakeMigDevice
from simulation.scenario_file import duration_s
from stream_jobs.mig import MigInstance, check_layout, creatable_starts, table_for

GIB = 2**30
MAX_INSTANCES_PER_GPU = 7
"""At most 7 instances fit on a GPU (7 compute slices): the simulator's slots per GPU."""

GpuLayout = tuple[MigInstance, ...]


class MigLayoutError(UserError):
    """An invalid MIG layout in a scenario: ``message``, at ``sub`` inside the field (``[1][0]``)."""

    def __init__(self, message: str, sub: str = "") -> None:
        super().__init__(f"{sub}: {message}" if sub else message)
        self.message = message
        self.sub = sub


@dataclass(frozen=True)
class MigRelayout:
    at: float
    gpu: int
    layout: GpuLayout


def parse_gpu_layout(value: object, sub: str, model: str, memory_gib: float) -> GpuLayout:
    """``[3g.40gb, 1g.10gb@4, ...]`` -> placed instances, validated against the profile table."""
    if not isinstance(value, list) or not value:
        raise MigLayoutError(f"expected a list of MIG profiles like [3g.40gb, 1g.10gb@4], got {value!r}", sub)
    names: list[str] = []
    starts: list[int | None] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise MigLayoutError(f"expected a profile like 3g.40gb or 3g.40gb@4, got {item!r}", f"{sub}[{i}]")
        name, _, start = item.partition("@")
        if start and not start.isdigit():
            raise MigLayoutError(f"the placement after @ must be a memory slice 0-7, got {item!r}", f"{sub}[{i}]")
        names.append(name)
        starts.append(int(start) if start else None)
    table = table_for(model, int(memory_gib * GIB))  # by the GPU's size, then every profile must be on it
    if table is None or table_for(model, int(memory_gib * GIB), names) is not table:
        raise MigLayoutError(f"no MIG profile table has all of {', '.join(sorted(set(names)))} for {memory_gib:g} GiB "
                             f"GPUs (40 GB: 1g.5gb..7g.40gb; 80 GB: 1g.10gb..7g.80gb)", sub)
    placed: list[MigInstance] = [MigInstance(n, s) for n, s in zip(names, starts, strict=True) if s is not None]
    try:
        check_layout(table, placed)
        out: list[MigInstance] = list(placed)
        for name in (n for n, s in zip(names, starts, strict=True) if s is None):
            free = creatable_starts(table, out, name)
            if not free:
                raise ValueError(f"{name} does not fit next to {', '.join(f'{i.profile}@{i.start}' for i in out)}")
            out.append(MigInstance(name, free[0]))
    except ValueError as exc:
        raise MigLayoutError(str(exc), sub) from None
    return tuple(sorted(out, key=lambda inst: inst.start))


def parse_layouts(value: object, gpus: int, model: str, memory_gib: float) -> tuple[GpuLayout, ...]:
    """``nodes[i].mig_layout``: one list of profiles per GPU of the node."""
    if not isinstance(value, list) or len(value) != gpus:
        raise MigLayoutError(f"expected one list of profiles per GPU ({gpus}), got {value!r}")
    return tuple(parse_gpu_layout(item, f"[{i}]", model, memory_gib) for i, item in enumerate(value))


def parse_relayouts(value: object, gpus: int, model: str, memory_gib: float) -> tuple[MigRelayout, ...]:
    """``nodes[i].mig_relayout``: ``[{at, gpu, layout}, ...]``, in time order."""
    if not isinstance(value, list):
        raise MigLayoutError("expected a list of {at, gpu, layout}")
    changes = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) - {"at", "gpu", "layout"} or "layout" not in item:
            raise MigLayoutError(f"expected {{at: <duration>, gpu: <index>, layout: [profiles]}}, got {item!r}",
                                 f"[{i}]")
        gpu = item.get("gpu", 0)
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < gpus:
            raise MigLayoutError(f"expected a GPU index 0..{gpus - 1}, got {gpu!r}", f"[{i}].gpu")
        try:
            at = duration_s(item.get("at", 0))
        except PydanticCustomError as exc:
            raise MigLayoutError(exc.message(), f"[{i}].at") from None
        changes.append(MigRelayout(at, gpu, parse_gpu_layout(item["layout"], f"[{i}].layout", model, memory_gib)))
    return tuple(sorted(changes, key=lambda c: (c.at, c.gpu)))


# --------------------------------------------------------------------------- simulator side


def mig_device_uuid(scenario: str, node: str, gpu: int, inst: MigInstance) -> str:
    """A MIG device's uuid: stable for the same instance (profile and placement) across re-layouts."""
    digest = hashlib.sha256(f"{scenario}/mig/{node}/{gpu}/{inst.profile}@{inst.start}".encode()).hexdigest()
    return f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def fake_devices(scenario: str, node: str, gpu: int, layout: GpuLayout, memory_gib: float) -> list[FakeMigDevice]:
    table = table_for(None, int(memory_gib * GIB), [i.profile for i in layout])
    devices = []
    for inst in layout:
        profile = table.profile(inst.profile) if table else None
        devices.append(FakeMigDevice(uuid=mig_device_uuid(scenario, node, gpu, inst), profile=inst.profile,
                                     gpu_instance_id=inst.start + 1, compute_instance_id=0, placement_start=inst.start,
                                     mem_total_bytes=int((profile.memory_gib if profile else 0) * GIB)))
    return devices


def slot_resources(devices_per_gpu: list[list[FakeMigDevice]]) -> list[str | None]:
    """The resource of each simulator slot (``gpu * 7 + k``: the k-th instance of that GPU; None:
    no instance there)."""
    out: list[str | None] = []
    for devices in devices_per_gpu:
        out += [f"nvidia.com/mig-{d.profile}" for d in devices]
        out += [None] * (MAX_INSTANCES_PER_GPU - len(devices))
    return out


def relayout_slots(old: list[FakeMigDevice], new: list[FakeMigDevice], owners: list[int | None],
                   where: str) -> list[int | None]:
    """The owners of ``new``'s devices: a device that stays (same uuid) keeps its pod; destroying
    a held device is an error naming it."""
    kept = {d.uuid: owners[k] for k, d in enumerate(old) if k < len(owners)}
    new_uuids = {d.uuid for d in new}
    for k, device in enumerate(old):
        if owners[k] is not None and device.uuid not in new_uuids:
            raise MigLayoutError(f"{where}: the re-layout destroys the {device.profile} instance that a pod holds")
    out = [kept.get(d.uuid) for d in new]
    return out + [None] * (MAX_INSTANCES_PER_GPU - len(out))
