"""The sampler over the faithful fake NVML: MIG, time-slicing, NotSupported fields, lost GPUs,
XIDs and attribution produce the message a user of the samples topic expects."""

from __future__ import annotations

import pytest

from producers.agent.fake_nvml import FakeGpu, FakeMigDevice, FakeProcess
from producers.agent.nvml_api import NvmlUnavailable
from tests.agent.helpers import GIB, at, by_uuid, container, gpu_uuid, make_sampler, pod_uid, ref


def test_every_gpu_is_reported_with_its_readings_and_sequence() -> None:
    gpus = [FakeGpu(gpu_uuid(i), i, gpu_util_pct=10.0 * i, mem_used_bytes=i * GIB, power_w=100 + i) for i in range(4)]
    sampler, _, _ = make_sampler(gpus)
    first = sampler.sample(at(0))
    second = sampler.sample(at(10))
    assert (first.seq, second.seq) == (0, 1)
    assert first.node == "node-a" and first.agent_boot_id == "boot-1" and first.ts == at(0)
    assert first.driver_version == "550.54.15" and first.cuda_driver_version == "12.4"
    assert [g.index for g in first.gpus] == [0, 1, 2, 3]
    g2 = first.gpus[2]
    assert (g2.uuid, g2.gpu_util_pct, g2.mem_used_bytes, g2.power_w) == (gpu_uuid(2), 20.0, 2 * GIB, 102.0)
    assert g2.mem_total_bytes == 80 * GIB and g2.model == "NVIDIA H100 80GB HBM3"
    assert all(g.health == "ok" for g in first.gpus) and first.errors == []


def test_mig_devices_are_enumerated_with_parent_profile_instances_and_memory() -> None:
    parent = FakeGpu(gpu_uuid(0), 0, mig_devices=[
        FakeMigDevice("MIG-aaaa", "3g.40gb", 1, 0, 40 * GIB, 12 * GIB, [FakeProcess(101, 11 * GIB)]),
        FakeMigDevice("MIG-bbbb", "1g.10gb", 13, 0, 10 * GIB, 0),
    ])
    plain = FakeGpu(gpu_uuid(1), 1, gpu_util_pct=50.0)
    sampler, _, _ = make_sampler(
        [parent, plain],
        assignments={"MIG-aaaa": [ref("asr-0", "asr", uid=6)]},
        pids={101: container(6, 6)},
    )
    readings = sampler.sample(at(0)).gpus
    assert [g.uuid for g in readings] == [gpu_uuid(0), "MIG-aaaa", "MIG-bbbb", gpu_uuid(1)]
    phys, big, small, other = readings
    # utilisation is not supported under MIG: absent, not zero, and not an error
    assert phys.gpu_util_pct is None and phys.health == "ok" and phys.processes == []
    assert phys.mem_used_bytes == 12 * GIB  # the parent sums its MIG devices
    assert (big.mig_parent_uuid, big.mig_profile, big.gpu_instance_id, big.compute_instance_id) == (
        gpu_uuid(0), "3g.40gb", 1, 0)
    assert (big.mem_total_bytes, big.mem_used_bytes, big.index, big.gpu_util_pct) == (40 * GIB, 12 * GIB, 0, None)
    assert [(p.pid, p.mem_used_bytes, p.pod_name, p.container_name) for p in big.processes] == [
        (101, 11 * GIB, "asr-0", "asr")]
    assert big.processes[0].sm_util_pct is None  # per-process utilisation is not available under MIG
    assert [r.pod for r in big.assigned_to] == ["asr-0"]
    assert (small.mig_profile, small.gpu_instance_id, small.assigned_to, small.processes) == ("1g.10gb", 13, [], [])
    assert other.gpu_util_pct == 50.0


