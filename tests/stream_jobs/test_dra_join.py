"""The node stage's DRA join: a sample's DRA allocations resolved through the node's ResourceSlice
devices to the GPU / MIG readings they name, so a DRA GPU is attributed, priced and alerted on as a
device-plugin GPU is. Unit cases of :mod:`stream_jobs.dra_join`, the node stage's hook (counters,
restart from a checkpoint), and twin fleets: golden scenarios replayed once as the device plugin
reports them and once as DRA does, with the same outputs and report."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import orjson
import pytest

from schemas.codec import decode, encode
from schemas.messages import DraAllocation, DraDevice, GpuSample, Message, NodeState, PodRef
from schemas.outputs import Alert, PodWindow
from simulation.fleet_state import SimulatedRecord, Tick
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from simulation.simulator import FleetSimulator
from stream_jobs.config import EngineConfig, Thresholds
from stream_jobs.dra_join import device_table, join
from stream_jobs.node_stage import NodeStage
from stream_jobs.timeutil import epoch
from tests.conftest import REPO_ROOT
from tests.stream_jobs.helpers import T0, node, pod, reading, sample

DRIVER = "gpu.nvidia.com"
CONFIG = EngineConfig(thresholds=Thresholds(idle_after=60.0))
BASE = epoch(T0)


def dra_device(index: int, pool: str = "n1", uuid: str | None = "", **extra: object) -> DraDevice:
    return DraDevice(driver=DRIVER, pool=pool, device=f"gpu-{index}", resource="nvidia.com/gpu",
                     uuid=f"GPU-{index}" if uuid == "" else uuid, **extra)  # type: ignore[arg-type]


def alloc(owner: str, index: int, claim: str | None = None, container: str = "main", driver: str = DRIVER,
          device: str | None = None) -> DraAllocation:
    return DraAllocation(driver=driver, pool="n1", device=device or f"gpu-{index}", namespace="ns", pod=owner,
                         container=container, claim_namespace="ns", claim_name=claim or f"{owner}-gpu")


def dra_node(devices: list[DraDevice], t: float = 0) -> NodeState:
    return node(t=t).model_copy(update={"dra_devices": devices})


def dra_sample(t: float, allocations: list[DraAllocation], util: float = 1.0) -> GpuSample:
    """The agent's sample of a node whose two GPUs the kubelet gave through DRA: no assigned_to, and
    the processes known by their cgroup's pod UID only."""
    owners = {a.pod for a in allocations}
    gpus = [reading(i, util, [], processes=[]) for i in range(2)]
    gpus = [g.model_copy(update={"mem_used_bytes": 2**30, "processes": [
        p for a in allocations if a.device == f"gpu-{g.index}"
        for p in reading(g.index, util, [a.pod]).processes]}) if any(a.device == f"gpu-{g.index}" for a in allocations)
        else g for g in gpus]
    assert owners
    return sample(t, gpus).model_copy(update={"dra_allocations": allocations})


# ------------------------------------------------------------------ the join itself


def test_an_allocation_puts_its_pod_on_the_reading_of_its_device() -> None:
    table = device_table([dra_device(0), dra_device(1)])
    result = join(dra_sample(0, [alloc("a", 1)]), table, {("ns", "a"): "uid-a"})
    gpus = {g.uuid: g for g in result.sample.gpus}
    assert gpus["GPU-1"].assigned_to == [PodRef(namespace="ns", pod="a", container="main", pod_uid="uid-a")]
    assert gpus["GPU-0"].assigned_to == []
    assert (result.resolved, result.unresolved, result.other_driver) == (1, 0, 0)
    assert not gpus["GPU-1"].shared


def test_a_shared_claim_makes_a_shared_gpu_and_a_pod_counts_once_per_container() -> None:
    table = device_table([dra_device(0), dra_device(1)])
    allocations = [alloc("a", 0, claim="shared"), alloc("b", 0, claim="shared"),
                   alloc("a", 0, claim="second-claim-same-device"), alloc("c", 1, container="left"),
                   alloc("c", 1, container="right")]
    result = join(dra_sample(0, allocations), table, {})
    gpus = {g.uuid: g for g in result.sample.gpus}
    assert [(r.pod, r.container, r.pod_uid) for r in gpus["GPU-0"].assigned_to] == [("a", "main", None),
                                                                                  ("b", "main", None)]
    assert gpus["GPU-0"].shared
    assert [r.container for r in gpus["GPU-1"].assigned_to] == ["left", "right"]
    assert not gpus["GPU-1"].shared  # two containers of one pod
    assert result.resolved == 5


