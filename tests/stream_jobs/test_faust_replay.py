"""The faust runtime on the real broker: scenarios replayed through topics and a ``gpulens worker``
child process give the in-process report byte for byte — also when the worker is SIGKILLed in
the middle and restarted — and poison on every input topic is dead-lettered while the stream goes
on."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from common.errors import UserError
from common.kafka import read_to_end
from common.settings import CommonSettings, KafkaSettings, load_settings
from gpulens.cli import main
from schemas.codec import decode, encode
from schemas.messages import GpuSample
from schemas.outputs import Alert, DeadLetter
from schemas.topics import (
    ALERTS,
    DEADLETTER,
    GPU_SAMPLES,
    K8S_WORKLOADS,
    POD_WINDOWS,
    WORKLOAD_ALLOCATOR,
    key_partition,
)
from simulation.fleet_state import SimulatedRecord
from simulation.kafka_replay import KafkaReplay
from simulation.replay import compare_report, run_in_process
from simulation.scenario import PoisonSpec, load_scenario
from simulation.simulator import FleetSimulator
from stream_jobs.offsets import EXIT_STALLED
from stream_jobs.pipeline import INPUT_TOPICS
from tests.conftest import REPO_ROOT, SHARED_SCENARIOS

pytestmark = pytest.mark.kafka


def _settings(kafka: KafkaSettings, tmp_path: Path) -> CommonSettings:
    return load_settings(CommonSettings, kafka=kafka.model_dump(), data_dir=tmp_path)


def _json(report: dict[str, object]) -> bytes:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2)


@pytest.mark.parametrize("name", ["idle-notebook", "fragmentation-basic"])
def test_shared_example_through_kafka_matches_in_process(name: str, kafka_settings: KafkaSettings,
                                                         topic_prefix: str, tmp_path: Path) -> None:
    scenario = load_scenario(SHARED_SCENARIOS / f"{name}.yaml")
    expected = run_in_process(scenario).report
    report = KafkaReplay(scenario, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix).run(timeout_s=180)
    assert _json(report) == _json(expected)
    assert report["alerts"], "the example has alerts: an empty report would match nothing"


@pytest.mark.parametrize("name", ["mig-fragmentation", "vram-fragmentation", "noisy-neighbour"])
def test_fragmentation_goldens_through_kafka_match_in_process(name: str, kafka_settings: KafkaSettings,
                                                              topic_prefix: str, tmp_path: Path) -> None:
    """MIG layouts and shared-GPU tenants travel in the node summaries on the internal topic, and the
    cluster stage's MIG and VRAM state survives the faust runtime: same report, same new alerts."""
    scenario = load_scenario(REPO_ROOT / "simulation" / "scenarios" / f"{name}.yaml")
    expected = run_in_process(scenario).report
    report = KafkaReplay(scenario, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix).run(timeout_s=180)
    assert _json(report) == _json(expected)
    assert {"mig_fragmentation", "vram_fragmentation", "noisy_neighbour"} & {a["type"] for a in report["alerts"]}


def test_queued_workloads_through_kafka_match_in_process(kafka_settings: KafkaSettings, topic_prefix: str,
                                                         tmp_path: Path) -> None:
    """Kueue workload states travel on their own compacted topic through the faust workers."""
    scenario = load_scenario(REPO_ROOT / "simulation" / "scenarios" / "queued-workloads.yaml")
    expected = run_in_process(scenario).report
    report = KafkaReplay(scenario, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix).run(timeout_s=180)
    assert _json(report) == _json(expected)
    assert {a["subject"]["kind"] for a in report["alerts"]} == {"workload"}
    assert report["cluster"]["max_queued_gpu_demand"] == 6


def test_allocator_statistics_through_kafka_match_in_process(kafka_settings: KafkaSettings, topic_prefix: str,
                                                            tmp_path: Path) -> None:
    """Allocator reports travel on workload.allocator.v1 to the node stage of the faust workers."""
    path = REPO_ROOT / "simulation" / "scenarios" / "allocator-fragmentation.yaml"
    scenario = load_scenario(path)
    expected = run_in_process(scenario).report
    report = KafkaReplay(scenario, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix).run(timeout_s=180)
    assert _json(report) == _json(expected)
    assert [(a["type"], a["state"]) for a in report["alerts"]] == [
        ("allocator_fragmentation", "firing"), ("allocator_fragmentation", "resolved")]
    assert compare_report(report, orjson.loads(path.with_name("allocator-fragmentation.expected.json").read_bytes()),
                          scenario.sample_interval_s) == []


