"""DRA in scenarios: the keys (``nodes[].dra``, ``claims``, ``pods[].claim``), the objects the
simulator builds for them as the API server serves them, read back by the watcher's own
``DraIndex`` and translation, and what a shared claim does over time."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from producers.watcher.dra import DraIndex
from producers.watcher.translate import node_to_state
from schemas.messages import GpuSample, PodState
from schemas.outputs import PodWindow
from schemas.topics import GPU_SAMPLES, K8S_PODS
from simulation.k8s_objects import claim_object, device_class_objects, node_object, resource_slice_object, slot_devices
from simulation.replay import run_in_process
from simulation.scenario import ScenarioError, parse_scenario
from simulation.simulator import FleetSimulator

T0 = datetime(2026, 1, 5, 9, tzinfo=UTC)
GIB = 2**30


def _scenario(**extra: Any) -> dict[str, Any]:
    return {"name": "dra", "duration": "10m", "nodes": [{"name": "gpu-a", "gpus": 2, "dra": True}],
            "claims": [{"name": "shared", "namespace": "ml", "count": 1}],
            "pods": [{"name": "p", "namespace": "ml", "claim": "shared"}]} | extra


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["pods"][0].update(claim="nope"), "pods[0].claim: no claim ml/nope in claims"),
    (lambda d: d["pods"][0].update(namespace="other"), "pods[0].claim: no claim other/shared in claims"),
    (lambda d: d["pods"][0].update(gpus=3), "pods[0].gpus: a pod with claim shared gets its 1 device(s): leave "
                                            "gpus out or write 1, got 3"),
    (lambda d: d["pods"][0].update(resource="nvidia.com/gpu"), "pods[0].resource: a pod with a claim requests no "
                                                               "extended resource (claim shared asks gpu.nvidia.com)"),
    (lambda d: d["claims"][0].update(device_class="gpu.amd.com"),
     "claims[0].device_class: expected one of gpu.nvidia.com, mig.nvidia.com, got 'gpu.amd.com'"),
    (lambda d: d["claims"][0].update(device_class="mig.nvidia.com"),
     "claims[0].profile: mig.nvidia.com needs a profile like 1g.10gb"),
    (lambda d: d["claims"][0].update(profile="1g.10gb"),
     "claims[0].profile: only with device_class: mig.nvidia.com, not gpu.nvidia.com"),
    (lambda d: d["claims"][0].update(count=0), "claims[0].count: must be >= 1, got 0"),
    (lambda d: d["claims"][0].update(template="yes"), "claims[0].template: expected true or false, got 'yes'"),
    (lambda d: d["claims"].append({"name": "shared", "namespace": "ml"}), "claims[1].name: duplicate claim ml/shared"),
    (lambda d: d["nodes"][0].update(time_slicing=2),
     "nodes[0].dra: cannot be combined with time_slicing (a DRA device is shared through a shared claim)"),
    (lambda d: d["nodes"][0].update(dra="true"), "nodes[0].dra: expected true or false, got 'true'"),
])
def test_a_wrong_dra_key_names_the_field(change: Any, message: str) -> None:
    data = copy.deepcopy(_scenario())
    change(data)
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    assert str(caught.value) == message


def test_a_pod_with_a_claim_may_write_the_claims_count() -> None:
    scenario = parse_scenario(_scenario(claims=[{"name": "shared", "namespace": "ml", "count": 2}],
                                        pods=[{"name": "p", "namespace": "ml", "claim": "shared", "gpus": 2}]))
    assert scenario.claim(scenario.pods[0]) == scenario.claims[0]
    assert scenario.claims[0].resource == "nvidia.com/gpu"


def _index(simulator: FleetSimulator) -> DraIndex:
    index = DraIndex()
    for obj in device_class_objects(T0):
        index.apply("deviceclasses", obj)
    for node in simulator.nodes.values():
        if node.spec.dra:
            index.apply("resourceslices", resource_slice_object(node, T0))
    return index


def test_the_slice_of_a_dra_node_reads_as_the_device_plugins_allocatable() -> None:
    """The watcher's own translation of a DRA node and of its device-plugin twin: the same GPU
    capacity, and each device's UUID is the one NVML reports for it."""
    dra = parse_scenario(_scenario(nodes=[{"name": "gpu-a", "gpus": 2, "dra": True},
                                          {"name": "gpu-b", "gpus": 2, "mig": "3g.40gb", "dra": True}]))
    plugin = parse_scenario(_scenario(nodes=[{"name": "gpu-a", "gpus": 2}, {"name": "gpu-b", "gpus": 2,
                                                                              "mig": "3g.40gb"}], claims=[], pods=[]))
    simulator, twin = FleetSimulator(dra), FleetSimulator(plugin)
    index = _index(simulator)
    for name in ("gpu-a", "gpu-b"):
        node, plugin_node = simulator.nodes[name], twin.nodes[name]
        assert node_object(node, T0)["status"]["allocatable"] == {}
        state = node_to_state(node_object(node, T0), T0, dra=index)
        plugin_state = node_to_state(node_object(plugin_node, T0), T0)
        assert state is not None and plugin_state is not None
        assert state.gpu_allocatable == plugin_state.gpu_allocatable == plugin_state.gpu_capacity
        assert [d.device for d in state.dra_devices] == sorted(d for d in slot_devices(node) if d)
    gpus = {d.device: d for d in index.node_devices("gpu-a")}
    assert {name: (d.resource, d.uuid, d.model, d.memory_bytes) for name, d in gpus.items()} == {
        f"gpu-{g.index}": ("nvidia.com/gpu", g.uuid, "NVIDIA H100 80GB HBM3", 80 * GIB)
        for g in simulator.nodes["gpu-a"].gpus}
    migs = index.node_devices("gpu-b")
    parents = {g.uuid: g for g in simulator.nodes["gpu-b"].gpus}
    assert len(migs) == 4 and all(d.resource == "nvidia.com/mig-3g.40gb" and d.mig_profile == "3g.40gb"
                                  and d.mig_parent_uuid in parents and d.memory_bytes == 40 * GIB for d in migs)
    assert {d.uuid for d in migs} == {m.uuid for g in parents.values() for m in g.mig_devices}