def test_two_pods_time_slicing_one_gpu_each_get_their_own_memory_and_sm_util() -> None:
    gpu = FakeGpu(gpu_uuid(0), 0, gpu_util_pct=60.0, processes=[
        FakeProcess(201, 9 * GIB, sm_util_pct=45.0),
        FakeProcess(202, 3 * GIB, sm_util_pct=5.0),
    ])
    sampler, _, _ = make_sampler(
        [gpu],
        # the device plugin hands out time-slicing replicas as <uuid>::<n>
        assignments={f"{gpu_uuid(0)}::0": [ref("alice-nb", "nb", uid=1)],
                     f"{gpu_uuid(0)}::1": [ref("bob-nb", "nb", uid=2)]},
        pids={201: container(1, 1), 202: container(2, 2)},
    )
    reading = sampler.sample(at(0)).gpus[0]
    assert reading.shared is True
    assert sorted(r.pod for r in reading.assigned_to) == ["alice-nb", "bob-nb"]
    per_pod = {p.pod_name: (p.pod_uid, p.mem_used_bytes, p.sm_util_pct, p.container_name) for p in reading.processes}
    assert per_pod == {
        "alice-nb": (pod_uid(1), 9 * GIB, 45.0, "nb"),
        "bob-nb": (pod_uid(2), 3 * GIB, 5.0, "nb"),
    }
    assert {p.container_id for p in reading.processes} == {"01" * 32, "02" * 32}


def test_pod_names_without_uids_from_the_kubelet_are_inferred_only_when_unambiguous() -> None:
    # PodResources carries no pod UID: names come from elimination across devices
    gpus = [
        FakeGpu(gpu_uuid(0), 0, processes=[FakeProcess(301, GIB, 10.0)]),  # alice alone
        FakeGpu(gpu_uuid(1), 1, processes=[FakeProcess(302, GIB, 10.0), FakeProcess(303, GIB, 10.0)]),  # alice+bob
        FakeGpu(gpu_uuid(2), 2, processes=[FakeProcess(304, GIB, 10.0), FakeProcess(305, GIB, 10.0)]),  # carol+dave
        FakeGpu(gpu_uuid(3), 3, processes=[FakeProcess(306, GIB, 10.0)]),  # erin alone
    ]
    sampler, _, _ = make_sampler(
        gpus,
        assignments={
            gpu_uuid(0): [ref("alice")],
            gpu_uuid(1): [ref("alice"), ref("bob")],
            gpu_uuid(2): [ref("carol"), ref("dave")],
            gpu_uuid(3): [ref("erin")],
        },
        pids={301: container(1, 1), 302: container(1, 1), 303: container(2, 2), 304: container(3, 3),
              305: container(4, 4), 306: container(7, 7)},
    )
    sample = sampler.sample(at(0))
    names = {p.pid: p.pod_name for g in sample.gpus for p in g.processes}
    assert names[301] == names[302] == "alice"
    assert names[303] == "bob"  # alice is known, so the other pod on the shared GPU is bob
    assert names[304] is None and names[305] is None  # two unknown pods, two unknown UIDs: not guessed
    assert names[306] == "erin"
    assert all(p.pod_uid for g in sample.gpus for p in g.processes)


def test_inferred_names_are_withdrawn_when_the_uid_runs_on_a_device_its_pod_does_not_hold() -> None:
    gpus = [
        FakeGpu(gpu_uuid(0), 0, processes=[FakeProcess(401, GIB, 1.0)]),
        FakeGpu(gpu_uuid(1), 1, processes=[FakeProcess(402, GIB, 1.0)]),
    ]
    sampler, _, _ = make_sampler(
        gpus,
        assignments={gpu_uuid(0): [ref("erin")]},  # GPU 1 is not assigned to anyone
        pids={401: container(9, 9), 402: container(9, 9)},  # a pod using a GPU it was not given
    )
    sample = sampler.sample(at(0))
    assert [p.pod_name for g in sample.gpus for p in g.processes] == [None, None]


@pytest.mark.parametrize("field", ["power_w", "temperature_c", "clock_mhz", "pcie_throughput_bytes_per_s",
                                   "nvlink_bytes_total", "process_utilization", "utilization"])
