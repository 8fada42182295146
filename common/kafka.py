"""The confluent-kafka adapter: the one module that imports it.

- :class:`BoundedProducer` — the thin producer every gpulens producer uses: idempotent, acks=all,
  compressed, batched by linger, a bounded local queue whose overflow is counted (never unbounded
  memory), delivery reports counted, flush on close.
- :func:`make_consumer` — a consumer with manual commits, for sinks and tools.
- :func:`ensure_topics` / :func:`broker_reachable` — the admin side of ``gpulens topics create``
  (partitions, cleanup policy, replication from :class:`~common.settings.TopicSettings`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from common.backoff import Backoff
from common.errors import RetriableError, UserError
from common.logs import get_logger
from common.settings import KafkaSettings, ProducerSettings, TopicSettings
from schemas.codec import WIRE_HEADERS
from schemas.topics import TopicSpec

Headers = list[tuple[str, str | bytes | None]]

__all__ = [
    "TOPIC_CALL_TIMEOUT_S",
    "BoundedProducer",
    "BrokerUnavailable",
    "Consumer",
    "KafkaError",
    "KafkaException",
    "Message",
    "PartitionReplicas",
    "ReadRecord",
    "TopicFollower",
    "TopicReport",
    "broker_reachable",
    "cluster_metadata",
    "commit_offsets",
    "committed_lag",
    "consumer_lag",
    "create_acls",
    "ensure_topics",
    "group_lag",
    "group_members",
    "header_counts_since",
    "make_consumer",
    "partition_replicas",
    "read_ranges",
    "read_to_end",
    "topic_configs",
    "wait_for_broker",
]


_LIBRDKAFKA_LOG = logging.getLogger("librdkafka")
log = get_logger(__name__)


def _client_conf(kafka: KafkaSettings) -> dict[str, Any]:
    """librdkafka settings plus its log routed into our structured logging (not raw stderr)."""
    return kafka.to_librdkafka() | {"logger": _LIBRDKAFKA_LOG}


class BrokerUnavailable(RetriableError):
    """No broker answered at the configured bootstrap servers."""


T = TypeVar("T")

TOPIC_CALL_TIMEOUT_S = 3.0
"""How long one attempt of a starting service to create its topics waits for the broker before the
next, backed off (:func:`wait_for_broker`)."""


def wait_for_broker(attempt: Callable[[], T], wait_s: float, what: str) -> T:
    """``attempt()``, called again while it raises :class:`BrokerUnavailable` (a broker not started
    yet, restarting, or a replicated cluster's broker killed), backing off from 1 s to 30 s, for
    up to ``wait_s``; then that error. ``what`` names the caller in the log lines."""
    deadline = time.monotonic() + wait_s
    backoff = Backoff(base_s=1.0, cap_s=30.0)
    while True:
        try:
            return attempt()
        except BrokerUnavailable as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise
            delay = min(backoff.next_delay_s(), remaining)
            log.warning("waiting for the Kafka broker", waiting=what, retry_in_s=round(delay, 1), error=str(exc),
                        gives_up_in_s=round(remaining))
            time.sleep(delay)


def broker_unavailable(exc: Exception, *, env_hint: bool = True, also: str | None = None) -> UserError:
    """The one user error for a Kafka broker that did not answer: what failed, and how to get one
    (the local broker, the bootstrap servers setting unless the command took them as a flag, and
    the command's own way around it, ``also``)."""
    ways = ["Start one with `gpulens kafka up`"]
    if env_hint:
        ways.append("set GPULENS_KAFKA__BOOTSTRAP_SERVERS")
    if also:
        ways.append(also)
    if len(ways) == 1:
        text = ways[0]
    elif len(ways) == 2:
        text = f"{ways[0]} or {ways[1]}"
    else:
        text = ", ".join(ways[:-1]) + f", or {ways[-1]}"
    return UserError(f"{exc}. {text}.")


@dataclass
class ProducerStats:
    produced: int = 0
    delivered: int = 0
    failed: int = 0
    overflowed: int = 0
    last_error: str | None = None


_UNASSIGNED = -1
"""librdkafka's ``RD_KAFKA_PARTITION_UA``: the partitioner places the record by its key."""


class BoundedProducer:
    """confluent-kafka Producer with a bounded queue and counted outcomes.

    ``produce`` never blocks and never grows memory past ``queue_max_messages`` /
    ``queue_max_kbytes``: when the local queue is full (broker down for long), the record is
    counted in ``stats.overflowed`` and ``False`` is returned. Queued records are delivered when
    the broker comes back, within ``delivery_timeout_ms``.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        settings: ProducerSettings | None = None,
        on_delivery: Callable[[str, bool], None] | None = None,
        on_delivery_report: Callable[[str, int, int, bool], None] | None = None,
    ) -> None:
        """``on_delivery(topic, ok)`` and ``on_delivery_report(topic, partition, offset, ok)`` run
        from ``poll``/``flush`` for every record (offset -1 when it failed)."""
        settings = settings or ProducerSettings()
        conf = _client_conf(kafka) | {
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": settings.compression,
            "linger.ms": settings.linger_ms,
            "queue.buffering.max.messages": settings.queue_max_messages,
            "queue.buffering.max.kbytes": settings.queue_max_kbytes,
            "message.timeout.ms": settings.delivery_timeout_ms,
        }
        self._producer = Producer(conf)
        self._on_delivery = on_delivery
        self._on_delivery_report = on_delivery_report
        self._lock = threading.Lock()
        self.stats = ProducerStats()

    def _delivery(self, err: KafkaError | None, msg: Message) -> None:
        with self._lock:
            if err is None:
                self.stats.delivered += 1
            else:
                self.stats.failed += 1
                self.stats.last_error = str(err)
        if self._on_delivery is not None:
            self._on_delivery(msg.topic() or "", err is None)
        if self._on_delivery_report is not None:
            partition = msg.partition()
            offset = msg.offset()
            self._on_delivery_report(msg.topic() or "", -1 if partition is None else int(partition),
                                     -1 if offset is None or err is not None else int(offset), err is None)

    def produce(
        self, topic: str, key: str | bytes | None, value: bytes | None, headers: Headers | None = None,
        partition: int | None = None,
    ) -> bool:
        """Queue one record; ``False`` when the bounded queue is full (counted as overflow).
        ``partition``: None lets librdkafka's partitioner place it by its key.

        Every record with a value carries the wire headers (content type, schema version) first."""
        if value is not None:
            headers = [*WIRE_HEADERS, *(headers or [])]
        try:
            self._producer.produce(
                topic, value=value, key=key, headers=headers, on_delivery=self._delivery,
                partition=_UNASSIGNED if partition is None else partition,
            )
        except BufferError:
            self.stats.overflowed += 1
            self._producer.poll(0)
            return False
        self.stats.produced += 1
        self._producer.poll(0)
        return True

    def poll(self, timeout_s: float = 0.0) -> None:
        self._producer.poll(timeout_s)

    @property
    def queue_depth(self) -> int:
        return len(self._producer)

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for outstanding deliveries; returns how many are still queued."""
        return int(self._producer.flush(timeout_s))

    def close(self, timeout_s: float = 30.0) -> int:
        return self.flush(timeout_s)


def make_consumer(
    kafka: KafkaSettings, group_id: str, extra: dict[str, Any] | None = None
) -> Consumer:
    conf = _client_conf(kafka) | {
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    }
    conf.update(extra or {})
    return Consumer(conf)


def commit_offsets(consumer: Consumer, offsets: dict[tuple[str, int], int]) -> None:
    """Synchronously commit, per (topic, partition), the next offset to read; raises KafkaException."""
    consumer.commit(
        offsets=[TopicPartition(topic, partition, offset) for (topic, partition), offset in offsets.items()],
        asynchronous=False,
    )


def seek_to(consumer: Consumer, topic: str, partition: int, offset: int) -> None:
    """Read an assigned partition again from ``offset``; raises KafkaException."""
    consumer.seek(TopicPartition(topic, partition, offset))


def consumer_lag(consumer: Consumer) -> dict[tuple[str, int], int]:
    """Messages not yet consumed per assigned (topic, partition), from cached high watermarks."""
    lags: dict[tuple[str, int], int] = {}
    assignment = consumer.assignment()
    if not assignment:
        return lags
    for tp in consumer.position(assignment):
        try:
            low, high = consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            continue
        if high is None or high < 0:
            continue
        position = tp.offset if tp.offset >= 0 else low
        lags[(tp.topic, tp.partition)] = max(0, high - position)
    return lags


def _committed(kafka: KafkaSettings, group_id: str, topics: Iterable[str],
               timeout_s: float) -> list[tuple[int, int, int]]:
    """(committed offset or -1, low, high watermark) of every partition of ``topics`` for ``group_id``."""
    reader = Consumer(_client_conf(kafka) | {"group.id": group_id, "enable.auto.commit": False})
    try:
        metadata = reader.list_topics(timeout=timeout_s)
        partitions = [TopicPartition(topic, p) for topic in topics if topic in metadata.topics
                      for p in metadata.topics[topic].partitions]
        out = []
        for tp in reader.committed(partitions, timeout=timeout_s) if partitions else []:
            low, high = reader.get_watermark_offsets(tp, timeout=timeout_s)
            out.append((tp.offset, low, high))
        return out
    finally:
        reader.close()


def group_lag(kafka: KafkaSettings, group_id: str, topics: Iterable[str], timeout_s: float = 10.0) -> int:
    """Records in ``topics`` the consumer group has not committed yet (a group with no commit lags by all)."""
    return sum(max(0, high - (offset if offset >= 0 else low))
               for offset, low, high in _committed(kafka, group_id, topics, timeout_s))


def committed_lag(kafka: KafkaSettings, group_id: str, topics: Iterable[str],
                  timeout_s: float = 10.0) -> tuple[int, int]:
    """(records behind, partitions with a committed offset) of ``group_id`` over ``topics``: the
    lag of what the group has started on, as an operator reads it."""
    committed = [(offset, high) for offset, _low, high in _committed(kafka, group_id, topics, timeout_s)
                 if offset >= 0]
    return sum(max(0, high - offset) for offset, high in committed), len(committed)


def group_members(kafka: KafkaSettings, group_id: str, timeout_s: float = 10.0) -> tuple[str, int]:
    """(state in lower case, number of members) of the consumer group ``group_id``."""
    admin = AdminClient(_client_conf(kafka))  # referenced until the answer: a collected client never answers
    description = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)[group_id].result()
    return str(getattr(description.state, "name", description.state)).lower(), len(description.members or [])


def cluster_metadata(kafka: KafkaSettings, timeout_s: float = 10.0) -> Any:
    """The cluster's metadata (brokers, topics and their partitions); raises :class:`KafkaException`
    when no broker answers."""
    return AdminClient(_client_conf(kafka)).list_topics(timeout=timeout_s)


def topic_configs(kafka: KafkaSettings, names: Sequence[str], timeout_s: float = 10.0) -> dict[str, dict[str, str]]:
    """Every config of the topics ``names`` (``cleanup.policy``, ``min.insync.replicas``, ...)."""
    if not names:
        return {}
    admin = AdminClient(_client_conf(kafka))  # referenced until the answers: a collected client never answers
    return {name: _describe_topic(admin, name, timeout_s) for name in names}


def header_counts_since(kafka: KafkaSettings, topic: str, since_ms: int, header: str,
                        timeout_s: float = 10.0) -> dict[str, int]:
    """How many records of ``topic`` written since ``since_ms`` (epoch milliseconds) carry each value
    of the header ``header`` (``""`` for none): read from the offsets for that time to the end."""
    consumer = make_consumer(kafka, f"gpulens-count-{topic}")
    counts: dict[str, int] = {}
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        partitions = sorted(metadata.partitions) if metadata is not None and metadata.error is None else []
        starts = consumer.offsets_for_times([TopicPartition(topic, p, since_ms) for p in partitions],
                                            timeout=timeout_s) if partitions else []
        ends: dict[int, int] = {}
        assign = []
        for tp in starts:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=timeout_s)
            if 0 <= tp.offset < high:
                ends[tp.partition] = high
                assign.append(TopicPartition(topic, tp.partition, tp.offset))
        if not assign:
            return counts
        consumer.assign(assign)
        deadline = time.monotonic() + 3 * timeout_s
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    continue
                value = dict(msg.headers() or []).get(header)
                key = value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")
                counts[key] = counts.get(key, 0) + 1
                partition = int(msg.partition() or 0)
                if int(msg.offset() or 0) + 1 >= ends.get(partition, 0):
                    ends.pop(partition, None)
        return counts
    finally:
        consumer.close()


