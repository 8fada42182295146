"""The watcher against the simulated API server, through the real ``kubernetes`` client."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from datetime import UTC, datetime

from common.backoff import Backoff, backoff_delay_s
from producers.watcher.fake_apiserver import FakeApiServer
from producers.watcher.fake_cluster import make_event, make_node, make_pod, set_finished
from producers.watcher.informer import Informer
from producers.watcher.kube import KubeSource, api_client
from producers.watcher.service import WatcherMemorySink
from schemas.messages import PodState
from schemas.topics import K8S_EVENTS, K8S_NODES, K8S_PODS
from tests.watcher.conftest import Factory, FakeClock, populate


def pod_keys(sink: WatcherMemorySink) -> Counter[str]:
    return Counter(r.key for r in sink.of(K8S_PODS))


def test_initial_list_emits_every_gpu_pod_once(server: FakeApiServer, make_service: Factory) -> None:
    uids = populate(server)
    service, sink, _ = make_service(page_size=2)  # paginated lists, continue tokens
    assert service.sync(threading.Event())
    expected = {uids[f"train-{i}"] for i in range(5)} | {uids["log-shipper"]}  # CPU pod on a GPU node counts
    assert pod_keys(sink) == Counter({uid: 1 for uid in expected})
    assert sorted(r.key for r in sink.of(K8S_NODES)) == ["gpu-0", "gpu-1"]
    states = {r.key: r.message for r in sink.of(K8S_PODS)}
    two = states[uids["train-1"]]
    assert isinstance(two, PodState) and two.gpu_requests == {"nvidia.com/gpu": 2}
    assert any("limit=2" in path for path in server.requests)


def test_updates_flow_and_unchanged_pods_are_not_reemitted(server: FakeApiServer, make_service: Factory) -> None:
    uids = populate(server)
    service, sink, _ = make_service()
    service.sync(threading.Event())
    before = len(sink.records)
    informer = service.pod_informers[0]
    server.patch("pods", "ml/train-0", lambda p: set_finished(p, datetime(2024, 5, 6, 9, tzinfo=UTC)))
    # new resourceVersions, nothing we report changed
    server.patch("pods", "ml/train-1", lambda p: p["metadata"].setdefault("annotations", {}).update({"x": "1"}))
    server.put("pods", server.get("pods", "ml/train-2") or {})
    informer.watch_once()
    fresh = sink.records[before:]
    changed = [(r.key, r.message.phase) for r in fresh if isinstance(r.message, PodState)]
    assert changed == [(uids["train-0"], "Succeeded")]
    assert informer.resource_version == str(server.resource_version)
    # deletion as the real server does it: MODIFIED with deletionTimestamp, then DELETED: the
    # deletion time, then the final state and a tombstone, once
    server.delete("pods", "ml/train-0")
    informer.watch_once()
    tail = [r for r in sink.records[before + 1:] if r.key == uids["train-0"]]
    assert len(tail) == 3 and all(isinstance(r.message, PodState) for r in tail[:2])
    deleting, final = tail[0].message, tail[1].message
    assert isinstance(deleting, PodState) and not deleting.deleted and deleting.deleted_at is not None
    assert isinstance(final, PodState) and final.deleted and final.deleted_at == deleting.deleted_at
    assert final.phase == "Succeeded" and tail[2].message is None


def test_forced_410_relists_and_deletes_each_vanished_pod_exactly_once(
        server: FakeApiServer, make_service: Factory) -> None:
    uids = populate(server)
    service, sink, _ = make_service()
    stop = threading.Event()
    service.sync(stop)
    informer = service.pod_informers[0]
    version_before = informer.resource_version
    # while the watcher is away: two pods go, one comes, one changes; then history is compacted
    server.delete("pods", "ml/train-1")
    server.delete("pods", "vision/train-4")
    server.delete("pods", "web/web")  # never reported: nothing to delete downstream
    new_uid = server.put("pods", make_pod("train-5", namespace="ml", gpus=4))["metadata"]["uid"]
    server.patch("pods", "ml/train-0", lambda p: set_finished(p, datetime(2024, 5, 6, 9, tzinfo=UTC), 137, "OOMKilled"))
    server.compact()
    start = len(sink.records)
    informer.step(stop)  # watch from the old version -> ERROR 410
    assert not informer.synced
    informer.step(stop)  # re-list
    assert informer.synced and informer.relists == 2 and informer.resource_version != version_before
    informer.watch_once()  # and nothing more arrives twice
    informer.watch_once()
    fresh = sink.records[start:]
    by_key: dict[str, list[object]] = {}
    for record in fresh:
        by_key.setdefault(record.key, []).append(record.message)
    for gone in ("train-1", "train-4"):
        final, tombstone = by_key[uids[gone]]
        assert isinstance(final, PodState) and final.deleted and tombstone is None
    assert uids["web"] not in by_key
    assert [m.phase for m in by_key[new_uid] if isinstance(m, PodState)] == ["Pending"]
    assert [m.last_termination_reason for m in by_key[uids["train-0"]] if isinstance(m, PodState)] == ["OOMKilled"]
    assert set(by_key) == {uids["train-1"], uids["train-4"], new_uid, uids["train-0"]}
    text = service.metrics.registry.render()
    assert 'gpulens_watcher_relists_total{reason="gone",resource="pods"} 1.0' in text
    assert 'gpulens_watcher_relist_deletes_total{resource="pods"} 3.0' in text


def test_backoff_schedule_is_exponential_jittered_and_capped() -> None:
    rng = random.Random(1)
    delays = [backoff_delay_s(attempt, rng=rng) for attempt in range(1, 41)]
    assert all(0 < d <= 30.0 for d in delays)
    assert max(delays) > 15.0  # it does reach the cap region
    ceilings = [min(30.0, 0.5 * 2 ** (a - 1)) for a in range(1, 41)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))  # jitter within [c/2, c]
    assert backoff_delay_s(100, jitter=0.0) == 30.0
    assert len({round(d, 6) for d in delays[10:]}) > 20  # jittered, not lock-step
    backoff = Backoff(rng=random.Random(2))
    assert [round(backoff.next_delay_s(), 3) <= c for c in (0.5, 1, 2)] == [True, True, True]
    backoff.reset()
    assert backoff.next_delay_s() <= 0.5


def test_server_errors_back_off_then_recover(server: FakeApiServer, make_service: Factory) -> None:
    populate(server)
    service, sink, clock = make_service()
    stop = threading.Event()
    server.fail_next(5, 500, path_contains="/nodes")
    assert service.node_informer.sync(stop)
    assert len(clock.sleeps) == 5
    assert all(0 < s <= 30 for s in clock.sleeps) and clock.sleeps[-1] > clock.sleeps[0]
    assert len(sink.of(K8S_NODES)) == 2
    # a failing watch backs off and resumes from the same version: no re-list
    informer = service.node_informer
    server.fail_next(2, 503, path_contains="/nodes")
    version = informer.resource_version
    informer.step(stop)
    informer.step(stop)
    assert informer.relists == 1 and informer.resource_version == version and len(clock.sleeps) == 7
    server.put("nodes", make_node("gpu-2", gpus=2))
    informer.step(stop)
    assert informer.backoff.failures == 0 and [r.key for r in sink.of(K8S_NODES)][-1] == "gpu-2"
    assert 'gpulens_watcher_errors_total{kind="watch_503",resource="nodes"} 2.0' in service.metrics.registry.render()


def test_dropped_connections_resume_without_loss(server: FakeApiServer, make_service: Factory) -> None:
    uids = populate(server)
    service, sink, _ = make_service()
    stop = threading.Event()
    service.start(stop)
    try:
        server.patch("pods", "ml/train-0", lambda p: set_finished(p, datetime(2024, 5, 6, 9, tzinfo=UTC)))
        time.sleep(0.3)
        server.drop_watches()
        server.patch("pods", "ml/train-2", lambda p: set_finished(p, datetime(2024, 5, 6, 9, tzinfo=UTC), 1, "Error"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and pod_keys(sink)[uids["train-2"]] < 2:
            time.sleep(0.05)
    finally:
        service.shutdown(stop)
    assert pod_keys(sink)[uids["train-0"]] == 2 and pod_keys(sink)[uids["train-2"]] == 2
    assert all(inf.relists == 1 for inf in service.informers)  # resumed, never re-listed
    assert 'kind="watch"' in service.metrics.registry.render()  # the broken stream was counted


def test_bookmarks_advance_the_version(server: FakeApiServer, make_service: Factory) -> None:
    populate(server)
    service, sink, _ = make_service(namespaces=("ml",))
    service.sync(threading.Event())
    informer = service.pod_informers[0]
    listed = int(informer.resource_version or 0)
    before = len(sink.records)
    server.put("nodes", make_node("cpu-10", gpus=0))  # another collection: no bookmark for pods
    informer.watch_once()
    assert int(informer.resource_version or 0) == listed
    for index in range(3):  # pods of another namespace: filtered out, the version still moves
        server.put("pods", make_pod(f"other-{index}", namespace="vision", gpus=1))
    informer.watch_once()
    assert int(informer.resource_version or 0) == server.resource_version > listed
    assert len(sink.records) == before
    query = server.watch_requests[-1]
    assert query["allowWatchBookmarks"] == "true" and query["resourceVersion"] == str(listed)  # the 2nd watch
    assert 1 <= int(query["timeoutSeconds"]) <= 2


def test_events_for_gpu_pods_only_in_both_apis(server: FakeApiServer, make_service: Factory) -> None:
    populate(server)
    pending = server.get("pods", "vision/train-3") or {}
    web = server.get("pods", "web/web") or {}
    at = datetime(2024, 5, 6, 8, tzinfo=UTC)
    server.put("events", make_event(pending, "FailedScheduling",
                                    "0/3 nodes are available: 2 Insufficient nvidia.com/gpu.", at))
    server.put("events", make_event(web, "BackOff", "Back-off restarting failed container", at))
    server.put("events", make_event(pending, "Pulled", "Successfully pulled image", at, type_="Normal"))
    for api in ("events.k8s.io", "core"):
        service, sink, _ = make_service(events_api=api)
        service.sync(threading.Event())
        events = sink.of(K8S_EVENTS)
        assert [(r.key, getattr(r.message, "category", None)) for r in events] == [
            (pending["metadata"]["uid"], "scheduling_failed")]
    # re-lists and new resourceVersions of the same event do not repeat it
    informer = service.event_informers[0]
    informer.relist("gone")
    assert len(sink.of(K8S_EVENTS)) == 1


def test_namespaced_watch_sees_only_its_namespaces(server: FakeApiServer, make_service: Factory) -> None:
    uids = populate(server)
    service, sink, _ = make_service(namespaces=("vision",))
    service.sync(threading.Event())
    assert set(pod_keys(sink)) == {uids["train-3"], uids["train-4"]}
    assert any("/namespaces/vision/pods" in path for path in server.requests)


def test_empty_watch_streams_back_off_instead_of_spinning(server: FakeApiServer) -> None:
    class Quick:
        resource = "pods"

        def list(self) -> tuple[list[dict[str, object]], str]:
            return [], "5"

        def watch(self, resource_version: str, timeout_s: int):  # type: ignore[no-untyped-def]
            return iter(())

        def interrupt(self) -> None:
            pass

    class Nothing:
        def upsert(self, obj: dict[str, object]) -> None:
            pass

        def delete(self, obj: dict[str, object], observed: str) -> None:
            pass

    clock = FakeClock()
    informer = Informer(Quick(), Nothing(), clock=clock, backoff=Backoff(rng=random.Random(3)))
    stop = threading.Event()
    for _ in range(8):
        informer.step(stop)
    assert len(clock.sleeps) == 7 and clock.sleeps[-1] > 10  # growing waits, no hot loop


def test_kube_source_lists_in_pages(server: FakeApiServer) -> None:
    for index in range(7):
        server.put("pods", make_pod(f"p{index}", gpus=1))
    source = KubeSource(api_client(host=server.url), "pods", page_size=3)
    items, version = source.list()
    assert sorted(i["metadata"]["name"] for i in items) == [f"p{i}" for i in range(7)]
    assert version == str(server.resource_version)


def test_pods_already_on_a_node_that_becomes_a_gpu_node_are_reported(
        server: FakeApiServer, make_service: Factory) -> None:
    uids = populate(server)
    service, sink, _ = make_service()
    service.sync(threading.Event())
    assert uids["web"] not in pod_keys(sink)
    stored = service.pod_informers[0].store[uids["web"]]
    assert "conditions" not in stored["status"]  # a CPU pod is kept as a small stub
    server.put("nodes", make_node("cpu-0", gpus=2))  # the device plugin came up
    service.node_informer.watch_once()
    web = [r.message for r in sink.of(K8S_PODS) if r.key == uids["web"]]
    assert len(web) == 1 and isinstance(web[0], PodState)
    assert (web[0].node, web[0].phase, web[0].gpu_requests) == ("cpu-0", "Running", {})
    assert web[0].containers[0].container_id  # what attribution needs
