"""Progress published as pod annotations (``gpulens.io/steps|tokens|samples``): translated, and
emitted by the watcher through the simulated API server only when a total changes."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.fake_cluster import make_pod
from producers.watcher.translate import pod_progress
from schemas.messages import WorkloadProgress
from schemas.topics import WORKLOAD_PROGRESS
from tests.watcher.conftest import Factory, populate

TS = datetime(2024, 5, 6, 8, tzinfo=UTC)


def annotated(values: dict[str, Any]) -> dict[str, Any]:
    pod = make_pod("train", namespace="ml", gpus=1)
    pod["metadata"]["uid"] = "uid-1"
    pod["metadata"]["annotations"] = {f"gpulens.io/{k}": v for k, v in values.items()}
    return pod


def test_annotations_become_totals() -> None:
    message, bad = pod_progress(annotated({"steps": "120", "tokens": " 4096 "}), TS)
    assert bad == {}
    assert message == WorkloadProgress(pod_uid="uid-1", namespace="ml", pod="train", ts=TS,
                                       steps_total=120.0, tokens_total=4096.0)


def test_a_pod_without_progress_annotations_has_none() -> None:
    assert pod_progress(make_pod("web", namespace="web", gpus=0), TS) == (None, {})


def test_malformed_values_are_named_and_the_good_ones_kept() -> None:
    message, bad = pod_progress(annotated({"steps": "-3", "tokens": "1.5", "samples": "9" * 30}), TS)
    assert message is None
    assert bad == {"gpulens.io/steps": "not_integer", "gpulens.io/tokens": "not_integer",
                   "gpulens.io/samples": "too_large"}
    message, bad = pod_progress(annotated({"steps": "abc", "samples": "7"}), TS)
    assert message is not None and message.samples_total == 7.0 and message.steps_total is None
    assert bad == {"gpulens.io/steps": "not_integer"}


def set_progress(pod: dict[str, Any], **values: str) -> None:
    pod["metadata"].setdefault("annotations", {}).update({f"gpulens.io/{k}": v for k, v in values.items()})


def test_the_watcher_emits_progress_when_annotations_change(server: FakeApiServer, make_service: Factory) -> None:
    uids = populate(server)
    service, sink, _ = make_service()
    assert service.sync(threading.Event())
    assert sink.of(WORKLOAD_PROGRESS) == []
    informer = service.pod_informers[0]
    server.patch("pods", "ml/train-0", lambda p: set_progress(p, steps="10", tokens="1000"))
    informer.watch_once()
    # unchanged totals (another annotation changes): nothing new
    server.patch("pods", "ml/train-0", lambda p: p["metadata"]["annotations"].update({"x": "1"}))
    informer.watch_once()
    # a restarted job: the total goes down and is passed on as is
    server.patch("pods", "ml/train-0", lambda p: set_progress(p, steps="3"))
    informer.watch_once()
    # malformed: counted and logged, no message and no crash; the watcher goes on
    server.patch("pods", "ml/train-0", lambda p: set_progress(p, steps="oops", tokens="oops"))
    informer.watch_once()
    server.patch("pods", "ml/train-0", lambda p: set_progress(p, steps="4", tokens="1001"))
    informer.watch_once()
    records = sink.of(WORKLOAD_PROGRESS)
    assert {r.key for r in records} == {uids["train-0"]}
    totals = [(r.message.steps_total, r.message.tokens_total) for r in records
              if isinstance(r.message, WorkloadProgress)]
    assert totals == [(10.0, 1000.0), (3.0, 1000.0), (4.0, 1001.0)]
    registry = service.metrics.registry.registry
    assert registry.get_sample_value("gpulens_watcher_progress_malformed_total", {"reason": "not_integer"}) == 2
