"""The fleet's Prometheus series (stream_jobs.fleet_metrics): dcgm-exporter's names, units and
labels for what means the same, series of ended pods gone, the series cap and its counter, and the
node stage filling the window fields the series need."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from common.metrics import MetricsRegistry
from schemas.outputs import Alert, AlertSubject, ClusterCapacity, PodLifecycle, PodWindow
from stream_jobs.config import EngineConfig
from stream_jobs.fleet_metrics import METRICS, FleetSeries, metric_table
from stream_jobs.internal import PodUsage
from stream_jobs.node_stage import NodeStage
from tests.conftest import REPO_ROOT
from tests.stream_jobs.helpers import GIB, at, node, pod, reading, sample

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(registry: MetricsRegistry) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(registry.render()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _named(series: Series, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (n, labels), value in series.items() if n == name}


def _window(name: str = "train-0", gpu: str = "GPU-aaa", start_s: float = 0.0, util: float | None = 42.5,
            mem_gib: float | None = 3.0, share: float = 1.0, **extra: object) -> PodWindow:
    fields: dict[str, object] = dict(
        window_id=f"w-{name}-{gpu}-{start_s}", pod_uid=f"uid-{name}", namespace="ml", pod=name, node="gpu-node-7",
        gpu_uuid=gpu, gpu_model="NVIDIA H100 80GB HBM3", window_start=at(start_s),
        window_end=at(start_s + 60), team="vision", allocated_s=60.0, busy_s=45.0, idle_s=15.0, samples=6,
        avg_sm_util_pct=util, avg_mem_used_bytes=mem_gib * GIB if mem_gib is not None else None,
        share_fraction=share, cost_usd=0.05, gpu_index=3, container="trainer", mem_total_bytes=80 * GIB,
        avg_power_w=312.5)
    fields.update(extra)
    return PodWindow.model_validate(fields)


def _fleet(max_series: int = 100_000) -> tuple[MetricsRegistry, FleetSeries]:
    registry = MetricsRegistry()
    return registry, FleetSeries(registry, max_series)


DEFAULT = frozenset({("cluster", "default")})
"""A single-cluster install's series still carry ``cluster``: label sets stay the same when a second
cluster comes."""


def _team(team: str, cluster: str = "default") -> frozenset[tuple[str, str]]:
    return frozenset({("cluster", cluster), ("team", team)})


DCGM_LABELS = frozenset({("cluster", "default"), ("gpu", "3"), ("UUID", "GPU-aaa"),
                         ("modelName", "NVIDIA H100 80GB HBM3"),
                         ("Hostname", "gpu-node-7"), ("pod", "train-0"), ("namespace", "ml"),
                         ("container", "trainer"), ("team", "vision")})


def test_window_maps_to_dcgm_names_units_and_labels() -> None:
    registry, fleet = _fleet()
    fleet.observe([_window()])
    series = _scrape(registry)
    assert series[("DCGM_FI_DEV_GPU_UTIL", DCGM_LABELS)] == 42.5
    assert series[("DCGM_FI_DEV_FB_USED", DCGM_LABELS)] == 3 * 1024  # MiB, as dcgm-exporter
    assert series[("DCGM_FI_DEV_FB_FREE", DCGM_LABELS)] == 77 * 1024
    assert series[("DCGM_FI_DEV_POWER_USAGE", DCGM_LABELS)] == 312.5
    assert series[("gpulens_pod_gpu_idle_seconds", DCGM_LABELS)] == 15.0
    assert series[("gpulens_pod_gpu_allocated_seconds", DCGM_LABELS)] == 60.0
    assert abs(series[("gpulens_pod_gpu_cost_usd_per_hour", DCGM_LABELS)] - 3.0) < 1e-9  # $0.05 a minute
    assert series[("gpulens_team_cost_usd_per_hour", _team("vision"))] == 3.0
    assert series[("gpulens_pod_gpu_window_end_timestamp_seconds", DCGM_LABELS)] == at(60).timestamp()


def test_a_newer_window_replaces_the_figures_and_an_older_one_does_not() -> None:
    registry, fleet = _fleet()
    fleet.observe([_window(start_s=60, util=80.0)])
    fleet.observe([_window(start_s=0, util=10.0)])  # a redelivered older window
    assert _named(_scrape(registry), "DCGM_FI_DEV_GPU_UTIL") == {DCGM_LABELS: 80.0}
    fleet.observe([_window(start_s=120, util=5.0)])
    assert _named(_scrape(registry), "DCGM_FI_DEV_GPU_UTIL") == {DCGM_LABELS: 5.0}


def test_missing_figures_are_absent_not_zero() -> None:
    registry, fleet = _fleet()
    fleet.observe([_window(util=None, mem_gib=None, avg_power_w=None)])
    series = _scrape(registry)
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE"):
        assert _named(series, name) == {}, name
    assert _named(series, "gpulens_pod_gpu_idle_seconds") == {DCGM_LABELS: 15.0}


def test_fb_free_only_for_a_pod_holding_the_gpu_alone() -> None:
    registry, fleet = _fleet()
    fleet.observe([_window(share=0.5)])
    series = _scrape(registry)
    assert _named(series, "DCGM_FI_DEV_FB_FREE") == {}
    assert _named(series, "DCGM_FI_DEV_FB_USED") == {DCGM_LABELS: 3 * 1024}


def _capacity(**extra: object) -> ClusterCapacity:
    fields: dict[str, object] = dict(
        window_id="c", window_start=at(0), window_end=at(60), gpus_total=16, gpus_allocated=10, gpus_busy=7,
        gpus_idle_allocated=3, gpus_free=6, largest_free_block=2, stranded_gpus=4, pending_pods=2,
        pending_gpu_demand=8)
    fields.update(extra)
    return ClusterCapacity.model_validate(fields)


def test_cluster_figures_from_the_latest_capacity_record() -> None:
    registry, fleet = _fleet()
    fleet.observe([_capacity()])
    series = _scrape(registry)
    assert _named(series, "gpulens_cluster_gpus") == {
        frozenset({("cluster", "default"), ("state", s)}): v for s, v in
        [("total", 16), ("allocated", 10), ("busy", 7), ("idle_allocated", 3), ("free", 6)]}
    assert series[("gpulens_cluster_stranded_gpus", DEFAULT)] == 4
    assert series[("gpulens_cluster_largest_free_block_gpus", DEFAULT)] == 2
    assert series[("gpulens_cluster_pending_pods", DEFAULT)] == 2
    assert series[("gpulens_cluster_pending_gpus", DEFAULT)] == 8


def _alert(kind: str, state: str, name: str = "train-0", gpu: str | None = "GPU-aaa", cluster: str = "default",
           **details: object) -> Alert:
    return Alert(id=f"{kind}-{name}", type=kind, severity="warning", state=state,  # type: ignore[arg-type]
                 cluster=cluster,
                 at=at(600), started_at=at(600), summary="s", details=details,
                 subject=AlertSubject(kind="pod", namespace="ml", name=name, gpu_uuid=gpu))


def test_idle_class_while_the_idle_alert_is_open() -> None:
    registry, fleet = _fleet()
    fleet.observe([_window(), _alert("idle_gpu", "firing", idle_class="vram_held")])
    assert _named(_scrape(registry), "gpulens_pod_gpu_idle") == {DCGM_LABELS | {("idle_class", "vram_held")}: 1.0}
    fleet.observe([_alert("idle_gpu", "resolved", idle_class="vram_held")])
    assert _named(_scrape(registry), "gpulens_pod_gpu_idle") == {}


def test_idle_alert_before_its_pods_first_window_is_shown_with_it() -> None:
    registry, fleet = _fleet()
    fleet.observe([_alert("idle_gpu", "firing", idle_class="no_process"), _window()])  # one batch, alert first
    fleet.observe([_alert("idle_gpu", "firing", name="later", idle_class="vram_held")])
    assert _named(_scrape(registry), "gpulens_pod_gpu_idle") == {DCGM_LABELS | {("idle_class", "no_process")}: 1.0}
    fleet.observe([_window("later")])
    assert {dict(labels)["pod"] for labels in _named(_scrape(registry), "gpulens_pod_gpu_idle")} == {"train-0", "later"}


def test_pending_pod_and_its_wait() -> None:
    registry, fleet = _fleet()
    fleet.observe([_alert("pending_gpu", "firing", name="big-job", gpu=None, pending_s=420.0, gpus=8)])
    labels = frozenset({("cluster", "default"), ("namespace", "ml"), ("pod", "big-job")})
    series = _scrape(registry)
    assert series[("gpulens_pod_pending_since_timestamp_seconds", labels)] == at(180).timestamp()
    assert series[("gpulens_pod_pending_gpus", labels)] == 8
    fleet.observe([_alert("pending_gpu", "resolved", name="big-job", gpu=None, pending_s=420.0, gpus=8)])
    assert _named(_scrape(registry), "gpulens_pod_pending_gpus") == {}


def _lifecycle(name: str, end_reason: str) -> PodLifecycle:
    return PodLifecycle(pod_uid=f"uid-{name}", namespace="ml", name=name, gpus=1, created_at=at(0), pending_s=0,
                        running_s=60, gpu_hours=0.1, idle_gpu_hours=0.0, end_reason=end_reason)  # type: ignore[arg-type]


def _pods_with_series(registry: MetricsRegistry) -> set[str]:
    return {dict(labels).get("pod", "") for (name, labels) in _scrape(registry)
            if name.startswith(("DCGM_", "gpulens_pod_"))}


def test_series_of_ended_pods_disappear() -> None:
    registry, fleet = _fleet()
    fleet.observe([_window("a"), _window("b"), _window("c"), _window("d"),
                   _alert("idle_gpu", "firing", name="a", idle_class="no_process"),
                   _alert("pending_gpu", "firing", name="e", gpu=None, pending_s=60.0, gpus=1)])
    assert _pods_with_series(registry) == {"a", "b", "c", "d", "e"}
    # the node stage: pod a left its node (its idle alert's series go with it)
    fleet.observe([PodUsage(pod_uid="uid-a", node="gpu-node-7", ts=at(120))])
    # the cluster stage: b finished, e was deleted while pending
    fleet.observe([_lifecycle("b", "Succeeded"), _lifecycle("e", "Deleted")])
    assert _pods_with_series(registry) == {"c", "d"}
    # the end of a replay: records for pods still open are not an end
    fleet.observe([PodUsage(pod_uid="uid-c", node="gpu-node-7", ts=at(120), open=True),
                   _lifecycle("c", "Running")])
    assert _pods_with_series(registry) == {"c", "d"}
    assert _named(_scrape(registry), "gpulens_team_cost_usd_per_hour") == {_team("vision"): 6.0}


def test_pods_whose_windows_stopped_coming_expire_in_event_time() -> None:
    registry, fleet = _fleet()
    fleet.observe([_window("moved", start_s=0), _window("stays", start_s=0)])
    fleet.observe([_window("stays", start_s=s) for s in (60, 120, 180)])
    assert _pods_with_series(registry) == {"moved", "stays"}  # 3 windows behind: not yet
    fleet.observe([_window("stays", start_s=240)])
    assert _pods_with_series(registry) == {"stays"}


def test_a_newer_window_updates_its_series_and_a_relabelled_one_moves_it() -> None:
    registry, fleet = _fleet()
    fleet.observe([_window(start_s=0, util=10.0)])
    fleet.observe([_window(start_s=60, util=20.0), _window(start_s=0, util=99.0)])  # an older one comes late
    assert _named(_scrape(registry), "DCGM_FI_DEV_GPU_UTIL") == {DCGM_LABELS: 20.0}
    fleet.observe([_window(start_s=120, team="nlp")])  # the pod's team label changed
    series = _scrape(registry)
    assert set(_named(series, "DCGM_FI_DEV_GPU_UTIL")) == {DCGM_LABELS - {("team", "vision")} | {("team", "nlp")}}
    assert _named(series, "gpulens_team_cost_usd_per_hour") == {_team("nlp"): 3.0}
    # the series' stale time moved with its newest window: 3 windows on it is still there
    fleet.observe([_window("other", start_s=s) for s in (180, 240, 300)])
    assert _pods_with_series(registry) == {"train-0", "other"}
    fleet.observe([_window("other", start_s=360)])
    assert _pods_with_series(registry) == {"other"}


def test_series_cap_drops_new_series_and_counts_them() -> None:
    per_pod = sum(1 for m in METRICS if m.source == "window")
    registry, fleet = _fleet(max_series=2 * per_pod + 1)  # two pods of one team
    fleet.observe([_window(f"p{i}") for i in range(5)])
    series = _scrape(registry)
    assert _pods_with_series(registry) == {"p0", "p1"}
    assert series[("gpulens_fleet_series_dropped_total", frozenset())] == 3 * per_pod
    assert series[("gpulens_fleet_series", frozenset())] == 2 * per_pod + 1  # + the team's cost rate
    fleet.observe([_window("other-team", team="nlp")])  # a new team costs its team series too
    assert _pods_with_series(registry) == {"p0", "p1"}
    assert _scrape(registry)[("gpulens_fleet_series_dropped_total", frozenset())] == 4 * per_pod + 1
    # figures of admitted pods still update at the cap; an ended pod frees room
    fleet.observe([_window("p0", start_s=60, util=99.0), PodUsage(pod_uid="uid-p1", node="gpu-node-7", ts=at(60))])
    fleet.observe([_window("p4", start_s=60)])
    assert _pods_with_series(registry) == {"p0", "p4"}
    assert _named(_scrape(registry), "DCGM_FI_DEV_GPU_UTIL")[DCGM_LABELS - {("pod", "train-0")} | {("pod", "p0")}] \
        == 99.0


def test_zero_cap_exports_no_fleet_series() -> None:
    registry, fleet = _fleet(max_series=0)
    fleet.observe([_window(), _capacity()])
    assert not [name for (name, _labels) in _scrape(registry) if name.startswith(("DCGM_", "gpulens_cluster"))]


def test_node_stage_windows_carry_index_container_memory_total_and_power() -> None:
    stage = NodeStage("n1", EngineConfig(window_s=60.0, sample_interval_s=10.0))
    stage.submit(node())
    stage.submit(pod("train", gpus=1))
    for t in range(0, 60, 10):
        stage.submit(sample(t, [reading(0, None), reading(1, 50.0, owners=["train"], mem_gib=4.0,
                                                          power_w=200.0 + t)]))
    windows = [m for m in stage.advance(at(130).timestamp()) if isinstance(m, PodWindow)]
    assert len(windows) == 1
    w = windows[0]
    assert (w.gpu_index, w.container, w.mem_total_bytes) == (1, "main", 80 * GIB)
    assert w.avg_power_w == 225.0  # mean of 200..250 W, each sample standing for 10 s
    assert w.avg_mem_used_bytes == 4 * GIB
    assert w.window_end - w.window_start == timedelta(seconds=60)


def test_docs_list_every_metric() -> None:
    assert metric_table() in (REPO_ROOT / "docs" / "prometheus.md").read_text()


def test_a_pod_whose_team_changes_moves_its_cost_to_the_new_team() -> None:
    registry, fleet = _fleet()
    fleet.observe([_window("a", start_s=0), _window("b", start_s=0)])
    fleet.observe([_window("a", start_s=60, team="nlp")])
    assert _named(_scrape(registry), "gpulens_team_cost_usd_per_hour") == {
        _team("vision"): 3.0, _team("nlp"): 3.0}
    fleet.observe([PodUsage(pod_uid="uid-b", node="gpu-node-7", ts=at(120))])
    assert _named(_scrape(registry), "gpulens_team_cost_usd_per_hour") == {_team("nlp"): 3.0}
    assert _scrape(registry)[("gpulens_fleet_series", frozenset())] == sum(
        1 for m in METRICS if m.source == "window") + 1


def test_two_clusters_with_the_same_node_and_pod_names_keep_separate_series() -> None:
    """One worker reading two clusters: same node, pod, uid and alert ids; nothing merges or overwrites."""
    registry, fleet = _fleet()
    fleet.observe([_window(util=10.0), _window(util=90.0, cluster="east"),
                   _capacity(stranded_gpus=1, largest_free_block=4, pending_pods=1),
                   _capacity(cluster="east", stranded_gpus=3, largest_free_block=8, pending_pods=5, gpus_total=32),
                   _alert("idle_gpu", "firing", idle_class="vram_held", cluster="east"),
                   _alert("pending_gpu", "firing", name="big-job", gpu=None, pending_s=60.0, gpus=8),
                   _alert("pending_gpu", "firing", name="big-job", gpu=None, pending_s=60.0, gpus=2, cluster="east")])
    east = DCGM_LABELS - {("cluster", "default")} | {("cluster", "east")}
    series = _scrape(registry)
    assert _named(series, "DCGM_FI_DEV_GPU_UTIL") == {DCGM_LABELS: 10.0, east: 90.0}
    assert _named(series, "gpulens_team_cost_usd_per_hour") == {_team("vision"): 3.0, _team("vision", "east"): 3.0}
    assert _named(series, "gpulens_pod_gpu_idle") == {east | {("idle_class", "vram_held")}: 1.0}
    assert _named(series, "gpulens_pod_pending_gpus") == {
        frozenset({("cluster", c), ("namespace", "ml"), ("pod", "big-job")}): v
        for c, v in [("default", 8), ("east", 2)]}
    for name, default, other in [("gpulens_cluster_stranded_gpus", 1, 3),
                                 ("gpulens_cluster_largest_free_block_gpus", 4, 8),
                                 ("gpulens_cluster_pending_pods", 1, 5)]:
        assert _named(series, name) == {DEFAULT: default, frozenset({("cluster", "east")}): other}
    assert series[("gpulens_cluster_gpus", frozenset({("cluster", "east"), ("state", "total")}))] == 32
    assert series[("gpulens_cluster_gpus", frozenset({("cluster", "default"), ("state", "total")}))] == 16
    # the pod ends in one cluster only: its namesake in the other keeps its series
    fleet.observe([PodUsage(pod_uid="uid-train-0", node="gpu-node-7", ts=at(120), cluster="east"),
                   PodLifecycle.model_validate(dict(pod_uid="uid-big-job", namespace="ml", name="big-job",
                                                    end_reason="Succeeded", cluster="east", gpus=2,
                                                    created_at=at(0), pending_s=60.0, running_s=0.0,
                                                    gpu_hours=0.0, idle_gpu_hours=0.0))])
    series = _scrape(registry)
    assert _named(series, "DCGM_FI_DEV_GPU_UTIL") == {DCGM_LABELS: 10.0}
    assert _named(series, "gpulens_pod_gpu_idle") == {}
    assert _named(series, "gpulens_team_cost_usd_per_hour") == {_team("vision"): 3.0}
    assert set(_named(series, "gpulens_pod_pending_gpus")) == {
        frozenset({("cluster", "default"), ("namespace", "ml"), ("pod", "big-job")})}