def test_device_plugin_and_dra_pods_of_one_gpu_are_both_kept() -> None:
    base = dra_sample(0, [alloc("b", 0)])
    with_plugin = base.model_copy(update={"gpus": [base.gpus[0].model_copy(update={"assigned_to": [
        PodRef(namespace="ns", pod="a", container="main")]}), base.gpus[1]]})
    result = join(with_plugin, device_table([dra_device(0)]), {})
    assert [r.pod for r in result.sample.gpus[0].assigned_to] == ["a", "b"]
    assert result.sample.gpus[0].shared


@pytest.mark.parametrize(("devices", "allocation", "counts"), [
    ([], alloc("a", 0), (0, 1, 0)),  # the node's slices not seen yet
    ([dra_device(1)], alloc("a", 0), (0, 1, 0)),  # a device the node does not publish
    ([dra_device(0, uuid=None)], alloc("a", 0), (0, 1, 0)),  # a device without a UUID
    ([dra_device(0, uuid="GPU-elsewhere")], alloc("a", 0), (0, 1, 0)),  # no reading has the UUID
    ([dra_device(0, pool="other-pool")], alloc("a", 0), (0, 1, 0)),  # same name in another pool
    ([dra_device(0)], alloc("a", 0, driver="compute-domain.nvidia.com", device="channel-0"), (0, 0, 1)),
])
def test_an_allocation_that_does_not_resolve_leaves_the_reading_unassigned_and_is_counted(
        devices: list[DraDevice], allocation: DraAllocation, counts: tuple[int, int, int]) -> None:
    before = dra_sample(0, [allocation])
    result = join(before, device_table(devices), {})
    assert result.sample is before
    assert all(g.assigned_to == [] for g in result.sample.gpus)
    assert (result.resolved, result.unresolved, result.other_driver) == counts


def test_a_sample_without_allocations_is_returned_as_it_is() -> None:
    plain = sample(0, [reading(0, 1.0, ["a"])])
    assert join(plain, device_table([dra_device(0)]), {}).sample is plain


def test_a_mig_device_resolves_to_its_mig_reading() -> None:
    parent = reading(0, None, []).model_copy(update={"uuid": "GPU-P"})
    mig = reading(0, 1.0, [], processes=[]).model_copy(update={
        "uuid": "MIG-1", "mig_parent_uuid": "GPU-P", "mig_profile": "1g.10gb"})
    table = device_table([DraDevice(driver=DRIVER, pool="n1", device="gpu-0-mig-1g10gb-0",
                                    resource="nvidia.com/mig-1g.10gb", uuid="MIG-1", mig_profile="1g.10gb",
                                    mig_parent_uuid="GPU-P", physical_gpu="GPU-P")])
    s = sample(0, [parent, mig]).model_copy(update={"dra_allocations": [alloc("a", 0, device="gpu-0-mig-1g10gb-0")]})
    gpus = {g.uuid: g for g in join(s, table, {}).sample.gpus}
    assert [r.pod for r in gpus["MIG-1"].assigned_to] == ["a"]
    assert gpus["GPU-P"].assigned_to == []


# ------------------------------------------------------------------ the node stage


def _drive(stage: NodeStage, messages: list[Message], until: float) -> list[Message]:
    for message in messages:
        stage.submit(message)
    return stage.advance(BASE + until)


def test_the_node_stage_attributes_a_dra_gpu_like_a_device_plugin_gpu() -> None:
    times = [float(t) for t in range(0, 100, 10)]
    plugin = [node(), pod("a"), *[sample(t, [reading(0, 1.0, ["a"]), reading(1, 0.0, [])]) for t in times]]
    dra = [dra_node([dra_device(0), dra_device(1)]), pod("a"), *[dra_sample(t, [alloc("a", 0)]) for t in times]]
    plugin_out = _drive(NodeStage("n1", CONFIG), plugin, 100)
    stage = NodeStage("n1", CONFIG)
    dra_out = _drive(stage, dra, 100)
    assert [m.model_dump() for m in dra_out] == [m.model_dump() for m in plugin_out]
    assert [(m.type, m.state) for m in dra_out if isinstance(m, Alert)] == [("idle_gpu", "firing")]
    assert stage.counters["dra_resolved"] == len(times)
    assert "dra_unresolved" not in stage.counters


def test_samples_before_the_slices_stay_unassigned_and_are_counted_then_resolve() -> None:
    stage = NodeStage("n1", CONFIG)
    out = _drive(stage, [node(), pod("a"), dra_sample(0, [alloc("a", 0)]), dra_sample(10, [alloc("a", 0)]),
                         dra_node([dra_device(0)], t=20), dra_sample(20, [alloc("a", 0)])], 30)
    out += stage.flush(BASE + 30)
    windows = [m for m in out if isinstance(m, PodWindow)]
    assert stage.counters["dra_unresolved"] == 2
    assert stage.counters["dra_resolved"] == 1
    assert sum(w.allocated_s for w in windows) == 10.0  # only the sample after the slices


