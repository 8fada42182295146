"""MIG geometry: NVIDIA's GPU instance profile tables and placement rules, as pure functions.

A MIG-capable GPU has 8 memory slices and 7 compute slices. A GPU instance of a profile takes a
run of memory slices starting at one of the profile's allowed start positions (NVIDIA MIG user
guide, "Supported MIG Profiles": on 80 GB parts a 3g.40gb takes 4 of the 8 memory slices and
starts at slice 0 or 4) and a number of compute slices; two instances may not share a memory
slice, and the compute slices of all instances add up to at most 7. Compute and memory slices
are therefore counted separately: a 1g.20gb takes 1 compute slice but 2 memory slices.

What this module answers, for one GPU described by its instances (profile, start, in use or not):
free slices, whether and where a profile can still be created without touching any instance
(:func:`creatable_starts`), and after a re-layout that destroys only the empty instances
(:func:`relayout_starts`), the largest profile either way, and how many of each profile fit.
The cluster stage builds the ``mig_fragmentation`` alert and the MIG capacity figures on these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from schemas.messages import GpuReading
from schemas.outputs import MigGpuLayout, MigInstanceInfo

COMPUTE_SLICES = 7
MEMORY_SLICES = 8
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_PROFILE_NAME = re.compile(r"^(\d+)g\.(\d+)gb$")


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile of a table."""

    name: str
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]
    """Allowed placement starts, as memory-slice indices."""
    memory_gib: float
    """Memory the instance exposes (what nvidia-smi shows, approximately): less than the nominal
    figure in the name (a 1g.10gb on an 80 GB part exposes about 9.5-9.75 GiB)."""


@dataclass(frozen=True)
class MigTable:
    """The profiles of one GPU memory size (all MIG parts of that size share the geometry)."""

    name: str
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