def _kill_mid_scenario(replay: KafkaReplay, kafka_settings: KafkaSettings, windows_total: int) -> None:
    """Start the worker, send the whole scenario and SIGKILL the worker a third of the way through."""
    replay.create_topics()
    replay.worker.start()
    replay.send(replay.ticks())  # a burst: the worker is busy when it dies
    windows = POD_WINDOWS.name(replay.prefix)
    deadline = time.monotonic() + 120
    while len(read_to_end(kafka_settings, windows)) < windows_total // 3:
        assert time.monotonic() < deadline, replay.worker.tail()
        assert replay.worker.alive(), replay.worker.tail()
        time.sleep(0.2)
    replay.worker.kill()  # SIGKILL: no commit, no flush
    written_before = len(read_to_end(kafka_settings, windows))
    assert written_before < windows_total, "the worker had finished before it was killed"
    replay.finish()


def test_worker_killed_mid_scenario_resumes_exactly(kafka_settings: KafkaSettings, topic_prefix: str,
                                                    tmp_path: Path) -> None:
    scenario = load_scenario(SHARED_SCENARIOS / "idle-notebook.yaml")
    expected = run_in_process(scenario)
    windows_total = expected.report["stream"]["pod_windows"]
    replay = KafkaReplay(scenario, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix,
                         work_dir=tmp_path / "replay")
    # state records of at most 4 KB: every checkpoint is split, and the restart restores chunks
    replay.worker.env["GPULENS_STATE_RECORD_MAX_BYTES"] = "4096"
    try:
        _kill_mid_scenario(replay, kafka_settings, windows_total)
        replay.worker.start()
        done = replay.wait_done(timeout_s=180)
        outputs = replay.read_outputs(done)
        report = replay.report(outputs)
    finally:
        replay.close()
    assert replay.worker.starts == 2
    assert _json(report) == _json(expected.report)
    changelog = read_to_end(kafka_settings, f"{topic_prefix}-stream-jobs-node-stages-changelog")
    assert max(len(r.value or b"") for r in changelog) <= 4096
    assert any(r.key and b"#" in r.key for r in changelog), "the states were split into chunks"
    # every alert transition is on the topic; read deduplicated by (id, state) the set is exactly the
    # in-process one (a transition may appear twice: at-least-once, the sink keeps one row per id)
    on_topic = [decode(r.value, Alert) for r in outputs.alert_records]
    transitions = {(a.id, a.state) for a in on_topic}
    wanted = {(a.id, a.state) for a in expected.outputs if isinstance(a, Alert)}
    assert transitions == wanted and wanted
    for record in outputs.alert_records:
        assert record.key == decode(record.value, Alert).id.encode()


_WITHHELD_CHANGELOG = textwrap.dedent("""
    import sys
    from faust.transport.consumer import Consumer
    from gpulens.cli import main

    resume = Consumer.resume_partitions

    def resume_all_but_the_node_changelog(self, tps):
        return resume(self, [tp for tp in tps if not tp.topic.endswith("-node-stages-changelog")])

    Consumer.resume_partitions = resume_all_but_the_node_changelog  # the restore never gets them
    main(["worker", "--stage", "all"])
""")