def test_a_claims_demand_before_and_after_allocation() -> None:
    """A pending claim counts its request (device class and count, a MIG profile through its
    selector); an allocated one the devices of its status, both as the resource they stand for."""
    scenario = parse_scenario(_scenario(
        nodes=[{"name": "gpu-a", "gpus": 2, "mig": "1g.10gb", "dra": True}],
        claims=[{"name": "slices", "namespace": "ml", "device_class": "mig.nvidia.com", "profile": "1g.10gb",
                 "count": 3}],
        pods=[{"name": "p", "namespace": "ml", "claim": "slices"}]))
    simulator = FleetSimulator(scenario)
    index = _index(simulator)
    claim, pod = simulator.claims[("ml", "slices")], simulator.pods[0]
    pod_obj = simulator._pod_object(pod, T0)
    assert pod_obj["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "slices"}]
    assert pod_obj["spec"]["containers"][0]["resources"] == {"requests": {}, "limits": {}, "claims": [{"name": "gpus"}]}
    index.apply("resourceclaims", claim_object(claim, T0, T0, [], {0: pod}))
    index.track_pod(pod_obj)
    assert index.pod_demand(pod_obj) == {"nvidia.com/mig-1g.10gb": 3}
    node = simulator.nodes["gpu-a"]
    claim.node, claim.slots, claim.reserved = "gpu-a", [0, 1, 2], [0]
    obj = claim_object(claim, T0, T0, slot_devices(node), {0: pod})
    assert obj["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "gpu-a", "device": name}
        for name in ("gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-1", "gpu-0-mig-1g10gb-2")]
    assert obj["status"]["reservedFor"] == [{"resource": "pods", "name": "p", "uid": pod.uid}]
    index.apply("resourceclaims", obj)
    assert index.pod_demand(pod_obj) == {"nvidia.com/mig-1g.10gb": 3}


def _pod_states(simulator: FleetSimulator) -> list[tuple[float, str, dict[str, int]]]:
    out = []
    for tick in simulator.run():
        for record in tick.records:
            if record.topic == K8S_PODS.suffix and record.value is not None:
                state = PodState.model_validate_json(record.value)
                out.append((tick.offset_s, state.name, dict(state.gpu_requests)))
    return out


def test_a_shared_claim_counts_once_and_moves_to_its_next_consumer() -> None:
    scenario = parse_scenario({
        "name": "shared", "duration": "12m",
        "nodes": [{"name": "gpu-a", "gpus": 2, "dra": True}],
        "claims": [{"name": "shared-gpu", "namespace": "ml"}],
        "pods": [{"name": "a", "namespace": "ml", "claim": "shared-gpu", "run_for": "10m", "util": 30},
                 {"name": "b", "namespace": "ml", "claim": "shared-gpu", "create": "1m", "util": 20}]})
    simulator = FleetSimulator(scenario)
    states = _pod_states(simulator)
    gpu = {"nvidia.com/gpu": 1}
    assert states[:2] == [(0.0, "a", gpu), (60.0, "b", {})]  # b shares a's claim: no GPU of its own
    # a ends at 10m (its last message still counts the GPU), then b is the claim's first consumer
    assert [s for s in states if s[0] == 600.0] == [(600.0, "a", gpu), (600.0, "b", gpu)]
    assert simulator.claims[("ml", "shared-gpu")].reserved == [1]


def test_the_kubelet_reports_a_shared_device_for_each_pod_of_the_claim() -> None:
    scenario = parse_scenario({
        "name": "shared", "duration": "2m",
        "nodes": [{"name": "gpu-a", "gpus": 2, "dra": True}],
        "claims": [{"name": "shared-gpu", "namespace": "ml"}],
        "pods": [{"name": "a", "namespace": "ml", "claim": "shared-gpu", "util": 30, "memory_gib": 20},
                 {"name": "b", "namespace": "ml", "claim": "shared-gpu", "util": 20, "memory_gib": 10}]})
    simulator = FleetSimulator(scenario)
    last = [r for tick in simulator.run() for r in tick.records if r.topic == GPU_SAMPLES.suffix][-1]
    sample = GpuSample.model_validate_json(last.value or b"")
    claim = simulator.claims[("ml", "shared-gpu")]
    assert [(a.pod, a.claim_namespace, a.claim_name, a.pool, a.device) for a in sample.dra_allocations] == [
        ("a", "ml", "shared-gpu", "gpu-a", "gpu-0"), ("b", "ml", "shared-gpu", "gpu-a", "gpu-0")]
    assert sample.dra_allocations[0].cdi_ids == [f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu-0"]
    gpu0 = sample.gpus[0]
    assert gpu0.gpu_util_pct == 50.0 and gpu0.mem_used_bytes == 30 * GIB and len(gpu0.processes) == 2


def test_a_template_claim_is_made_with_its_pod_and_deleted_after_it_ends() -> None:
    scenario = parse_scenario({
        "name": "tmpl", "duration": "5m",
        "nodes": [{"name": "gpu-a", "gpus": 2, "dra": True}],
        "claims": [{"name": "two", "namespace": "ml", "count": 2, "template": True}],
        "pods": [{"name": "a", "namespace": "ml", "claim": "two", "create": "1m", "run_for": "2m"}]})
    simulator = FleetSimulator(scenario)
    pod = simulator.pods[0]
    claim = pod.claim
    assert claim is not None and claim.name.startswith("a-gpus-") and claim.created is None
    obj = simulator._pod_object(pod, T0)
    assert obj["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "two"}]
    states = _pod_states(simulator)
    assert states[0] == (60.0, "a", {"nvidia.com/gpu": 2}) and states[-1] == (180.0, "a", {"nvidia.com/gpu": 2})
    assert claim.created == 60.0 and claim.deleted
    assert simulator._pod_object(pod, T0)["status"]["resourceClaimStatuses"] == [
        {"name": "gpus", "resourceClaimName": claim.name}]
    # the claim is gone; the pod, which ended, keeps the GPUs it held while it ran
    assert simulator.dra is not None
    assert simulator.dra.pod_demand(simulator._pod_object(pod, T0)) == {"nvidia.com/gpu": 2}


def test_a_claim_pod_never_lands_on_a_device_plugin_node_nor_a_plain_pod_on_a_dra_node() -> None:
    scenario = parse_scenario({
        "name": "apart", "duration": "1m",
        "nodes": [{"name": "plugin", "gpus": 8}, {"name": "dra", "gpus": 1, "dra": True}],
        "claims": [{"name": "two", "count": 2, "template": True}],
        "pods": [{"name": "claims-two", "claim": "two"}, {"name": "asks-two", "gpus": 2, "node": "dra"}]})
    simulator = FleetSimulator(scenario)
    list(simulator.run())
    assert [p.last_message for p in simulator.pods] == [
        "0/2 nodes are available: 2 cannot allocate all claims.",
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector."]


def test_consumable_capacity_shares_a_device_among_claims() -> None:
    """``dra_shared`` devices (``allowMultipleAllocations``) take claims with ``memory_gib`` until
    their memory is spoken for; each result is a share (``shareID``, ``consumedCapacity``) that the
    kubelet reports as ``share_id``; the watcher counts the device once, in the first claim."""
    scenario = parse_scenario({
        "name": "shares", "duration": "2m",
        "nodes": [{"name": "gpu-a", "gpus": 2, "dra": True, "dra_shared": True}],
        "claims": [{"name": "forty", "namespace": "ml", "memory_gib": 40, "template": True},
                   {"name": "thirty", "namespace": "ml", "memory_gib": 30, "template": True},
                   {"name": "twenty", "namespace": "ml", "memory_gib": 20, "template": True}],
        "pods": [{"name": "pa", "namespace": "ml", "claim": "forty", "util": 30, "memory_gib": 35},
                 {"name": "pb", "namespace": "ml", "claim": "thirty", "util": 20, "memory_gib": 25},
                 {"name": "pc", "namespace": "ml", "claim": "twenty", "util": 40, "memory_gib": 15}]})
    simulator = FleetSimulator(scenario)
    ticks = list(simulator.run())
    node = simulator.nodes["gpu-a"]
    device = resource_slice_object(node, T0)["spec"]["devices"][0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"] == {"value": "80Gi", "requestPolicy": {
        "default": "80Gi", "validRange": {"min": "1Mi", "max": "80Gi"}}}
    pa, pb, pc = simulator.pods
    assert (pa.slots, pb.slots, pc.slots) == ([0], [0], [1])  # 40 + 30 on gpu-0; 20 more would not fit
    assert pa.claim is not None and pb.claim is not None
    obj = claim_object(pa.claim, T0, T0, slot_devices(node), {p.index: p for p in simulator.pods})
    assert obj["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "40Gi"}}
    result = obj["status"]["allocation"]["devices"]["results"][0]
    assert result["device"] == "gpu-0" and result["consumedCapacity"] == {"memory": "40Gi"} and result["shareID"]
    sample = GpuSample.model_validate_json(
        next(r for r in ticks[-1].records if r.topic == GPU_SAMPLES.suffix).value or b"")
    shares = {(a.pod, a.device): a.share_id for a in sample.dra_allocations}
    assert shares == {("pa", "gpu-0"): result["shareID"], ("pb", "gpu-0"): shares[("pb", "gpu-0")],
                      ("pc", "gpu-1"): shares[("pc", "gpu-1")]} and len(set(shares.values())) == 3
    assert sample.gpus[0].mem_used_bytes == 60 * GIB and sample.gpus[0].gpu_util_pct == 50.0
    index = simulator.dra
    assert index is not None and index.node_capacity("gpu-a") == {"nvidia.com/gpu": 2}
    demands = sorted((p.spec.name, index.pod_demand(simulator._pod_object(p, T0))) for p in simulator.pods)
    assert demands == [("pa", {"nvidia.com/gpu": 1}), ("pb", {}), ("pc", {"nvidia.com/gpu": 1})]


@pytest.mark.parametrize(("node", "claim", "message"), [
    ({"dra_shared": True}, {}, "nodes[0].dra_shared: needs dra: true"),
    ({"dra": True, "mig": "1g.10gb", "dra_shared": True}, {},
     "nodes[0].dra_shared: only for whole GPUs, not with mig or mig_layout"),
    ({"dra": True}, {"device_class": "mig.nvidia.com", "profile": "1g.10gb", "memory_gib": 5},
     "claims[0].memory_gib: a share of a whole GPU: not with a MIG profile"),
    ({"dra": True}, {"memory_gib": 0}, "claims[0].memory_gib: must be >= 0.000976562, got 0"),
])
def test_a_wrong_consumable_capacity_key_names_the_field(node: dict[str, Any], claim: dict[str, Any],
                                                          message: str) -> None:
    data = _scenario(nodes=[{"name": "gpu-a", "gpus": 2} | node],
                     claims=[{"name": "shared", "namespace": "ml"} | claim])
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    assert str(caught.value) == message


def test_pods_running_together_on_a_shared_claim_pay_the_whole_gpu_between_them() -> None:
    """Both consumers of a shared claim run at once: the GPU is allocated once (in the first
    consumer's demand; the second holds no GPU-hours), and its whole price over the period is
    attributed across them by their use, in the lifecycle rows as in the windows."""
    scenario = parse_scenario({
        "name": "shared-cost", "duration": "30m", "prices": {"NVIDIA H100 80GB HBM3": 2.0},
        "nodes": [{"name": "gpu-a", "gpus": 1, "dra": True}],
        "claims": [{"name": "shared-gpu", "namespace": "ml"}],
        "pods": [{"name": "reader-a", "namespace": "ml", "claim": "shared-gpu", "util": 30, "memory_gib": 20},
                 {"name": "reader-b", "namespace": "ml", "claim": "shared-gpu", "create": "5m", "util": 10,
                  "memory_gib": 10}]})
    result = run_in_process(scenario)
    report = result.report
    rows = {p["name"]: p for p in report["pods"]}
    assert (rows["reader-a"]["gpus"], rows["reader-b"]["gpus"]) == (1, 0)
    assert (rows["reader-a"]["gpu_hours"], rows["reader-b"]["gpu_hours"]) == (0.5, 0.0)
    assert report["cluster"]["gpu_hours_capacity"] == report["cluster"]["gpu_hours_allocated"] == 0.5
    full_price = 0.5 * 2.0  # one GPU for 30 minutes at $2 an hour
    # reader-a alone for 5 minutes, then its 30 % of their 40 % of use for 25 minutes: 3/4 of the GPU
    assert rows["reader-a"]["cost_usd"] == pytest.approx(2.0 * (5 + 25 * 0.75) / 60, abs=1e-4)
    assert rows["reader-b"]["cost_usd"] == pytest.approx(2.0 * 25 * 0.25 / 60, abs=1e-4)
    assert rows["reader-a"]["cost_usd"] + rows["reader-b"]["cost_usd"] == pytest.approx(full_price, abs=1e-4)
    windows = [m for m in result.outputs if isinstance(m, PodWindow)]
    assert sum(w.cost_usd for w in windows) == pytest.approx(full_price, abs=1e-4)