def test_a_not_supported_field_is_absent_for_that_field_only(field: str) -> None:
    gpu = FakeGpu(gpu_uuid(0), 0, gpu_util_pct=70.0, power_w=300.0, temperature_c=60.0,
                  processes=[FakeProcess(11, GIB, 40.0)], unsupported={field})
    other = FakeGpu(gpu_uuid(1), 1, power_w=200.0)
    errors: list[str] = []
    sampler, _, _ = make_sampler([gpu, other], errors=errors)
    sampler.sample(at(0))
    sample = sampler.sample(at(10))
    reading, untouched = sample.gpus
    values = {
        "power_w": reading.power_w, "temperature_c": reading.temperature_c, "clock_mhz": reading.sm_clock_mhz,
        "pcie_throughput_bytes_per_s": reading.pcie_tx_bytes_per_s,
        "nvlink_bytes_total": reading.nvlink_tx_bytes_per_s,
        "process_utilization": reading.processes[0].sm_util_pct, "utilization": reading.gpu_util_pct,
    }
    assert values.pop(field) is None
    assert all(v is not None for v in values.values()), values
    assert reading.health == "ok" and sample.errors == [] and errors == []
    assert untouched.power_w == 200.0 and untouched.health == "ok"


def test_a_failing_field_degrades_that_gpu_is_counted_and_named() -> None:
    gpu = FakeGpu(gpu_uuid(0), 0, failing={"power_w": "unknown"}, gpu_util_pct=30.0)
    errors: list[str] = []
    sampler, _, _ = make_sampler([gpu, FakeGpu(gpu_uuid(1), 1)], errors=errors)
    sample = sampler.sample(at(0))
    bad, good = sample.gpus
    assert bad.power_w is None and bad.gpu_util_pct == 30.0
    assert bad.health == "degraded" and "power" in (bad.health_reason or "")
    assert good.health == "ok"
    assert errors == ["unknown"]
    assert any("power" in e and gpu_uuid(0) in e for e in sample.errors)


def test_a_lost_gpu_is_reported_alone_and_the_others_keep_flowing() -> None:
    gpus = [FakeGpu(gpu_uuid(i), i, gpu_util_pct=50.0) for i in range(3)]
    errors: list[str] = []
    sampler, nvml, _ = make_sampler(gpus, assignments={gpu_uuid(1): [ref("train")]}, errors=errors)
    sampler.sample(at(0))
    nvml.gpu(gpu_uuid(1)).lost = True
    sample = sampler.sample(at(10))
    assert [g.health for g in sample.gpus] == ["ok", "lost", "ok"]
    lost = sample.gpus[1]
    # reported under its last known identity, still attributed, with no made-up readings
    assert (lost.uuid, lost.index, lost.model) == (gpu_uuid(1), 1, "NVIDIA H100 80GB HBM3")
    assert lost.gpu_util_pct is None and lost.mem_used_bytes is None
    assert [r.pod for r in lost.assigned_to] == ["train"]
    assert sample.gpus[0].gpu_util_pct == 50.0 and sample.gpus[2].gpu_util_pct == 50.0
    assert "gpu_lost" in errors and any("lost" in e for e in sample.errors)


def test_a_gpu_lost_before_it_was_ever_read_gets_a_placeholder_identity() -> None:
    gpus = [FakeGpu(gpu_uuid(0), 0, lost=True), FakeGpu(gpu_uuid(1), 1)]
    sampler, _, _ = make_sampler(gpus)
    sample = sampler.sample(at(0))
    assert sample.gpus[0].health == "lost" and sample.gpus[0].uuid == "GPU-unknown-node-a-0"
    assert sample.gpus[1].health == "ok"


def test_xids_are_reported_once_on_their_gpu_and_critical_ones_degrade_health() -> None:
    gpus = [FakeGpu(gpu_uuid(0), 0), FakeGpu(gpu_uuid(1), 1)]
    sampler, nvml, _ = make_sampler(gpus)
    nvml.inject_xid(gpu_uuid(0), 48)
    nvml.inject_xid(gpu_uuid(1), 13)
    nvml.inject_xid("GPU-not-here", 79)
    sample = sampler.sample(at(0))
    first, second = sample.gpus
    assert [(x.xid, x.critical, x.at) for x in first.xids] == [(48, True, at(0))]
    assert first.health == "degraded" and "xid 48" in (first.health_reason or "")
    assert [(x.xid, x.critical) for x in second.xids] == [(13, False)]
    assert second.health == "ok"  # an application error, not a hardware fault
    assert any("xid 79" in e for e in sample.errors)
    nxt = sampler.sample(at(10))
    assert [g.xids for g in nxt.gpus] == [[], []] and nxt.gpus[0].health == "ok"