def test_a_restore_that_gets_no_changelog_record_ends_the_worker_and_a_restart_resumes_exactly(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> None:
    """A worker whose restore of the stage tables reads nothing (a CI chaos run saw one wait five
    minutes for a changelog partition faust never fetched) exits 70, saying what it waited for;
    restarted, it restores and the run ends as the in-process one."""
    scenario = load_scenario(SHARED_SCENARIOS / "idle-notebook.yaml")
    expected = run_in_process(scenario)
    replay = KafkaReplay(scenario, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix,
                         work_dir=tmp_path / "replay")
    try:
        _kill_mid_scenario(replay, kafka_settings, expected.report["stream"]["pod_windows"])
        log = tmp_path / "withheld.log"
        with open(log, "wb") as out:
            stalled = subprocess.run([sys.executable, "-c", _WITHHELD_CHANGELOG], stdout=out, stderr=subprocess.STDOUT,
                                     env=replay.worker.env | {"GPULENS_STALL_GIVE_UP_S": "3"}, timeout=120,
                                     check=False)
        said = log.read_text()
        assert stalled.returncode == EXIT_STALLED, said[-3000:]
        give_up = next(line for line in said.splitlines() if "restore read nothing; giving up" in line)
        assert "-node-stages-changelog:" in give_up and '"fetching":false' in give_up, give_up
        replay.worker.start()
        done = replay.wait_done(timeout_s=180)
        report = replay.report(replay.read_outputs(done))
    finally:
        replay.close()
    assert _json(report) == _json(expected.report)


def test_poison_on_every_input_topic_is_dead_lettered_and_the_stream_goes_on(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> None:
    golden = load_scenario(REPO_ROOT / "simulation" / "scenarios" / "late-and-poison.yaml")
    # the golden file poisons the five topics it predates; the Kueue workloads and the allocator
    # statistics topics are added here
    scenario = replace(golden, poison=(*golden.poison, PoisonSpec(90.0, K8S_WORKLOADS.suffix, "{\"uid\": 1}"),
                                       PoisonSpec(100.0, WORKLOAD_ALLOCATOR.suffix, "{\"devices\": []}")))
    assert {p.topic for p in scenario.poison} == {spec.suffix for spec in INPUT_TOPICS}
    expected = run_in_process(scenario)
    replay = KafkaReplay(scenario, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix)
    report = replay.run(timeout_s=180)
    assert _json(report) == _json(expected.report)
    assert report["stream"]["deadletters"] == 7 and report["stream"]["late_samples_dropped"] == 1
    assert any(a["type"] == "idle_gpu" for a in report["alerts"]), "alerts after the poison still fire"
    letters = read_to_end(kafka_settings, DEADLETTER.name(topic_prefix))
    sources = set()
    for record in letters:
        headers = record.headers
        letter = decode(record.value, DeadLetter)
        assert headers["error"].decode() == letter.error and letter.error
        assert headers["content-type"] == b"application/json" and headers["gpulens-schema-version"] == b"2"
        assert headers["source_topic"].decode() == letter.source_topic
        assert int(headers["source_partition"]) == letter.source_partition
        assert letter.source_offset is not None and int(headers["source_offset"]) == letter.source_offset >= 0
        sources.add(letter.source_topic)
    assert sources == {spec.name(topic_prefix) for spec in INPUT_TOPICS}
    alerts = read_to_end(kafka_settings, ALERTS.name(topic_prefix))
    assert {decode(r.value, Alert).id for r in alerts} == {a["id"] for a in report["alerts"]}
    # the workers' outputs carry the wire headers like every other gpulens message
    assert all(r.headers.get("content-type") == b"application/json" and r.headers.get("gpulens-schema-version")
               == b"2" for r in alerts)


def test_hostile_state_keeps_the_worker_running_and_dead_letters_dated_records(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path) -> None:
    """Every pod carries 10 KB label values (once enough to push the cluster stage's state record
    past the broker's 1 MB limit and crash-loop the worker); a few records are dated 1970 and
    2100 (once held in a reorder buffer for ever / dropped silently later)."""
    blob = "x" * 10_240
    pods = "\n".join(
        f"  - {{name: job-{i}, namespace: ml, gpus: 1, create: {i % 5}m, run_for: {6 + i % 7}m, util: 70, "
        f"labels: {{team: t{i % 3}, a: {blob}, b: {blob}}}}}" for i in range(40))
    path = tmp_path / "hostile.yaml"
    path.write_text(f"""name: hostile
start: "2026-01-05T09:00:00Z"
duration: 20m
nodes:
  - {{name: n1, gpus: 8, model: "NVIDIA H100 80GB HBM3"}}
  - {{name: n2, gpus: 8, model: "NVIDIA H100 80GB HBM3"}}
pods:
{pods}
""")
    scenario = load_scenario(path)
    ticks = list(FleetSimulator(scenario).run())
    for index, when in ((20, "1970-01-01T00:00:00Z"), (40, "2100-01-01T00:00:00Z"), (60, "1970-01-02T00:00:00Z")):
        tick = ticks[index]
        for suffix in ("k8s.pods.v1", "gpu.samples.v1"):
            original = next(r for t in [tick, *ticks] for r in t.records if r.topic == suffix and r.value is not None)
            assert original.value is not None
            dated = orjson.loads(original.value) | {"ts": when}
            tick.records.append(SimulatedRecord(suffix, original.key, orjson.dumps(dated)))
    expected = run_in_process(scenario, ticks=ticks)
    assert expected.report["stream"]["deadletters"] == 6
    replay = KafkaReplay(scenario, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix,
                         work_dir=tmp_path / "replay")
    try:
        replay.create_topics()
        replay.worker.start()
        replay.send(ticks)
        replay.finish()
        done = replay.wait_done(timeout_s=240)
        outputs = replay.read_outputs(done)
        report = replay.report(outputs)
        assert replay.worker.alive() and replay.worker.starts == 1, replay.worker.tail()
    finally:
        replay.close()
    assert report["stream"] == expected.report["stream"], [
        (r.headers, decode(r.value, DeadLetter).error[:90]) for r in outputs.deadletters]
    assert _json(report) == _json(expected.report)
    reasons = sorted(decode(r.value, DeadLetter).error for r in outputs.deadletters)
    assert len(reasons) == 6
    assert sum("behind the stream's clock" in r and "(horizon_s)" in r for r in reasons) == 4
    assert sum("ahead of the stream's clock" in r and "2100-01-01" in r for r in reasons) == 2


def test_chaos_replay_kills_the_worker_on_a_seeded_schedule_and_matches_in_process(
        kafka_settings: KafkaSettings, capsys: pytest.CaptureFixture[str]) -> None:
    """``gpulens replay --kafka --chaos``: SIGKILLs at seeded points (the seed rotates by day, so
    CI covers other schedules over time, and is printed to rerun one); the report is the
    in-process one byte for byte, so no sample was lost or counted twice in pod.windows."""
    seed = int(time.time() // 86400)
    path = SHARED_SCENARIOS / "idle-notebook.yaml"
    expected = run_in_process(load_scenario(path)).report
    code = main(["replay", str(path), "--kafka", kafka_settings.bootstrap_servers, "--chaos", "--seed", str(seed),
                 "--kills", "5", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    kills = [line for line in err.splitlines() if ": SIGKILL worker" in line]
    assert len(kills) == 5, err
    assert f"chaos: seed {seed}, 5 SIGKILLs" in err
    assert orjson.loads(out) == expected, f"seed {seed}"
    assert out.strip().encode() == _json(expected), f"seed {seed}"


def test_chaos_needs_kafka() -> None:
    assert main(["replay", str(SHARED_SCENARIOS / "idle-notebook.yaml"), "--chaos"]) == 2


def test_a_failed_replay_keeps_every_workers_log_and_says_where(kafka_settings: KafkaSettings,
                                                                 topic_prefix: str) -> None:
    """A replay through Kafka whose worker fails keeps its work directory, with every worker's log
    (what tells why), and its error names it."""
    scenario = load_scenario(SHARED_SCENARIOS / "idle-notebook.yaml")
    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump())
    replay = KafkaReplay(scenario, settings, topic_prefix=topic_prefix)  # its own temporary directory
    replay.worker.env["GPULENS_LATENESS_S"] = "-1"  # refused at start-up: the worker exits 2
    try:
        with pytest.raises(UserError) as failed:
            replay.run(timeout_s=60)
        message = str(failed.value)
        assert "the stream worker stopped" in message
        assert f"the logs of every worker are kept in {replay.work_dir}" in message
        assert "GPULENS_LATENESS_S" in replay.worker.log_path.read_text(), "the log says which setting is wrong"
    finally:
        shutil.rmtree(replay.work_dir, ignore_errors=True)


def test_a_valid_sample_keyed_otherwise_replays_as_in_process(kafka_settings: KafkaSettings, topic_prefix: str,
                                                              tmp_path: Path) -> None:
    """The node stage reads the samples partition its node's state is on. A scenario's poison that
    is a valid sample keyed by the bare node name (in a cluster whose agents key by ``<cluster>/<node>``)
    would hash elsewhere: the driver puts it on its node's partition, as the agent would have, so
    it is applied as in-process (a sample on another partition is dead-lettered, see
    test_direct_samples)."""
    base = load_scenario(REPO_ROOT / "simulation" / "scenarios" / "idle-node.yaml")
    partitions = KafkaReplay(base, _settings(kafka_settings, tmp_path)).node_partitions
    node = base.nodes[0].name
    cluster = next(name for name in ("eu-west", "us-east", "ap-south", "lab")
                   if key_partition(node.encode(), partitions) != key_partition(f"{name}/{node}".encode(), partitions))
    scenario = replace(base, cluster=cluster)
    ticks = list(FleetSimulator(scenario).run())
    tick, record = next((tick, record) for tick in ticks[3:] for record in tick.records
                        if record.topic == GPU_SAMPLES.suffix and record.key == f"{cluster}/{node}")
    sample = decode(record.value, GpuSample)
    extra = sample.model_copy(update={"gpus": [gpu.model_copy(update={"gpu_util_pct": 1.0}) for gpu in sample.gpus]})
    scenario = replace(scenario, poison=(PoisonSpec(tick.offset_s, GPU_SAMPLES.suffix, encode(extra).decode(),
                                                    key=sample.node),))
    expected = run_in_process(scenario).report
    assert expected != run_in_process(replace(scenario, poison=())).report, "the idle sample counts in-process"
    report = KafkaReplay(scenario, _settings(kafka_settings, tmp_path), topic_prefix=topic_prefix).run(timeout_s=180)
    assert _json(report) == _json(expected)
    assert report["stream"]["deadletters"] == 0
