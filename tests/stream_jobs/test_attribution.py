"""Who a GPU's time belongs to: exclusive, shared (by SM, by memory, estimated) and MIG units."""

from __future__ import annotations

from schemas.messages import GpuProcess, GpuReading, PodRef
from stream_jobs.attribution import attribute, unit_fraction
from tests.stream_jobs.helpers import GIB, reading


def _shared(processes: list[GpuProcess], util: float | None = 80.0) -> GpuReading:
    refs = [PodRef(namespace="ns", pod=p, container="main", pod_uid=f"uid-{p}") for p in ("a", "b")]
    return GpuReading(uuid="GPU-0", index=0, model="L4", gpu_util_pct=util, mem_used_bytes=8 * GIB,
                      mem_total_bytes=24 * GIB, assigned_to=refs, processes=processes, shared=True)


def test_exclusive_gpu_belongs_wholly_to_its_pod() -> None:
    [share] = attribute(reading(0, 42.0, ["a"], mem_gib=3), {})
    assert (share.pod_uid, share.share, share.util_pct, share.mem_bytes, share.estimated) == (
        "uid-a", 1.0, 42.0, 3 * GIB, False)


def test_unassigned_gpu_belongs_to_nobody() -> None:
    assert attribute(reading(0, 90.0, []), {}) == []


def test_pod_ref_without_uid_is_matched_by_name() -> None:
    ref = PodRef(namespace="ns", pod="a", container="main")
    r = GpuReading(uuid="GPU-0", index=0, model="m", gpu_util_pct=10.0, assigned_to=[ref])
    assert attribute(r, {("ns", "a"): "uid-a"})[0].pod_uid == "uid-a"


def test_shared_gpu_split_by_process_sm_util() -> None:
    procs = [GpuProcess(pid=1, pod_uid="uid-a", sm_util_pct=60.0, mem_used_bytes=6 * GIB),
             GpuProcess(pid=2, pod_uid="uid-b", sm_util_pct=20.0, mem_used_bytes=2 * GIB)]
    a, b = attribute(_shared(procs), {})
    assert (a.share, a.util_pct, a.mem_bytes) == (0.75, 60.0, 6 * GIB)
    assert (b.share, b.util_pct, b.mem_bytes) == (0.25, 20.0, 2 * GIB)
    assert not a.estimated and not b.estimated


def test_shared_gpu_split_by_memory_when_sm_is_unknown() -> None:
    procs = [GpuProcess(pid=1, pod_uid="uid-a", mem_used_bytes=6 * GIB),
             GpuProcess(pid=2, pod_uid="uid-b", mem_used_bytes=2 * GIB)]
    a, b = attribute(_shared(procs), {})
    assert (a.share, b.share) == (0.75, 0.25)
    assert a.util_pct == 60.0 and not a.estimated


def test_shared_gpu_without_per_process_figures_is_an_estimated_even_split() -> None:
    procs = [GpuProcess(pid=1, pod_uid="uid-a"), GpuProcess(pid=2, pod_uid="uid-b")]
    a, b = attribute(_shared(procs), {})
    assert (a.share, b.share, a.estimated, b.estimated) == (0.5, 0.5, True, True)
    assert a.util_pct == 40.0


def test_missing_utilisation_stays_missing_unless_nothing_runs() -> None:
    busy = reading(0, None, ["a"], mem_gib=2)
    assert attribute(busy, {})[0].util_pct is None
    empty = GpuReading(uuid="MIG-1", index=0, model="m", mig_parent_uuid="GPU-0", mig_profile="1g.10gb",
                       mem_used_bytes=0, assigned_to=[PodRef(namespace="ns", pod="a", container="c", pod_uid="u")])
    assert attribute(empty, {})[0].util_pct == 0.0


def test_mig_unit_fraction() -> None:
    def mig(profile: str | None) -> GpuReading:
        return GpuReading(uuid="MIG-1", index=0, model="m", mig_parent_uuid="GPU-0", mig_profile=profile)

    assert unit_fraction(reading(0, 1.0, ["a"])) == 1.0
    assert unit_fraction(mig("3g.40gb")) == 3 / 7
    assert unit_fraction(mig(None)) == 1 / 7