def broker_reachable(kafka: KafkaSettings, timeout_s: float = 5.0) -> bool:
    admin = AdminClient(_client_conf(kafka))
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return True


@dataclass
class TopicReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    replication_factor: int = 1
    """The replication factor of the topics created (and wanted of the existing ones)."""
    min_insync_replicas: int | None = None
    """Their ``min.insync.replicas`` (None: the broker's default)."""
    fewer_replicas: list[str] = field(default_factory=list)
    """Existing topics with fewer replicas than ``replication_factor`` (reported, never changed)."""


CLUSTER_SIZE_SETTLE_S = 5.0
"""How long ``auto`` replication waits for brokers to answer when some seem missing (a broker that
missed its heartbeats under load is fenced and unlisted for a moment)."""


class TopicLister(Protocol):
    """What :func:`_cluster_size` asks of an admin client."""

    def list_topics(self, timeout: float) -> Any: ...


def _cluster_size(admin: TopicLister, metadata: Any, timeout_s: float) -> int:
    """How many brokers the cluster has, for ``auto`` replication: the brokers that answer, or more
    where existing partitions keep replicas on brokers that do not answer now (a broker down);
    with 2 found, asked again for up to :data:`CLUSTER_SIZE_SETTLE_S` (one fenced for a moment).
    One broker (the demo's) is never waited for."""
    def known(listed: Any) -> set[int]:
        ids = {int(broker) for broker in listed.brokers}
        for topic in listed.topics.values():
            for partition in topic.partitions.values():
                ids.update(int(replica) for replica in partition.replicas)
        return ids

    seen = known(metadata)
    deadline = time.monotonic() + CLUSTER_SIZE_SETTLE_S
    while len(seen) == 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        with contextlib.suppress(KafkaException):
            seen |= known(admin.list_topics(timeout=timeout_s))
    return len(seen)


