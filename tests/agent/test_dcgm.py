"""The dcgm-exporter source: exposition text in dcgm-exporter's real format (its default counters
plus the profiling ones, the labels it adds with Kubernetes mapping on, MIG instances with
GPU_I_ID / GPU_I_PROFILE; tests/agent/data/dcgm-exporter-gpu-node-7.txt) becomes gpu.samples.v1;
a bad or absent exporter is a clear error the agent retries with backoff while it keeps running."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from common.metrics import MetricsRegistry
from producers.agent.dcgm import DcgmExporterSource, DcgmExporterUnavailable, readings_from_exposition
from producers.agent.service import AgentMetrics, AgentService, AgentStdoutSink
from schemas.codec import decode, encode
from schemas.messages import GpuReading, GpuSample
from stream_jobs.attribution import attribute
from tests.conftest import REPO_ROOT

FIXTURE = (Path(__file__).parent / "data" / "dcgm-exporter-gpu-node-7.txt").read_text()
MIB = 2**20
TS = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
MIG_PARENT = "GPU-e1a7f3c9-2b5d-4e8f-9c1a-6d4b8e2f7a64"


def _by_uuid(gpus: list[GpuReading]) -> dict[str, GpuReading]:
    return {g.uuid: g for g in gpus}


def test_full_gpus_map_dcgm_fields_units_and_pods() -> None:
    found = readings_from_exposition(FIXTURE)
    assert found.errors == [] and found.driver_version == "570.133.20"
    gpus = _by_uuid(found.gpus)
    train = gpus["GPU-3f1c2a4e-8b7d-4c61-9e0a-5d2b7c9e1f30"]
    assert (train.index, train.model) == (0, "NVIDIA H100 80GB HBM3")
    assert train.gpu_util_pct == 97 and train.mem_util_pct == 41
    assert train.mem_used_bytes == 61440 * MIB and train.mem_total_bytes == (61440 + 19582 + 537) * MIB
    assert train.power_w == pytest.approx(612.345) and train.temperature_c == 62
    assert (train.sm_clock_mhz, train.mem_clock_mhz) == (1980, 2619)
    assert train.sm_active_pct == pytest.approx(91.2345) and train.tensor_active_pct == pytest.approx(45.6789)
    assert train.sm_occupancy_pct == pytest.approx(50.3318) and train.dram_active_pct == pytest.approx(38.7442)
    assert train.pcie_rx_bytes_per_s == 734003200
    assert train.clock_event_reasons == ["sw_power_cap"]
    assert (train.ecc_sbe_volatile_total, train.ecc_dbe_volatile_total) == (0, 0)
    assert [(p.namespace, p.pod, p.container, p.pod_uid) for p in train.assigned_to] == [
        ("ml", "train-0", "trainer", "6b1d9f2e-0c4a-4e8b-9a51-2f7c3d8e4a10")]
    assert not train.shared and train.processes == [], "dcgm-exporter lists no processes: none made up"

    sliced = gpus["GPU-7a9e4b21-1d3f-4f8a-b2c6-8e0d5a3f9c42"]
    assert sliced.shared and [p.pod for p in sliced.assigned_to] == ["nb-alice", "nb-bob"]
    assert sliced.clock_event_reasons == ["gpu_idle"]

    idle = gpus["GPU-b5d2c8e1-6f4a-4a9c-8d3b-1e7f2a5c6d53"]
    assert idle.assigned_to == [] and idle.gpu_util_pct == 0 and idle.mem_used_bytes == 0
    assert (idle.ecc_sbe_volatile_total, idle.ecc_dbe_volatile_total) == (17, 2)
    assert idle.clock_event_reasons == ["hw_slowdown", "hw_thermal_slowdown"]


def test_mig_gpu_is_a_physical_reading_then_one_per_gpu_instance() -> None:
    gpus = readings_from_exposition(FIXTURE).gpus
    assert [g.uuid for g in gpus if g.index == 3] == [MIG_PARENT, f"MIG-{MIG_PARENT}/1", f"MIG-{MIG_PARENT}/7"]
    parent, big, small = (g for g in gpus if g.index == 3)
    assert parent.mig_parent_uuid is None and parent.assigned_to == [] and parent.mem_used_bytes is None
    assert parent.power_w == pytest.approx(187.56) and parent.temperature_c == 45
    assert (big.mig_parent_uuid, big.mig_profile, big.gpu_instance_id) == (MIG_PARENT, "3g.40gb", 1)
    assert big.mem_used_bytes == 28160 * MIB and big.mem_total_bytes == (28160 + 12133 + 215) * MIB
    assert big.gr_engine_active_pct == pytest.approx(74.2113) and big.gpu_util_pct is None
    assert big.power_w is None, "a physical field belongs to the parent, not to each instance"
    assert [(p.namespace, p.pod) for p in big.assigned_to] == [("serving", "infer-0")]
    assert (small.mig_profile, small.gpu_instance_id) == ("1g.10gb", 7)
    assert [(p.pod, p.pod_uid) for p in small.assigned_to] == [("nb-carol", None)]


def test_samples_round_trip_the_schema_and_attribute_pods_in_the_stream_jobs() -> None:
    source = DcgmExporterSource("gpu-node-7", "http://x/metrics", "boot", 10.0, fetch=lambda url, t: FIXTURE)
    sample = source.sample(TS)
    assert decode(encode(sample), GpuSample) == sample and sample.seq == 0 and source.sample(TS).seq == 1
    schema = json.loads((REPO_ROOT / "schemas" / "json" / "gpu.samples.v1.schema.json").read_text())
    jsonschema.validate(json.loads(encode(sample)), schema, format_checker=jsonschema.FormatChecker())
    big = _by_uuid(sample.gpus)[f"MIG-{MIG_PARENT}/1"]
    [share] = attribute(big, {("serving", "infer-0"): "uid-infer-0"})
    assert share.pod_uid == "f1a2b3c4-d5e6-4f70-8192-a3b4c5d6e7f8"
    small = _by_uuid(sample.gpus)[f"MIG-{MIG_PARENT}/7"]
    [share] = attribute(small, {("research", "nb-carol"): "uid-carol"})
    assert share.pod_uid == "uid-carol", "no pod_uid label: joined by namespace/name"


def test_a_new_last_xid_becomes_one_xid_event() -> None:
    last: dict[str, int] = {}
    first = readings_from_exposition(FIXTURE, last, TS)
    assert all(g.xids == [] for g in first.gpus), "the value at start may be old: a baseline, not an event"
    text = "\n".join(line.replace('err_code="0",err_msg="No Error"} 0', 'err_code="79",err_msg="fallen off"} 79')
                     if line.startswith("DCGM_FI_DEV_XID_ERRORS{gpu=\"0\"") else line for line in FIXTURE.splitlines())
    second = _by_uuid(readings_from_exposition(text, last, TS).gpus)["GPU-3f1c2a4e-8b7d-4c61-9e0a-5d2b7c9e1f30"]
    assert [(x.xid, x.critical, x.at) for x in second.xids] == [(79, True, TS)]
    assert second.health == "degraded" and "xid 79" in (second.health_reason or "")
    third = _by_uuid(readings_from_exposition(text, last, TS).gpus)["GPU-3f1c2a4e-8b7d-4c61-9e0a-5d2b7c9e1f30"]
    assert third.xids == [] and third.health == "ok"


@pytest.mark.parametrize(("text", "kind"), [
    ("<html><body>502 Bad Gateway</body></html>", "exporter_bad_text"),
    ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1" 5', "exporter_bad_text"),
    ("", "exporter_no_gpus"),
    ("# HELP go_goroutines x\ngo_goroutines 12\n", "exporter_no_gpus"),
])
def test_text_that_is_not_usable_is_a_clear_error(text: str, kind: str) -> None:
    with pytest.raises(DcgmExporterUnavailable) as caught:
        readings_from_exposition(text)
    assert caught.value.kind == kind and "dcgm-exporter" in str(caught.value)


def test_a_series_without_its_gpu_labels_is_skipped_and_reported() -> None:
    text = FIXTURE + 'DCGM_FI_DEV_GPU_UTIL{gpu="9",modelName="x"} 50\n'
    found = readings_from_exposition(text)
    assert len(found.gpus) == 6 and found.errors == [
        "dcgm-exporter series DCGM_FI_DEV_GPU_UTIL without a usable gpu/UUID/GPU_I_ID label skipped"]


class Exporter:
    """dcgm-exporter's /metrics served by a local HTTP server whose body the test changes."""

    def __init__(self, port: int = 0) -> None:
        self.body = FIXTURE.encode()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(exporter.body)))
                self.end_headers()
                self.wfile.write(exporter.body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    yield e
    e.close()


def _metric(metrics: AgentMetrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.registry.get_sample_value(f"gpulens_{name}", labels)


def test_exporter_down_then_up_and_bad_text_mid_run_are_retried_and_the_agent_keeps_running() -> None:
    probe = Exporter()
    port = probe.port
    probe.close()  # nothing listens there now
    now = [1000.0]
    out = io.BytesIO()
    metrics = AgentMetrics(MetricsRegistry())
    source = DcgmExporterSource("gpu-node-7", f"http://127.0.0.1:{port}/metrics", "boot", 10.0, timeout_s=2)
    service = AgentService(source, AgentStdoutSink(out), metrics, backoff_max_s=8, clock=lambda: now[0])
    up = {"source": "dcgm-exporter"}
    assert service.step() is None and _metric(metrics, "agent_source_up", up) == 0
    assert _metric(metrics, "agent_source_failures_total", up | {"kind": "exporter_unreachable"}) == 1
    now[0] += 0.5
    assert service.step() is None, "backoff: not retried before 1 s"
    assert _metric(metrics, "agent_source_failures_total", up | {"kind": "exporter_unreachable"}) == 1
    now[0] += 0.6
    assert service.step() is None
    assert _metric(metrics, "agent_source_failures_total", up | {"kind": "exporter_unreachable"}) == 2
    exporter = Exporter(port)
    try:
        now[0] += 2.0
        sample = service.step()
        assert sample is not None and len(sample.gpus) == 6 and _metric(metrics, "agent_source_up", up) == 1
        exporter.body = b"<html>oops</html>"
        now[0] += 10
        assert service.step() is None and _metric(metrics, "agent_source_up", up) == 0
        assert _metric(metrics, "agent_source_failures_total", up | {"kind": "exporter_bad_text"}) == 1
        exporter.body = FIXTURE.encode()
        now[0] += 10
        again = service.step()
        assert again is not None and again.seq == sample.seq + 1, "seq continues: a gap would read as a lost sample"
    finally:
        exporter.close()
    lines = out.getvalue().splitlines()
    assert [decode(line, GpuSample).seq for line in lines] == [0, 1]


def test_cli_once_reads_the_exporter_and_rejects_bad_combinations(exporter: Exporter) -> None:
    env_cmd = [sys.executable, "-m", "gpulens", "agent", "--node-name", "gpu-node-7", "--once", "--stdout"]
    run = subprocess.run([*env_cmd, "--source", "dcgm-exporter", "--dcgm-url",
                          f"http://127.0.0.1:{exporter.port}/metrics"], cwd=REPO_ROOT, capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr
    sample = decode(run.stdout.strip(), GpuSample)
    assert sample.node == "gpu-node-7" and len(sample.gpus) == 6
    bad = subprocess.run([*env_cmd, "--source", "dcgm-exporter", "--simulate"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cannot be combined with --source dcgm-exporter" in bad.stderr
    url = subprocess.run([*env_cmd, "--source", "dcgm-exporter", "--dcgm-url", "localhost:9400"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert url.returncode == 2 and "GPULENS_DCGM_URL" in url.stderr and len(url.stderr.strip().splitlines()) == 1
    lean = subprocess.run([sys.executable, "-m", "producers.agent", "--node-name", "n", "--once", "--stdout",
                           "--source", "dcgm-exporter", "--dcgm-url", f"http://127.0.0.1:{exporter.port}/metrics"],
                          cwd=REPO_ROOT, capture_output=True, timeout=60)
    assert lean.returncode == 0 and len(decode(lean.stdout.strip(), GpuSample).gpus) == 6
