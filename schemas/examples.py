"""One realistic example message per topic: documentation by example, and the fixtures of the
contract tests and benchmarks."""

from __future__ import annotations

from datetime import UTC, datetime

from schemas import messages as m
from schemas import outputs as o

TS = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
GIB = 2**30


def gpu_sample(gpus: int = 8, node: str = "gpu-a") -> m.GpuSample:
    readings = []
    for index in range(gpus):
        readings.append(
            m.GpuReading(
                uuid=f"GPU-{node}-{index:04d}-5a1c-4c3e-9b2f-1d0e8a7b6c5d",
                index=index,
                model="NVIDIA H100 80GB HBM3",
                gpu_util_pct=93.0,
                mem_util_pct=41.0,
                mem_used_bytes=61 * GIB,
                mem_total_bytes=80 * GIB,
                power_w=612.5,
                temperature_c=64.0,
                sm_clock_mhz=1980,
                mem_clock_mhz=2619,
                pcie_tx_bytes_per_s=1.2e9,
                pcie_rx_bytes_per_s=0.8e9,
                assigned_to=[m.PodRef(namespace="research", pod="train-llm-0", container="trainer",
                                      pod_uid="6f1c2a4e-1111-4a5b-9c8d-0123456789ab")],
                processes=[
                    m.GpuProcess(pid=41000 + index,
                                 container_id="containerd://3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e",
                                 pod_uid="6f1c2a4e-1111-4a5b-9c8d-0123456789ab", pod_namespace="research",
                                 pod_name="train-llm-0", container_name="trainer",
                                 mem_used_bytes=60 * GIB, sm_util_pct=92.0, process_name="python")
                ],
            )
        )
    return m.GpuSample(node=node, ts=TS, agent_boot_id="b0c3e2d1-0000-4000-8000-000000000001", seq=42,
                       sample_interval_s=10.0, driver_version="550.54.15", cuda_driver_version="12.4", gpus=readings,
                       dra_allocations=[m.DraAllocation(
                           driver="gpu.nvidia.com", pool=node, device="gpu-0", namespace="research",
                           pod="train-llm-0", container="trainer", claim_namespace="research",
                           claim_name="train-llm-0-gpu-x7k2p", cdi_ids=["k8s.gpu.nvidia.com/device=gpu-0"])])


_GPU_A_0 = "GPU-gpu-a-0000-5a1c-4c3e-9b2f-1d0e8a7b6c5d"
"""The first GPU of :func:`gpu_sample` (node ``gpu-a``)."""