def ensure_topics(
    kafka: KafkaSettings,
    specs: Iterable[TopicSpec],
    prefix: str,
    replication: TopicSettings | None = None,
    timeout_s: float = 15.0,
) -> TopicReport:
    """Create every missing topic with its partitions, cleanup policy and replication
    (``replication``, the settings' ``topics``: by default 3 replicas or one per broker when there
    are fewer, and ``min.insync.replicas`` 2 when there are 2 or more); idempotent.

    Existing topics are left alone; a partition count or cleanup policy that differs from the
    registry is reported in ``mismatched``, fewer replicas in ``fewer_replicas`` (never silently
    changed). A replication factor above the brokers the cluster has is a :class:`UserError`.
    """
    admin = AdminClient(_client_conf(kafka))
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerUnavailable(f"no Kafka broker at {kafka.bootstrap_servers}: {exc}") from None
    factor, min_insync = (replication or TopicSettings()).resolve(_cluster_size(admin, metadata, timeout_s))
    report = TopicReport(replication_factor=factor, min_insync_replicas=min_insync)
    wanted: dict[str, TopicSpec] = {spec.name(prefix): spec for spec in specs}
    missing = [name for name in wanted if name not in metadata.topics]
    present = [name for name in wanted if name in metadata.topics]
    if missing:
        insync = {} if min_insync is None else {"min.insync.replicas": str(min_insync)}
        futures = admin.create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=wanted[name].partitions,
                    replication_factor=factor,
                    config=wanted[name].kafka_config() | insync,
                )
                for name in missing
            ],
            request_timeout=timeout_s,
        )
        for name, future in futures.items():
            try:
                future.result()
                report.created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise _creation_error(name, exc, factor, len(metadata.brokers), kafka.bootstrap_servers) from None
                report.existing.append(name)
        _await_metadata(admin, report.created, timeout_s)
    for name in present:
        spec = wanted[name]
        partitions = len(metadata.topics[name].partitions)
        replicas = min((len(p.replicas) for p in metadata.topics[name].partitions.values()), default=0)
        if replicas < factor:
            report.fewer_replicas.append(f"{name} ({replicas} replica(s), want {factor})")
        policy = _cleanup_policy(admin, name, timeout_s)
        if partitions != spec.partitions or policy != spec.cleanup_policy:
            report.mismatched.append(
                f"{name} (partitions {partitions}, want {spec.partitions}; "
                f"cleanup.policy {policy}, want {spec.cleanup_policy})"
            )
        else:
            report.existing.append(name)
    return report