def _table(name: str, unit_gb: int, gib_per_slice: float) -> MigTable:
    """NVIDIA's geometry scaled by the memory slice size (``unit_gb``: nominal GB per slice)."""
    rows = (  # (compute slices, memory slices, allowed starts)
        (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        (1, 2, (0, 2, 4, 6)),
        (2, 2, (0, 2, 4)),
        (3, 4, (0, 4)),
        (4, 4, (0,)),
        (7, 8, (0,)),
    )
    return MigTable(name, tuple(
        MigProfile(f"{c}g.{m * unit_gb}gb", c, m, starts, round(m * gib_per_slice, 2)) for c, m, starts in rows))


TABLE_40GB = _table("A100 40GB", 5, 4.75)
"""A100-SXM4/PCIE-40GB: 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb."""
TABLE_80GB = _table("A100/H100 80GB", 10, 9.75)
"""A100 80GB, H100 80GB: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb."""
TABLES: tuple[MigTable, ...] = (TABLE_40GB, TABLE_80GB)


def table_for(model: str | None, mem_total_bytes: int | None, profiles: Iterable[str] = ()) -> MigTable | None:
    """The profile table of a GPU: the one holding every profile its instances use (1g.10gb is on
    both tables: then by memory size, about 40 or 80 GB, or the model name), else None."""
    names = set(profiles)
    tables = [t for t in TABLES if names <= {p.name for p in t.profiles}]
    if len(tables) == 1:
        return tables[0]
    by_size: MigTable | None = None
    if mem_total_bytes:
        gib = mem_total_bytes / 2**30
        by_size = TABLE_40GB if 30 <= gib < 60 else TABLE_80GB if 60 <= gib < 100 else None
    elif model and ("40GB" in model or "80GB" in model):
        by_size = TABLE_40GB if "40GB" in model else TABLE_80GB
    return by_size if by_size in tables else None


def profile_of_resource(resource: str) -> str | None:
    """``nvidia.com/mig-3g.40gb`` -> ``3g.40gb`` (None for any other resource)."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    name = resource[len(MIG_RESOURCE_PREFIX):]
    return name if _PROFILE_NAME.match(name) else None


@dataclass(frozen=True)
class MigInstance:
    """One GPU instance on a GPU: its profile, its first memory slice, and whether a pod holds it."""

    profile: str
    start: int
    used: bool = False


def _memory_range(table: MigTable, inst: MigInstance) -> range:
    profile = table.profile(inst.profile)
    if profile is None:
        raise ValueError(f"{inst.profile} is not a profile of the {table.name} table")
    return range(inst.start, inst.start + profile.memory_slices)


def check_layout(table: MigTable, instances: Sequence[MigInstance]) -> None:
    """Raise ``ValueError`` naming the problem when the instances are not a layout the driver
    could have made: an unknown profile, a start the profile does not allow, overlapping memory
    slices, or more than 7 compute slices."""
    taken: dict[int, str] = {}
    compute = 0
    for inst in instances:
        profile = table.profile(inst.profile)
        if profile is None:
            known = ", ".join(p.name for p in table.profiles)
            raise ValueError(f"{inst.profile} is not a {table.name} profile (known: {known})")
        if inst.start not in profile.starts:
            raise ValueError(f"{inst.profile} cannot start at memory slice {inst.start} "
                             f"(allowed: {', '.join(map(str, profile.starts))})")
        for s in _memory_range(table, inst):
            if s in taken:
                raise ValueError(f"{inst.profile}@{inst.start} overlaps {taken[s]} on memory slice {s}")
            taken[s] = f"{inst.profile}@{inst.start}"
        compute += profile.compute_slices
    if compute > COMPUTE_SLICES:
        raise ValueError(f"the instances take {compute} compute slices; a GPU has {COMPUTE_SLICES}")


def pack(table: MigTable, profiles: Sequence[str]) -> tuple[MigInstance, ...]:
    """A layout of ``profiles`` in the given order, each at its lowest free allowed start (how
    ``nvidia-smi mig -cgi`` places instances created without an explicit placement). Raises
    ``ValueError`` when a profile does not fit."""
    placed: list[MigInstance] = []
    for name in profiles:
        starts = creatable_starts(table, placed, name)
        if not starts:
            after = ", ".join(f"{i.profile}@{i.start}" for i in placed) or "nothing"
            raise ValueError(f"{name} does not fit after {after}")
        placed.append(MigInstance(name, starts[0]))
    return tuple(placed)


def free_slices(table: MigTable, instances: Iterable[MigInstance], count_empty: bool = True) -> tuple[int, int]:
    """``(compute, memory)`` slices not held: by any instance (``count_empty=False``), or by an
    instance in use (``count_empty=True``: an empty instance's slices count as free, since a
    re-layout can take them)."""
    compute = COMPUTE_SLICES
    memory = MEMORY_SLICES
    for inst in instances:
        if count_empty and not inst.used:
            continue
        profile = table.profile(inst.profile)
        if profile is None:
            continue
        compute -= profile.compute_slices
        memory -= profile.memory_slices
    return max(compute, 0), max(memory, 0)


def creatable_starts(table: MigTable, fixed: Iterable[MigInstance], profile_name: str) -> list[int]:
    """The allowed starts at which ``profile_name`` can be created next to the ``fixed``
    instances: its memory slices all free and enough compute slices left."""
    profile = table.profile(profile_name)
    if profile is None:
        return []
    fixed = list(fixed)
    taken = {s for inst in fixed for s in _memory_range(table, inst)}
    compute_left = COMPUTE_SLICES - sum(p.compute_slices for i in fixed if (p := table.profile(i.profile)))
    if compute_left < profile.compute_slices:
        return []
    return [start for start in profile.starts
            if start + profile.memory_slices <= MEMORY_SLICES
            and not taken.intersection(range(start, start + profile.memory_slices))]


def relayout_starts(table: MigTable, instances: Iterable[MigInstance], profile_name: str) -> list[int]:
    """Where ``profile_name`` could be created once the empty instances are destroyed (the
    instances in use stay where they are)."""
    return creatable_starts(table, [i for i in instances if i.used], profile_name)


def max_count(table: MigTable, fixed: Iterable[MigInstance], profile_name: str) -> int:
    """How many instances of ``profile_name`` fit next to ``fixed`` at once (greedy from the
    lowest start: the allowed starts of a profile are aligned to its size, so that is optimal)."""
    placed = list(fixed)
    count = 0
    while starts := creatable_starts(table, placed, profile_name):
        placed.append(MigInstance(profile_name, starts[0], used=True))
        count += 1
    return count


def _size(profile: MigProfile) -> tuple[int, int]:
    return profile.compute_slices, profile.memory_slices


def largest_creatable(table: MigTable, fixed: Iterable[MigInstance]) -> str | None:
    """The largest profile (compute slices, then memory slices) that fits next to ``fixed``."""
    fixed = list(fixed)
    fitting = [p for p in table.profiles if creatable_starts(table, fixed, p.name)]
    return max(fitting, key=_size).name if fitting else None


def larger_or_equal(table: MigTable, a: str, b: str) -> bool:
    """Whether profile ``a`` is at least as large as ``b`` in both compute and memory slices."""
    pa, pb = table.profile(a), table.profile(b)
    return pa is not None and pb is not None and pa.compute_slices >= pb.compute_slices \
        and pa.memory_slices >= pb.memory_slices


@dataclass(frozen=True)
class GpuMigFigures:
    """What one MIG GPU offers at one instant (see the module docstring)."""

    free_compute_slices: int
    """Not held by an instance in use (empty instances count as free)."""
    free_memory_slices: int
    unpartitioned_compute_slices: int
    """Not held by any instance at all."""
    unpartitioned_memory_slices: int
    empty_instances: dict[str, int]
    """Instances nobody holds, by profile: what the scheduler can place pods on now."""
    largest_creatable: str | None
    """The largest profile that can still be created without destroying any instance."""
    largest_after_relayout: str | None
    """The largest profile that can be created once the empty instances are destroyed."""
    relayout_counts: dict[str, int]
    """Per profile, how many fit at once after destroying the empty instances."""


def gpu_figures(table: MigTable, instances: Sequence[MigInstance]) -> GpuMigFigures:
    used = [i for i in instances if i.used]
    free_c, free_m = free_slices(table, instances, count_empty=True)
    part_c, part_m = free_slices(table, instances, count_empty=False)
    empty: dict[str, int] = {}
    for inst in instances:
        if not inst.used:
            empty[inst.profile] = empty.get(inst.profile, 0) + 1
    return GpuMigFigures(
        free_compute_slices=free_c, free_memory_slices=free_m,
        unpartitioned_compute_slices=part_c, unpartitioned_memory_slices=part_m,
        empty_instances=dict(sorted(empty.items())),
        largest_creatable=largest_creatable(table, instances),
        largest_after_relayout=largest_creatable(table, used),
        relayout_counts={p.name: n for p in table.profiles if (n := max_count(table, used, p.name))},
    )


def layouts_from_sample(readings: Sequence[GpuReading]) -> list[MigGpuLayout] | None:
    """The MIG-enabled GPUs of one node sample with their instances (None: no MIG device in it).

    An instance is in use when the kubelet assigned it to a pod or a process runs on it. A
    reading without a placement start gets the driver's default packing of its GPU's profiles
    (largest first, each at its lowest free start), flagged ``placement_inferred``."""
    children: dict[str, list[GpuReading]] = {}
    for reading in readings:
        if reading.mig_parent_uuid is not None and reading.mig_profile:
            children.setdefault(reading.mig_parent_uuid, []).append(reading)
    if not children:
        return None
    out = []
    for parent in readings:
        migs = children.get(parent.uuid)
        if parent.mig_parent_uuid is not None or not migs:
            continue
        layout = _layout(parent, migs)
        if layout is not None:
            out.append(layout)
    return out or None


def _layout(parent: GpuReading, migs: list[GpuReading]) -> MigGpuLayout | None:
    """The layout of ``parent`` from its MIG devices' readings; None when their placement is not
    given and cannot be inferred (left out rather than guessed)."""
    migs = sorted(migs, key=lambda r: (r.mig_placement_start if r.mig_placement_start is not None else 99,
                                       r.gpu_instance_id or 0, r.uuid))
    inferred = any(r.mig_placement_start is None for r in migs)
    starts = [r.mig_placement_start or 0 for r in migs]
    if inferred:
        packed = _default_packing(parent, migs)
        if packed is None:
            return None
        migs, starts = packed
    return MigGpuLayout(
        gpu_uuid=parent.uuid, gpu_index=parent.index, model=parent.model, mem_total_bytes=parent.mem_total_bytes,
        placement_inferred=inferred,
        instances=[MigInstanceInfo(profile=r.mig_profile or "", start=start, uuid=r.uuid,
                                   used=bool(r.assigned_to or r.processes))
                   for r, start in zip(migs, starts, strict=True)],
    )


def _default_packing(parent: GpuReading, migs: list[GpuReading]) -> tuple[list[GpuReading], list[int]] | None:
    """The driver's default packing of ``migs`` on ``parent``: the readings largest first and the
    start of each; None for profiles the GPU's table does not know or cannot pack."""
    table = table_for(parent.model, parent.mem_total_bytes, [r.mig_profile or "" for r in migs])
    order = sorted(migs, key=lambda r: (*(-n for n in _size_of(table, r.mig_profile or "")),
                                       r.gpu_instance_id or 0, r.uuid))
    try:
        packed = pack(table, [r.mig_profile or "" for r in order]) if table else None
    except ValueError:
        packed = None
    if packed is None:
        return None
    return order, [inst.start for inst in packed]


def _size_of(table: MigTable | None, name: str) -> tuple[int, int]:
    profile = table.profile(name) if table else None
    return _size(profile) if profile else (0, 0)
