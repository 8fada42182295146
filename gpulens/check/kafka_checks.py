"""The Kafka checks: brokers, topics, consumer groups, dead letters.

Through the clients :mod:`common.kafka` (the confluent-kafka adapter) provides."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from common import kafka as ck
from common.settings import TopicSettings
from gpulens.check.core import Context, Result, State
from schemas.outputs import DeadLetterReason
from schemas.topics import ALL_TOPICS, DEADLETTER, INTERNAL_TOPICS

_REACH_FIX = ("check GPULENS_KAFKA__BOOTSTRAP_SERVERS and the security settings (GPULENS_KAFKA__SECURITY_PROTOCOL, "
              "__SASL_*, __SSL_*: `gpulens config show`); locally, `gpulens kafka up`")

DEADLETTER_FIXES: dict[str, str] = {
    DeadLetterReason.TOO_OLD: ("records older than the store's TTL or the stream's horizon: raise "
                               "GPULENS_RAW_SAMPLE_TTL_DAYS / GPULENS_STATE_TTL_DAYS (the sink) or GPULENS_HORIZON_S "
                               "(the workers), or check the nodes' clocks (NTP)"),
    DeadLetterReason.TOO_FAR_AHEAD: ("clock skew: sync the nodes' clocks (NTP), or raise GPULENS_MAX_FUTURE_SKEW_S "
                                     "(the sink) / GPULENS_MAX_SKEW_S (the workers)"),
    DeadLetterReason.UNKNOWN_CLUSTER: ("a cluster outside the workers' allow-list: add it to "
                                       "GPULENS_ACCEPT_CLUSTERS, or fix GPULENS_CLUSTER of that cluster's agents "
                                       "and watcher"),
    DeadLetterReason.INVALID: ("a producer of another version or a compromised writer: compare the agents' and "
                               "watcher's versions with the workers' (docs/schemas.md); the letters' "
                               "source_topic and payload say which"),
    DeadLetterReason.TOO_LARGE: "a producer of another version or a compromised writer (see `invalid`)",
    DeadLetterReason.OUT_OF_RANGE: "a producer of another version or a compromised writer (see `invalid`)",
    DeadLetterReason.INCONSISTENT: "a producer of another version or a compromised writer (see `invalid`)",
    DeadLetterReason.REJECTED_BY_STORE: ("ClickHouse refused rows: check its schema and migrations "
                                         "(`gpulens check` migrations line; restart `gpulens sink` to apply them)"),
    DeadLetterReason.UNAPPLIABLE: "a gpulens bug: report it with the letters' error and payload",
    DeadLetterReason.UNDELIVERABLE: ("no alert destination accepted an alert: check GPULENS_ALERTMANAGER_URL / "
                                     "GPULENS_WEBHOOK_URL and the forwarder's logs"),
}


def _metadata(ctx: Context) -> Any:
    """The cluster's metadata, or None when no broker answered (the ``kafka`` line says so)."""
    if "metadata" not in ctx.cache:
        try:
            ctx.cache["metadata"] = ck.cluster_metadata(ctx.settings.kafka, ctx.timeout_s)
        except ck.KafkaException as exc:
            ctx.cache["metadata"] = None
            ctx.cache["metadata_error"] = str(exc)
    return ctx.cache["metadata"]


def _unreachable(name: str) -> list[Result]:
    return [Result(name, State.FAIL, "skipped: no Kafka broker answered (see the kafka line)", _REACH_FIX)]


def reachable(ctx: Context) -> list[Result]:
    kafka = ctx.settings.kafka
    metadata = _metadata(ctx)
    if metadata is None:
        return [Result("kafka", State.FAIL, f"no broker answered at {kafka.bootstrap_servers} "
                       f"({kafka.security_protocol}): {ctx.cache.get('metadata_error')}", _REACH_FIX)]
    return [Result("kafka", State.OK, f"{len(metadata.brokers)} broker(s) at {kafka.bootstrap_servers} "
                   f"({kafka.security_protocol})")]


