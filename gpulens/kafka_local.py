"""A real Apache Kafka (KRaft) on 127.0.0.1 for the embedded default and the tests: one broker, or
a cluster of three that replicates every topic.

``gpulens kafka up`` resolves Kafka's jars from Maven Central with ``mvn`` (``kafka_2.13`` plus a
reload4j logging binding) into a cache directory, formats KRaft storage once, starts a combined
broker+controller in its own process session, and waits until it answers. The pid file makes
``up`` idempotent and lets ``down`` stop it cleanly from another shell.

``gpulens kafka up --brokers 3`` runs three such nodes (node ids 1 to 3), each its own process
with its own data directory (``<data dir>/kafka/node-<id>``), all three voters of the KRaft
quorum; node ``i`` listens on ``port + 2i`` for clients and ``controller_port + 2i`` for the quorum
(:func:`common.settings.local_kafka_ports`). Internal topics get 3 replicas and every topic
``min.insync.replicas`` 2, so the cluster keeps accepting ``acks=all`` writes with one node down.
:meth:`LocalKafka.kill_node` and :meth:`LocalKafka.start_node` crash (SIGKILL) and restart one
node: the chaos tests' leader failovers.

With :class:`LocalSasl` the same broker authenticates every client with SASL/SCRAM-SHA-256 (the
credentials are formatted into the KRaft storage, ``kafka-storage format --add-scram``) and
authorizes it with the StandardAuthorizer: no ACL, no access, except for the admin super user.
That is how the per-component principals and their ACLs (:mod:`gpulens.kafka_acls`) are tested.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from common.errors import UserError
from common.kafka import KafkaException, broker_reachable, cluster_metadata
from common.processes import pid_alive
from common.settings import (
    LOCAL_KAFKA_BROKERS,
    CommonSettings,
    KafkaSettings,
    check_local_kafka_ports,
    local_kafka_ports,
)

SCALA = "2.13"
SLF4J_VERSION = "1.7.36"
RELOAD4J_VERSION = "1.2.25"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.gpulens</groupId><artifactId>local-kafka</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_{scala}</artifactId>
      <version>{version}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId>
      <version>{slf4j}</version></dependency>
    <dependency><groupId>ch.qos.reload4j</groupId><artifactId>reload4j</artifactId>
      <version>{reload4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J = """log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File={log}
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=INFO
"""


@dataclass(frozen=True)
class LocalSasl:
    """SASL/SCRAM and ACLs on the local broker: ``users`` are (name, password) pairs of SCRAM-SHA-256
    principals, formatted into the storage; ``admin`` (one of them) is the only super user. The
    controller listener (loopback) authenticates the admin with SASL/PLAIN."""

    users: tuple[tuple[str, str], ...]
    admin: str = "admin"
    mechanism: str = "SCRAM-SHA-256"

    def __post_init__(self) -> None:
        names = [name for name, _password in self.users]
        if self.admin not in names:
            raise ValueError(f"the admin {self.admin!r} must be one of the users")
        for name, password in self.users:
            if not name or not password or any(c in name + password for c in '",[]=\\ '):
                raise ValueError(f"user {name!r}: names and passwords without spaces, quotes, commas, = or brackets")

    def password(self, user: str) -> str:
        return dict(self.users)[user]


@dataclass(frozen=True)
class LocalNode:
    """One node (a combined broker and KRaft controller) of the local cluster."""

    index: int
    home: Path
    """Its data, config, logs and pid file."""
    port: int
    controller_port: int

    @property
    def node_id(self) -> int:
        """Its Kafka ``node.id`` (the broker id in metadata): 1, 2, 3."""
        return self.index + 1

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "server.log"

    def running_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def configured_port(self) -> int | None:
        """The client port its written config listens on (None: no config yet)."""
        try:
            for line in (self.home / "server.properties").read_text().splitlines():
                if line.startswith("listeners="):
                    return int(line.split("://", 1)[1].split(",", 1)[0].rsplit(":", 1)[1])
        except (OSError, IndexError, ValueError):
            return None
        return None


@dataclass(frozen=True)
class LocalKafka:
    """Paths and ports of the local broker, or of the local cluster (``brokers`` 3). ``home`` holds
    the data, config, logs and pid file of the single broker, and a directory per node of a cluster."""

    home: Path
    cache: Path
    version: str = "3.9.1"
    port: int = 9092
    controller_port: int = 9093
    heap_mb: int = 512
    sasl: LocalSasl | None = None
    """SASL/SCRAM with the StandardAuthorizer (ACLs); ``None``: PLAINTEXT, no authorization."""
    brokers: int = 1
    """1: a single broker; 3: three nodes replicating every topic."""

    def __post_init__(self) -> None:
        if self.brokers not in LOCAL_KAFKA_BROKERS:
            raise UserError(f"a local Kafka has 1 or 3 brokers, not {self.brokers} (GPULENS_LOCAL_KAFKA__BROKERS)")
        try:
            check_local_kafka_ports(self.port, self.controller_port, self.brokers)
        except ValueError as exc:
            raise UserError(str(exc)) from None

    @classmethod
    def from_settings(cls, settings: CommonSettings) -> LocalKafka:
        lk = settings.local_kafka
        return cls(
            home=settings.data_dir / "kafka",
            cache=lk.cache_dir,
            version=lk.version,
            port=lk.port,
            controller_port=lk.controller_port,
            heap_mb=lk.heap_mb,
            brokers=lk.brokers,
        )

    @property
    def nodes(self) -> list[LocalNode]:
        """The nodes: the single broker lives in ``home`` itself, a cluster's node ``i`` in ``home/node-<i+1>``."""
        ports = local_kafka_ports(self.port, self.controller_port, self.brokers)
        if self.brokers == 1:
            return [LocalNode(0, self.home, *ports[0])]
        return [LocalNode(i, self.home / f"node-{i + 1}", port, controller)
                for i, (port, controller) in enumerate(ports)]

    @property
    def libs(self) -> Path:
        return self.cache / f"kafka_{SCALA}-{self.version}" / "libs"

    @property
    def pid_file(self) -> Path:
        """The pid file of the (first) node."""
        return self.nodes[0].pid_file

    @property
    def log_file(self) -> Path:
        """The broker log of the (first) node."""
        return self.nodes[0].log_file

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    @property
    def what(self) -> str:
        """How messages name it: ``Kafka 3.9.1`` or ``Kafka 3.9.1 (3 brokers)``."""
        return f"Kafka {self.version}" + ("" if self.brokers == 1 else f" ({self.brokers} brokers)")

    def client(self, user: str | None = None) -> KafkaSettings:
        """The connection settings of a client of this broker: as ``user`` (default: the admin)
        when it runs with SASL, PLAINTEXT otherwise."""
        if self.sasl is None:
            return KafkaSettings(bootstrap_servers=self.bootstrap)
        name = user or self.sasl.admin
        return KafkaSettings(bootstrap_servers=self.bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism=self.sasl.mechanism,  # type: ignore[arg-type]
                             sasl_username=name, sasl_password=SecretStr(self.sasl.password(name)))

    # ------------------------------------------------------------------ lifecycle

    def up(self, timeout_s: float = 90.0, progress: bool = True) -> str:
        """Start the broker (every node of the cluster) unless it already runs; returns a one-line status."""
        self._refuse_another_size()
        pids = [node.running_pid() for node in self.nodes]
        running = self._already_running(pids)
        if running is not None:
            return running
        self._require_tools()
        self.fetch(progress=progress)
        started = {node.index: self._launch(node) for node, pid in zip(self.nodes, pids, strict=True) if pid is None}
        return self._wait_started(started, timeout_s)

    def _already_running(self, pids: list[int | None]) -> str | None:
        """What ``up`` says when it has nothing to start (None: start the nodes without a pid);
        raises when the ports are another process's or another config's."""
        nodes = self.nodes
        if all(pid is not None and _port_open(node.port) for node, pid in zip(nodes, pids, strict=True)):
            return f"{self.what} already running on {self.bootstrap} ({_pids(pids)})"
        for node, pid in zip(nodes, pids, strict=True):
            running_port = node.configured_port() if pid is not None else None
            if running_port is not None and running_port != node.port:
                raise UserError(
                    f"the broker gpulens started from {node.home} (pid {pid}) listens on port {running_port}, "
                    f"not {node.port}; use that port (GPULENS_LOCAL_KAFKA__PORT={running_port - 2 * node.index}), "
                    "stop it with `gpulens kafka down`, or choose another GPULENS_DATA_DIR"
                )
        if self.brokers == 1 and pids[0] is not None:
            return f"{self.what} is starting on {self.bootstrap} (pid {pids[0]}); try again shortly"
        if self.brokers == 1 and _port_open(self.port):
            return f"a broker already answers on {self.bootstrap}; using it (not started by gpulens)"
        taken = [node.port for node, pid in zip(nodes, pids, strict=True) if pid is None and _port_open(node.port)]
        if taken:
            raise UserError(f"port(s) {', '.join(map(str, taken))} of the {self.brokers}-broker cluster are taken by "
                            "a process gpulens did not start: choose other ports (GPULENS_LOCAL_KAFKA__PORT, "
                            "__CONTROLLER_PORT) or stop it")
        return None

    def _wait_started(self, started: dict[int, subprocess.Popen[bytes]], timeout_s: float) -> str:
        """Until every node answers and the cluster lists them all; stops everything on a failure."""
        nodes = self.nodes
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for index, process in started.items():
                if process.poll() is not None:
                    nodes[index].pid_file.unlink(missing_ok=True)
                    self.down()
                    raise UserError(
                        f"Kafka exited with status {process.returncode} while starting; "
                        f"see {nodes[index].home / 'logs'}"
                    )
            if all(_port_open(node.port) for node in nodes) and self._ready():
                now = [node.running_pid() for node in nodes]
                return f"{self.what} started on {self.bootstrap} ({_pids(now)})"
            time.sleep(0.5)
        self.down()
        raise UserError(f"Kafka did not answer on {self.bootstrap} within {timeout_s:.0f}s; see {self.log_file}")

    def down(self, timeout_s: float = 30.0) -> str:
        """Stop every node gpulens started from ``home`` (whatever the cluster's size): SIGTERM, then
        SIGKILL what is still running after ``timeout_s``."""
        pids = [pid for node in self._every_node() if (pid := node.running_pid()) is not None]
        if not pids:
            return "Kafka is not running (nothing started by gpulens)"
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
            time.sleep(0.2)
        for pid in pids:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        for node in self._every_node():
            node.pid_file.unlink(missing_ok=True)
        return f"Kafka stopped ({_pids(pids)})"

    def stop(self) -> None:
        """Stop the broker (a chaos replay's outage: ``simulation.kafka_replay.BrokerControl``);
        refuses when no broker started by gpulens runs (an outage that stops nothing tests nothing)."""
        if self.running_pid() is None:
            raise UserError(f"no broker started by gpulens runs from {self.home}: nothing to stop")
        self.down()

    def start(self) -> None:
        """Start it again, on the same data."""
        self.up(progress=False)

    def kill_node(self, index: int) -> int:
        """SIGKILL node ``index`` (0-based; its broker id is ``index + 1``): a crash, no controlled
        shutdown. Returns its pid; refuses when it does not run."""
        node = self.nodes[index]
        pid = node.running_pid()
        if pid is None:
            raise UserError(f"node {node.node_id} of the local Kafka does not run: nothing to kill")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        node.pid_file.unlink(missing_ok=True)
        return pid

    def start_node(self, index: int, timeout_s: float = 90.0) -> int:
        """Start node ``index`` again on its data and wait until the cluster lists it; its pid."""
        node = self.nodes[index]
        if node.running_pid() is not None:
            raise UserError(f"node {node.node_id} of the local Kafka runs already")
        process = self._launch(node)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                node.pid_file.unlink(missing_ok=True)
                raise UserError(f"node {node.node_id} exited with status {process.returncode} while starting; "
                                f"see {node.home / 'logs'}")
            if _port_open(node.port) and self._everyone_sees_everyone():
                return process.pid
            time.sleep(0.2)
        raise UserError(f"node {node.node_id} did not rejoin within {timeout_s:.0f}s; see {node.log_file}")

    def broker_ids(self, timeout_s: float = 2.0, node: LocalNode | None = None) -> set[int]:
        """The brokers the cluster's metadata lists now (registered and not fenced), as any node
        or as ``node`` sees them."""
        client = self.client()
        if node is not None:
            client = client.model_copy(update={"bootstrap_servers": f"127.0.0.1:{node.port}"})
        try:
            return {int(broker_id) for broker_id in cluster_metadata(client, timeout_s).brokers}
        except KafkaException:
            return set()

    def _everyone_sees_everyone(self) -> bool:
        """Whether each node's metadata lists every node: a client asking any of them (``auto``
        replication counts the brokers it is told of) gets the whole cluster."""
        everyone = {node.node_id for node in self.nodes}
        return all(self.broker_ids(node=node) == everyone for node in self.nodes)

    def status(self) -> str:
        for size in LOCAL_KAFKA_BROKERS:
            other = self._sized(size)
            if size != self.brokers and other is not None and any(n.running_pid() for n in other.nodes):
                return other.status()
        if self.brokers == 1:
            pid = self.running_pid()
            if pid is not None:
                state = "answering" if _port_open(self.port) else "starting or unhealthy"
                return f"{self.what}: running (pid {pid}) on {self.bootstrap}, {state}"
            if _port_open(self.port):
                return f"a broker not started by gpulens answers on {self.bootstrap}"
            return "Kafka: not running"
        lines = [f"{self.what} on {self.bootstrap}:"]
        for node in self.nodes:
            pid = node.running_pid()
            state = ("answering" if _port_open(node.port) else "starting or unhealthy") if pid is not None else (
                "port taken by a process gpulens did not start" if _port_open(node.port) else "not running")
            lines.append(f"  node {node.node_id} 127.0.0.1:{node.port}: "
                         + (f"running (pid {pid}), {state}" if pid is not None else state))
        return "\n".join(lines)

    def answering(self) -> bool:
        """Whether any broker (ours or not) accepts connections on our (first) port."""
        return _port_open(self.port)

    def running_pid(self) -> int | None:
        """The pid of the (first running) node; None when none runs."""
        return next((pid for node in self.nodes if (pid := node.running_pid()) is not None), None)

    def _sized(self, size: int) -> LocalKafka | None:
        """This local Kafka with ``size`` brokers (None: its ports cannot hold that many)."""
        try:
            return dataclasses.replace(self, brokers=size, sasl=None)
        except UserError:
            return None

    def _every_node(self) -> list[LocalNode]:
        """The nodes of every cluster size that may have been started from ``home``."""
        return [node for size in LOCAL_KAFKA_BROKERS if (sized := self._sized(size)) is not None
                for node in sized.nodes]

    def _refuse_another_size(self) -> None:
        for size in LOCAL_KAFKA_BROKERS:
            other = self._sized(size)
            if size == self.brokers or other is None:
                continue
            if any(node.running_pid() is not None for node in other.nodes):
                raise UserError(f"a local Kafka of {size} broker(s) started from {self.home} runs; stop it with "
                                f"`gpulens kafka down` first, or use it (`gpulens kafka up --brokers {size}`)")

    def _launch(self, node: LocalNode) -> subprocess.Popen[bytes]:
        """Write the node's config, format its storage once, start it in its own session."""
        self._write_config(node)
        self._format_storage(node)
        node.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(node.home / "logs" / "stdout.log", "ab") as out:
            process = subprocess.Popen(
                self._java_command(node, "kafka.Kafka", str(node.home / "server.properties")),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self._java_env(),
            )
        node.pid_file.write_text(str(process.pid))
        return process

    # ------------------------------------------------------------------ setup

    def fetch(self, progress: bool = True) -> Path:
        """Resolve the broker's jars with Maven (cached after the first run)."""
        marker = self.libs / ".complete"
        if marker.exists():
            return self.libs
        self._require_tools()
        work = self.libs.parent
        work.mkdir(parents=True, exist_ok=True)
        (work / "pom.xml").write_text(
            _POM.format(scala=SCALA, version=self.version, slf4j=SLF4J_VERSION, reload4j=RELOAD4J_VERSION)
        )
        if progress:
            print(f"fetching Apache Kafka {self.version} (Scala {SCALA}) with mvn into {self.libs} ...", flush=True)
        result = subprocess.run(
            ["mvn", "-B", "-q", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
             f"-DoutputDirectory={self.libs}", "-DincludeScope=runtime"],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise UserError(f"mvn could not fetch Kafka {self.version}:\n{(result.stdout + result.stderr)[-2000:]}")
        marker.touch()
        return self.libs

    def _require_tools(self) -> None:
        missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
        if missing:
            raise UserError(
                f"{' and '.join(missing)} not found: the local broker needs Java 17+ and Maven. "
                "Alternatives: point gpulens at an existing broker with "
                "GPULENS_KAFKA__BOOTSTRAP_SERVERS=host:port, or run `docker compose up kafka`."
            )

    def _listener_config(self, node: LocalNode) -> list[str]:
        if self.sasl is None:
            return [
                f"listeners=PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            ]
        sasl = self.sasl
        admin, password = sasl.admin, sasl.password(sasl.admin)
        scram = sasl.mechanism.lower()
        return [
            f"listeners=SASL_PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            f"advertised.listeners=SASL_PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            # clients and the broker itself: SCRAM, credentials in the cluster metadata
            f"sasl.enabled.mechanisms={sasl.mechanism}",
            f"sasl.mechanism.inter.broker.protocol={sasl.mechanism}",
            f"listener.name.sasl_plaintext.{scram}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{admin}" password="{password}";',
            # the controller listener: PLAIN with the admin alone (SCRAM needs the metadata it serves)
            "sasl.mechanism.controller.protocol=PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
            "listener.name.controller.plain.sasl.jaas.config="
            f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{admin}" '
            f'password="{password}" user_{admin}="{password}";',
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users=User:{admin}",
            "allow.everyone.if.no.acl.found=false",
        ]

    def _replication_config(self) -> list[str]:
        """One broker: one replica of everything. A cluster: 3 replicas of every internal topic and
        of topics created without a factor, and ``min.insync.replicas`` 2 (one node may be down)."""
        if self.brokers == 1:
            return ["offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1"]
        return [f"offsets.topic.replication.factor={self.brokers}",
                f"transaction.state.log.replication.factor={self.brokers}",
                "transaction.state.log.min.isr=2",
                f"default.replication.factor={self.brokers}",
                "min.insync.replicas=2"]

    def _write_config(self, node: LocalNode) -> None:
        node.home.mkdir(parents=True, exist_ok=True)
        voters = ",".join(f"{other.node_id}@127.0.0.1:{other.controller_port}" for other in self.nodes)
        (node.home / "server.properties").write_text(
            "\n".join([
                "process.roles=broker,controller",
                f"node.id={node.node_id}",
                f"controller.quorum.voters={voters}",
                *self._listener_config(node),
                f"log.dirs={node.home / 'data'}",
                "num.partitions=3",
                *self._replication_config(),
                "offsets.topic.num.partitions=12",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=true",
                "log.retention.hours=72",
                "log.segment.bytes=67108864",
                "",
            ])
        )
        (node.home / "log4j.properties").write_text(_LOG4J.format(log=node.log_file))

    def _cluster_id(self) -> str:
        """The cluster's id: every node's storage is formatted with the same one (kept in ``home``)."""
        if self.brokers == 1:
            return _cluster_id()
        path = self.home / "cluster.id"
        if not path.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            path.write_text(_cluster_id())
        return path.read_text().strip()

    def _format_storage(self, node: LocalNode) -> None:
        if (node.home / "data" / "meta.properties").exists():
            return
        scram: list[str] = []
        if self.sasl is not None:
            for name, password in self.sasl.users:
                scram += ["--add-scram", f"{self.sasl.mechanism}=[name={name},password={password}]"]
        result = subprocess.run(
            self._java_command(node, "kafka.tools.StorageTool", "format", "-t", self._cluster_id(),
                               "-c", str(node.home / "server.properties"), *scram),
            capture_output=True, text=True, check=False, env=self._java_env(),
        )
        if result.returncode != 0:
            raise UserError(f"formatting KRaft storage failed:\n{(result.stdout + result.stderr)[-2000:]}")

    def _java_command(self, node: LocalNode, main_class: str, *args: str) -> list[str]:
        return [
            "java", f"-Xmx{self.heap_mb}m", f"-Xms{min(self.heap_mb, 256)}m",
            "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{node.home / 'log4j.properties'}",
            f"-Dkafka.logs.dir={node.home / 'logs'}",
            "-cp", f"{self.libs}/*", main_class, *args,
        ]

    def _java_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("CLASSPATH", None)
        return env

    def _ready(self) -> bool:
        if self.brokers == 1:
            return broker_reachable(self.client(), timeout_s=2.0)
        return self._everyone_sees_everyone()


def _pids(pids: Sequence[int | None]) -> str:
    known = [str(pid) for pid in pids if pid is not None]
    return f"pid {known[0]}" if len(known) == 1 else f"pids {', '.join(known)}"


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _cluster_id() -> str:
    """A random KRaft cluster id (base64url of a UUID, as ``kafka-storage random-uuid`` prints).

    One in 64 such ids starts with ``-``, which the storage tool's argument parser takes for an
    option ("expected one argument"); Kafka's own generator skips those, and so does this.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
