"""DRA lowered to the device-plugin model (producers/watcher/dra.py, docs/dra.md), on real-shaped
``resource.k8s.io/v1`` JSON: what a node's slices count as, what a pod's claims ask for, and that
no object — however large or malformed — stops the translation."""

from __future__ import annotations

import copy
import logging
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from common.settings import ConfigError, WatcherSettings, load_settings
from producers.watcher.bounds import Trim
from producers.watcher.dra import DraChange, DraDriver, DraDriverTable, DraIndex
from producers.watcher.fake_cluster import make_node, make_pod
from producers.watcher.service import WatcherConfig
from producers.watcher.translate import TranslateConfig, node_to_state, pod_to_state
from schemas.codec import decode, encode
from schemas.messages import MAX_DRA_DEVICES, NodeState
from tests.watcher.dra_objects import (
    allocate,
    claim,
    claim_pod,
    counter_set,
    device_class,
    gpu_device,
    mig_device,
    resource_slice,
)

TS = datetime(2024, 5, 6, 8, tzinfo=UTC)
CONFIG = TranslateConfig()


def bare_node(name: str) -> dict[str, Any]:
    """A node with no device plugin and no GPU labels: only DRA tells it has GPUs."""
    return make_node(name, gpus=0)


def index_with(*objects: tuple[str, dict[str, Any]]) -> DraIndex:
    index = DraIndex()
    for kind, obj in objects:
        index.apply(kind, obj)
    return index


# --------------------------------------------------------------------------- nodes


def test_whole_gpus_published_by_nvidias_driver_count_as_nvidia_gpu() -> None:
    index = index_with(("resourceslices", resource_slice("dra-0", [gpu_device(i) for i in range(8)])))
    state = node_to_state(bare_node("dra-0"), TS, CONFIG, dra=index)
    assert state is not None
    assert state.gpu_capacity == state.gpu_allocatable == {"nvidia.com/gpu": 8}
    first = state.dra_devices[0]
    assert (first.driver, first.pool, first.device, first.resource) == ("gpu.nvidia.com", "dra-0", "gpu-0",
                                                                        "nvidia.com/gpu")
    assert first.uuid == "GPU-00000000-0000-0000-0000-000000000000" and first.physical_gpu == first.uuid
    assert first.model == "NVIDIA H100 80GB HBM3" and first.memory_bytes == 81559 * 2**20
    assert not state.truncated
    assert decode(encode(state), NodeState) == state
    # without the index, the same node is no GPU node at all (as before DRA)
    assert node_to_state(bare_node("dra-0"), TS, CONFIG) is None
    # another node's slice does not count here
    assert node_to_state(bare_node("dra-1"), TS, CONFIG, dra=index) is None


def test_dra_gpus_add_to_device_plugin_gpus_of_a_mixed_node() -> None:
    index = index_with(("resourceslices", resource_slice("mixed", [gpu_device(4), gpu_device(5)])))
    state = node_to_state(make_node("mixed", gpus=4), TS, CONFIG, dra=index)
    assert state is not None and state.gpu_capacity == {"nvidia.com/gpu": 6}
    assert state.gpu_product == "NVIDIA-A100-SXM4-80GB"  # the labels are still read


def test_static_mig_devices_count_as_their_profile_and_their_parent_not_at_all() -> None:
    parent = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
    migs = [mig_device(1, "1g.10gb", start, parent_uuid=parent, uuid=f"MIG-{start}") for start in range(7)]
    index = index_with(("resourceslices", resource_slice("mig-0", [gpu_device(0), gpu_device(1, uuid=parent),
                                                                   *migs])))
    state = node_to_state(bare_node("mig-0"), TS, CONFIG, dra=index)
    assert state is not None
    # the device plugin's mixed strategy twin: one whole GPU, seven 1g.10gb devices
    assert state.gpu_capacity == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 7}
    mig = next(d for d in state.dra_devices if d.uuid == "MIG-0")
    assert (mig.resource, mig.mig_profile, mig.mig_parent_uuid, mig.physical_gpu) == (
        "nvidia.com/mig-1g.10gb", "1g.10gb", parent, parent)
    assert mig.memory_bytes == 10 * 2**30


