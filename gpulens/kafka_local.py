"""A real single-node Apache Kafka (KRaft) on 127.0.0.1 for the embedded default and the tests.

``gpulens kafka up`` resolves Kafka's jars from Maven Central with ``mvn`` (``kafka_2.13`` plus a
reload4j logging binding) into a cache directory, formats KRaft storage once, starts a combined
broker+controller in its own process session, and waits until it answers. The pid file makes
``up`` idempotent and lets ``down`` stop it cleanly from another shell.

With :class:`LocalSasl` the same broker authenticates every client with SASL/SCRAM-SHA-256 (the
credentials are formatted into the KRaft storage, ``kafka-storage format --add-scram``) and
authorizes it with the StandardAuthorizer: no ACL, no access, except for the admin super user.
That is how the per-component principals and their ACLs (:mod:`gpulens.kafka_acls`) are tested.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from common.errors import UserError
from common.kafka import broker_reachable
from common.processes import pid_alive
from common.settings import CommonSettings, KafkaSettings

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
class LocalKafka:
    """Paths and ports of one local broker. ``home`` holds data, config, logs and the pid file."""

    home: Path
    cache: Path
    version: str = "3.9.1"
    port: int = 9092
    controller_port: int = 9093
    heap_mb: int = 512
    sasl: LocalSasl | None = None
    """SASL/SCRAM with the StandardAuthorizer (ACLs); ``None``: PLAINTEXT, no authorization."""

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
        )

    @property
    def libs(self) -> Path:
        return self.cache / f"kafka_{SCALA}-{self.version}" / "libs"

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "server.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

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
        """Start the broker unless it already runs; returns a one-line status."""
        pid = self.running_pid()
        if pid is not None and _port_open(self.port):
            return f"Kafka {self.version} already running on {self.bootstrap} (pid {pid})"
        if pid is not None:
            running_port = self._configured_port()
            if running_port is not None and running_port != self.port:
                raise UserError(
                    f"the broker gpulens started from {self.home} (pid {pid}) listens on port {running_port}, "
                    f"not {self.port}; use that port (GPULENS_LOCAL_KAFKA__PORT={running_port}), stop it with "
                    "`gpulens kafka down`, or choose another GPULENS_DATA_DIR"
                )
            return f"Kafka {self.version} is starting on {self.bootstrap} (pid {pid}); try again shortly"
        if pid is None and _port_open(self.port):
            return f"a broker already answers on {self.bootstrap}; using it (not started by gpulens)"
        self._require_tools()
        self.fetch(progress=progress)
        self._write_config()
        self._format_storage()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.home / "logs" / "stdout.log", "ab") as out:
            process = subprocess.Popen(
                self._java_command("kafka.Kafka", str(self.home / "server.properties")),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self._java_env(),
            )
        self.pid_file.write_text(str(process.pid))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise UserError(
                    f"Kafka exited with status {process.returncode} while starting; "
                    f"see {self.home / 'logs'}"
                )
            if _port_open(self.port) and self._ready():
                return f"Kafka {self.version} started on {self.bootstrap} (pid {process.pid})"
            time.sleep(0.5)
        self.down()
        raise UserError(f"Kafka did not answer on {self.bootstrap} within {timeout_s:.0f}s; see {self.log_file}")

    def down(self, timeout_s: float = 30.0) -> str:
        pid = self.running_pid()
        if pid is None:
            return "Kafka is not running (nothing started by gpulens)"
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return f"Kafka stopped (pid {pid})"

    def stop(self) -> None:
        """Stop the broker (a chaos replay's outage: ``simulation.kafka_replay.BrokerControl``);
        refuses when no broker started by gpulens runs (an outage that stops nothing tests nothing)."""
        if self.running_pid() is None:
            raise UserError(f"no broker started by gpulens runs from {self.home}: nothing to stop")
        self.down()

    def start(self) -> None:
        """Start it again, on the same data."""
        self.up(progress=False)

    def status(self) -> str:
        pid = self.running_pid()
        if pid is not None:
            state = "answering" if _port_open(self.port) else "starting or unhealthy"
            return f"Kafka {self.version}: running (pid {pid}) on {self.bootstrap}, {state}"
        if _port_open(self.port):
            return f"a broker not started by gpulens answers on {self.bootstrap}"
        return "Kafka: not running"

    def _configured_port(self) -> int | None:
        try:
            for line in (self.home / "server.properties").read_text().splitlines():
                if line.startswith("listeners="):
                    return int(line.split("PLAINTEXT://", 1)[1].split(",", 1)[0].rsplit(":", 1)[1])
        except (OSError, IndexError, ValueError):
            return None
        return None

    def answering(self) -> bool:
        """Whether any broker (ours or not) accepts connections on our port."""
        return _port_open(self.port)

    def running_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if pid_alive(pid) else None

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

    def _listener_config(self) -> list[str]:
        if self.sasl is None:
            return [
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            ]
        sasl = self.sasl
        admin, password = sasl.admin, sasl.password(sasl.admin)
        scram = sasl.mechanism.lower()
        return [
            f"listeners=SASL_PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=SASL_PLAINTEXT://127.0.0.1:{self.port}",
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

    def _write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "server.properties").write_text(
            "\n".join([
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                *self._listener_config(),
                f"log.dirs={self.home / 'data'}",
                "num.partitions=3",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=12",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=true",
                "log.retention.hours=72",
                "log.segment.bytes=67108864",
                "",
            ])
        )
        (self.home / "log4j.properties").write_text(_LOG4J.format(log=self.log_file))

    def _format_storage(self) -> None:
        if (self.home / "data" / "meta.properties").exists():
            return
        cluster_id = _cluster_id()
        scram: list[str] = []
        if self.sasl is not None:
            for name, password in self.sasl.users:
                scram += ["--add-scram", f"{self.sasl.mechanism}=[name={name},password={password}]"]
        result = subprocess.run(
            self._java_command("kafka.tools.StorageTool", "format", "-t", cluster_id,
                               "-c", str(self.home / "server.properties"), *scram),
            capture_output=True, text=True, check=False, env=self._java_env(),
        )
        if result.returncode != 0:
            raise UserError(f"formatting KRaft storage failed:\n{(result.stdout + result.stderr)[-2000:]}")

    def _java_command(self, main_class: str, *args: str) -> list[str]:
        return [
            "java", f"-Xmx{self.heap_mb}m", f"-Xms{min(self.heap_mb, 256)}m",
            "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.home / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.home / 'logs'}",
            "-cp", f"{self.libs}/*", main_class, *args,
        ]

    def _java_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("CLASSPATH", None)
        return env

    def _ready(self) -> bool:
        return broker_reachable(self.client(), timeout_s=2.0)


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
