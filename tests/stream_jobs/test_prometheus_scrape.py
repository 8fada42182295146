"""A real Prometheus scrapes a real stream worker while a scenario plays paced through Kafka: PromQL
over its HTTP API returns the per-pod utilisation the stages computed (the in-process replay's
windows), an ended pod's series are gone, and ``promtool check metrics`` accepts the exposition
apart from its camelCase warning on dcgm-exporter's own label name ``modelName``.

Prometheus and promtool come from scripts/prometheus-build.sh (built from the Go module proxy once,
then cached; scripts/test.sh builds them before the tests). A failed build fails these tests."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from common.settings import CommonSettings, KafkaSettings, load_settings
from schemas.outputs import PodWindow
from simulation.kafka_replay import CONSUMING_LOG_LINE, KafkaReplay
from simulation.replay import run_in_process
from simulation.scenario import load_scenario
from stream_jobs.fleet_metrics import METRICS
from tests.child_process import free_port
from tests.conftest import REPO_ROOT, SHARED_SCENARIOS

pytestmark = pytest.mark.kafka

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "prometheus" / "gpulens-prometheus.json"
PACE_S = 0.08
"""Wall seconds between two ticks of the scenario (10 s of event time each)."""
LATENESS_S = 30.0


class Prometheus:
    def __init__(self, binary: Path, work: Path, target: str) -> None:
        self.port = free_port()
        config = work / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [{"job_name": "gpulens-worker", "static_configs": [{"targets": [target]}]}],
        }))
        self.log = work / "prometheus.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [str(binary), f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "prometheus not ready within 60 s"
            time.sleep(0.3)

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _by_pod_gpu(result: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    return {(r["metric"]["pod"], r["metric"]["UUID"]): float(r["value"][1]) for r in result}


@pytest.fixture
def prometheus_and_worker(prometheus_dir: Path, kafka_settings: KafkaSettings, topic_prefix: str,
                          tmp_path: Path) -> Iterator[tuple[Prometheus, KafkaReplay, int]]:
    scenario = load_scenario(SHARED_SCENARIOS / "idle-notebook.yaml")
    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump(), data_dir=tmp_path)
    replay = KafkaReplay(scenario, settings, lateness_s=LATENESS_S, topic_prefix=topic_prefix,
                         work_dir=tmp_path / "replay")
    metrics_port = free_port()
    replay.worker.env["GPULENS_METRICS_PORT"] = str(metrics_port)
    prometheus: Prometheus | None = None
    try:
        replay.create_topics()
        replay.worker.start()
        prometheus = Prometheus(prometheus_dir / "prometheus", tmp_path, f"127.0.0.1:{metrics_port}")
        yield prometheus, replay, metrics_port
    finally:
        if prometheus is not None:
            prometheus.stop()
        replay.close()


def _wait(what: str, check: Any, replay: KafkaReplay, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert replay.worker.alive(), replay.worker.tail()
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f} s; worker:\n{replay.worker.tail()}"
        time.sleep(0.5)


def test_prometheus_scrapes_per_pod_utilisation_from_a_paced_replay(
        prometheus_and_worker: tuple[Prometheus, KafkaReplay, int], prometheus_dir: Path) -> None:
    prometheus, replay, metrics_port = prometheus_and_worker
    expected = run_in_process(replay.scenario, lateness_s=LATENESS_S)
    windows = {(w.pod, w.gpu_uuid, w.window_end): w for w in expected.outputs if isinstance(w, PodWindow)}
    ticks = replay.ticks()
    replay.send(ticks[:1])  # the worker logs its partition positions when the first records come
    _wait("the worker consuming", lambda: replay.worker.logged_since_start(CONSUMING_LOG_LINE), replay)

    def shown() -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
        """What Prometheus holds now: utilisation and window end per pod and GPU, from one instant."""
        result = prometheus.query('{__name__=~"DCGM_FI_DEV_GPU_UTIL|gpulens_pod_gpu_window_end_timestamp_seconds"}')
        util = _by_pod_gpu([r for r in result if r["metric"]["__name__"] == "DCGM_FI_DEV_GPU_UTIL"])
        ends = _by_pod_gpu([r for r in result if r["metric"]["__name__"] != "DCGM_FI_DEV_GPU_UTIL"])
        return util, ends

    def shown_when(condition: Any) -> Any:
        util, ends = shown()
        return (util, ends) if condition(ends) else None

    def check_against_in_process(util: dict[tuple[str, str], float], ends: dict[tuple[str, str], float]) -> None:
        assert util, "no DCGM_FI_DEV_GPU_UTIL series"
        for (pod, gpu), value in util.items():
            end = datetime.fromtimestamp(ends[(pod, gpu)], UTC)
            window = windows[(pod, gpu, end)]
            assert window.avg_sm_util_pct is not None
            assert value == pytest.approx(window.avg_sm_util_pct), (pod, gpu, end)

    # paced: ten minutes of event time (notebook-alice idle since 09:05), one tick every PACE_S
    mid = 60
    for tick in ticks[1:mid]:
        replay.send([tick])
        time.sleep(PACE_S)
    alice_end = (replay.scenario.start + timedelta(minutes=8)).timestamp()
    util, ends = _wait("notebook-alice's 09:07-09:08 window scraped", lambda: shown_when(
        lambda ends: any(pod == "notebook-alice" and end >= alice_end for (pod, _gpu), end in ends.items())), replay)
    check_against_in_process(util, ends)
    assert {pod for pod, _gpu in util} == {"train-llm", "notebook-alice"}
    idle = [v for (pod, _gpu), v in util.items() if pod == "notebook-alice"]
    assert len(idle) == 1 and idle[0] < 5.0, "notebook-alice is idle (1 %) since 09:05"
    train = prometheus.query('avg by (pod) (DCGM_FI_DEV_GPU_UTIL{pod="train-llm"})')
    assert [r["metric"]["pod"] for r in train] == ["train-llm"] and float(train[0]["value"][1]) > 80.0

    # the rest, still paced: notebook-alice is deleted at 09:25, train-llm runs on
    for tick in ticks[mid:]:
        replay.send([tick])
        time.sleep(PACE_S)
    last_tick = ticks[-1].ts
    final_end = _window_end_at_or_before(last_tick - timedelta(seconds=LATENESS_S))
    util, ends = _wait("train-llm's last closed window scraped", lambda: shown_when(
        lambda ends: bool(ends) and min(ends.values()) >= final_end.timestamp()), replay)
    check_against_in_process(util, ends)
    assert {pod for pod, _gpu in util} == {"train-llm"}, "the deleted notebook's series must be gone"
    assert len(util) == 4, "train-llm holds 4 GPUs"
    assert prometheus.query('DCGM_FI_DEV_GPU_UTIL{pod="notebook-alice"}') == []
    seen = prometheus.query('count_over_time(DCGM_FI_DEV_GPU_UTIL{pod="notebook-alice"}[10m])')
    assert seen and float(seen[0]["value"][1]) >= 3, "scraped several times while it ran (paced, not a burst)"
    idle_class = prometheus.query("max_over_time(gpulens_pod_gpu_idle[10m])")
    assert [(r["metric"]["pod"], r["metric"]["idle_class"]) for r in idle_class] == \
        [("notebook-alice", "vram_held")]

    # every query of the Prometheus dashboard runs; all but the per-pod pending table (no pod waits
    # past the threshold in this scenario) and the idle table (the notebook is gone) show data
    # the scenario names no cluster: its series carry cluster="default", what the selector offers
    clusters = prometheus.query("count by (cluster) (max_over_time(DCGM_FI_DEV_GPU_UTIL[10m]))")
    assert [r["metric"].get("cluster") for r in clusters] == ["default"]
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$namespace", ".*").replace("$team", ".*").replace("$cluster", "default")
            result = prometheus.query(expr)
            if "pending_since" not in expr and "gpulens_pod_gpu_idle{" not in expr:
                assert result, f"dashboard panel {panel['title']!r}: {expr} returned nothing"

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        exposition = answer.read()
    def promtool_check_metrics(text: bytes) -> tuple[int, list[str]]:
        lint = subprocess.run([str(prometheus_dir / "promtool"), "check", "metrics"], input=text,
                              capture_output=True, timeout=60, check=False)
        return lint.returncode, [line for line in (lint.stdout + lint.stderr).decode().splitlines() if line.strip()]

    # promtool names the family, not the label: the warnings are the camelCase one on the families
    # with dcgm-exporter's labels, and with modelName/Hostname renamed nothing is left
    _code, problems = promtool_check_metrics(exposition)
    camel = "label names should be written in 'snake_case' not 'camelCase'"
    assert problems and all(line.endswith(camel) for line in problems), problems
    assert {line.split()[0] for line in problems} == {
        m.name for m in METRICS if "modelName" in m.labels and f"\n{m.name}{{".encode() in exposition}
    renamed = exposition.replace(b"modelName=", b"model_name=").replace(b"Hostname=", b"hostname=")
    assert promtool_check_metrics(renamed) == (0, [])


def _window_end_at_or_before(ts: datetime, width_s: float = 60.0) -> datetime:
    epoch = ts.timestamp()
    return datetime.fromtimestamp(epoch - epoch % width_s, UTC)
