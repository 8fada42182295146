"""A shared pod's memory need: HAMi's nvidia.com/gpumem (MiB) wins over the gpulens.io/vram-request
annotation; neither, or an unreadable annotation, gives None; gpumem is never counted as GPUs."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from producers.watcher.translate import TranslateConfig, pod_to_state

FIXTURES = Path(__file__).parent / "fixtures"
TS = datetime(2024, 5, 6, 8, 0, 5, tzinfo=UTC)


def _pod(resources: dict[str, Any] | None = None, annotation: str | None = None) -> dict[str, Any]:
    pod = copy.deepcopy(json.loads((FIXTURES / "timesliced_shared.json").read_text()))
    if resources is not None:
        pod["spec"]["containers"][0]["resources"] = resources
    annotations = pod["metadata"].setdefault("annotations", {})
    annotations.pop("gpulens.io/vram-request", None)
    if annotation is not None:
        annotations["gpulens.io/vram-request"] = annotation
    return pod


def _need(pod: dict[str, Any]) -> int | None:
    state = pod_to_state(pod, TS, TranslateConfig())
    assert state is not None
    return state.vram_request_bytes


def test_hami_gpumem_in_mib_and_not_a_gpu() -> None:
    pod = _pod({"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480}}, annotation="8Gi")
    state = pod_to_state(pod, TS, TranslateConfig())
    assert state is not None
    assert state.vram_request_bytes == 20480 * 2**20 == 20 * 2**30  # the request wins over the annotation
    assert state.gpu_requests == {"nvidia.com/gpu": 1}


def test_gpumem_of_two_containers_adds_up() -> None:
    pod = _pod({"requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "3000"}})
    second = copy.deepcopy(pod["spec"]["containers"][0])
    second["name"] = "sidecar"
    second["resources"] = {"limits": {"nvidia.com/gpumem": "1000"}}
    pod["spec"]["containers"].append(second)
    assert _need(pod) == 4000 * 2**20


def test_annotation_quantities() -> None:
    assert _need(_pod(annotation="20Gi")) == 20 * 2**30
    assert _need(_pod(annotation="16G")) == 16 * 10**9
    assert _need(_pod(annotation="1073741824")) == 2**30


def test_no_need_or_unreadable() -> None:
    assert _need(_pod()) is None
    assert _need(_pod(annotation="a lot")) is None
    assert _need(_pod(annotation="0")) is None
