"""MIG profile tables and placement rules, against hand-derived cases from NVIDIA's table.

80 GB parts: 8 memory slices (10 GB each), 7 compute slices. 1g.10gb: 1c/1m at 0..6;
1g.20gb: 1c/2m at 0,2,4,6; 2g.20gb: 2c/2m at 0,2,4; 3g.40gb: 3c/4m at 0,4; 4g.40gb: 4c/4m at 0;
7g.80gb: 7c/8m at 0.
"""

from __future__ import annotations

import pytest

from stream_jobs.mig import (
    TABLE_40GB,
    TABLE_80GB,
    MigInstance,
    check_layout,
    creatable_starts,
    free_slices,
    gpu_figures,
    largest_creatable,
    max_count,
    pack,
    profile_of_resource,
    relayout_starts,
    table_for,
)

GIB = 2**30


def _one_g(used: list[bool]) -> list[MigInstance]:
    return [MigInstance("1g.10gb", i, u) for i, u in enumerate(used)]


def test_tables_follow_nvidia_names_and_geometry() -> None:
    assert [p.name for p in TABLE_80GB.profiles] == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert [p.name for p in TABLE_40GB.profiles] == ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    three = TABLE_80GB.profile("3g.40gb")
    assert three is not None and (three.compute_slices, three.memory_slices, three.starts) == (3, 4, (0, 4))
    one = TABLE_80GB.profile("1g.10gb")
    assert one is not None and 9.5 <= one.memory_gib <= 9.75 and one.starts == (0, 1, 2, 3, 4, 5, 6)
    assert TABLE_80GB.profile("1g.20gb").starts == (0, 2, 4, 6)  # type: ignore[union-attr]


def test_table_by_profiles_then_memory() -> None:
    assert table_for("NVIDIA H100 80GB HBM3", 80 * GIB) is TABLE_80GB
    assert table_for("NVIDIA A100-SXM4-40GB", 40 * GIB) is TABLE_40GB
    assert table_for("x", None, ["1g.5gb"]) is TABLE_40GB
    # 1g.10gb exists on both tables; 3g.40gb only on the 80 GB one
    assert table_for("x", None, ["1g.10gb", "3g.40gb"]) is TABLE_80GB
    assert table_for("NVIDIA L4", 24 * GIB) is None
    assert profile_of_resource("nvidia.com/mig-3g.40gb") == "3g.40gb"
    assert profile_of_resource("nvidia.com/gpu") is None


def test_seven_one_g_fill_compute_but_leave_a_memory_slice() -> None:
    layout = pack(TABLE_80GB, ["1g.10gb"] * 7)
    assert [i.start for i in layout] == [0, 1, 2, 3, 4, 5, 6]
    # all 7 compute slices taken, memory slice 7 is unpartitioned but unusable without compute
    assert free_slices(TABLE_80GB, layout, count_empty=False) == (0, 1)
    assert largest_creatable(TABLE_80GB, layout) is None
    with pytest.raises(ValueError, match="does not fit"):
        pack(TABLE_80GB, ["1g.10gb"] * 8)


def test_three_g_needs_start_zero_or_four() -> None:
    # four busy 1g at 0..3, three empty at 4..6: destroying the empties frees memory 4..7 and
    # compute 3 slices -> a 3g.40gb at 4 fits; as partitioned, nothing fits
    gpu = _one_g([True, True, True, True, False, False, False])
    assert creatable_starts(TABLE_80GB, gpu, "3g.40gb") == []
    assert relayout_starts(TABLE_80GB, gpu, "3g.40gb") == [4]
    # the same three free slices at 2..4 (busy 0, 1, 5, 6): memory 2..4 free and slice 7
    # unpartitioned, yet neither 0..3 nor 4..7 is free -> no 3g.40gb even after a re-layout
    gpu = _one_g([True, True, False, False, False, True, True])
    assert free_slices(TABLE_80GB, gpu) == (3, 4)
    assert relayout_starts(TABLE_80GB, gpu, "3g.40gb") == []
    assert relayout_starts(TABLE_80GB, gpu, "2g.20gb") == [2]


def test_compute_and_memory_counted_separately() -> None:
    # 4g.40gb@0 + 1g.20gb@4 + 1g.20gb@6: memory full (4+2+2), compute 4+1+1 = 6 of 7
    layout = [MigInstance("4g.40gb", 0, True), MigInstance("1g.20gb", 4, True), MigInstance("1g.20gb", 6, True)]
    check_layout(TABLE_80GB, layout)
    assert free_slices(TABLE_80GB, layout) == (1, 0)
    assert largest_creatable(TABLE_80GB, layout) is None
    # 3g.40gb@0 + 3g.40gb@4 = 6 compute slices; no 1g fits (no memory slice left)
    two = [MigInstance("3g.40gb", 0, True), MigInstance("3g.40gb", 4, True)]
    assert free_slices(TABLE_80GB, two) == (1, 0)
    assert creatable_starts(TABLE_80GB, two, "1g.10gb") == []


def test_check_layout_names_the_problem() -> None:
    with pytest.raises(ValueError, match="cannot start at memory slice 2"):
        check_layout(TABLE_80GB, [MigInstance("3g.40gb", 2)])
    with pytest.raises(ValueError, match="overlaps"):
        check_layout(TABLE_80GB, [MigInstance("3g.40gb", 0), MigInstance("1g.10gb", 3)])
    with pytest.raises(ValueError, match="not a A100/H100 80GB profile"):
        check_layout(TABLE_80GB, [MigInstance("1g.5gb", 0)])
    # a valid 7-compute layout: 4g.40gb@0 + 3g.40gb@4
    check_layout(TABLE_80GB, [MigInstance("4g.40gb", 0), MigInstance("3g.40gb", 4)])


def test_max_count_and_figures() -> None:
    assert max_count(TABLE_80GB, [], "1g.10gb") == 7
    assert max_count(TABLE_80GB, [], "1g.20gb") == 4
    assert max_count(TABLE_80GB, [], "2g.20gb") == 3
    assert max_count(TABLE_80GB, [], "3g.40gb") == 2
    assert max_count(TABLE_80GB, [], "4g.40gb") == 1
    # 3g.40gb@0 busy, 1g.10gb@4..6 empty: free = 4 compute, 4 memory. As partitioned only
    # memory slice 7 is unpartitioned: no 1g.10gb starts at 7 and a 1g.20gb@6 overlaps -> none.
    # After a re-layout memory 4..7 and 4 compute slices are free: 1g.10gb at 4, 5, 6 (3);
    # 1g.20gb at 4, 6 (2); 2g.20gb at 4 (1); 3g.40gb at 4 (1); 4g.40gb only at 0 (0)
    gpu = [MigInstance("3g.40gb", 0, True)] + [MigInstance("1g.10gb", s, False) for s in (4, 5, 6)]
    fig = gpu_figures(TABLE_80GB, gpu)
    assert (fig.free_compute_slices, fig.free_memory_slices) == (4, 4)
    assert (fig.unpartitioned_compute_slices, fig.unpartitioned_memory_slices) == (1, 1)
    assert fig.empty_instances == {"1g.10gb": 3}
    assert fig.largest_creatable is None
    assert fig.largest_after_relayout == "3g.40gb"
    assert fig.relayout_counts == {"1g.10gb": 3, "1g.20gb": 2, "2g.20gb": 1, "3g.40gb": 1}
