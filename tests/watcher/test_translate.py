"""Translation of realistic API-server JSON into pod, node and event messages."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from producers.watcher.events import event_key, event_to_message
from producers.watcher.translate import (
    ChangeFilter,
    TranslateConfig,
    gpu_requests,
    node_to_state,
    owner_chain,
    pod_to_state,
)

FIXTURES = Path(__file__).parent / "fixtures"
TS = datetime(2024, 5, 6, 8, 0, 5, tzinfo=UTC)
CONFIG = TranslateConfig()


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def pod(name: str) -> Any:
    state = pod_to_state(load(name), TS, CONFIG)
    assert state is not None
    return state


def test_pytorchjob_worker() -> None:
    state = pod("pytorchjob_worker.json")
    where = (state.namespace, state.name, state.node, state.phase)
    assert where == ("nlp", "llama-ft-worker-1", "gpu-a100-07", "Running")
    assert state.gpu_requests == {"nvidia.com/gpu": 8}  # rdma/ib and cpu are not GPUs
    assert [(o.kind, o.name) for o in state.owners] == [("PyTorchJob", "llama-ft")]
    assert state.gang_id == "nlp/llama-ft"
    assert (state.team, state.project) == ("nlp-platform", "llama-finetune")
    assert state.scheduled_at == at("2024-05-06T07:58:43Z")
    assert state.started_at == at("2024-05-06T07:58:47Z")  # the init container started first
    assert state.finished_at is None and not state.deleted
    main = next(c for c in state.containers if c.name == "pytorch")
    assert main.container_id == "9a1b2c3d" + "e" * 56  # runtime prefix stripped, as in cgroup paths
    assert main.image == "nvcr.io/nvidia/pytorch:24.03-py3" and main.state == "running"
    assert state.priority_class == "training-high"
    assert state.labels["training.kubeflow.org/replica-type"] == "worker"


def test_volcano_gang_member_pending() -> None:
    state = pod("volcano_gang_member.json")
    assert state.phase == "Pending" and state.node is None
    assert state.gpu_requests == {"nvidia.com/gpu": 4}  # only a limit: limits stand for requests
    assert state.gang_id == "research/mpi-bert-7c1f0e2a-0a59-4b0c-b4f0-62c3bb0d99aa"  # from the annotation
    assert [(o.kind, o.api_version) for o in state.owners] == [("Job", "batch.volcano.sh/v1alpha1")]
    assert state.team == "search-research" and state.project == "research"  # project falls back to namespace
    scheduled = next(c for c in state.conditions if c.type == "PodScheduled")
    assert scheduled.status == "False" and scheduled.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in (scheduled.message or "")
    assert state.scheduled_at is None
    assert [c.image for c in state.containers] == ["registry.example.com/research/bert-mpi:2.3"]


def test_mig_request_and_deployment_owner() -> None:
    state = pod("mig_request.json")
    assert state.gpu_requests == {"nvidia.com/mig-1g.10gb": 1}
    assert [(o.kind, o.name) for o in state.owners] == [("ReplicaSet", "embed-serve-6f9c7d8b5d"),
                                                         ("Deployment", "embed-serve")]
    assert state.gang_id is None and state.team == "search"


def test_time_sliced_shared_request() -> None:
    state = pod("timesliced_shared.json")
    assert state.gpu_requests == {"nvidia.com/gpu.shared": 1}
    assert state.project == "alice-experiments"  # from an annotation
    assert state.team == "notebooks"
    assert state.owners[0].kind == "StatefulSet"


def test_crashloopbackoff_and_cronjob_owner() -> None:
    state = pod("crashloopbackoff.json")
    assert state.phase == "Running" and state.restarts == 7
    container = state.containers[0]
    assert (container.state, container.state_reason) == ("waiting", "CrashLoopBackOff")
    assert (state.last_termination_reason, state.last_exit_code) == ("Error", 1)
    assert container.last_finished_at == at("2024-05-06T00:21:39Z")
    assert [(o.kind, o.name) for o in state.owners] == [("Job", "nightly-eval-28585440"), ("CronJob", "nightly-eval")]


def test_oomkilled() -> None:
    state = pod("oomkilled.json")
    assert state.phase == "Failed"
    assert (state.last_termination_reason, state.last_exit_code) == ("OOMKilled", 137)
    assert state.finished_at == at("2024-05-06T07:12:44Z")
    assert state.gpu_requests == {"nvidia.com/gpu": 2}
    assert state.owners == []


def test_evicted() -> None:
    state = pod("evicted.json")
    assert state.phase == "Failed" and state.status_reason == "Evicted"
    assert (state.last_termination_reason, state.last_exit_code) == ("Evicted", 137)
    assert state.finished_at == at("2024-05-06T04:30:02Z")
    assert any(c.type == "DisruptionTarget" and c.reason == "TerminationByKubelet" for c in state.conditions)


def test_pending_with_failed_scheduling_event_in_both_shapes() -> None:
    state = pod("pending_failedscheduling.json")
    assert state.phase == "Pending" and state.gpu_requests == {"nvidia.com/gpu": 8}
    core = event_to_message(load("failedscheduling_event_core.json"))
    new = event_to_message(load("failedscheduling_event_v1.json"))
    assert core is not None and new is not None
    for event in (core, new):
        assert event.category == "scheduling_failed" and event.type == "Warning"
        assert event.message.startswith("0/40 nodes are available: 40 Insufficient nvidia.com/gpu.")
        assert event.involved_uid == state.uid and event.involved_kind == "Pod"
        assert event.count == 14 and event.ts == at("2024-05-06T07:52:31.000123Z")
        assert event.source == "default-scheduler"
        assert event_key(event) == state.uid
    assert core.model_dump() == new.model_dump()


def test_eviction_preemption_and_oom_events() -> None:
    evicted = event_to_message(load("evicted_event_core.json"))
    preempted = event_to_message(load("preempted_event_v1.json"))
    oom = event_to_message(load("oom_node_event_core.json"))
    assert evicted is not None and evicted.category == "evicted" and evicted.source == "kubelet"
    assert preempted is not None and preempted.category == "preempted" and preempted.message.startswith("Preempted by")
    assert oom is not None
    assert (oom.category, oom.involved_kind, oom.involved_name) == ("oom_killed", "Node", "gpu-a100-01")
    assert event_to_message({"metadata": {"uid": "x"}, "reason": "X"}) is None  # no involved object


def test_pod_without_gpu_is_reported_only_on_a_gpu_node() -> None:
    cpu_pod = load("oomkilled.json")
    cpu_pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    assert pod_to_state(cpu_pod, TS, CONFIG) is None
    state = pod_to_state(cpu_pod, TS, CONFIG, gpu_nodes={"gpu-a100-01"})
    assert state is not None and state.gpu_requests == {}


def test_gpu_requests_follow_the_scheduler_rule_and_extra_resources() -> None:
    obj = load("pytorchjob_worker.json")
    obj["spec"]["initContainers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    extra = {"name": "sidecar", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    obj["spec"]["containers"].append(extra)
    assert gpu_requests(obj, CONFIG) == {"nvidia.com/gpu": 9}  # max(sum of app containers, max init)
    obj["spec"]["initContainers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "12"}}
    assert gpu_requests(obj, CONFIG) == {"nvidia.com/gpu": 12}
    amd = {"spec": {"containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "2"}}}]}}
    assert gpu_requests(amd, CONFIG) == {}
    assert gpu_requests(amd, TranslateConfig(extra_gpu_resources=("amd.com/gpu",))) == {"amd.com/gpu": 2}


def test_configurable_team_and_gang_keys() -> None:
    config = TranslateConfig(team_keys=("volcano.sh/queue-name",), gang_keys=("volcano.sh/job-name",))
    state = pod_to_state(load("volcano_gang_member.json"), TS, config)
    assert state is not None and state.team == "research" and state.gang_id == "research/mpi-bert"


def test_gpu_node_with_gfd_labels() -> None:
    state = node_to_state(load("node_gpu_a100.json"), TS)
    assert state is not None
    assert state.gpu_capacity == {"nvidia.com/gpu": 8} and state.gpu_allocatable == {"nvidia.com/gpu": 7}
    assert state.gpu_product == "NVIDIA-A100-SXM4-80GB" and state.gpu_memory_bytes == 81920 * 2**20
    assert (state.driver_version, state.cuda_driver_version) == ("535.104.05", "12.2")
    assert state.mig_strategy == "single" and state.ready and not state.unschedulable
    assert [(t.key, t.value, t.effect) for t in state.taints] == [("nvidia.com/gpu", "present", "NoSchedule")]


def test_mig_mixed_node_not_ready_and_cordoned() -> None:
    state = node_to_state(load("node_mig_mixed.json"), TS)
    assert state is not None
    assert state.gpu_capacity == {"nvidia.com/gpu": 0, "nvidia.com/mig-1g.5gb": 14, "nvidia.com/mig-3g.20gb": 2}
    assert state.mig_strategy == "mixed" and not state.ready and state.unschedulable
    assert (state.driver_version, state.cuda_driver_version) == ("550.54.15", "12.4")


def test_cpu_node_is_not_reported() -> None:
    assert node_to_state(load("node_cpu.json"), TS) is None


@pytest.mark.parametrize("fixture", ["pytorchjob_worker.json", "crashloopbackoff.json"])
def test_change_filter_ignores_resource_version_and_time(fixture: str) -> None:
    changes = ChangeFilter()
    obj = load(fixture)
    first = pod_to_state(obj, TS, CONFIG)
    assert first is not None and changes.changed(first.uid, first)
    bumped = copy.deepcopy(obj)
    bumped["metadata"]["resourceVersion"] = "99999999"
    bumped["metadata"]["managedFields"] = [{"manager": "kubelet", "time": "2024-05-06T08:05:00Z"}]
    again = pod_to_state(bumped, datetime(2024, 5, 6, 9, tzinfo=UTC), CONFIG)
    assert again is not None and not changes.changed(again.uid, again)
    bumped["status"]["containerStatuses"][-1]["restartCount"] = 99
    third = pod_to_state(bumped, TS, CONFIG)
    assert third is not None and changes.changed(third.uid, third)
    changes.forget(third.uid)
    assert changes.changed(third.uid, third)


def test_node_heartbeat_is_not_a_change() -> None:
    changes = ChangeFilter()
    node = load("node_gpu_a100.json")
    state = node_to_state(node, TS)
    assert state is not None and changes.changed(state.node, state)
    for condition in node["status"]["conditions"]:
        condition["lastHeartbeatTime"] = "2024-05-06T08:00:40Z"
    beat = node_to_state(node, TS)
    assert beat is not None and not changes.changed(beat.node, beat)


def test_owner_chain_jobset() -> None:
    obj = {"metadata": {"labels": {"jobset.sigs.k8s.io/jobset-name": "llm-pretrain"},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "llm-pretrain-workers-0",
                                             "controller": True}]}}
    chain = [(o.kind, o.name) for o in owner_chain(obj)]
    assert chain == [("Job", "llm-pretrain-workers-0"), ("JobSet", "llm-pretrain")]
