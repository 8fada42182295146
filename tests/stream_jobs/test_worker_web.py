"""faust's web server of ``gpulens worker`` (no authentication): off by default, and when a port is
set it listens on loopback only — not reachable through the machine's other addresses."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from common.settings import CommonSettings, KafkaSettings, WorkerSettings, load_settings
from simulation.kafka_replay import WorkerProcess, child_env
from tests.child_process import free_port


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the LISTEN sockets on ``port`` (Linux /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A = LISTEN
                found.add(address)
    return found


def _other_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


def test_web_server_is_off_by_default() -> None:
    settings = load_settings(WorkerSettings)
    assert settings.web_port == 0
    assert str(settings.web_bind) == "127.0.0.1"


@pytest.mark.kafka
def test_worker_web_server_listens_on_loopback_only(kafka_settings: KafkaSettings, topic_prefix: str,
                                                    tmp_path: Path) -> None:
    port = free_port()
    settings = load_settings(CommonSettings, kafka=kafka_settings.model_dump(), data_dir=tmp_path)
    env = child_env(settings, topic_prefix, tmp_path, {"GPULENS_WEB_PORT": str(port),
                                                        "GPULENS_APP_ID": f"{topic_prefix}-web"})
    worker = WorkerProcess(env, tmp_path / "worker.log")
    worker.start()
    try:
        deadline = time.monotonic() + 90
        while True:
            assert worker.alive(), worker.tail()
            assert time.monotonic() < deadline, "the web server never came up\n" + worker.tail()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.3)
        # loopback in hex, as /proc/net/tcp writes it (little-endian): 127.0.0.1
        assert _listening_addresses(port) == {"0100007F"}, _listening_addresses(port)
        other = _other_address()
        if other is not None:
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()
    finally:
        worker.stop()