def test_the_device_table_survives_a_restart_from_the_checkpoint() -> None:
    stage = NodeStage("n1", CONFIG)
    _drive(stage, [dra_node([dra_device(0), dra_device(1, uuid=None)]), pod("a")], 1)
    saved = orjson.loads(orjson.dumps(stage.to_dict()))  # the changelog holds JSON
    assert saved["info"]["dra_devices"] == {DRIVER: {"n1": {"gpu-0": "GPU-0", "gpu-1": None}}}
    restored = NodeStage.from_dict(saved, CONFIG)
    _drive(restored, [dra_sample(10, [alloc("a", 0)])], 20)
    assert restored.counters["dra_resolved"] == 1
    # a checkpoint written before DRA restores with no devices
    del saved["info"]["dra_devices"]
    assert NodeStage.from_dict(saved, CONFIG).info.dra_devices == {}


def test_a_node_state_without_devices_forgets_the_old_ones() -> None:
    stage = NodeStage("n1", CONFIG)
    _drive(stage, [dra_node([dra_device(0)]), pod("a"), dra_node([], t=5), dra_sample(10, [alloc("a", 0)])], 20)
    assert stage.counters["dra_unresolved"] == 1


# ------------------------------------------------------------------ twin fleets


def _as_dra(ticks: list[Tick]) -> Iterator[Tick]:
    """The same fleet as DRA reports it: each node's GPUs published as devices ``gpu-<index>`` (MIG
    devices ``gpu-<index>-mig-<n>``) on its node states; the agent's samples without ``assigned_to``
    (the kubelet names DRA devices, not UUIDs) and with the pods as ``dra_allocations``, their
    processes known by the cgroup's pod UID only (no assignment to bind names with)."""
    names: dict[str, dict[str, tuple[str, str]]] = {}  # node -> GPU / MIG uuid -> (device name, resource)
    for tick in ticks:
        for record in tick.records:
            if record.topic.endswith("gpu.samples.v1") and record.value is not None:
                s = decode(record.value, GpuSample)
                devices = names.setdefault(s.node, {})
                for g in s.gpus:
                    if g.uuid in devices:
                        continue
                    if g.mig_parent_uuid is None:
                        devices[g.uuid] = (f"gpu-{g.index}", "nvidia.com/gpu")
                    else:
                        migs = sum(1 for name, _ in devices.values() if name.startswith(f"gpu-{g.index}-mig-"))
                        devices[g.uuid] = (f"gpu-{g.index}-mig-{migs}", f"nvidia.com/mig-{g.mig_profile}")
    for tick in ticks:
        records = []
        for record in tick.records:
            value = record.value
            if record.topic.endswith("k8s.nodes.v1") and value is not None:
                state = decode(value, NodeState)
                value = encode(state.model_copy(update={"dra_devices": [
                    DraDevice(driver=DRIVER, pool=state.node, device=name, resource=resource, uuid=uuid)
                    for uuid, (name, resource) in names.get(state.node, {}).items()]}))
            elif record.topic.endswith("gpu.samples.v1") and value is not None:
                s = decode(value, GpuSample)
                devices = names[s.node]
                allocations = [DraAllocation(driver=DRIVER, pool=s.node, device=devices[g.uuid][0],
                                             namespace=r.namespace, pod=r.pod, container=r.container,
                                             claim_namespace=r.namespace, claim_name=f"{r.pod}-gpu")
                               for g in s.gpus for r in g.assigned_to]
                value = encode(s.model_copy(update={"dra_allocations": allocations, "gpus": [
                    g.model_copy(update={"assigned_to": [], "shared": False, "processes": [
                        p.model_copy(update={"pod_namespace": None, "pod_name": None, "container_name": None})
                        for p in g.processes]}) for g in s.gpus]}))
            records.append(SimulatedRecord(record.topic, record.key, value))
        yield dataclasses.replace(tick, records=records)


@pytest.mark.parametrize("name", ["ends-and-prices", "shared-gpus", "mig", "noisy-neighbour", "crashloop",
                                  "sample-gaps", "idle-node"])
def test_a_dra_twin_of_a_golden_fleet_gives_the_same_outputs_and_report(name: str) -> None:
    scenario = load_scenario(REPO_ROOT / "simulation" / "scenarios" / f"{name}.yaml")
    ticks = list(FleetSimulator(scenario).run())
    assert any(r.assigned_to for t in ticks for rec in t.records if rec.topic.endswith("gpu.samples.v1")
               and rec.value is not None for r in decode(rec.value, GpuSample).gpus)
    plugin = run_in_process(scenario, ticks=ticks)
    dra = run_in_process(scenario, ticks=_as_dra(ticks))
    assert dra.deadletters == plugin.deadletters == []
    assert [m.model_dump() for m in dra.outputs] == [m.model_dump() for m in plugin.outputs]
    assert dra.report == plugin.report