def _creation_error(name: str, exc: KafkaException, factor: int, answering: int, bootstrap: str) -> Exception:
    """What a failed creation of topic ``name`` raises: a broker away is waited for
    (:class:`BrokerUnavailable`), too few brokers for the replicas is the user's to fix."""
    if _broker_away(exc):
        return BrokerUnavailable(f"creating {name}: {exc}")
    if exc.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR:
        return UserError(
            f"cannot create {name} with {factor} replicas on {answering} broker(s) answering at {bootstrap}: "
            "start the brokers that are down (auto counts every broker the cluster's partitions name), or set "
            "GPULENS_TOPICS__REPLICATION_FACTOR to at most the number answering")
    return exc


def _await_metadata(admin: AdminClient, topics: list[str], timeout_s: float) -> None:
    """Return once every new topic shows in the metadata with its partitions, so callers can use it at once.

    A controller acknowledges creation before the brokers' metadata has caught up."""
    deadline = time.monotonic() + timeout_s
    while topics:
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerUnavailable(f"created topics, then no broker answered: {exc}") from None
        missing = [t for t in topics if t not in metadata.topics or not metadata.topics[t].partitions]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise BrokerUnavailable(f"created topics not visible in the metadata after {timeout_s:.0f}s: {missing}")
        time.sleep(0.1)


