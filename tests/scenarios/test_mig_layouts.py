"""MIG layouts in scenarios and their figures end to end (simulator -> stages -> report).

Hand-derived cases; the golden ``mig-fragmentation`` covers the fire-then-resolve path.
"""

from __future__ import annotations

import pytest

from schemas.outputs import ClusterCapacity
from simulation.mig_layouts import MigLayoutError
from simulation.replay import run_in_process
from simulation.scenario import ScenarioError, parse_scenario


def _scenario(nodes: list[dict], pods: list[dict], **extra: object) -> dict:
    return {"name": "t", "start": "2026-01-05T09:00:00Z", "duration": "20m", "nodes": nodes, "pods": pods} | extra


def test_layout_parsing_places_and_checks() -> None:
    sc = parse_scenario(_scenario([{"name": "a", "gpus": 1, "mig_layout": [["1g.10gb", "3g.40gb", "2g.20gb"]]}], []))
    layout = sc.nodes[0].mig_layout
    assert layout is not None
    # 1g.10gb at 0; 3g.40gb: 0 taken -> 4; 2g.20gb: starts 0, 2, 4 -> 2 (0 overlaps the 1g, 4 the 3g)
    assert [(i.profile, i.start) for i in layout[0]] == [("1g.10gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)]
    with pytest.raises(ScenarioError, match=r"nodes\[0\].mig_layout\[0\]: 3g.40gb cannot start at memory slice 2"):
        parse_scenario(_scenario([{"name": "a", "gpus": 1, "mig_layout": [["3g.40gb@2"]]}], []))
    with pytest.raises(ScenarioError, match="one list of profiles per GPU"):
        parse_scenario(_scenario([{"name": "a", "gpus": 2, "mig_layout": [["7g.80gb"]]}], []))
    with pytest.raises(ScenarioError, match="no MIG profile table"):
        parse_scenario(_scenario([{"name": "a", "gpus": 1, "mig_layout": [["1g.5gb"]]}], []))
    with pytest.raises(ScenarioError, match="cannot be combined"):
        parse_scenario(_scenario([{"name": "a", "gpus": 1, "mig": "1g.10gb", "mig_layout": [["7g.80gb"]]}], []))


def test_relayout_may_not_destroy_a_held_instance() -> None:
    sc = parse_scenario(_scenario(
        [{"name": "a", "gpus": 1, "mig_layout": [["7g.80gb"]],
          "mig_relayout": [{"at": "1m", "gpu": 0, "layout": ["3g.40gb", "3g.40gb"]}]}],
        [{"name": "p", "resource": "nvidia.com/mig-7g.80gb"}]))
    with pytest.raises(MigLayoutError, match=r"destroys the 7g\.80gb instance that a pod holds"):
        run_in_process(sc)


def test_unused_slices_and_fragmentation_across_two_gpus() -> None:
    # GPU 0: 3g.40gb@0 held by big-0, 3g.40gb@4 empty the whole run. GPU 1: 7g.80gb held.
    # small asks for a 1g.10gb: none exists; a re-layout of GPU 0 could destroy the empty
    # 3g.40gb@4 and create a 1g.10gb at 4 (memory 4 free, 7 - 3 = 4 compute slices free) -> fires
    # at 2m. Free slices (empty instances count): GPU 0 4 compute / 4 memory, GPU 1 0 / 0.
    # The empty 3g.40gb@4 is idle from 0m to the last window's last instant (19m50s = 1190 s)
    # >= mig_unused_after (10m here) -> one unused instance; pending demand {1g.10gb: 1}.
    sc = parse_scenario(_scenario(
        [{"name": "a", "gpus": 2, "mig_layout": [["3g.40gb", "3g.40gb"], ["7g.80gb"]]}],
        [{"name": "big-0", "resource": "nvidia.com/mig-3g.40gb", "node": "a"},
         {"name": "big-1", "resource": "nvidia.com/mig-7g.80gb"},
         {"name": "small", "resource": "nvidia.com/mig-1g.10gb", "create": "1m"}],
        thresholds={"mig_unused_after": "10m"}))
    result = run_in_process(sc)
    frag = [a for a in result.report["alerts"] if a["type"] == "mig_fragmentation"]
    assert [(a["state"], a["at"]) for a in frag] == [("firing", "2026-01-05T09:03:00Z")]
    details = frag[0]["details"]
    assert details["relayout_candidates"][0] | {"gpu_uuid": None} == {
        "node": "a", "gpu_index": 0, "gpu_uuid": None, "start": 4, "destroy": ["3g.40gb@4"],
        "free_compute_slices": 4, "free_memory_slices": 4}
    assert (details["free_compute_slices"], details["free_memory_slices"]) == (4, 4)
    cluster = result.report["cluster"]
    assert cluster["mig_unused_slices"]["instances"] == [
        {"node": "a", "gpu_index": 0, "profile": "3g.40gb", "start": 4, "idle_s": 1190.0}]
    assert cluster["mig_unused_slices"]["pending_profiles"] == {"1g.10gb": 1}
    last = [m for m in result.outputs if isinstance(m, ClusterCapacity)][-1]
    assert last.mig_free_instances_by_profile == {"3g.40gb": 1}
    assert last.mig_free_by_node == {"a": {"3g.40gb": 1}}
    # after a re-layout of the empty 3g.40gb@4: 1g.10gb x3 (4, 5, 6), 1g.20gb x2, 2g.20gb x1, 3g.40gb x1
    assert last.mig_relayout_capacity_by_profile == {"1g.10gb": 3, "1g.20gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    gpu0 = next(g for g in last.mig_layouts or [] if g.gpu_index == 0)
    assert (gpu0.largest_creatable_profile, gpu0.largest_after_relayout) == (None, "3g.40gb")


def test_no_mig_fleet_has_no_mig_figures() -> None:
    sc = parse_scenario(_scenario([{"name": "a", "gpus": 2}], [{"name": "p", "gpus": 3}]))
    result = run_in_process(sc)
    assert not any(k.startswith(("mig", "max_mig")) for k in result.report["cluster"])
    assert all(m.mig_gpus is None and m.mig_layouts is None for m in result.outputs if isinstance(m, ClusterCapacity))
