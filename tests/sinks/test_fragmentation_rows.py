"""Fragmentation figures reach ClickHouse (migration 8): capacity MIG and shared-VRAM columns, and one
mig_gpu_windows / shared_gpu_windows row per GPU per window, from the goldens replayed through the sink's writer."""

from __future__ import annotations

from common.metrics import MetricsRegistry
from schemas.codec import encode
from schemas.outputs import ClusterCapacity
from schemas.topics import CLUSTER_CAPACITY
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from sinks.batches import Batch, BatchWriter, ConsumedRecord, SinkMetrics
from sinks.clickhouse import ClickHouseStore
from sinks.ddl import TtlDays
from sinks.migrations import migrate
from tests.conftest import REPO_ROOT

PREFIX = "gpulens"


def test_mig_windows_and_capacity_columns(store: ClickHouseStore) -> None:
    scenario = load_scenario(REPO_ROOT / "simulation" / "scenarios" / "mig-fragmentation.yaml")
    ttl = TtlDays.keeping(scenario.start)
    migrate(store, ttl)
    windows = [m for m in run_in_process(scenario).outputs if isinstance(m, ClusterCapacity)]
    topic = CLUSTER_CAPACITY.name(PREFIX)
    records = [ConsumedRecord(topic, 0, i, None, encode(w)) for i, w in enumerate(windows)]
    writer = BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, ttl)
    writer.write(Batch(topic, 0, records, 0, len(records) - 1))
    # 12 one-minute windows, one MIG GPU each
    assert store.query("SELECT count() FROM mig_gpu_windows FINAL").rows == [[12]]
    # the window 09:00-09:01 ends with serve-0..3 on 1g.10gb@0..3 and 1g.10gb@4..6 empty: 3 compute
    # and 4 memory slices free, nothing creatable as partitioned, a 3g.40gb after a re-layout
    rows = store.query(
        "SELECT instance_profiles, instance_starts, instance_used, free_compute_slices, free_memory_slices, "
        "largest_creatable_profile, largest_after_relayout FROM mig_gpu_windows FINAL "
        "WHERE window_start = '2026-01-05 09:00:00'").rows
    assert rows == [[["1g.10gb"] * 7, [0, 1, 2, 3, 4, 5, 6], [1, 1, 1, 1, 0, 0, 0], 3, 4, None, "3g.40gb"]]
    # after the re-layout at 8m: [1g.10gb x4, 3g.40gb@4], all held -> nothing free
    rows = store.query(
        "SELECT instance_profiles, instance_starts, free_compute_slices, free_memory_slices "
        "FROM mig_gpu_windows FINAL WHERE window_start = '2026-01-05 09:10:00'").rows
    assert rows == [[["1g.10gb"] * 4 + ["3g.40gb"], [0, 1, 2, 3, 4], 0, 0]]
    rows = store.query(
        "SELECT mig_gpus, mig_free_compute_slices, mig_free_instances_by_profile, mig_pending_by_profile "
        "FROM cluster_capacity FINAL WHERE window_start = '2026-01-05 09:00:00'").rows
    assert rows == [[1, 3, {"1g.10gb": 3}, {"3g.40gb": 1}]]


def test_shared_gpu_windows_and_capacity_columns(store: ClickHouseStore) -> None:
    scenario = load_scenario(REPO_ROOT / "simulation" / "scenarios" / "vram-fragmentation.yaml")
    ttl = TtlDays.keeping(scenario.start)
    migrate(store, ttl)
    windows = [m for m in run_in_process(scenario).outputs if isinstance(m, ClusterCapacity)]
    topic = CLUSTER_CAPACITY.name(PREFIX)
    records = [ConsumedRecord(topic, 0, i, None, encode(w)) for i, w in enumerate(windows)]
    BatchWriter(store, SinkMetrics(MetricsRegistry()), PREFIX, ttl).write(Batch(topic, 0, records, 0, len(records) - 1))
    # 12 windows x 4 shared GPUs
    assert store.query("SELECT count() FROM shared_gpu_windows FINAL").rows == [[48]]
    # at 09:00-09:01 each GPU holds one 14 GiB tenant of 24 GiB: 10 GiB free
    rows = store.query(
        "SELECT node, gpu_index, free_bytes, pod_names, pod_mem_bytes, pod_peak_bytes FROM shared_gpu_windows FINAL "
        "WHERE window_start = '2026-01-05 09:00:00' ORDER BY node, gpu_index").rows
    gib14 = 14 * 2**30
    assert rows == [["gpu-a", 0, 10 * 2**30, ["tenant-0"], [gib14], [gib14]],
                    ["gpu-a", 1, 10 * 2**30, ["tenant-1"], [gib14], [gib14]],
                    ["gpu-b", 0, 10 * 2**30, ["tenant-2"], [gib14], [gib14]],
                    ["gpu-b", 1, 10 * 2**30, ["tenant-3"], [gib14], [gib14]]]
    rows = store.query(
        "SELECT shared_gpus, shared_vram_free_bytes, shared_vram_largest_free_bytes, shared_vram_stranded_bytes, "
        "shared_vram_pending_bytes FROM cluster_capacity FINAL WHERE window_start = '2026-01-05 09:00:00'").rows
    assert rows == [[4, 40 * 2**30, 10 * 2**30, 40 * 2**30, 20 * 2**30]]
    # the MIG table stays empty on a fleet without MIG GPUs, and the MIG columns NULL / empty
    assert store.query("SELECT count() FROM mig_gpu_windows").rows == [[0]]
    assert store.query("SELECT countIf(mig_gpus IS NULL), countIf(empty(mig_pending_by_profile)) "
                       "FROM cluster_capacity FINAL").rows == [[12, 12]]