def test_a_gpu_that_falls_off_the_bus_reports_xid_79_and_lost() -> None:
    gpus = [FakeGpu(gpu_uuid(0), 0), FakeGpu(gpu_uuid(1), 1, gpu_util_pct=80.0)]
    sampler, nvml, _ = make_sampler(gpus)
    sampler.sample(at(0))
    nvml.inject_xid(gpu_uuid(0), 79)
    nvml.gpu(gpu_uuid(0)).lost = True
    sample = sampler.sample(at(10))
    lost = sample.gpus[0]
    assert lost.health == "lost" and [x.xid for x in lost.xids] == [79] and lost.xids[0].critical
    assert sample.gpus[1].gpu_util_pct == 80.0


def test_nvml_gone_as_a_whole_raises_and_no_sample_is_counted() -> None:
    sampler, nvml, _ = make_sampler([FakeGpu(gpu_uuid(0), 0)])
    sampler.sample(at(0))
    nvml.driver_gone = True
    with pytest.raises(NvmlUnavailable):
        sampler.sample(at(10))
    nvml.driver_gone = False
    assert sampler.sample(at(20)).seq == 1


def test_per_process_sm_util_averages_new_samples_and_idle_processes_read_zero() -> None:
    gpu = FakeGpu(gpu_uuid(0), 0, processes=[FakeProcess(1, GIB, 80.0), FakeProcess(2, GIB, None)])
    sampler, _, _ = make_sampler([gpu])
    sample = sampler.sample(at(0))
    assert [(p.pid, p.sm_util_pct) for p in sample.gpus[0].processes] == [(1, 80.0), (2, 0.0)]
    gpu.processes[0].sm_util_pct = 20.0
    assert sampler.sample(at(10)).gpus[0].processes[0].sm_util_pct == 20.0


def test_nvlink_counters_become_rates_between_samples() -> None:
    gpu = FakeGpu(gpu_uuid(0), 0, nvlink_tx_bytes_total=1_000, nvlink_rx_bytes_total=5_000)
    sampler, _, _ = make_sampler([gpu])
    assert sampler.sample(at(0)).gpus[0].nvlink_tx_bytes_per_s is None  # no previous counter
    gpu.nvlink_tx_bytes_total += 10_000_000
    gpu.nvlink_rx_bytes_total += 20_000_000
    reading = sampler.sample(at(10)).gpus[0]
    assert (reading.nvlink_tx_bytes_per_s, reading.nvlink_rx_bytes_per_s) == (1_000_000.0, 2_000_000.0)
    gpu.nvlink_tx_bytes_total = 0  # counter reset (driver reload): no negative rate
    assert sampler.sample(at(20)).gpus[0].nvlink_tx_bytes_per_s is None


def test_index_device_ids_map_to_uuids() -> None:
    gpus = [FakeGpu(gpu_uuid(0), 0), FakeGpu(gpu_uuid(1), 1)]
    sampler, _, _ = make_sampler(gpus, assignments={"1": [ref("train")]})
    sample = by_uuid(sampler.sample(at(0)))
    assert sample[gpu_uuid(0)].assigned_to == [] and [r.pod for r in sample[gpu_uuid(1)].assigned_to] == ["train"]


def test_kubelet_outage_keeps_recent_assignments_briefly_then_drops_them() -> None:
    sampler, _, pods = make_sampler([FakeGpu(gpu_uuid(0), 0)], assignments={gpu_uuid(0): [ref("train")]})
    assert sampler.sample(at(0)).gpus[0].assigned_to
    pods.failing = "kubelet PodResources List failed: UNAVAILABLE: connection refused"
    kept = [sampler.sample(at(10 * i)) for i in range(1, 4)]
    assert all(s.gpus[0].assigned_to for s in kept)
    assert all(any("UNAVAILABLE" in e for e in s.errors) for s in kept)
    assert sampler.sample(at(40)).gpus[0].assigned_to == []
    pods.failing = None
    assert sampler.sample(at(50)).gpus[0].assigned_to