def test_partitionable_devices_sharing_counters_are_one_physical_gpu() -> None:
    """Dynamic MIG (partitions.go): per GPU a counter set, the full GPU and every MIG placement
    consuming from it; on 1.37 the counter sets may sit in their own slice of the pool."""
    devices = []
    for gpu in range(2):
        counters = f"gpu-{gpu}-counter-set"
        devices.append(gpu_device(gpu, counter_set=counters))
        devices += [mig_device(gpu, "1g.10gb", start, counter_set=counters) for start in range(7)]
        devices.append(mig_device(gpu, "3g.40gb", 0, counter_set=counters, memory="40Gi"))
    counters_slice = resource_slice("part-0", [], name="part-0-counters", slice_count=2,
                                    shared_counters=[counter_set(f"gpu-{g}-counter-set") for g in range(2)])
    devices_slice = resource_slice("part-0", devices, name="part-0-devices", slice_count=2)
    index = index_with(("resourceslices", counters_slice), ("resourceslices", devices_slice))
    state = node_to_state(bare_node("part-0"), TS, CONFIG, dra=index)
    assert state is not None
    assert state.gpu_capacity == {"nvidia.com/gpu": 2}
    assert len(state.dra_devices) == 18
    gpu0 = "GPU-00000000-0000-0000-0000-000000000000"
    on_gpu0 = [d for d in state.dra_devices if d.device.startswith("gpu-0")]
    assert {d.physical_gpu for d in on_gpu0} == {gpu0}
    assert {d.resource for d in on_gpu0} == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"}
    # partitions without a published full GPU: still one physical GPU per counter set
    only_migs = [mig_device(0, "1g.10gb", s, counter_set="gpu-0-counter-set") for s in range(7)]
    index = index_with(("resourceslices", resource_slice("part-1", only_migs)))
    state = node_to_state(bare_node("part-1"), TS, CONFIG, dra=index)
    assert state is not None and state.gpu_capacity == {"nvidia.com/gpu": 1}
    assert {d.physical_gpu for d in state.dra_devices} == {"part-1/gpu-0-counter-set"}


def test_a_device_several_claims_may_share_counts_once_in_capacity() -> None:
    index = index_with(("resourceslices", resource_slice("shared-0", [gpu_device(0, multi=True), gpu_device(1)])))
    assert index.node_capacity("shared-0") == {"nvidia.com/gpu": 2}
    assert [d.multi_allocatable for d in index.node_devices("shared-0")] == [True, False]


def test_only_the_newest_generation_of_a_pool_counts_and_deletes_take_effect() -> None:
    index = DraIndex()
    old = resource_slice("gen-0", [gpu_device(i) for i in range(4)], name="gen-0-a", generation=1)
    new = resource_slice("gen-0", [gpu_device(i) for i in range(2)], name="gen-0-b", generation=2)
    assert index.apply("resourceslices", old) == DraChange(nodes=frozenset({"gen-0"}))
    assert index.node_capacity("gen-0") == {"nvidia.com/gpu": 4}
    index.apply("resourceslices", new)
    assert index.node_capacity("gen-0") == {"nvidia.com/gpu": 2}
    index.apply("resourceslices", old, deleted=True)
    assert index.node_capacity("gen-0") == {"nvidia.com/gpu": 2}
    assert index.apply("resourceslices", new, deleted=True).nodes == {"gen-0"}
    assert index.node_capacity("gen-0") == {} and index.node_devices("gen-0") == []


def test_devices_that_are_not_gpus_are_left_out(caplog: pytest.LogCaptureFixture) -> None:
    vfio = {"name": "gpu-vfio-0", "attributes": {"type": {"string": "vfio"}, "uuid": {"string": "GPU-v"}}}
    untyped = {"name": "gpu-9", "attributes": {"uuid": {"string": "GPU-9"}}}
    nic = resource_slice("n", [{"name": "eth0", "attributes": {"type": {"string": "gpu"}}}], driver="net.example.com")
    caplog.set_level(logging.INFO, logger="producers.watcher.dra")
    index = index_with(("resourceslices", resource_slice("n", [vfio, untyped, gpu_device(0)])),
                       ("resourceslices", nic))
    assert [d.device for d in index.node_devices("n")] == ["gpu-0"]
    assert index.node_capacity("n") == {"nvidia.com/gpu": 1}
    index.apply("resourceslices", {**nic, "metadata": {"name": "another-nic-slice"}})
    notes = [r for r in caplog.records if "not in the driver table" in r.getMessage()]
    assert len(notes) == 1  # once per driver, not per slice


