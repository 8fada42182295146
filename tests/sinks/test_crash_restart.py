"""The sink process killed (SIGKILL) at random points and restarted still stores every row once;
while it runs, ``gpulens sql`` and ``gpulens report`` read the embedded engine it owns through its
local query endpoint; SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
import pytest

from common.settings import KafkaSettings
from gpulens.cli import main
from schemas.topics import CLUSTER_CAPACITY, GPU_SAMPLES, POD_WINDOWS
from sinks.clickhouse import StoreError, open_store
from sinks.query_server import RemoteReader, endpoint_file
from tests.child_process import GpulensChild
from tests.sinks import factories as f
from tests.sinks.conftest import Item

pytestmark = pytest.mark.kafka

NODES = [f"node-{i}" for i in range(6)]
SEQS = 100
PODS = [f"p{i}" for i in range(5)]
MINUTES = 15
GPUS_PER_POD = 4


def _dataset() -> list[Item]:
    items: list[Item] = []
    for seq in range(SEQS):
        items += [(GPU_SAMPLES, node, f.sample(node, seq)) for node in NODES]
    for minute in range(MINUTES):
        # every pod on every GPU of gpu-a: each GPU-window shared by all pods, as the node stage stamps it
        windows = f.stamped(f.window(p, g, minute, busy_s=30.0) for p in PODS for g in range(GPUS_PER_POD))
        items += [(POD_WINDOWS, w.pod_uid, w) for w in windows]
        items.append((CLUSTER_CAPACITY, "cluster", f.capacity(minute)))
    return items


def _env(kafka: KafkaSettings, prefix: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env.update({
        "GPULENS_DATA_DIR": str(data_dir),
        "GPULENS_TOPIC_PREFIX": prefix,
        "GPULENS_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "GPULENS_GROUP_ID": f"{prefix}-sink",
        "GPULENS_GROUP_INSTANCE_ID": f"{prefix}-sink-0",
        "GPULENS_SESSION_TIMEOUT_MS": "6000",
        "GPULENS_BATCH_MAX_ROWS": "20",
        "GPULENS_BATCH_MAX_AGE_S": "0.05",
        "GPULENS_LOG_FORMAT": "text",
        "GPULENS_PRICES_USD_PER_GPU_HOUR": '{"NVIDIA H100 80GB HBM3": 2.5}',
    })
    return env


def test_sigkill_at_random_points_then_restart_stores_every_row_once(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path,
    producer: Callable[[Iterable[Item]], int], capsys: pytest.CaptureFixture[str],
) -> None:
    producer(_dataset())
    env = _env(kafka_settings, topic_prefix, tmp_path)
    seed = int(time.time())
    rng = random.Random(seed)
    replays = 0
    for _ in range(4):
        sink = GpulensChild(env, "sink")
        assert sink.assigned.wait(60), "".join(sink.lines)
        time.sleep(rng.uniform(0.05, 1.5))
        sink.proc.send_signal(signal.SIGKILL)
        assert sink.wait(30) == -signal.SIGKILL
        replays += sum("replaying journalled batches" in line for line in sink.lines)

    final = GpulensChild(env, "sink", "--exit-when-idle", "2")
    assert final.wait(120) == 0, "".join(final.lines[-30:])

    # the sink runs again (nothing new to consume): queries go through its endpoint
    serving = GpulensChild(env, "sink")
    try:
        deadline = time.monotonic() + 60
        while not endpoint_file(tmp_path).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert endpoint_file(tmp_path).exists(), "".join(serving.lines)
        capsys.readouterr()
        assert main(["sql", "SELECT count() AS n FROM gpu_samples", "--format", "json",
                     "--data-dir", str(tmp_path)]) == 0
        assert orjson.loads(capsys.readouterr().out) == [{"n": len(NODES) * SEQS * 8}]
        assert main(["sql", "DROP TABLE gpu_samples", "--data-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("gpulens: refused:") and "DROP" in err and "\n" not in err
        assert main(["report", "--json", "--data-dir", str(tmp_path)]) == 0
        report = orjson.loads(capsys.readouterr().out)
        assert report["summary"][0]["gpu_hours_allocated"] == pytest.approx(len(PODS) * GPUS_PER_POD * MINUTES / 60)
    finally:
        serving.proc.send_signal(signal.SIGTERM)
        assert serving.wait(30) == 0, "".join(serving.lines[-20:])
    assert not endpoint_file(tmp_path).exists(), "a clean stop removes the endpoint file"

    store = open_store(f"chdb://{tmp_path / 'clickhouse'}")
    try:
        counts = {t: int(store.query(f"SELECT count() FROM {t}").rows[0][0])
                  for t in ("gpu_samples", "gpu_processes", "pod_windows", "cluster_capacity")}
        assert counts == {
            "gpu_samples": len(NODES) * SEQS * 8,
            "gpu_processes": len(NODES) * SEQS * 4,
            "pod_windows": len(PODS) * GPUS_PER_POD * MINUTES,
            "cluster_capacity": MINUTES,
        }, f"seed {seed}, journal replays {replays}"
        seqs = store.query("SELECT node, count(), uniqExact(seq, gpu_uuid) FROM gpu_samples GROUP BY node").rows
        assert all(r[1] == r[2] == SEQS * 8 for r in seqs)
        for table in ("gpu_hourly", "gpu_daily"):
            rolled = store.query(f"SELECT node, sum(samples) FROM {table} GROUP BY node ORDER BY node").rows
            assert [(str(r[0]), int(r[1])) for r in rolled] == [(node, SEQS * 8) for node in sorted(NODES)], (
                f"seed {seed}: {table} counts every sample once")
        hours = store.query("SELECT sum(allocated_gpu_hours), sum(busy_gpu_hours) FROM rollup_daily").rows[0]
        expected = len(PODS) * GPUS_PER_POD * MINUTES / 60
        assert hours == [pytest.approx(expected), pytest.approx(expected / 2)], f"seed {seed}"
        for table in ("pod_active_hourly", "pod_active_daily"):
            active = store.query(f"SELECT sum(active_windows), sum(active_gpu_s) FROM {table}").rows[0]
            assert active == [len(PODS) * GPUS_PER_POD * MINUTES, pytest.approx(expected * 3600)], (
                f"seed {seed}: {table}")
        shared = store.query(
            "SELECT sum(windows), sum(requested_gpu_s), sum(usage_gpu_s) FROM shared_gpu_daily").rows[0]
        # each GPU's minute is split among the pods on it: the used GPU-seconds add up to the GPUs' time
        assert shared == [len(PODS) * GPUS_PER_POD * MINUTES, pytest.approx(expected * 3600),
                          pytest.approx(GPUS_PER_POD * MINUTES * 60)], f"seed {seed}"
    finally:
        store.close()


def test_sigterm_stops_the_sink_within_10_s_while_a_long_read_runs(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path,
) -> None:
    env = _env(kafka_settings, topic_prefix, tmp_path)
    env["GPULENS_CLICKHOUSE__QUERY_MAX_EXECUTION_TIME_S"] = "300"
    sink = GpulensChild(env, "sink")
    deadline = time.monotonic() + 60
    while not endpoint_file(tmp_path).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert endpoint_file(tmp_path).exists(), "".join(sink.lines)
    info = orjson.loads(endpoint_file(tmp_path).read_bytes())
    errors: list[Exception] = []

    def long_read() -> None:
        try:
            RemoteReader(int(info["port"]), str(info["token"]), timeout_s=120).query(
                "SELECT count() FROM numbers(1e12)")
        except StoreError as exc:
            errors.append(exc)

    reader = threading.Thread(target=long_read, daemon=True)
    reader.start()
    time.sleep(2.0)
    assert reader.is_alive(), errors
    sent = time.monotonic()
    sink.proc.send_signal(signal.SIGTERM)
    assert sink.wait(30) == 0, "".join(sink.lines[-20:])
    assert time.monotonic() - sent < 10, "".join(sink.lines[-20:])
    reader.join(10)
    assert not reader.is_alive() and len(errors) == 1