@dataclass
class _TopicSurvey:
    """What the cluster holds of the registry's topics."""

    wanted: int
    missing: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    replication: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Topic -> (its smallest replication factor, its min.insync.replicas)."""


def _survey(ctx: Context, metadata: Any) -> _TopicSurvey:
    wanted = {spec.name(ctx.prefix): spec for spec in ALL_TOPICS}
    present = sorted(name for name in wanted if name in metadata.topics)
    configs = ck.topic_configs(ctx.settings.kafka, present, ctx.timeout_s)
    survey = _TopicSurvey(len(wanted), missing=sorted(name for name in wanted if name not in metadata.topics))
    for name in present:
        spec = wanted[name]
        partitions = metadata.topics[name].partitions
        policy = configs.get(name, {}).get("cleanup.policy")
        if len(partitions) != spec.partitions or policy != spec.cleanup_policy:
            survey.mismatched.append(f"{name} (partitions {len(partitions)}, want {spec.partitions}; "
                                     f"cleanup.policy {policy}, want {spec.cleanup_policy})")
        factor = min((len(p.replicas) for p in partitions.values()), default=0)
        survey.replication[name] = (factor, int(configs.get(name, {}).get("min.insync.replicas", "1")))
    return survey


def topics(ctx: Context) -> list[Result]:
    metadata = _metadata(ctx)
    if metadata is None:
        return _unreachable("topics")
    prefix = ctx.prefix
    survey = _survey(ctx, metadata)
    results: list[Result] = []
    if survey.missing:
        results.append(Result("topics", State.FAIL, f"{len(survey.missing)} of {survey.wanted} topics missing: "
                              + ", ".join(survey.missing),
                              f"`gpulens topics create --topic-prefix {prefix}` (or the topics Job of deploy/k8s)"))
    if survey.mismatched:
        results.append(Result("topics", State.FAIL, "topics unlike their contract: " + "; ".join(survey.mismatched),
                              "a topic's partitions cannot shrink nor its key placement change: recreate it "
                              "(delete it, then `gpulens topics create`), after the sink has stored what it holds; "
                              "a cleanup.policy is changed with kafka-configs --alter"))
    if not results:
        results.append(Result("topics", State.OK, f"{survey.wanted} topics under prefix {prefix!r} with their "
                              "partitions and cleanup policy"))
    if survey.replication:
        results.append(_replication(survey.replication, len(metadata.brokers), ctx.settings.topics))
    return results


def _replication(replication: dict[str, tuple[int, int]], brokers: int, wanted: TopicSettings) -> Result:
    """The replicas and ``min.insync.replicas`` of the topics against what ``gpulens topics create``
    gives them on this cluster (``GPULENS_TOPICS__*``: by default 3, or one per broker on fewer, and 2)."""
    factors = sorted({f for f, _ in replication.values()})
    isr = sorted({m for _, m in replication.values()})
    text = f"replication factor {'/'.join(map(str, factors))}, min.insync.replicas {'/'.join(map(str, isr))}, " \
           f"{brokers} broker(s)"
    impossible = sorted(n for n, (f, m) in replication.items() if m > f)
    if impossible:
        return Result("replication", State.FAIL, f"{text}: min.insync.replicas above the replication "
                      "factor of " + ", ".join(impossible) + " (every acks=all write fails)",
                      "lower min.insync.replicas of those topics or raise their replication factor "
                      "(kafka-reassign-partitions)")
    factor, min_insync = wanted.resolve(brokers)
    fewer = sorted(n for n, (f, _) in replication.items() if f < factor)
    if fewer:
        loses = " lose data with their broker" if 1 in factors else " stop taking writes sooner"
        return Result("replication", State.WARN, f"{text}: {len(fewer)} topic(s) with fewer than {factor} "
                      f"replicas (GPULENS_TOPICS__REPLICATION_FACTOR {wanted.replication_factor}){loses}",
                      f"raise their replication factor to {factor} (kafka-reassign-partitions) and "
                      f"min.insync.replicas to {min_insync or 1} (kafka-configs --alter); new topics get them "
                      "from `gpulens topics create`")
    weak = sorted(n for n, (f, m) in replication.items() if min_insync is not None and f >= 2 and m < min_insync)
    if weak:
        return Result("replication", State.WARN, f"{text}: {len(weak)} topic(s) with min.insync.replicas below "
                      f"{min_insync} (GPULENS_TOPICS__MIN_INSYNC_REPLICAS): their acks=all writes are acknowledged "
                      "by fewer replicas, and lost if those die",
                      f"kafka-configs --alter --add-config min.insync.replicas={min_insync} on those topics")
    return Result("replication", State.OK, text)


def groups(ctx: Context) -> list[Result]:
    metadata = _metadata(ctx)
    if metadata is None:
        return _unreachable("groups")
    prefix = ctx.prefix
    inputs = sorted(t for t in metadata.topics if t.startswith(prefix + ".") or t.startswith(ctx.worker_group))
    sink_topics = [spec.name(prefix) for spec in ALL_TOPICS]
    results: list[Result] = []
    for role, group, names, fix in (
        ("worker", ctx.worker_group, inputs + [spec.name(prefix) for spec in INTERNAL_TOPICS],
         "start the stream workers (`gpulens worker`, deploy/k8s/workers.yaml): `kubectl -n gpulens get pods "
         "-l app.kubernetes.io/name=gpulens-worker`; a different group id is --worker-group (GPULENS_APP_ID)"),
        ("sink", ctx.sink_group, sink_topics,
         "start the sink (`gpulens sink`, deploy/k8s/sink.yaml) and read its logs; a different group id is "
         "--sink-group (GPULENS_GROUP_ID)"),
    ):
        name = f"{role}-group"
        state, members = ck.group_members(ctx.settings.kafka, group, ctx.timeout_s)
        lag, committed = ck.committed_lag(ctx.settings.kafka, group, sorted(set(names)), ctx.timeout_s)
        if members == 0:
            results.append(Result(name, State.FAIL, f"group {group!r} has no member (state {state}); "
                                  f"{lag} records behind", fix))
        elif lag > ctx.thresholds.max_lag:
            results.append(Result(name, State.WARN, f"group {group!r}: {members} member(s), {lag} records behind "
                                  f"(threshold {ctx.thresholds.max_lag})",
                                  f"add {role}s (up to the partitions of their topics) or find the slow one in its "
                                  "logs and /metrics; a burst after a restart catches up by itself"))
        else:
            results.append(Result(name, State.OK, f"group {group!r}: {members} member(s), {lag} records behind"
                                  + ("" if committed else " (nothing committed yet)")))
    return results


def deadletters(ctx: Context) -> list[Result]:
    metadata = _metadata(ctx)
    if metadata is None:
        return _unreachable("deadletters")
    topic = DEADLETTER.name(ctx.prefix)
    if topic not in metadata.topics:
        return [Result("deadletters", State.FAIL, f"{topic} is missing (see the topics line)",
                       f"`gpulens topics create --topic-prefix {ctx.prefix}`")]
    counts = Counter({reason or DeadLetterReason.INVALID.value: count for reason, count in ck.header_counts_since(
        ctx.settings.kafka, topic, int((ctx.now - 3600) * 1000), "reason", ctx.timeout_s).items()})
    total = sum(counts.values())
    limits = ctx.thresholds
    if total <= limits.deadletters_warn_per_h and not counts.get(DeadLetterReason.UNAPPLIABLE):
        return [Result("deadletters", State.OK, f"{total} dead letter(s) in the last hour on {topic}")]
    results = []
    for reason, count in counts.most_common():
        state = State.WARN
        if total > limits.deadletters_fail_per_h or reason == DeadLetterReason.UNAPPLIABLE:
            state = State.FAIL
        fix = DEADLETTER_FIXES.get(reason, "read the letters (their error says why)")
        results.append(Result(f"deadletters {reason}", state, f"{count} dead letter(s) {reason!r} in the last hour "
                              f"on {topic} (of {total}; warn above {limits.deadletters_warn_per_h}, fail above "
                              f"{limits.deadletters_fail_per_h})", fix))
    return results