def all_examples() -> dict[str, m.Message]:
    subject = o.AlertSubject(kind="pod", namespace="research", name="notebook-alice", node="gpu-a",
                             gpu_uuid="GPU-gpu-a-0004")
    return {
        "gpu.samples.v1": gpu_sample(),
        "k8s.pods.v1": m.PodState(
            uid="6f1c2a4e-1111-4a5b-9c8d-0123456789ab", namespace="research", name="train-llm-0", ts=TS,
            node="gpu-a", phase="Running", gpu_requests={"nvidia.com/gpu": 4},
            conditions=[m.PodCondition(type="PodScheduled", status="True", last_transition_at=TS)],
            owners=[m.OwnerRef(kind="PyTorchJob", name="train-llm", uid="u-1")], team="nlp", project="chat",
            gang_id="train-llm", containers=[m.ContainerState(name="trainer", container_id="containerd://abc",
                                                              image="nvcr.io/nvidia/pytorch:24.05-py3",
                                                              ready=True, state="running")],
            created_at=TS, scheduled_at=TS, started_at=TS),
        "k8s.nodes.v1": m.NodeState(node="gpu-a", ts=TS, gpu_capacity={"nvidia.com/gpu": 8},
                                    gpu_allocatable={"nvidia.com/gpu": 8}, gpu_product="NVIDIA-H100-80GB-HBM3",
                                    gpu_memory_bytes=80 * GIB, ready=True,
                                    taints=[m.Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")],
                                    dra_devices=[m.DraDevice(
                                        driver="gpu.nvidia.com", pool="gpu-a", device="gpu-0",
                                        resource="nvidia.com/gpu", uuid=_GPU_A_0, model="NVIDIA H100 80GB HBM3",
                                        memory_bytes=80 * GIB, physical_gpu=_GPU_A_0)]),
        "k8s.events.v1": m.K8sEvent(uid="e-1", ts=TS, category="scheduling_failed", reason="FailedScheduling",
                                    message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                                    type="Warning", involved_kind="Pod", involved_uid="p-4",
                                    involved_namespace="research", involved_name="train-4"),
        "workload.progress.v1": m.WorkloadProgress(pod_uid="p-1", namespace="research", pod="train-llm-0", ts=TS,
                                                   steps_total=1200.0, tokens_total=4.9e9),
        "workload.allocator.v1": m.WorkloadAllocator(
            pod_uid="p-1", namespace="research", pod="train-llm-0", node="gpu-a", ts=TS,
            devices=[m.AllocatorDevice(device=0, gpu_uuid="GPU-0", reserved_bytes=60 * GIB, allocated_bytes=12 * GIB,
                                       max_reserved_bytes=62 * GIB, alloc_retries_total=14, ooms_total=0)]),
        "pod.windows.v1": o.PodWindow(window_id="w-1", pod_uid="p-1", namespace="research", pod="train-llm-0",
                                      node="gpu-a", gpu_uuid="GPU-0", gpu_model="NVIDIA H100 80GB HBM3",
                                      window_start=TS, window_end=TS, allocated_s=60, busy_s=60, idle_s=0,
                                      samples=6, avg_sm_util_pct=92.0, max_sm_util_pct=95.0, cost_usd=0.0417),
        "cluster.capacity.v1": o.ClusterCapacity(window_id="c-1", window_start=TS, window_end=TS, gpus_total=24,
                                                 gpus_allocated=16, gpus_busy=16, gpus_idle_allocated=0,
                                                 gpus_free=8, free_gpus_by_node={"gpu-a": 2, "gpu-b": 3, "gpu-c": 3},
                                                 largest_free_block=3, stranded_gpus=8, pending_pods=1,
                                                 pending_gpu_demand=4),
        "pod.lifecycle.v1": o.PodLifecycle(pod_uid="p-1", namespace="research", name="train-b", gpus=5,
                                           created_at=TS, scheduled_at=TS, started_at=TS, finished_at=TS,
                                           pending_s=0, running_s=1200, gpu_hours=1.6667, idle_gpu_hours=0,
                                           end_reason="Succeeded"),
        "alerts.v1": o.Alert(id="a-1", type="idle_gpu", severity="warning", state="firing", at=TS, started_at=TS,
                             subject=subject, summary="notebook-alice holds 1 idle GPU for 10m",
                             details={"idle_class": "vram_held"}),
        "k8s.workloads.v1": m.WorkloadState(
            uid="9b2e4c1a-2222-4c3d-8e9f-0123456789ab", namespace="research", name="job-train-llm-5c1f2",
            ts=TS, phase="queued", queue_name="research", priority_class="batch", priority=100,
            pod_sets=[m.PodSetDemand(name="workers", count=2, gpu_requests_per_pod={"nvidia.com/gpu": 8})],
            gpu_requests={"nvidia.com/gpu": 16}, gpus=16,
            owners=[m.OwnerRef(kind="JobSet", name="train-llm", uid="u-9", api_version="jobset.x-k8s.io/v1alpha2")],
            team="nlp", project="chat", gang_id="research/train-llm",
            pending_reason="couldn't assign flavors to pod set workers: insufficient quota for nvidia.com/gpu",
            created_at=TS),
        "deadletter.v1": o.DeadLetter(error="gpus.0.index: Field required", source_topic="gpulens.gpu.samples.v1",
                                      source_partition=3, source_offset=1042, at=TS, payload_text="{}"),
    }