def test_another_vendors_driver_is_a_table_entry_not_code() -> None:
    vendor = DraDriver(driver="gpu.example.com", device_classes={"gpu.example.com": "gpu"}, type_attribute=None,
                       uuid_attribute="serial", model_attribute="model", memory_capacity="vram",
                       gpu_resource="example.com/gpu", partition_resource_prefix="example.com/part-")
    index = DraIndex(DraDriverTable([vendor]))
    device = {"name": "card-0", "attributes": {"serial": {"string": "EX-1"}, "gpu.example.com/model": {"string": "X9"}},
              "capacity": {"vram": {"value": "64Gi"}}}
    index.apply("resourceslices", resource_slice("ex-0", [device], driver="gpu.example.com"))
    index.apply("resourceslices", resource_slice("ex-0", [gpu_device(0)], name="nvidia-ignored"))
    [card] = index.node_devices("ex-0")
    assert (card.resource, card.uuid, card.model, card.memory_bytes) == ("example.com/gpu", "EX-1", "X9", 64 * 2**30)
    index.apply("resourceclaims", claim("c", device_class_name="gpu.example.com", count=3))
    pod = claim_pod("p", "uid-p", ["c"])
    index.track_pod(pod)
    assert index.pod_demand(pod) == {"example.com/gpu": 3}


# --------------------------------------------------------------------------- pods


def test_a_pending_pods_unallocated_claim_is_pending_demand_then_its_allocation() -> None:
    index = index_with(("deviceclasses", device_class()),
                       ("resourceslices", resource_slice("dra-0", [gpu_device(i) for i in range(8)])))
    pod = claim_pod("train", "uid-train", ["train-gpus"])
    index.track_pod(pod)
    assert index.pod_demand(pod) == {}  # the claim is not seen yet
    change = index.apply("resourceclaims", claim("train-gpus", count=4))
    assert change.pods == {"uid-train"}
    state = pod_to_state(pod, TS, CONFIG, dra=index)
    assert state is not None and state.phase == "Pending" and state.gpu_requests == {"nvidia.com/gpu": 4}
    assert pod_to_state(pod, TS, CONFIG) is None  # without DRA, the pod asks for no GPU
    allocated = allocate(claim("train-gpus", count=4), "dra-0", ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
                         [("train", "uid-train")])
    assert index.apply("resourceclaims", allocated).pods == {"uid-train"}
    assert index.pod_demand(pod) == {"nvidia.com/gpu": 4}


