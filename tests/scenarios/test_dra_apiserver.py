"""A DRA scenario played at real speed through a real kube-apiserver (``simulation/kube_replay.py``):
the DeviceClasses, ResourceSlices, ResourceClaimTemplates and ResourceClaims (with the allocation and
reservations written into their status, a pod's extended resource served by DRA with the claim the
scheduler makes for it, shares of a device several claims hold) are admitted by the server's own
validation, the watcher follows them through its least-privilege kubeconfig, and the report equals
the in-process replay's."""

from __future__ import annotations

import pytest

from simulation.kube_local import LocalKube, build_binaries
from simulation.kube_replay import DRA_PATH, run_through_apiserver, starting_now
from simulation.replay import compare_report, run_in_process
from simulation.scenario import parse_scenario

SCENARIO = {
    "name": "dra-apiserver",
    "duration": "30s", "sample_interval": "5s", "window": "10s",
    "prices": {"NVIDIA H100 80GB HBM3": 2.0},
    "dra_extended_resources": True,
    "nodes": [{"name": "gpu-a", "gpus": 2}, {"name": "gpu-b", "gpus": 2, "dra": True},
              {"name": "gpu-c", "gpus": 1, "mig": "3g.40gb", "dra": True},
              {"name": "gpu-d", "gpus": 1, "dra": True, "dra_shared": True}],
    "claims": [{"name": "shared-gpu", "namespace": "ml"},
               {"name": "two", "namespace": "ml", "count": 2, "template": True},
               {"name": "four", "namespace": "ml", "count": 4, "template": True},
               {"name": "mig-3g", "namespace": "ml", "device_class": "mig.nvidia.com", "profile": "3g.40gb",
                "template": True},
               {"name": "half", "namespace": "ml", "memory_gib": 40, "template": True}],
    "pods": [
        {"name": "plain", "namespace": "ml", "gpus": 2, "util": 60, "memory_gib": 10},
        {"name": "train", "namespace": "ml", "claim": "two", "run_for": "15s", "util": 80, "memory_gib": 20},
        {"name": "reader-a", "namespace": "ml", "claim": "shared-gpu", "create": "5s", "util": 30,
         "memory_gib": 5},
        {"name": "reader-b", "namespace": "ml", "claim": "shared-gpu", "create": "20s", "util": 20,
         "memory_gib": 5},
        {"name": "too-big", "namespace": "ml", "claim": "four", "delete": "20s"},
        {"name": "slice", "namespace": "ml", "claim": "mig-3g", "memory_gib": 8},
        {"name": "served", "namespace": "ml", "gpus": 1, "node": "gpu-b", "create": "20s", "util": 40},
        {"name": "share-a", "namespace": "ml", "claim": "half", "util": 30, "memory_gib": 20},
        {"name": "share-b", "namespace": "ml", "claim": "half", "util": 20, "memory_gib": 10},
    ],
}


def test_a_dra_scenario_through_the_real_apiserver_matches_the_in_process_replay(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    with LocalKube(tmp_path_factory.mktemp("kube-dra"), build_binaries()) as plane:
        # the lead covers creating the DRA objects and starting the watcher on a loaded machine
        scenario = starting_now(parse_scenario(SCENARIO), lead_s=8.0)
        real = run_through_apiserver(scenario, plane)
        served = plane.admin().get(f"{DRA_PATH}/namespaces/ml/resourceclaims")["items"]
        slices = plane.admin().get(f"{DRA_PATH}/resourceslices")["items"]
    expected = run_in_process(scenario).report
    assert real.deadletters == []
    # the shared claim is still allocated to the readers; the templates' claims of ended pods are gone
    shared = next(c for c in served if c["metadata"]["name"] == "shared-gpu")
    assert [r["name"] for r in shared["status"]["reservedFor"]] == ["reader-a", "reader-b"]
    assert shared["status"]["allocation"]["devices"]["results"][0]["pool"] == "gpu-b"
    assert not any(c["metadata"]["name"].startswith(("train-", "too-big-")) for c in served)
    assert any(c["metadata"]["name"].startswith("served-extended-resources-") for c in served)
    assert sorted(s["spec"]["nodeName"] for s in slices) == ["gpu-b", "gpu-c", "gpu-d"]
    shared = next(s for s in slices if s["spec"]["nodeName"] == "gpu-d")["spec"]["devices"][0]
    assert shared["allowMultipleAllocations"] is True  # the server kept it: consumable capacity is served
    shares = [c for c in served if c["metadata"]["name"].startswith("share-")]
    assert len(shares) == 2 and all(c["status"]["allocation"]["devices"]["results"][0]["shareID"] for c in shares)
    assert [(p["name"], p["node"], p["end_reason"]) for p in real.report["pods"]] == [
        ("plain", "gpu-a", "Running"), ("train", "gpu-b", "Succeeded"), ("reader-a", "gpu-b", "Running"),
        ("reader-b", "gpu-b", "Running"), ("too-big", None, "Deleted"), ("slice", "gpu-c", "Running"),
        ("served", "gpu-b", "Running"), ("share-a", "gpu-d", "Running"), ("share-b", "gpu-d", "Running")]
    rows = {p["name"]: p for p in real.report["pods"]}
    # train's claim was deleted after it ended: its row keeps its GPUs; reader-b shares reader-a's
    # GPU, holds none of it and pays its share
    assert (rows["train"]["gpus"], rows["reader-a"]["gpus"], rows["reader-b"]["gpus"]) == (2, 1, 0)
    assert rows["train"]["cost_usd"] > 0 and rows["reader-b"]["cost_usd"] > 0
    problems = compare_report(real.report, expected, scenario.sample_interval_s)
    assert problems == [], "\n".join(problems)
