"""Configuration of every gpulens service, validated once at start-up.

Each service has one settings model. Values come from CLI flags (highest precedence), then
environment variables prefixed ``GPULENS_`` (nested with ``__``, e.g.
``GPULENS_KAFKA__BOOTSTRAP_SERVERS``), then defaults. No other module reads the environment.
Kafka connection settings are mapped here, once, to librdkafka keys (confluent-kafka) and to
aiokafka/faust arguments. Secrets are ``SecretStr`` and never printed.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyAddress,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from common.clickhouse_target import ClickHouseTarget
from common.errors import UserError
from schemas.messages import CLUSTER_NAME_PATTERN, DEFAULT_CLUSTER

ENV_PREFIX = "GPULENS_"


class ConfigError(UserError):
    """Invalid configuration: the message names the setting and what it accepts."""


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpulens"


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpulens"


class KafkaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = None
    ssl_certificate_location: Path | None = None
    ssl_key_location: Path | None = None
    ssl_key_password: SecretStr | None = None
    client_id: str = "gpulens"

    @field_validator("bootstrap_servers")
    @classmethod
    def _hosts_have_ports(cls, value: str) -> str:
        for server in value.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"expected host:port[,host:port...], got {server!r}")
        return value

    def to_librdkafka(self) -> dict[str, Any]:
        """confluent-kafka configuration for this connection."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            "client.id": self.client_id,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = str(self.ssl_ca_location)
        if self.ssl_certificate_location:
            conf["ssl.certificate.location"] = str(self.ssl_certificate_location)
        if self.ssl_key_location:
            conf["ssl.key.location"] = str(self.ssl_key_location)
        if self.ssl_key_password:
            conf["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        return conf

    def to_aiokafka(self) -> dict[str, Any]:
        """aiokafka (and so faust) keyword arguments for this connection."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "client_id": self.client_id,
        }
        if self.sasl_mechanism:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = (
                self.sasl_password.get_secret_value() if self.sasl_password else None
            )
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs["ssl_context"] = self.ssl_context()
        return kwargs

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS context from the configured CA / client certificate files (aiokafka needs one)."""
        context = ssl.create_default_context(cafile=str(self.ssl_ca_location) if self.ssl_ca_location else None)
        if self.ssl_certificate_location:
            context.load_cert_chain(
                str(self.ssl_certificate_location),
                str(self.ssl_key_location) if self.ssl_key_location else None,
                self.ssl_key_password.get_secret_value() if self.ssl_key_password else None,
            )
        return context

    def faust_broker_url(self) -> str:
        scheme = "kafka"
        return ";".join(f"{scheme}://{server.strip()}" for server in self.bootstrap_servers.split(","))


class ProducerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "lz4"
    linger_ms: int = Field(default=50, ge=0, le=5000)
    queue_max_messages: int = Field(default=100_000, ge=1)
    queue_max_kbytes: int = Field(default=262_144, ge=1)
    delivery_timeout_ms: int = Field(default=300_000, ge=1000)


LOCAL_KAFKA_BROKERS = (1, 3)
"""The sizes of the local cluster ``gpulens kafka up`` runs: one broker, or three replicating ones."""


def local_kafka_ports(port: int, controller_port: int, brokers: int) -> list[tuple[int, int]]:
    """(client port, controller port) of each node of a local cluster: node ``i`` listens on
    ``port + 2i`` for clients and ``controller_port + 2i`` for the KRaft quorum."""
    return [(port + 2 * i, controller_port + 2 * i) for i in range(brokers)]


class LocalKafkaSettings(BaseModel):
    """The local Kafka cluster ``gpulens kafka up`` runs for the embedded default: one broker, or
    three combined broker+controller nodes replicating every topic (``brokers``)."""

    model_config = ConfigDict(extra="forbid")

    version: str = "3.9.1"
    brokers: int = 1
    """``GPULENS_LOCAL_KAFKA__BROKERS``: 1 (the default) or 3; ``gpulens kafka up --brokers`` overrides it."""
    port: int = Field(default=9092, ge=1, le=65535)
    """The client port of the first node; node ``i`` of a cluster listens on ``port + 2i``."""
    controller_port: int = Field(default=9093, ge=1, le=65535)
    """The KRaft controller port of the first node; node ``i`` uses ``controller_port + 2i``."""
    heap_mb: int = Field(default=512, ge=128)
    """Java heap of each node."""
    start_timeout_s: float = Field(default=90.0, gt=0)
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    """Where the broker's jars are kept between runs (shared by every data directory)."""

    @field_validator("brokers")
    @classmethod
    def _a_cluster_size(cls, value: int) -> int:
        if value not in LOCAL_KAFKA_BROKERS:
            raise ValueError("expected 1 (a single broker) or 3 (three brokers replicating every topic)")
        return value

    @field_validator("controller_port")
    @classmethod
    def _ports_apart(cls, value: int, info: ValidationInfo) -> int:
        port, brokers = info.data.get("port"), info.data.get("brokers")
        if port is None or brokers is None:  # reported on their own variables
            return value
        return check_local_kafka_ports(port, value, brokers)


def check_local_kafka_ports(port: int, controller_port: int, brokers: int) -> int:
    """``controller_port`` when every port of the layout (:func:`local_kafka_ports`) is distinct
    and valid; else the ValueError that names the variables."""
    used = [p for pair in local_kafka_ports(port, controller_port, brokers) for p in pair]
    if max(used) > 65535 or len(set(used)) != len(used):
        clients = ", ".join(str(c) for c, _ in local_kafka_ports(port, controller_port, brokers))
        controllers = ", ".join(str(c) for _, c in local_kafka_ports(port, controller_port, brokers))
        raise ValueError(
            f"{brokers} node(s) listen on GPULENS_LOCAL_KAFKA__PORT + 2i ({clients}) and "
            f"GPULENS_LOCAL_KAFKA__CONTROLLER_PORT + 2i ({controllers}): these must be distinct ports up to "
            "65535 (e.g. PORT=9092 and CONTROLLER_PORT=9093)")
    return controller_port


class TopicSettings(BaseModel):
    """How topics are created (``gpulens topics create``, and the workers, sink and watcher when one
    is missing): ``GPULENS_TOPICS__REPLICATION_FACTOR`` and ``GPULENS_TOPICS__MIN_INSYNC_REPLICAS``."""

    model_config = ConfigDict(extra="forbid")

    replication_factor: Literal["auto"] | int = "auto"
    """Replicas per partition (1 to 16); ``auto``: 3, or the number of brokers when the cluster has fewer."""
    min_insync_replicas: int = Field(default=2, ge=1, le=16)
    """``min.insync.replicas`` of topics with 2 replicas or more (at most their replication factor):
    an ``acks=all`` write (every gpulens producer's) is acknowledged once that many replicas have it."""

    @field_validator("replication_factor", mode="before")
    @classmethod
    def _auto_or_a_number(cls, value: Any) -> Any:
        text = str(value).strip()
        if text == "auto":
            return text
        if not text.isdigit() or not 1 <= int(text) <= 16 or isinstance(value, bool | float):
            raise ValueError("expected auto or a number of replicas from 1 to 16")
        return int(text)

    @field_validator("min_insync_replicas")
    @classmethod
    def _not_above_the_replicas(cls, value: int, info: ValidationInfo) -> int:
        factor = info.data.get("replication_factor")
        if isinstance(factor, int) and factor >= 2 and value > factor:
            raise ValueError(f"at most GPULENS_TOPICS__REPLICATION_FACTOR ({factor}): with more, every acks=all "
                             "write would fail")
        return value

    def resolve(self, brokers: int) -> tuple[int, int | None]:
        """(replication factor, ``min.insync.replicas`` or None for the broker's default) of a topic
        created on a cluster of ``brokers`` brokers."""
        factor = min(3, max(1, brokers)) if self.replication_factor == "auto" else self.replication_factor
        return factor, (min(self.min_insync_replicas, factor) if factor >= 2 else None)


CLICKHOUSE_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
"""A ClickHouse name written unquoted (a cluster's, in ``ON CLUSTER``)."""


class ClickHouseSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = ""
    """``chdb:///path`` (embedded) or ``http(s)://user:pass@host:port/db``; empty = embedded under data_dir."""
    query_max_execution_time_s: float = Field(default=60.0, gt=0)
    """Limit of every read query (``gpulens sql``, ``report``, the sink's endpoint); it is then cancelled."""
    query_max_memory_bytes: int = Field(default=2 * 1024**3, ge=16 * 1024**2)
    query_max_result_rows: int = Field(default=1_000_000, ge=1)
    cluster: str = Field(default="", pattern=rf"^({CLICKHOUSE_IDENTIFIER})?$")
    """The ClickHouse cluster (of the server's ``remote_servers``, one shard of replicas) whose every
    replica holds the sink's tables: migrations run ``ON CLUSTER`` it with ``Replicated*MergeTree``
    engines (docs/sink.md, "ClickHouse cluster mode"). Empty: one server."""

    @field_validator("url")
    @classmethod
    def _a_target(cls, value: str) -> str:
        if value:
            ClickHouseTarget.parse(value)
        return value

    @field_validator("cluster")
    @classmethod
    def _a_server_for_a_cluster(cls, value: str, info: ValidationInfo) -> str:
        url = info.data.get("url", "")
        if value and (not url or ClickHouseTarget.parse(url).scheme == "chdb"):
            raise ValueError("a cluster needs a ClickHouse server: set GPULENS_CLICKHOUSE__URL to "
                             "http(s)://host:port/db of one of its replicas (the embedded engine is one server)")
        return value


class CommonSettings(BaseSettings):
    """What every service shares."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore", validate_default=True
    )

    topic_prefix: str = Field(default="gpulens", pattern=r"^[A-Za-z0-9._-]+$")
    data_dir: Path = Field(default_factory=_default_data_dir)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the Prometheus ``/metrics`` endpoint; 0 disables it."""
    metrics_addr: IPvAnyAddress = IPv4Address("127.0.0.1")
    """Address the ``/metrics`` endpoint listens on: loopback unless chosen (the Kubernetes
    manifests and the compose file set ``0.0.0.0`` so that Prometheus can scrape the pod)."""
    deadletter_rate_per_s: float = Field(default=100.0, gt=0)
    """Dead letters one process (a stream worker, a sink) writes a second at most (a token bucket,
    with ``deadletter_burst``); beyond it a rejected record is counted in
    ``gpulens_{stream,sink}_deadletters_suppressed_total`` and summarised in the log instead of written."""
    deadletter_burst: int = Field(default=1000, ge=1)
    """Dead letters a process may write at once before ``deadletter_rate_per_s`` applies."""
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    producer: ProducerSettings = Field(default_factory=ProducerSettings)
    local_kafka: LocalKafkaSettings = Field(default_factory=LocalKafkaSettings)
    topics: TopicSettings = Field(default_factory=TopicSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)

    @field_validator("data_dir")
    @classmethod
    def _data_dir_is_a_directory(cls, value: Path) -> Path:
        if value.exists() and not value.is_dir():
            raise ValueError(f"{value} exists and is not a directory; give a directory gpulens may create or write")
        return value

    def clickhouse_target(self) -> ClickHouseTarget:
        """``GPULENS_CLICKHOUSE__URL``, or the embedded engine under the data directory."""
        if self.clickhouse.url:
            return ClickHouseTarget.parse(self.clickhouse.url)
        return ClickHouseTarget.embedded_under(self.data_dir)

    def clickhouse_url(self) -> str:
        return self.clickhouse_target().url


def _cluster_name(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(CLUSTER_NAME_PATTERN, value):
        raise ValueError("expected a DNS label: 1-63 lowercase letters, digits and '-', starting and ending "
                         "with a letter or digit (e.g. prod-eu-1)")
    return value


class KafkaServiceSettings(CommonSettings):
    """What the long-running services that create their Kafka topics (the stream worker, the sink,
    the cluster watcher) share."""

    broker_wait_s: float = Field(default=300.0, ge=0)
    """How long a starting worker, sink or watcher waits for the Kafka broker (retrying with backoff from
    1 s to 30 s) before it exits with an error; 0 = fail at once."""


class ProducerIdentity(CommonSettings):
    """What the two producers (agent, watcher) share: the cluster they report for."""

    cluster: Annotated[str | None, AfterValidator(_cluster_name)] = None
    """``GPULENS_CLUSTER``: the cluster every message is stamped with (a DNS label). Required against
    a real cluster (node names and pod uids are unique only within one); ``default`` when simulated."""

    def cluster_name(self, real: bool) -> str:
        """The cluster to stamp messages with; ``real``: running against a real cluster (then unset
        is an error, since two clusters left at ``default`` would mix their nodes and pods)."""
        if self.cluster is not None:
            return self.cluster
        if real:
            raise ConfigError("GPULENS_CLUSTER is required against a real cluster: name this cluster with a "
                              "DNS label (e.g. GPULENS_CLUSTER=prod-eu-1), the same for its agents and watcher")
        return DEFAULT_CLUSTER


class AgentSettings(ProducerIdentity):
    node_name: str | None = Field(
        default=None, validation_alias=AliasChoices("GPULENS_NODE_NAME", "node_name", "NODE_NAME")
    )
    """This node's name: ``--node-name``, else ``GPULENS_NODE_NAME``, else ``NODE_NAME`` (downward API)."""
    sample_interval_s: float = Field(default=10.0, ge=1.0, le=3600.0)
    kubelet_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    proc_root: Path = Path("/proc")
    simulate: bool = False
    kubelet_timeout_s: float = Field(default=5.0, gt=0, le=60.0)
    """Deadline of one PodResources gRPC call."""
    gpu_resource_prefixes: list[str] = Field(default_factory=lambda: ["nvidia.com/"])
    """Extended resources whose device ids are GPUs or MIG devices (``nvidia.com/gpu``, ``nvidia.com/mig-*``)."""
    buffer_max_kbytes: int = Field(default=16_384, ge=64)
    """Bound of the local queue while the broker is unreachable; beyond it samples are dropped and counted."""
    buffer_max_messages: int = Field(default=10_000, ge=10)
    nvml_backoff_max_s: float = Field(default=60.0, ge=1.0)
    """Longest wait between NVML (re-)initialisation attempts (exponential backoff from 1 s)."""
    source: Literal["nvml", "dcgm-exporter"] = "nvml"
    """Where GPU readings come from: NVML (default) or the node's dcgm-exporter (no second poller)."""
    dcgm_url: str = "http://127.0.0.1:9400/metrics"
    """The node's dcgm-exporter ``/metrics`` (``source = dcgm-exporter``)."""
    dcgm_timeout_s: float = Field(default=5.0, gt=0, le=60.0)
    """Deadline of one scrape of dcgm-exporter."""
    progress_socket: str = "/var/run/gpulens/progress.sock"
    """Unix datagram socket where pods report training progress (docs/progress.md); empty = off."""
    progress_udp_port: int = Field(default=0, ge=0, le=65535)
    """UDP port for progress from pods that cannot mount the socket (attributed by source pod IP); 0 = off."""
    progress_udp_bind: IPvAnyAddress = IPv4Address("0.0.0.0")
    """Address the progress UDP port listens on."""
    progress_interval_s: float = Field(default=10.0, ge=1.0, le=3600.0)
    """Seconds between two ``workload.progress.v1`` messages of one pod (its totals so far)."""
    progress_max_datagram_bytes: int = Field(default=1024, ge=64, le=65507)
    """Larger progress datagrams are rejected (counted; summarised in the log once per minute)."""
    progress_rate_per_s: float = Field(default=20.0, gt=0, le=10_000)
    """Progress datagrams accepted per second per pod (all its PIDs and addresses together), bursts of twice that."""

    @field_validator("progress_socket")
    @classmethod
    def _socket_path(cls, value: str) -> str:
        if value and (not value.startswith("/") or len(value.encode()) > 107):
            raise ValueError(f"expected an absolute path of at most 107 bytes (or empty: off), got {value!r}")
        return value

    @field_validator("dcgm_url")
    @classmethod
    def _dcgm_url_is_http(cls, value: str) -> str:
        if urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc:
            raise ValueError(f"expected http(s)://host:port/metrics, got {value!r}")
        return value


_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_RESOURCE_NAME = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class DraDriver(BaseModel):
    """One DRA driver whose devices are GPUs, and how its ResourceSlices describe them (docs/dra.md):
    which attribute gives a device's type, UUID, model, MIG profile and parent GPU, which capacity its
    memory, and the extended-resource names its devices count as. Another vendor's driver is one more
    entry of ``GPULENS_DRA_DRIVERS``, not code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    driver: str = Field(pattern=_DNS_SUBDOMAIN, max_length=63)
    """The driver's name as slices and claim results carry it (``spec.driver``), e.g. ``gpu.nvidia.com``."""
    device_classes: dict[Annotated[str, Field(pattern=_DNS_SUBDOMAIN, max_length=253)],
                         Literal["gpu", "partition"]] = Field(default_factory=dict)
    """DeviceClasses known to select this driver's whole GPUs or partitions. A class not listed still
    counts when its CEL selectors name the driver (``device.driver == "..."``)."""
    type_attribute: str | None = "type"
    """The attribute that says what a device is; None: every device of the driver is a whole GPU."""
    gpu_types: tuple[str, ...] = ("gpu",)
    """Values of ``type_attribute`` for a whole GPU."""
    partition_types: tuple[str, ...] = ("mig",)
    """Values of ``type_attribute`` for a partition of a GPU (a MIG device); other values are not GPUs."""
    uuid_attribute: str | None = "uuid"
    model_attribute: str | None = "productName"
    profile_attribute: str | None = "profile"
    """A partition's profile (``1g.10gb``): it names the resource it counts as."""
    parent_uuid_attribute: str | None = "parentUUID"
    memory_capacity: str | None = "memory"
    """The capacity (``devices[].capacity``) holding the device's memory in bytes."""
    gpu_resource: str = Field(default="nvidia.com/gpu", pattern=_RESOURCE_NAME, max_length=253)
    """The extended resource a whole GPU counts as (the device plugin's name)."""
    partition_resource_prefix: str = Field(default="nvidia.com/mig-", max_length=200)
    """A partition counts as this prefix + its profile (``nvidia.com/mig-1g.10gb``)."""


NVIDIA_DRA_DRIVERS: tuple[DraDriver, ...] = (
    DraDriver(driver="gpu.nvidia.com", device_classes={"gpu.nvidia.com": "gpu", "mig.nvidia.com": "partition"}),
)
"""NVIDIA's DRA driver (NVIDIA/k8s-dra-driver-gpu, ``cmd/gpu-kubelet-plugin/deviceinfo.go``): devices of
type ``gpu`` or ``mig`` with ``uuid``, ``productName``, ``profile``, ``parentUUID`` and a ``memory`` capacity."""


class WatcherSettings(ProducerIdentity, KafkaServiceSettings):
    kubeconfig: Path | None = None
    namespaces: list[str] = Field(default_factory=list)
    team_label_keys: list[str] = Field(default_factory=lambda: ["team", "gpulens.io/team"])
    project_label_keys: list[str] = Field(default_factory=lambda: ["project", "gpulens.io/project"])
    extra_gpu_resources: list[str] = Field(default_factory=list)
    simulate: bool = False
    gang_label_keys: list[str] = Field(default_factory=lambda: [
        "scheduling.x-k8s.io/pod-group", "scheduling.k8s.io/group-name", "kueue.x-k8s.io/workload",
        "training.kubeflow.org/job-name", "jobset.sigs.k8s.io/jobset-name"])
    """Label or annotation keys whose value names a pod's gang (first match wins)."""
    watch_timeout_s: int = Field(default=300, ge=1, le=3600)
    """Server-side watch timeout; each watch lasts between this and twice this."""
    events_api: Literal["events.k8s.io", "core"] = "events.k8s.io"
    """Which Event API to watch (the same events either way; both are allowed by the ClusterRole)."""
    kube_context: str | None = None
    state_mark_interval_s: float = Field(default=1.0, gt=0, le=60)
    """How often the watcher writes a state mark for live stream workers (``schemas.control``)."""
    dra_drivers: tuple[DraDriver, ...] = Field(default=NVIDIA_DRA_DRIVERS, max_length=64)
    """``GPULENS_DRA_DRIVERS``: a JSON list of the DRA drivers whose devices are GPUs (docs/dra.md); NVIDIA's
    by default. Each driver once."""

    @field_validator("dra_drivers")
    @classmethod
    def _each_driver_once(cls, value: tuple[DraDriver, ...]) -> tuple[DraDriver, ...]:
        names = [d.driver for d in value]
        if len(set(names)) != len(names):
            raise ValueError(f"each driver once; got {names}")
        return value


@dataclass(frozen=True)
class Bounds:
    """The values a threshold accepts, and their unit."""

    low: float
    high: float | None
    unit: str
    """``%`` (of SM time or of a GPU's memory), ``s`` (seconds), or what a count counts."""

    def __contains__(self, value: float) -> bool:
        return self.low <= value and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"a number >= {self.low:g} ({self.unit})"
        return f"a number from {self.low:g} to {self.high:g} ({self.unit})"


PERCENT = Bounds(0.0, 100.0, "%")
SECONDS = Bounds(0.0, None, "s")

Percent = Annotated[float, PERCENT]
Seconds = Annotated[float, SECONDS]
Restarts = Annotated[float, Bounds(0.0, None, "restarts")]
Intervals = Annotated[float, Bounds(0.0, None, "sample intervals")]


class Thresholds(BaseModel):
    """Alert thresholds of the stream workers (docs/alerts.md): ``GPULENS_THRESHOLDS__<NAME>`` or the
    JSON object ``GPULENS_THRESHOLDS``, and a scenario's ``thresholds``. Each field's type carries its
    :class:`Bounds` (:meth:`bounds`); a duration (seconds) may also be given as ``<name>_s``. An
    unknown name or a value out of its bounds fails validation at that name."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False, use_attribute_docstrings=True)

    idle_util_pct: Percent = 5.0
    """``idle_gpu``: SM utilisation below which a pod's GPU is idle."""
    idle_after: Seconds = 600.0
    """``idle_gpu``: how long a pod's GPU must stay idle."""
    vram_pressure_pct: Percent = 95.0
    """``vram_pressure``, ``noisy_neighbour``: device memory used, of the GPU's total, at or above which
    the GPU is under pressure."""
    vram_pressure_after: Seconds = 60.0
    """``vram_pressure``, ``noisy_neighbour``: how long the pressure must hold."""
    pending_after: Seconds = 300.0
    """``pending_gpu``: how long after its creation a GPU pod (or workload) may wait."""
    fragmentation_after: Seconds = 120.0
    """``fragmentation``: how long a waiting pod no node fits, while the free GPUs add up, may wait."""
    gang_after: Seconds = 300.0
    """``gang_partial``: how long a gang may be partly running."""
    idle_node_after: Seconds = 1800.0
    """``idle_node``: how long a Ready node's GPUs may all be unallocated."""
    crashloop_restarts: Restarts = 3.0
    """``crashloop_gpu``: restarts within ``crashloop_window`` that make a crash loop."""
    crashloop_window: Seconds = 600.0
    """``crashloop_gpu``: the window restarts are counted in, and the quiet time that resolves it."""
    gpu_health_clear_after: Seconds = 300.0
    """``gpu_health``: how long a GPU must stay healthy before its alert resolves."""
    gap_intervals: Intervals = 3.0
    """A silence longer than this many sample intervals is a gap (not idle)."""
    allocator_unused_pct: Percent = 30.0
    """``allocator_fragmentation``: reserved-but-unused VRAM of a pod's caching allocator, as a share
    of the GPU's memory, at or above which the condition holds."""
    allocator_fragmentation_after: Seconds = 300.0
    """``allocator_fragmentation``: how long the condition must hold, and the window in which
    allocation retries or OOMs must occur."""
    mig_fragmentation_after: Seconds = 120.0
    """``mig_fragmentation``: how long a pending MIG pod no empty instance can host, while free slices
    exist, may wait."""
    mig_unused_after: Seconds = 1800.0
    """An empty MIG instance counts as unused slices in the report after this long (no alert)."""
    vram_fragmentation_after: Seconds = 120.0
    """``vram_fragmentation``: how long a pending pod's VRAM need may fit the shared GPUs' free VRAM in
    total but none alone."""

    @classmethod
    def names(cls) -> list[str]:
        return list(cls.model_fields)

    @classmethod
    def bounds(cls, name: str) -> Bounds:
        """What the threshold ``name`` accepts (a field name, without the ``_s`` form)."""
        return next(m for m in cls.model_fields[name].metadata if isinstance(m, Bounds))

    @classmethod
    def durations(cls) -> tuple[str, ...]:
        """The thresholds in seconds (which may be written ``<name>_s``)."""
        return tuple(name for name in cls.model_fields if cls.bounds(name) is SECONDS)

    @classmethod
    def name_of(cls, key: str) -> str | None:
        """The threshold a key names (``idle_after`` or ``idle_after_s``); None if none."""
        if key in cls.model_fields:
            return key
        if key.endswith("_s") and key[:-2] in cls.durations():
            return key[:-2]
        return None

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        names = {key: cls.name_of(str(key)) for key in data}
        unknown = [key for key, name in names.items() if name is None]
        if unknown:
            known = ", ".join(cls.model_fields)
            raise ValidationError.from_exception_data(cls.__name__, [InitErrorDetails(
                type=PydanticCustomError("unknown_threshold", "unknown threshold; known: {known}", {"known": known}),
                loc=(str(key),), input=data[key]) for key in unknown])
        twice = [key for key, name in names.items() if name != key and name in data]
        if twice:
            raise ValidationError.from_exception_data(cls.__name__, [InitErrorDetails(
                type=PydanticCustomError("threshold_twice", "given twice: as {name} and as {key}",
                                         {"name": str(names[key]), "key": str(key)}),
                loc=(str(key),), input=data[key]) for key in twice])
        return {names[key]: value for key, value in data.items()}

    @field_validator("*", mode="after")
    @classmethod
    def _within_bounds(cls, value: float, info: ValidationInfo) -> float:
        bounds = cls.bounds(str(info.field_name))
        if value not in bounds:
            raise PydanticCustomError("threshold_bounds", "expected {bounds}", {"bounds": str(bounds)})
        return value

    def to_dict(self) -> dict[str, float]:
        return self.model_dump()


class WorkerSettings(KafkaServiceSettings):
    stage: Literal["node", "cluster", "all"] = "all"
    window_s: float = Field(default=60.0, ge=1.0)
    sample_interval_s: float = Field(default=10.0, ge=1.0)
    prices_usd_per_gpu_hour: dict[str, float] = Field(default_factory=dict)
    thresholds: Thresholds = Field(default_factory=Thresholds)
    """``GPULENS_THRESHOLDS__<NAME>`` (e.g. ``GPULENS_THRESHOLDS__VRAM_PRESSURE_PCT=90``) or the JSON
    object ``GPULENS_THRESHOLDS``; names, units and bounds: :class:`Thresholds`."""
    web_port: int = Field(default=0, ge=0, le=65535)
    """Port of faust's web server (0 = off, the default: it has no authentication)."""
    web_bind: IPvAnyAddress = IPv4Address("127.0.0.1")
    """Address faust's web server listens on when ``web_port`` is set (loopback unless chosen)."""
    lateness_s: float = Field(default=30.0, ge=0)
    """Allowed lateness: the stages' watermark is each mark's time minus this."""
    max_skew_s: float = Field(default=600.0, gt=0)
    """Inputs whose event time is more than this ahead of the stream's clock (the wall clock live,
    the driver's marks in control mode) go to the dead-letter topic with that reason."""
    state_record_max_bytes: int = Field(default=512 * 1024, ge=1024, le=1_000_000)
    """Largest state record a stage writes to its changelog; larger states are split (the broker's
    default maximum message size is 1 MB)."""
    horizon_s: float = Field(default=86400.0, gt=0)
    """Inputs whose event time is more than this behind the stream's clock are dead-lettered."""
    watermark_source: Literal["clock", "control"] = "clock"
    """``clock``: the worker marks event-time progress from its wall clock (live fleets);
    ``control``: a driver (replay, demo) writes marks to the internal control topic."""
    clock_interval_s: float = Field(default=1.0, gt=0)
    """How often the worker writes a clock mark in ``clock`` mode (a node's alerts wait up to this
    for the next one)."""
    app_id: str | None = None
    """faust application id (consumer group, changelog topic names); default ``<topic_prefix>-stream-jobs``."""
    node_input_partitions: int = Field(default=12, ge=1, le=1024)
    """Partitions of the internal node-inputs topic (the node stage's parallelism); must be the
    partition count of ``gpu.samples.v1``, which the node stage reads partition by partition along
    with node-inputs (the worker creates it so when it is missing and refuses to start otherwise)."""
    read_ahead_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024)
    """Sample bytes a node partition may hold read but not yet released by a mark; beyond this it
    stops fetching its ``gpu.samples.v1`` partition until a mark needs more or releases what it
    holds (a worker catching up a backlog while marks lag behind would otherwise buffer it all)."""
    checkpoint_interval_s: float = Field(default=1.0, ge=0)
    """How often a stage writes its state to its changelog-backed table (and acknowledges what the
    state covers); a crash replays at most this much input. 0 = after every watermark mark."""
    stall_s: float = Field(default=5.0, gt=0)
    """A consumed partition whose next record has not come for this long although the log holds
    it is sought back to it (faust can drop fetched records after a rebalance)."""
    stall_give_up_s: float = Field(default=60.0, gt=0)
    """A partition still stalled after this long ends the worker (exit 70) so that it restarts
    from its checkpoints instead of hanging."""
    group_instance_id: str | None = None
    """Kafka static membership: a restarted worker with the same id takes its partitions back at
    once, without a rebalance (one id per worker process, e.g. the pod name)."""
    fleet_metrics_max_series: int = Field(default=100_000, ge=0, le=10_000_000)
    """Most fleet series (per-pod ``DCGM_FI_*`` / ``gpulens_pod_*``, cluster and team gauges) one
    worker's ``/metrics`` exports; series beyond it are dropped and counted
    (``gpulens_fleet_series_dropped_total``). 0 = no fleet series."""
    accept_clusters: str | None = None
    """``GPULENS_ACCEPT_CLUSTERS``: the only clusters whose records the workers take, a comma list
    (``prod-eu-1,prod-us-2``) or a JSON list of DNS labels; a record of another cluster is a dead
    letter (``unknown_cluster``). Unset or empty: every cluster. Kept as the comma list."""

    @field_validator("accept_clusters", mode="before")
    @classmethod
    def _cluster_list(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str) and value.strip().startswith("["):
            import json

            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("expected a comma list or a JSON list of cluster names") from None
        names = [str(name).strip() for name in value] if isinstance(value, list | tuple) else \
            [name.strip() for name in str(value).split(",")]
        names = [name for name in names if name]
        for name in names:
            try:
                _cluster_name(name)
            except ValueError as exc:
                raise ValueError(f"{name!r}: {exc}") from None
        return ",".join(sorted(set(names))) or None

    def accepted_clusters(self) -> frozenset[str] | None:
        """:attr:`accept_clusters` as a set (None: every cluster)."""
        return None if self.accept_clusters is None else frozenset(self.accept_clusters.split(","))


class SinkSettings(KafkaServiceSettings):
    batch_max_rows: int = Field(default=10_000, ge=1)
    batch_max_age_s: float = Field(default=2.0, gt=0)
    batch_group_max_rows: int = Field(default=10_000, ge=1)
    """The GPU-sample batches of several partitions that are due at once are stored as one insert
    (a group) of up to this many records; a batch larger than this is stored alone."""
    group_id: str = "gpulens-sink"
    raw_sample_ttl_days: int = Field(default=14, ge=1)
    rollup_ttl_days: int = Field(default=730, ge=1)
    state_ttl_days: int = Field(default=400, ge=1)
    """TTL of pods, nodes, events, progress, windows, capacity, lifecycle and alerts."""
    max_future_skew_s: float = Field(default=600.0, gt=0)
    """Records with a time more than this ahead of the sink's clock go to the dead-letter topic
    (``too_far_ahead``) instead of being stored; the stream's own bound (``max_skew_s``) by default.
    A simulated fleet played faster than the wall clock runs ahead of it by design: raise it there."""
    stall_s: float = Field(default=5.0, gt=0)
    """A consumed partition whose next record has not come for this long although the log holds
    it is sought back to it (faust can drop fetched records after a rebalance)."""
    stall_give_up_s: float = Field(default=60.0, gt=0)
    """A partition still stalled after this long ends the worker (exit 70) so that it restarts
    from its checkpoints instead of hanging."""
    group_instance_id: str | None = None
    """Kafka static membership: a restarted sink with the same id resumes its partitions at once."""
    session_timeout_ms: int = Field(default=45_000, ge=6_000)
    retry_initial_s: float = Field(default=0.5, gt=0)
    retry_max_s: float = Field(default=30.0, gt=0)
    prices_usd_per_gpu_hour: dict[str, float] = Field(default_factory=dict)
    """Price table loaded into ClickHouse at start (same variable as the workers')."""
    query_port: int = Field(default=0, ge=0, le=65535)
    """Port of the local read-only query endpoint served for the embedded engine (0 = any free)."""


class AdviseThresholds(BaseModel):
    """Thresholds of the reclaimable-capacity advisor (``gpulens advise``, docs/advise.md).

    Conservative by default: a recommendation needs an hour of evidence, a pod is reclaimed only
    after a whole hour idle, and a right-sized unit keeps 20 % headroom over the observed demand.
    """

    since_s: float = Field(default=7 * 86400.0, gt=0)
    """How far back from the latest data in the store the advisor looks (not from the wall clock)."""
    percentile: float = Field(default=95.0, gt=0, le=100)
    """Percentile of the per-window SM peaks taken as a pod's compute demand (VRAM uses the peak)."""
    headroom_pct: float = Field(default=20.0, ge=0, le=400)
    """Headroom added to the observed VRAM and SM demand before choosing a smaller unit."""
    min_evidence_s: float = Field(default=3600.0, gt=0)
    """Active time a pod (or a node) must have been observed before it gets a right-size (scale-to-zero)."""
    idle_stretch_s: float = Field(default=3600.0, gt=0)
    """Shortest run of wholly idle time buckets that makes a pod a reclaim candidate."""
    bucket_s: float = Field(default=3600.0, ge=60)
    """Time bucket of the reclaim and pack analyses (aligned to the epoch)."""
    idle_util_pct: float = Field(default=5.0, ge=0, le=100)
    """A GPU of a pod whose SM percentile stays below this and that never holds VRAM is unused."""


class AdvisorSettings(CommonSettings):
    """``gpulens report`` and ``gpulens advise``."""

    advise: AdviseThresholds = Field(default_factory=AdviseThresholds)
    """``GPULENS_ADVISE__SINCE_S``, ``__PERCENTILE``, ``__HEADROOM_PCT``, ``__MIN_EVIDENCE_S``,
    ``__IDLE_STRETCH_S``, ``__BUCKET_S``, ``__IDLE_UTIL_PCT``."""
    dead_letters_timeout_s: float = Field(default=3.0, ge=0, le=60)
    """How long the period's dead letters may take to count on Kafka (``<prefix>.deadletter.v1``),
    seconds; 0: not counted (the note says so)."""


class AlertForwardSettings(CommonSettings):
    """``gpulens alerts forward``: alerts.v1 -> Alertmanager's v2 API and/or a JSON webhook."""

    alertmanager_url: str | None = None
    """Alertmanager base URL (``http://alertmanager:9093``); transitions go to ``<url>/api/v2/alerts``."""
    webhook_url: str | None = None
    """A generic webhook: one POST per transition."""
    webhook_format: Literal["json", "slack"] = "json"
    """``json``: the alert as gpulens publishes it, plus ``labels``, ``annotations``; ``slack``: a
    Slack-compatible body (``text`` and ``blocks``) for incoming webhooks."""
    cluster: str = Field(default="default", min_length=1)
    """Value of the ``cluster`` label on every forwarded alert."""
    runbook_base_url: str = Field(default="docs/alerts.md", min_length=1)
    """Where docs/alerts.md is published; ``runbook_url`` is this plus ``#<alert type>``."""
    group_id: str = "gpulens-alerts-forward"
    max_attempts: int = Field(default=20, ge=1, le=1000)
    """Failed deliveries of one transition to one destination before it is dead-lettered."""
    retry_initial_s: float = Field(default=0.5, gt=0)
    retry_max_s: float = Field(default=30.0, gt=0)
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    firing_hold_s: float = Field(default=7 * 86400.0, ge=60)
    """A firing alert is sent with ``endsAt`` this far ahead, so Alertmanager keeps it firing until
    its resolved transition arrives (without it, Alertmanager resolves it after its resolve_timeout)."""
    batch_max_records: int = Field(default=500, ge=1, le=100_000)
    """Records consumed, delivered and then committed together."""

    @model_validator(mode="after")
    def _has_a_destination(self) -> AlertForwardSettings:
        if not self.alertmanager_url and not self.webhook_url:
            raise ValueError("set GPULENS_ALERTMANAGER_URL and/or GPULENS_WEBHOOK_URL (where to deliver alerts)")
        return self

    @field_validator("alertmanager_url", "webhook_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc):
            raise ValueError(f"expected http(s)://host[:port][/path], got {value!r}")
        return value


S = TypeVar("S", bound=CommonSettings)


def _env_name(loc: tuple[int | str, ...]) -> str:
    return ENV_PREFIX + "__".join(str(part).upper() for part in loc)


def load_settings(settings_type: type[S], **overrides: Any) -> S:
    """Build settings from flags (``overrides``; ``None`` means "not given"), env and defaults.

    Raises :class:`ConfigError` naming the environment variable and what it accepts.
    """
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return settings_type(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            if not loc:  # a check across fields: its message names the variables
                problems.append(str(error["msg"]).removeprefix("Value error, "))
                continue
            problems.append(f"{_env_name(loc)}: {error['msg']} (got {error.get('input')!r})")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
    except SettingsError as exc:
        # raised before validation when a structured variable (dict/list) is not valid JSON
        field = str(exc).split('"')[1] if str(exc).count('"') >= 2 else "?"
        raise ConfigError(f"invalid configuration: {_env_name((field,))}: not valid JSON; give a JSON object or "
                          f'list, e.g. {{"NVIDIA H100 80GB HBM3": 2.5}}') from None


def redacted(settings: BaseSettings) -> dict[str, Any]:
    """Settings as plain data with every secret masked, for ``gpulens config show``."""
    data = settings.model_dump(mode="json")
    clickhouse = data.get("clickhouse", {})
    if clickhouse.get("url"):
        clickhouse["url"] = ClickHouseTarget.parse(clickhouse["url"]).masked
    return data