def test_a_claim_from_a_template_is_found_through_the_pods_status() -> None:
    index = index_with(("resourceclaims", claim("train-gpu-x7k2p", count=2)))
    pod = claim_pod("train", "uid-t", [], templates={"gpu": "train-gpu-x7k2p"})
    index.track_pod(pod)
    assert index.pod_claims(pod) == ["ml/train-gpu-x7k2p"]
    assert index.pod_demand(pod) == {"nvidia.com/gpu": 2}
    not_yet = claim_pod("other", "uid-o", [], templates={})
    not_yet["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    assert index.pod_claims(not_yet) == []  # the controller has not made its claim yet


def test_mig_and_custom_classes_and_first_available_requests() -> None:
    index = index_with(("deviceclasses", device_class("mig.nvidia.com", "mig")),
                       ("deviceclasses", device_class("team-h100s")),  # a class the table does not name
                       ("deviceclasses", {"metadata": {"name": "nic"}, "spec": {"selectors": [
                           {"cel": {"expression": 'device.driver == "net.example.com"'}}]}}))
    index.apply("resourceclaims", claim("mig", device_class_name="mig.nvidia.com", count=2, selectors=[
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"]))
    index.apply("resourceclaims", claim("any-mig", device_class_name="mig.nvidia.com"))
    index.apply("resourceclaims", claim("custom", device_class_name="team-h100s"))
    index.apply("resourceclaims", claim("nic", device_class_name="nic"))
    first = claim("first")
    first["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2},
        {"name": "small", "deviceClassName": "mig.nvidia.com", "count": 1}]}]
    index.apply("resourceclaims", first)
    pod = claim_pod("p", "uid-p", ["mig", "any-mig", "custom", "nic", "first"])
    index.track_pod(pod)
    assert index.pod_demand(pod) == {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-any": 1, "nvidia.com/gpu": 3}


def test_a_shared_claim_counts_once_in_its_first_consumer() -> None:
    index = index_with(("resourceslices", resource_slice("dra-0", [gpu_device(0)])))
    early = claim_pod("early", "uid-early", ["shared"], created="2024-05-06T07:00:00Z")
    late = claim_pod("late", "uid-late", ["shared"], created="2024-05-06T07:05:00Z")
    index.apply("resourceclaims", claim("shared"))
    assert index.track_pod(late) == DraChange()
    assert index.pod_demand(late) == {"nvidia.com/gpu": 1}
    # an earlier consumer appears: it counts the claim now, and the late one must be republished
    assert index.track_pod(early).pods == {"uid-late"}
    assert (index.pod_demand(early), index.pod_demand(late)) == ({"nvidia.com/gpu": 1}, {})
    # once allocated, reservedFor decides (the scheduler's order)
    reserved = allocate(claim("shared"), "dra-0", ["gpu-0"], [("late", "uid-late"), ("early", "uid-early")])
    assert index.apply("resourceclaims", reserved).pods == {"uid-early", "uid-late"}
    assert (index.pod_demand(early), index.pod_demand(late)) == ({}, {"nvidia.com/gpu": 1})
    # the first consumer ends: the claim's status drops it, the other pod counts it
    index.apply("resourceclaims", allocate(claim("shared"), "dra-0", ["gpu-0"], [("early", "uid-early")]))
    assert index.forget_pod("uid-late").pods == {"uid-early"}
    assert index.pod_demand(early) == {"nvidia.com/gpu": 1}


def test_shares_of_a_device_with_consumable_capacity_count_once() -> None:
    index = index_with(("resourceslices", resource_slice("dra-0", [gpu_device(0, multi=True)])))
    a = allocate(claim("a"), "dra-0", ["gpu-0"], [("pa", "uid-a")], share_ids=["share-a"])
    b = allocate(claim("b"), "dra-0", ["gpu-0"], [("pb", "uid-b")], share_ids=["share-b"])
    index.apply("resourceclaims", a)
    assert index.apply("resourceclaims", b).pods == {"uid-a", "uid-b"}
    pa, pb = claim_pod("pa", "uid-a", ["a"]), claim_pod("pb", "uid-b", ["b"])
    assert (index.pod_demand(pa), index.pod_demand(pb)) == ({"nvidia.com/gpu": 1}, {})
    assert index.apply("resourceclaims", a, deleted=True).pods == {"uid-a", "uid-b"}
    assert index.pod_demand(pb) == {"nvidia.com/gpu": 1}


def test_the_claim_for_an_extended_resource_served_by_dra_is_not_counted_twice() -> None:
    index = index_with(("deviceclasses", device_class("gpu.nvidia.com", extended_resource="nvidia.com/gpu")),
                       ("resourceslices", resource_slice("dra-0", [gpu_device(0), gpu_device(1)])))
    pod = make_pod("ext", gpus=2)
    pod["metadata"]["uid"] = "uid-ext"
    pod["spec"]["nodeName"] = "dra-0"
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "ext-extended-resources-abcde",
        "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu",
                             "requestName": "container-0-request-0"}]}
    pod["spec"]["resourceClaims"] = [{"name": "extended", "resourceClaimName": "ext-extended-resources-abcde"}]
    made = claim("ext-extended-resources-abcde", namespace="ml", count=2, request="container-0-request-0")
    generated = allocate(made, "dra-0", ["gpu-0", "gpu-1"], [("ext", "uid-ext")], request="container-0-request-0")
    index.apply("resourceclaims", generated)
    index.track_pod(pod)
    state = pod_to_state(pod, TS, CONFIG, dra=index)
    assert state is not None and state.gpu_requests == {"nvidia.com/gpu": 2}


def _finished(pod: dict[str, Any]) -> dict[str, Any]:
    done = copy.deepcopy(pod)
    done["status"]["phase"] = "Succeeded"
    return done


