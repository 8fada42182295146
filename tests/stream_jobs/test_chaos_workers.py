"""Several worker processes in one group on the real broker, under chaos: SIGKILLs on a seeded
schedule, a worker added and one removed (two rebalances), the broker stopped for 20 s. The report
must be the in-process one byte for byte, and ``pod.windows`` must count every GPU sample the
simulator produced exactly once (no loss, no double count)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from common.kafka import topic_names
from common.settings import CommonSettings, KafkaSettings, load_settings
from gpulens.cli import main
from gpulens.kafka_local import LocalKafka
from schemas.codec import decode
from schemas.messages import GpuSample
from schemas.outputs import PodWindow
from schemas.topics import GPU_SAMPLES, INTERNAL_CONTROL
from simulation.fleet_state import Tick
from simulation.kafka_replay import CHAOS_READ_AHEAD_BYTES, ChaosPlan, KafkaReplay
from simulation.random_scenario import random_scenario
from simulation.replay import run_in_process
from simulation.scenario import load_scenario, parse_scenario
from simulation.simulator import FleetSimulator
from tests.conftest import REPO_ROOT, SHARED_SCENARIOS

pytestmark = pytest.mark.kafka

FLEET = Path(__file__).parent / "scenarios" / "fleet-2h-64gpu.yaml"


def _json(report: dict[str, object]) -> bytes:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2)


def _samples_produced(ticks: list[Tick]) -> int:
    """GPU samples attributed to a pod, as the simulator wrote them: (sample, GPU, pod) triples."""
    return sum(len(reading.assigned_to) for tick in ticks for record in tick.records
               if record.topic == GPU_SAMPLES.suffix and record.value is not None
               for reading in decode(record.value, GpuSample).gpus)


def _workers_said(replay: KafkaReplay, limit: int = 200) -> str:
    """The workers' warnings and errors (their own lines, not the Kafka clients'), to read a
    failure in the CI log: the workers' log files go with the test's temporary directory."""
    lines = [f"{worker.log_path.name}: {line}" for worker in replay.workers
             for line in worker.log_path.read_text(errors="replace").splitlines()
             if ('"level":"warning"' in line or '"level":"error"' in line) and '"logger":"stream_jobs' in line]
    return "\n".join(lines[-limit:])


def test_three_workers_survive_kills_a_rebalance_and_a_broker_outage(
        kafka_settings: KafkaSettings, local_kafka: LocalKafka, tmp_path: Path) -> None:
    scenario = load_scenario(FLEET)
    ticks = list(FleetSimulator(scenario).run())
    assert scenario.end_offset_s >= 2 * 3600 and sum(node.gpus for node in scenario.nodes) >= 64
    expected = run_in_process(scenario)
    produced = _samples_produced(ticks)
    in_process = sum(m.samples for m in expected.outputs if isinstance(m, PodWindow))
    assert produced == in_process > 20_000
    seed = int(time.time() // 86400)  # rotates daily; printed on failure to rerun it
    chaos = ChaosPlan.seeded(seed, len(ticks), kills=8, workers=3, outage_s=20.0)
    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump(), data_dir=tmp_path)
    # as gpulens replay --chaos runs them: node partitions pause and resume their samples all along
    replay = KafkaReplay(scenario, settings, workers=3, work_dir=tmp_path / "replay",
                         worker_settings={"GPULENS_READ_AHEAD_BYTES": str(CHAOS_READ_AHEAD_BYTES)})
    said: list[str] = []
    report = replay.run(timeout_s=420, chaos=chaos, say=said.append, broker=local_kafka)
    log = "\n".join(said)
    assert _json(report) == _json(expected.report), f"seed {seed}:\n{log}\nworkers:\n{_workers_said(replay)}"
    assert replay.outputs is not None
    counted = sum(m.samples for m in replay.outputs.outputs if isinstance(m, PodWindow))
    assert counted == produced, f"seed {seed}: pod.windows counts {counted} samples, {produced} produced"
    assert sum(": SIGKILL worker" in line for line in said) == 8, log
    assert replay.read_ahead_pauses() > 0, "the read-ahead bound was not exercised"
    assert f"{replay.read_ahead_pauses()} read-ahead pauses" in log
    assert sum("added" in line for line in said) == 1 and sum("removed" in line for line in said) == 1, log
    outage = [float(line.rsplit(" ", 1)[1].rstrip("s")) for line in said if "broker started again after" in line]
    assert len(outage) == 1 and outage[0] >= 20.0, log
    # a replay with a generated prefix that succeeded leaves no topic behind on the cluster
    assert [name for name in topic_names(kafka_settings) if name.startswith(replay.prefix)] == [], log
    assert any(line.startswith("deleted the replay's") for line in said), log
    # the group really split the work: every first-generation worker routed input partitions and
    # only one of them can own the control partition
    inputs = f'"topic":"{replay.prefix}.'
    for worker in replay.workers[:3]:
        lines = worker.log_path.read_text().splitlines()
        routed = {line.split(inputs, 1)[1].split('"', 1)[0] for line in lines
                  if '"partition position"' in line and inputs in line}
        assert routed - {INTERNAL_CONTROL.suffix, "internal.node-inputs.v1", "internal.cluster-inputs.v1"}, \
            f"{worker.log_path.name} routed no input partition"


def test_a_golden_with_three_workers_under_chaos(kafka_settings: KafkaSettings,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """One of the goldens and shared examples, rotating daily (``make chaos`` plays them all),
    through ``gpulens replay --kafka --workers 3 --chaos``: byte for byte the in-process report."""
    paths = sorted([*(REPO_ROOT / "simulation" / "scenarios").glob("*.yaml"), *SHARED_SCENARIOS.glob("*.yaml")])
    day = int(time.time() // 86400)
    path = paths[day % len(paths)]
    expected = run_in_process(load_scenario(path)).report
    code = main(["replay", str(path), "--kafka", kafka_settings.bootstrap_servers, "--workers", "3", "--chaos",
                 "--seed", str(day), "--kills", "4", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.strip().encode() == _json(expected), f"{path.name}, seed {day}:\n{err}"
    assert sum(": SIGKILL worker" in line for line in err.splitlines()) == 4, err


def test_a_random_scenario_with_three_workers_under_chaos(kafka_settings: KafkaSettings,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A random scenario (``simulation.random_scenario``, a seed that rotates daily; ``make chaos``
    plays more) through ``gpulens replay --random SEED --kafka --workers 3 --chaos``: a file nobody
    wrote, byte for byte the in-process report."""
    seed = int(time.time() // 86400)
    expected = run_in_process(parse_scenario(random_scenario(seed))).report
    code = main(["replay", "--random", str(seed), "--kafka", kafka_settings.bootstrap_servers, "--workers", "3",
                 "--chaos", "--seed", str(seed), "--kills", "3", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.strip().encode() == _json(expected), \
        f"random scenario of seed {seed} (python -m simulation.random_scenario {seed}):\n{err}"


def test_outage_needs_the_local_broker(kafka_settings: KafkaSettings) -> None:
    assert main(["replay", str(SHARED_SCENARIOS / "idle-notebook.yaml"), "--kafka", "127.0.0.1:1", "--chaos",
                 "--outage", "20"]) == 2
    assert main(["replay", str(SHARED_SCENARIOS / "idle-notebook.yaml"), "--workers", "3"]) == 2
