"""The whole worker process, as ``gpulens worker`` starts it: its topics, its metrics, its faust app.

A worker creates the topics it reads and writes if they are missing (idempotent), with the
node-inputs partition count, and its tables' changelogs, replicated as ``GPULENS_TOPICS__*`` say
(3 replicas and ``min.insync.replicas`` 2 on a cluster of 3 brokers or more); a broker that does not answer yet (a
broker restart, a worker started first) is waited for by :class:`common.backoff.Backoff` for up to
``broker_wait_s``, then the worker gives up naming the broker. Partition counts that differ from
its own end it with a config error naming the setting: the node stage reads partition p of the
samples and of node-inputs together. It serves ``/metrics`` (its own figures and the fleet's
series, :class:`~stream_jobs.fleet_metrics.FleetSeries`) and runs the stream jobs until stopped.
"""

from __future__ import annotations

from common.kafka import (
    TOPIC_CALL_TIMEOUT_S,
    BrokerUnavailable,
    TopicReport,
    broker_unavailable,
    ensure_topics,
    wait_for_broker,
)
from common.logs import get_logger
from common.settings import ConfigError, WorkerSettings
from schemas.topics import GPU_SAMPLES, node_stage_topics
from stream_jobs.faust_app import app_id, changelog_topics, run_stream_jobs
from stream_jobs.fleet_metrics import FleetSeries
from stream_jobs.offset_guard import WorkerMetrics

__all__ = ["create_topics", "run_worker"]

log = get_logger(__name__)


def create_topics(settings: WorkerSettings) -> TopicReport:
    """Create the worker's topics and changelogs if missing, waiting for the broker with backoff
    for up to ``settings.broker_wait_s``; raises the user error for an absent broker after that."""
    def attempt() -> TopicReport:
        report = ensure_topics(settings.kafka, node_stage_topics(settings.node_input_partitions),
                               settings.topic_prefix, settings.topics, timeout_s=TOPIC_CALL_TIMEOUT_S)
        ensure_topics(settings.kafka, changelog_topics(settings), app_id(settings), settings.topics,
                      timeout_s=TOPIC_CALL_TIMEOUT_S)
        return report

    try:
        return wait_for_broker(attempt, settings.broker_wait_s, "worker")
    except BrokerUnavailable as exc:
        raise broker_unavailable(exc) from None


def run_worker(settings: WorkerSettings) -> None:
    """Run the worker for ``settings`` until SIGTERM/SIGINT (blocks; exits the process)."""
    report = create_topics(settings)
    if report.mismatched:  # the node stage reads samples and node-inputs partition by partition
        raise ConfigError(f"GPULENS_NODE_INPUT_PARTITIONS ({settings.node_input_partitions}) must be the partition "
                          f"count of {GPU_SAMPLES.name(settings.topic_prefix)}, and the internal topics must have "
                          f"it too: {'; '.join(report.mismatched)}")
    # the topics faust creates itself (its leader topic) get the replication the others got
    settings = settings.model_copy(update={"topics": settings.topics.model_copy(
        update={"replication_factor": report.replication_factor})})
    metrics = WorkerMetrics()
    fleet = FleetSeries(metrics.registry, settings.fleet_metrics_max_series)
    if settings.metrics_port:
        port = metrics.registry.serve(settings.metrics_port, settings.metrics_addr)
        log.info("metrics served", port=port)
    run_stream_jobs(settings, metrics, fleet)