def test_a_pod_that_ended_keeps_the_gpus_its_claims_held_after_the_controller_deletes_them() -> None:
    """The resourceclaim controller releases and deletes a template's claim once the pod ended; the
    pod's last messages must still carry its GPUs (else its lifecycle row shows 0 GPUs and $0)."""
    index = index_with(("resourceslices", resource_slice("dra-0", [gpu_device(0), gpu_device(1)])))
    generated = claim("train-gpu-x7k2p", count=2)
    index.apply("resourceclaims", allocate(copy.deepcopy(generated), "dra-0", ["gpu-0", "gpu-1"],
                                           [("train", "uid-train")]))
    live = claim_pod("train", "uid-train", [], templates={"gpu": "train-gpu-x7k2p"}, node="dra-0")
    index.track_pod(live)
    state = pod_to_state(live, TS, CONFIG, dra=index)
    assert state is not None and state.gpu_requests == {"nvidia.com/gpu": 2}
    done = _finished(live)
    index.track_pod(done)
    released = allocate(copy.deepcopy(generated), "dra-0", ["gpu-0", "gpu-1"], [])
    assert index.apply("resourceclaims", released).pods == {"uid-train"}
    assert index.pod_demand(done) == {"nvidia.com/gpu": 2}
    assert index.apply("resourceclaims", released, deleted=True).pods == {"uid-train"}
    state = pod_to_state(done, TS, CONFIG, dra=index)
    assert state is not None and state.phase == "Succeeded" and state.gpu_requests == {"nvidia.com/gpu": 2}
    # a pod first seen after it ended counts what its claims hold then
    late = DraIndex()
    late.track_pod(done)
    assert late.pod_demand(done) == {}


def test_a_running_pods_claim_deleted_before_its_end_is_seen_keeps_its_demand() -> None:
    """The claim and pod watches are separate streams: the controller's release or deletion of a
    claim may arrive before the pod's own end; a bound pod keeps what the claim gave it, and so do
    its final state and tombstone when the pod is deleted (even from a stale, still-running copy)."""
    index = index_with(("resourceslices", resource_slice("dra-0", [gpu_device(0)])))
    index.apply("resourceclaims", allocate(claim("one"), "dra-0", ["gpu-0"], [("p", "uid-p")]))
    running = claim_pod("p", "uid-p", ["one"], node="dra-0")
    index.track_pod(running)
    assert index.pod_demand(running) == {"nvidia.com/gpu": 1}
    index.apply("resourceclaims", allocate(claim("one"), "dra-0", ["gpu-0"], []))  # released
    assert index.pod_demand(running) == {"nvidia.com/gpu": 1}
    index.apply("resourceclaims", claim("one"))  # deallocated
    assert index.pod_demand(running) == {"nvidia.com/gpu": 1}
    index.apply("resourceclaims", claim("one"), deleted=True)
    index.end_pod("uid-p")
    state = pod_to_state(running, TS, CONFIG, dra=index)
    assert state is not None and state.gpu_requests == {"nvidia.com/gpu": 1}
    # a pod not yet bound has no devices to keep: its demand follows its claim
    pending = claim_pod("q", "uid-q", ["two"])
    index.apply("resourceclaims", claim("two", count=2))
    index.track_pod(pending)
    assert index.pod_demand(pending) == {"nvidia.com/gpu": 2}
    index.apply("resourceclaims", claim("two", count=2), deleted=True)
    assert index.pod_demand(pending) == {}


def test_an_ended_pod_leaves_an_unallocated_shared_claim_to_the_pods_waiting_for_it() -> None:
    index = index_with(("resourceclaims", claim("shared")))
    first = claim_pod("first", "uid-1", ["shared"], created="2024-05-06T07:00:00Z")
    second = claim_pod("second", "uid-2", ["shared"], created="2024-05-06T07:05:00Z")
    index.track_pod(first)
    index.track_pod(second)
    assert (index.pod_demand(first), index.pod_demand(second)) == ({"nvidia.com/gpu": 1}, {})
    assert index.track_pod(_finished(first)).pods == {"uid-2"}
    assert index.pod_demand(second) == {"nvidia.com/gpu": 1}
    assert index.pod_demand(_finished(first)) == {"nvidia.com/gpu": 1}  # what it counted while live