def _cleanup_policy(admin: AdminClient, topic: str, timeout_s: float) -> str:
    """The topic's ``cleanup.policy``. A topic another client has just created is listed before
    every broker knows it (the broker asked answers "unknown topic" for a moment, as three workers
    starting together on a 3-broker cluster find): asked again for up to ``timeout_s``."""
    return _describe_topic(admin, topic, timeout_s)["cleanup.policy"]


def _describe_topic(admin: AdminClient, topic: str, timeout_s: float) -> dict[str, str]:
    """Every config of ``topic``, asked again for up to ``timeout_s`` while the broker asked does not
    know it yet (a topic just created is listed before every broker has it) or is away (killed or
    restarting: the next ask may reach another); still away then, :class:`BrokerUnavailable`."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result()
            return {key: str(entry.value) for key, entry in result.items()}
        except KafkaException as exc:
            away = _broker_away(exc)
            if not away and exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            if time.monotonic() >= deadline:
                if away:
                    raise BrokerUnavailable(f"no broker answered about {topic} in {timeout_s:.0f}s: {exc}") from None
                raise
            time.sleep(0.2)


_BROKER_AWAY = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                          KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_CONTROLLER, KafkaError.BROKER_NOT_AVAILABLE,
                          KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NETWORK_EXCEPTION})
"""Admin errors of a broker that is down, restarting or handing over its role: a moment of a
replicated cluster, not a fault of the caller (which retries, with backoff)."""


def _broker_away(exc: KafkaException) -> bool:
    error = exc.args[0]
    return bool(error.retriable()) or error.code() in _BROKER_AWAY


@dataclass(frozen=True)
class PartitionReplicas:
    """Who holds one partition: its leader's broker id (-1: none), its replicas, its in-sync replicas."""

    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def partition_replicas(kafka: KafkaSettings, topics: Iterable[str] | None = None,
                       timeout_s: float = 10.0) -> dict[tuple[str, int], PartitionReplicas]:
    """The leader and replicas of every partition of ``topics`` (every topic: None), as the cluster's
    metadata says now; raises :class:`KafkaException` when no broker answers."""
    metadata = AdminClient(_client_conf(kafka)).list_topics(timeout=timeout_s)
    names = metadata.topics if topics is None else [t for t in topics if t in metadata.topics]
    return {(name, p.id): PartitionReplicas(int(p.leader), tuple(p.replicas), tuple(p.isrs))
            for name in names for p in metadata.topics[name].partitions.values()}


