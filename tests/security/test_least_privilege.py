"""Least privilege by default, offline: the ACL table agrees with what the code reads and writes
and with docs/operations.md, and ``/metrics`` listens on loopback unless a service is told
otherwise (``GPULENS_METRICS_ADDR``), in every service that serves it."""

from __future__ import annotations

import ast
import re
import socket
import urllib.request
from ipaddress import IPv4Address

import pytest

from common.metrics import MetricsRegistry
from common.settings import CommonSettings, ConfigError, load_settings
from gpulens.kafka_acls import (
    AGENT_WRITES,
    SINK_READS,
    WORKER_INPUTS,
    component_access,
    kafka_acls_commands,
)
from tests.conftest import REPO_ROOT

OPERATIONS = REPO_ROOT / "docs" / "operations.md"


def test_the_acl_table_follows_what_the_code_reads() -> None:
    from sinks.rows import SINK_TOPICS
    from stream_jobs.pipeline import INPUT_TOPICS

    assert set(WORKER_INPUTS) == set(INPUT_TOPICS)
    assert set(SINK_READS) == set(SINK_TOPICS)


def test_the_agent_writes_the_topics_its_service_produces() -> None:
    source = (REPO_ROOT / "producers" / "agent" / "service.py").read_text()
    produced = set(re.findall(r"\b([A-Z_]+)\.name\(settings\.topic_prefix\)", source))
    assert produced == {spec_name for spec_name, spec in _topic_constants().items() if spec in AGENT_WRITES}


def _topic_constants() -> dict[str, object]:
    import schemas.topics as topics

    return {name: value for name, value in vars(topics).items() if isinstance(value, topics.TopicSpec)}


def test_docs_give_exactly_the_acls_of_the_table() -> None:
    text = OPERATIONS.read_text()
    match = re.search(r"<!-- acls:begin -->\n```bash\n(.*?)\n```\n<!-- acls:end -->", text, re.S)
    assert match, "docs/operations.md has no ACL block between <!-- acls:begin --> and <!-- acls:end -->"
    assert match.group(1) == "\n".join(kafka_acls_commands(component_access())), (
        "docs/operations.md's ACLs differ from gpulens.kafka_acls.component_access: regenerate the block")
    for component in component_access().values():
        assert f"`{component.principal}`" in text, f"the principals table misses {component.principal}"


def test_security_model_section_names_every_dead_letter_reason() -> None:
    text = OPERATIONS.read_text()
    section = text.split("## Security model", 1)[1].split("\n## ", 1)[0]
    for code in ("invalid", "too_large", "out_of_range", "inconsistent", "too_old", "too_far_ahead",
                 "unknown_cluster", "unappliable", "rejected_by_store", "undeliverable"):
        assert f"`{code}`" in section, code
    for needle in ("GPULENS_ACCEPT_CLUSTERS", "truncated", "Slack", "control characters", "bound parameter"):
        assert needle in section, needle


# --------------------------------------------------------------------------- /metrics address


def test_metrics_listen_on_loopback_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULENS_METRICS_ADDR", raising=False)
    assert load_settings(CommonSettings).metrics_addr == IPv4Address("127.0.0.1")
    registry = MetricsRegistry()
    registry.counter("probe", "a probe").inc()
    port = registry.serve(0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert b"gpulens_probe_total 1.0" in response.read()
    address = _non_loopback_address()
    if address is not None:  # another interface of this machine does not reach it
        with socket.socket() as sock:
            sock.settimeout(2)
            assert sock.connect_ex((address, port)) != 0, f"/metrics answers on {address}"


def test_the_metrics_address_is_a_validated_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_METRICS_ADDR", "0.0.0.0")
    settings = load_settings(CommonSettings)
    port = MetricsRegistry().serve(0, settings.metrics_addr)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
    monkeypatch.setenv("GPULENS_METRICS_ADDR", "every-interface")
    with pytest.raises(ConfigError, match="GPULENS_METRICS_ADDR"):
        load_settings(CommonSettings)


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the route picks the interface
            address = str(sock.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def _serve_calls() -> list[tuple[str, ast.Call]]:
    calls = []
    for package in ("producers", "stream_jobs", "sinks", "gpulens", "common"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "serve"
                        and node.args and "metrics_port" in ast.unparse(node.args[0])):
                    calls.append((path.relative_to(REPO_ROOT).as_posix(), node))
    return calls


def test_every_service_serves_metrics_on_its_address_setting() -> None:
    """Each service that serves ``/metrics`` on ``settings.metrics_port`` passes
    ``settings.metrics_addr`` with it: a call without it would listen on loopback only, and
    Prometheus could not scrape the pod the manifests configured with 0.0.0.0."""
    calls = _serve_calls()
    assert len(calls) >= 5, [where for where, _call in calls]
    missing = [where for where, call in calls
               if not any("metrics_addr" in ast.unparse(arg)
                          for arg in [*call.args[1:], *(keyword.value for keyword in call.keywords)])]
    assert missing == [], f"serve(settings.metrics_port) without settings.metrics_addr in {missing}"