def test_a_pending_pod_sharing_a_claim_it_does_not_count_is_still_a_gpu_pod() -> None:
    """Its demand is counted in the claim's first consumer, but it waits for GPUs all the same: it
    is published (with no demand), so its scheduling failures are reported with it."""
    index = index_with(("deviceclasses", device_class()),
                       ("resourceslices", resource_slice("dra-0", [gpu_device(0, multi=True)])))
    index.apply("resourceclaims", allocate(claim("shared"), "dra-0", ["gpu-0"], [("a", "uid-a")]))
    holder = claim_pod("a", "uid-a", ["shared"], node="dra-0")
    waiter = claim_pod("b", "uid-b", ["shared"], created="2024-05-06T07:05:00Z")
    for pod in (holder, waiter):
        index.track_pod(pod)
    state = pod_to_state(waiter, TS, CONFIG, gpu_nodes=(), dra=index)
    assert state is not None and state.phase == "Pending" and state.gpu_requests == {}
    assert index.uses_gpus(waiter) and not index.pod_demand(waiter)
    # a claim of another driver, or none seen yet, does not make a GPU pod
    index.apply("resourceclaims", allocate(claim("nic"), "dra-0", ["eth0"], [("c", "uid-c")],
                                           driver="net.example.com"))
    for other in (claim_pod("c", "uid-c", ["nic"]), claim_pod("d", "uid-d", ["not-made-yet"])):
        index.track_pod(other)
        assert not index.uses_gpus(other) and pod_to_state(other, TS, CONFIG, dra=index) is None


def test_an_allocated_device_whose_slice_is_gone_still_counts_as_requested() -> None:
    index = DraIndex()
    index.apply("resourceclaims", allocate(claim("c", device_class_name="mig.nvidia.com", selectors=[
        'device.attributes["gpu.nvidia.com"].profile == "2g.20gb"']), "n", ["gpu-0-mig-2g20gb-0"], [("p", "u")]))
    assert index.pod_demand(claim_pod("p", "u", ["c"])) == {"nvidia.com/mig-2g.20gb": 1}
    monitor = claim("watch-all")
    monitor["spec"]["devices"]["requests"][0]["exactly"] |= {"allocationMode": "All", "adminAccess": True}
    index.apply("resourceclaims", monitor)
    assert index.pod_demand(claim_pod("m", "um", ["watch-all"])) == {}  # admin access takes no GPU
    allocated_monitor = allocate(monitor, "n", ["gpu-0"], [("m", "um")])
    allocated_monitor["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    index.apply("resourceclaims", allocated_monitor)
    assert index.pod_demand(claim_pod("m", "um", ["watch-all"])) == {}
    other_driver = allocate(claim("d"), "n", ["eth0"], [("q", "v")], driver="net.example.com")
    index.apply("resourceclaims", other_driver)
    assert index.pod_demand(claim_pod("q", "v", ["d"])) == {}


# --------------------------------------------------------------------------- hostile input


def test_a_slice_of_10000_devices_is_cut_to_the_bound_and_flagged() -> None:
    index = DraIndex()
    huge = resource_slice("huge", [gpu_device(i, uuid=f"GPU-{i}") for i in range(10_000)])
    index.apply("resourceslices", huge)
    trim = Trim()
    state = node_to_state(bare_node("huge"), TS, CONFIG, trim, dra=index)
    assert state is not None and state.truncated and "items" in trim.what
    assert len(state.dra_devices) == MAX_DRA_DEVICES and state.gpu_capacity == {"nvidia.com/gpu": MAX_DRA_DEVICES}
    assert decode(encode(state), NodeState) == state


def test_absurd_and_missing_attributes_never_stop_the_translation() -> None:
    devices: list[Any] = [
        "not an object", None, {"name": 7}, {"name": "x" * 300, "attributes": {"type": {"string": "gpu"}}},
        {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "U" * 10_000},
                                          "productName": {"int": 12}},
         "capacity": {"memory": {"value": "100Ei"}}},
        {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "uuid": {"strings": ["a", "b"]}},
         "capacity": {"memory": "80Gi"}, "consumesCounters": "nope"},
        {"name": "gpu-2", "attributes": {"type": {"string": "mig"}, "profile": {"string": "p" * 1000}}},
        {"name": "gpu-3", "attributes": "garbage"},
    ]
    bad = resource_slice("odd", devices)
    index = DraIndex()
    index.apply("resourceslices", bad)
    index.apply("resourceslices", {"metadata": {"name": "no-spec"}})
    index.apply("resourceslices", {"metadata": {}, "spec": None})
    index.apply("resourceclaims", {"metadata": {"name": "c", "namespace": "ml"}, "spec": {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 10**30}}, "junk", {"name": 3}]}},
        "status": {"allocation": {"devices": {"results": [{"driver": None}, "junk"]}}, "reservedFor": "nobody"}})
    index.apply("deviceclasses", {"metadata": {"name": "weird"}, "spec": {"selectors": [{"cel": {"expression": 5}}]}})
    trim = Trim()
    state = node_to_state(bare_node("odd"), TS, CONFIG, trim, dra=index)
    assert state is not None and state.truncated and {"text", "quantity"} <= trim.what
    [gpu0, gpu1] = state.dra_devices
    assert len(gpu0.uuid or "") == 128 and gpu0.memory_bytes is None and gpu0.model == "12"
    assert gpu1.uuid is None and gpu1.memory_bytes is None
    pod = claim_pod("p", "uid", ["c"])
    index.track_pod(pod)
    assert index.pod_demand(pod) == {"nvidia.com/gpu": 2**16}  # the count read is bounded; the message clamps
    assert decode(encode(state), NodeState) == state