def topic_names(kafka: KafkaSettings, timeout_s: float = 10.0) -> list[str]:
    """Every topic on the cluster (internal ones included), sorted."""
    return sorted(AdminClient(_client_conf(kafka)).list_topics(timeout=timeout_s).topics)


def delete_prefixed(kafka: KafkaSettings, prefixes: Sequence[str], timeout_s: float = 30.0) -> list[str]:
    """Delete every topic whose name starts with one of ``prefixes``; the topics deleted, sorted.
    Raises :class:`AdminRequestFailed` when the cluster refuses or cannot be reached."""
    if isinstance(prefixes, str):  # a str is a sequence of one-letter prefixes: never what is meant
        raise TypeError("delete_prefixed takes a list of prefixes, not a str")
    admin = AdminClient(_client_conf(kafka))
    try:
        names = sorted(name for name in admin.list_topics(timeout=timeout_s).topics
                       if name.startswith(tuple(prefixes)))
        if names:
            for future in admin.delete_topics(names, request_timeout=timeout_s).values():
                future.result()
    except KafkaException as exc:
        raise AdminRequestFailed(str(exc)) from None
    return names


class AdminRequestFailed(RuntimeError):
    """An administrative request (deleting topics) the cluster refused or did not answer."""


def create_acls(kafka: KafkaSettings, rows: Iterable[tuple[str, str, str, str, str]],
                timeout_s: float = 30.0) -> int:
    """Create "allow" ACL bindings, one per ``(resource, name, pattern, principal, operation)``
    row (``topic``/``group``, ``literal``/``prefixed``, ``User:...``, ``READ``, ``WRITE``, ...;
    any host), as the principal of ``kafka`` (an admin); returns how many. Raises
    :class:`AdminRequestFailed` when the cluster refuses one (idempotent otherwise)."""
    bindings = [AclBinding(ResourceType[resource.upper()], name, ResourcePatternType[pattern.upper()],
                           principal, "*", AclOperation[operation.upper()], AclPermissionType.ALLOW)
                for resource, name, pattern, principal, operation in rows]
    if not bindings:
        return 0
    admin = AdminClient(_client_conf(kafka))  # held until every future is done
    try:
        for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
            future.result()
    except KafkaException as exc:
        raise AdminRequestFailed(str(exc)) from None
    return len(bindings)


def topic_partitions(kafka: KafkaSettings, topic: str, timeout_s: float = 10.0) -> Sequence[int]:
    metadata = AdminClient(_client_conf(kafka)).list_topics(topic, timeout=timeout_s)
    return sorted(metadata.topics[topic].partitions)


@dataclass(frozen=True)
class ReadRecord:
    """One record read back by :func:`read_to_end`."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int | None = None
    """The record's Kafka timestamp (producer create time unless the topic says log-append)."""


def _read_record(topic: str, msg: Message) -> ReadRecord:
    headers: dict[str, bytes] = {}
    for item in msg.headers() or []:
        name, val = item[0], item[1]
        headers[str(name)] = val if isinstance(val, bytes) else (b"" if val is None else str(val).encode())
    key = msg.key()
    kind, stamp = msg.timestamp()
    return ReadRecord(topic, int(msg.partition() or 0), int(msg.offset() or 0),
                      key.encode() if isinstance(key, str) else key, msg.value(), headers,
                      stamp if kind != 0 and stamp >= 0 else None)


class TopicFollower:
    """Reads a topic from its beginning and then, call by call, what was appended since: for state a
    process rebuilds and keeps current (e.g. the compacted pod states). No consumer group offsets
    are committed; a topic that does not exist yet reads as empty."""

    def __init__(self, kafka: KafkaSettings, topic: str, timeout_s: float = 30.0) -> None:
        self.topic = topic
        self._consumer = make_consumer(kafka, group_id=f"gpulens-reader-{topic}", extra={"enable.partition.eof": False})
        metadata = self._consumer.list_topics(topic, timeout=timeout_s)
        found = metadata.topics.get(topic)
        self.partitions: list[int] = sorted(found.partitions) if found is not None and found.error is None else []
        if self.partitions:
            self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self.partitions])

    def catch_up(self, timeout_s: float = 30.0, partial: bool = False) -> list[ReadRecord]:
        """Every record appended since the last call, up to each partition's high watermark now
        (in partition, offset order). Raises ``TimeoutError`` if they cannot be read in time, or,
        with ``partial``, returns what was read (the next call goes on from there)."""
        topic = self.topic
        deadline = time.monotonic() + timeout_s
        ends = {partition: self._high_watermark(partition, deadline) for partition in self.partitions}
        records: list[ReadRecord] = []
        while self._behind(ends):
            if time.monotonic() > deadline:
                if partial:
                    break
                raise TimeoutError(f"reading {topic}: got {len(records)} records before the deadline")
            for msg in self._consumer.consume(1000, 0.2):
                if msg.error():
                    continue
                partition = int(msg.partition() or 0)
                offset = int(msg.offset() or 0)
                if offset >= ends.get(partition, 0):
                    continue
                records.append(_read_record(topic, msg))
        records.sort(key=lambda r: (r.partition, r.offset))
        return records

    def _high_watermark(self, partition: int, deadline: float) -> int:
        """The partition's high watermark. Right after the assignment the client may not know the
        partition yet ("Local: Unknown partition", seen on a busy broker): asked again until the
        deadline, by the one retry schedule (:class:`common.backoff.Backoff`)."""
        backoff = Backoff(base_s=0.05, cap_s=1.0)
        while True:
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), timeout=max(0.1, deadline - time.monotonic()))
                return int(high)
            except KafkaException as exc:
                pause = backoff.next_delay_s()
                if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)

    def _behind(self, ends: dict[int, int]) -> bool:
        """Whether some partition's position is short of its end (positions skip compacted gaps)."""
        wanted = [TopicPartition(self.topic, p) for p, end in ends.items() if end > 0]
        if not wanted:
            return False
        for tp in self._consumer.position(wanted):
            low = 0
            if tp.offset < 0:  # nothing fetched yet: compare the partition's start with its end
                low, _high = self._consumer.get_watermark_offsets(tp, cached=True)
                if low is None or low < 0:
                    return True
            if max(tp.offset, low) < ends[tp.partition]:
                return True
        return False

    def close(self) -> None:
        self._consumer.close()


def read_ranges(kafka: KafkaSettings, topic: str, ranges: Iterable[tuple[int, int, int]],
                timeout_s: float = 30.0) -> list[ReadRecord]:
    """The records of ``topic`` in each ``(partition, first, last)`` offset range, in partition and
    offset order (no consumer group, nothing committed; offsets a compaction removed are skipped).
    Raises ``TimeoutError`` if they cannot all be read in time."""
    wanted = {partition: (first, last) for partition, first, last in ranges}
    if not wanted:
        return []
    consumer = make_consumer(kafka, group_id=f"gpulens-range-reader-{topic}")
    try:
        consumer.assign([TopicPartition(topic, p, first) for p, (first, _last) in wanted.items()])
        deadline = time.monotonic() + timeout_s
        records: list[ReadRecord] = []
        left = set(wanted)
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} partitions {sorted(left)}: not all records came in time")
            for msg in consumer.consume(1000, 0.2):
                if msg.error():
                    continue
                partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                first, last = wanted[partition]
                if first <= offset <= last:
                    records.append(_read_record(topic, msg))
                if offset >= last:
                    left.discard(partition)
                    consumer.pause([TopicPartition(topic, partition)])
        records.sort(key=lambda r: (r.partition, r.offset))
        return records
    finally:
        consumer.close()


def read_to_end(kafka: KafkaSettings, topic: str, timeout_s: float = 30.0) -> list[ReadRecord]:
    """Every record now in ``topic``, from the beginning to each partition's high watermark (no
    consumer group, nothing committed). Raises ``TimeoutError`` if they cannot be read in time."""
    follower = TopicFollower(kafka, topic, timeout_s)
    try:
        return follower.catch_up(timeout_s)
    finally:
        follower.close()