def test_the_encoded_node_with_the_most_devices_fits_a_message() -> None:
    migs = [mig_device(g, "1g.10gb", s, uuid=f"MIG-{g:04d}-{s}-" + "0" * 32) for g in range(150) for s in range(7)]
    index = index_with(("resourceslices", resource_slice("big", migs)))
    state = node_to_state(bare_node("big"), TS, CONFIG, dra=index)
    assert isinstance(state, NodeState) and len(state.dra_devices) == MAX_DRA_DEVICES
    assert len(encode(state)) < 1024 * 1024


# --------------------------------------------------------------------------- configuration


def test_the_driver_table_setting_is_validated_and_reaches_the_watcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_DRA_DRIVERS", '[{"driver": "gpu.example.com", "type_attribute": null, '
                                              '"gpu_resource": "example.com/gpu"}]')
    settings = load_settings(WatcherSettings)
    [driver] = WatcherConfig.from_settings(settings.model_copy(update={"simulate": True})).dra_drivers
    assert (driver.driver, driver.type_attribute, driver.gpu_resource) == ("gpu.example.com", None, "example.com/gpu")
    for bad, named in (('[{"driver": "Not A Name"}]', "GPULENS_DRA_DRIVERS__0__DRIVER"),
                       ('[{"driver": "a.b", "uuid_attr": "x"}]', "GPULENS_DRA_DRIVERS__0__UUID_ATTR"),
                       ('[{"driver": "a.b"}, {"driver": "a.b"}]', "GPULENS_DRA_DRIVERS"),
                       ('{"driver": "a.b"', "GPULENS_DRA_DRIVERS")):
        monkeypatch.setenv("GPULENS_DRA_DRIVERS", bad)
        with pytest.raises(ConfigError, match=named):
            load_settings(WatcherSettings)
    monkeypatch.delenv("GPULENS_DRA_DRIVERS")
    assert [d.driver for d in load_settings(WatcherSettings).dra_drivers] == ["gpu.nvidia.com"]
    assert "GPULENS_DRA_DRIVERS" not in os.environ


def test_the_other_vendor_example_of_the_docs_is_a_valid_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "dra.md").read_text()
    example = re.search(r"GPULENS_DRA_DRIVERS='(.+?)'", text, re.S)
    assert example is not None
    monkeypatch.setenv("GPULENS_DRA_DRIVERS", example.group(1))
    drivers = load_settings(WatcherSettings).dra_drivers
    assert [d.driver for d in drivers] == ["gpu.nvidia.com", "gpu.example.com"]
    assert drivers[0] == DraDriver(driver="gpu.nvidia.com", device_classes={"gpu.nvidia.com": "gpu",
                                                                             "mig.nvidia.com": "partition"})
    assert drivers[1].gpu_resource == "example.com/gpu"
