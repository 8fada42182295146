"""docker-compose.yml against the code: the configuration names and values each gpulens service
receives are real settings, ports agree with the defaults (Kafka 9092, ClickHouse 8123, one
metrics port), Kafka runs in KRaft mode at the version the local broker uses, the services start
in the right order, and Grafana's provisioned data source points at the compose ClickHouse.
Least privilege by default: every published port listens on loopback only, Grafana reads
ClickHouse as a read-only user (never the sink's) and allows no anonymous access unless asked.

No machine here runs a Docker engine, so this is the check that the file would work.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import urlsplit

import pytest

from common.settings import ConfigError, KafkaSettings, LocalKafkaSettings, load_settings
from sinks.readonly import ReadLimits
from tests.deploy.helpers import (
    GRAFANA_DIR,
    REPO_ROOT,
    by_name,
    compose,
    compose_command,
    compose_env,
    gpulens_services,
    is_setting,
    load_yaml_docs,
    manifests,
    settings_for,
)


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return compose()


def _kafka_env(spec: dict[str, Any]) -> dict[str, str]:
    return compose_env(spec["services"]["kafka"])


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    found = {}
    for item in value.split(","):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        found[name] = (host, int(port))
    return found


def _bindings(service: dict[str, Any]) -> dict[int, tuple[str, int]]:
    """container port -> (host address, host port); the address is "" where the entry names none
    (Docker then publishes on every interface)."""
    ports = {}
    for item in service.get("ports", []):
        assert isinstance(item, str), f"use the short syntax [ADDRESS:]HOST:CONTAINER, got {item!r}"
        parts = item.split(":")
        assert len(parts) in (2, 3), f"expected [ADDRESS:]HOST:CONTAINER, got {item!r}"
        address = parts[0] if len(parts) == 3 else ""
        ports[int(parts[-1])] = (address, int(parts[-2]))
    return ports


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port."""
    return {container: host for container, (_address, host) in _bindings(service).items()}


def test_every_component_is_there(spec: dict[str, Any]) -> None:
    services = spec["services"]
    assert {"kafka", "clickhouse", "topics", "watcher", "worker", "sink", "grafana"} <= set(services)
    commands = {name: compose_command(svc) for name, svc in gpulens_services(spec).items()}
    agents = [name for name, cmd in commands.items() if cmd[:1] == ["agent"]]
    assert len(agents) >= 2, "the compose fleet runs at least two simulated agents"
    for name in agents:
        assert "--simulate" in commands[name], f"{name} must run on simulated GPUs (no GPU in compose)"
    assert commands["watcher"] == ["watch", "--simulate"]
    assert commands["topics"] == ["topics", "create"]
    node_names = {compose_env(spec["services"][name])["GPULENS_NODE_NAME"] for name in agents}
    assert len(node_names) == len(agents), "each agent needs its own node name"
    for name in agents:
        env = compose_env(spec["services"][name])
        assert env["NODE_NAME"] == env["GPULENS_NODE_NAME"]


def test_gpulens_services_use_the_project_image(spec: dict[str, Any]) -> None:
    services = gpulens_services(spec)
    assert len(services) >= 6
    for name, service in services.items():
        assert service.get("build") in (".", {"context": "."}), f"{name} must build the repository's Dockerfile"


def test_every_gpulens_env_name_is_a_setting_and_loads(spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, service in gpulens_services(spec).items():
        settings_type = settings_for(compose_command(service))
        env = compose_env(service)
        for key in env:
            assert not key.startswith("GPULENS_") or is_setting(settings_type, key), (
                f"compose service {name}: {key} is not a setting of {settings_type.__name__}"
            )
        with monkeypatch.context() as patch:
            for key in list(os.environ):
                if key.startswith("GPULENS_") or key == "NODE_NAME":
                    patch.delenv(key)
            for key, value in env.items():
                patch.setenv(key, value)
            try:
                settings = load_settings(settings_type)
            except ConfigError as exc:
                pytest.fail(f"compose service {name}: {exc}")
        assert settings.kafka.bootstrap_servers == "kafka:9092", f"{name} must reach Kafka inside compose"


def test_no_other_service_sets_gpulens_names(spec: dict[str, Any]) -> None:
    others = set(spec["services"]) - set(gpulens_services(spec))
    for name in others:
        leaked = [key for key in compose_env(spec["services"][name]) if key.startswith("GPULENS_")]
        assert not leaked, f"{name} sets {leaked}, which no gpulens service reads there"


def test_kafka_is_kraft_at_the_local_broker_version_on_the_default_port(spec: dict[str, Any]) -> None:
    kafka = spec["services"]["kafka"]
    local = LocalKafkaSettings()
    assert kafka["image"] == f"apache/kafka:{local.version}"
    env = _kafka_env(spec)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, "single-node KRaft"
    assert not any("ZOOKEEPER" in key for key in env)

    listeners = _listeners(env["KAFKA_LISTENERS"])
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols)
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised

    # inside compose: services reach kafka:<port> of a listener advertised under that address
    inside = ("kafka", 9092)
    assert inside in advertised.values()
    (inside_name,) = [name for name, address in advertised.items() if address == inside]
    assert listeners[inside_name][1] == 9092

    # from the host: the default bootstrap address (127.0.0.1:9092) reaches a listener that
    # advertises an address the host can use
    default_port = int(KafkaSettings().bootstrap_servers.rpartition(":")[2])
    assert default_port == local.port == 9092
    published = _published(kafka)
    (outside_name,) = [name for name, address in advertised.items() if address[0] in ("localhost", "127.0.0.1")]
    assert advertised[outside_name][1] == default_port
    assert published.get(listeners[outside_name][1]) == default_port, "host port 9092 -> the host listener"


def test_sink_writes_to_the_compose_clickhouse(spec: dict[str, Any]) -> None:
    clickhouse = spec["services"]["clickhouse"]
    ch_env = compose_env(clickhouse)
    assert str(clickhouse["image"]).startswith("clickhouse/clickhouse-server")
    assert _published(clickhouse).get(8123) == 8123
    url = urlsplit(compose_env(spec["services"]["sink"])["GPULENS_CLICKHOUSE__URL"])
    assert (url.scheme, url.hostname, url.port) == ("http", "clickhouse", 8123)
    assert url.path.strip("/") == ch_env["CLICKHOUSE_DB"]
    assert (url.username, url.password) == (ch_env["CLICKHOUSE_USER"], ch_env["CLICKHOUSE_PASSWORD"])


def test_start_order(spec: dict[str, Any]) -> None:
    services = spec["services"]
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "healthcheck" in services["kafka"] and "healthcheck" in services["clickhouse"]
    for name, service in gpulens_services(spec).items():
        if name == "topics":
            continue
        assert service["depends_on"]["topics"]["condition"] == "service_completed_successfully", name
    assert services["sink"]["depends_on"]["clickhouse"]["condition"] == "service_healthy"
    assert services["topics"].get("restart") == "no", "the one-shot topics service must not restart"


def test_ports_and_settings_agree_with_kubernetes(spec: dict[str, Any]) -> None:
    docs = manifests()
    common = by_name(docs, "ConfigMap", "gpulens-common")["data"]
    for name, service in gpulens_services(spec).items():
        env = compose_env(service)
        assert env["GPULENS_METRICS_PORT"] == common["GPULENS_METRICS_PORT"], name
        assert env["GPULENS_TOPIC_PREFIX"] == common["GPULENS_TOPIC_PREFIX"], name
        assert env["GPULENS_DATA_DIR"] == common["GPULENS_DATA_DIR"], name
    worker = by_name(docs, "ConfigMap", "gpulens-worker")["data"]
    agent = by_name(docs, "ConfigMap", "gpulens-agent")["data"]
    compose_worker = compose_env(spec["services"]["worker"])
    # faust's web server has no authentication: off (the default) in every deployment
    assert "GPULENS_WEB_PORT" not in compose_worker and "GPULENS_WEB_PORT" not in worker
    assert compose_worker["GPULENS_SAMPLE_INTERVAL_S"] == agent["GPULENS_SAMPLE_INTERVAL_S"]
    for service in gpulens_services(spec).values():
        if compose_command(service)[:1] == ["agent"]:
            assert compose_env(service)["GPULENS_SAMPLE_INTERVAL_S"] == compose_worker["GPULENS_SAMPLE_INTERVAL_S"]


def test_grafana_is_provisioned_with_the_clickhouse_source_and_dashboards(spec: dict[str, Any]) -> None:
    grafana = spec["services"]["grafana"]
    env = compose_env(grafana)
    assert "grafana-clickhouse-datasource" in env["GF_INSTALL_PLUGINS"].split(",")
    mounts = {}
    for volume in grafana["volumes"]:
        source, _, rest = str(volume).partition(":")
        mounts[rest.split(":")[0]] = source
    provisioning = REPO_ROOT / mounts["/etc/grafana/provisioning"]
    assert provisioning.resolve() == (GRAFANA_DIR / "provisioning").resolve()

    (datasource,) = load_yaml_docs(provisioning / "datasources" / "clickhouse.yaml")[0]["datasources"]
    assert datasource["type"] == "grafana-clickhouse-datasource"
    ch_env = compose_env(spec["services"]["clickhouse"])
    data = datasource["jsonData"]
    assert data["host"] == "clickhouse"
    assert data["port"] == 8123 and data["protocol"] == "http"
    assert data["defaultDatabase"] == ch_env["CLICKHOUSE_DB"]
    # the user and its password: test_grafana_reads_clickhouse_as_a_read_only_user_not_the_sinks
    password = datasource["secureJsonData"]["password"]
    assert password.startswith("$") and env[password.lstrip("$").strip("{}")]

    (provider,) = load_yaml_docs(provisioning / "dashboards" / "gpulens.yaml")[0]["providers"]
    dashboards_path = provider["options"]["path"]
    dashboards = REPO_ROOT / mounts[dashboards_path]
    files = sorted(dashboards.glob("*.json"))
    assert files, "no dashboards provisioned"
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dashboards_path + "/") and (dashboards / home.rpartition("/")[2]).is_file()
    for path in files:
        dashboard = json.loads(path.read_text())
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["current"]["value"] == datasource["uid"], path.name
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}", f"{path.name}: {panel['title']}"


def test_workers_and_sink_price_gpus_alike(spec: dict[str, Any]) -> None:
    key = "GPULENS_PRICES_USD_PER_GPU_HOUR"
    worker, sink = (compose_env(spec["services"][name]) for name in ("worker", "sink"))
    assert json.loads(worker[key]) == json.loads(sink[key]) != {}
    docs = manifests()
    assert json.loads(by_name(docs, "ConfigMap", "gpulens-prices")["data"][key]) == json.loads(worker[key])
    for name in ("gpulens-worker-node", "gpulens-worker-cluster", "gpulens-sink"):
        (container,) = by_name(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"]
        sources = [source["configMapRef"]["name"] for source in container["envFrom"]]
        assert "gpulens-prices" in sources, f"{name} must read the shared price table"


# --------------------------------------------------------------------------- least privilege


CLICKHOUSE_USERS_D = "/etc/clickhouse-server/users.d/"


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host source of each bind mount."""
    found = {}
    for volume in service.get("volumes", []):
        source, _, rest = str(volume).partition(":")
        found[rest.split(":")[0]] = source
    return found


def test_every_published_port_listens_on_loopback_only(spec: dict[str, Any]) -> None:
    published = 0
    for name, service in spec["services"].items():
        for container, (address, _host) in _bindings(service).items():
            published += 1
            assert address == "127.0.0.1", (
                f"{name} publishes {container} on {address or 'every interface'}; use 127.0.0.1:HOST:CONTAINER")
    assert published >= 3, "Kafka, ClickHouse and Grafana are reachable from the host"


def test_metrics_listen_where_a_compose_prometheus_could_scrape(spec: dict[str, Any]) -> None:
    """Inside the compose network (never published): the address is set explicitly, since the
    setting's default is loopback."""
    from common.settings import CommonSettings

    assert str(CommonSettings.model_fields["metrics_addr"].default) == "127.0.0.1"
    for name, service in gpulens_services(spec).items():
        assert compose_env(service)["GPULENS_METRICS_ADDR"] == "0.0.0.0", name
        assert 9464 not in _published(service), f"{name} publishes its /metrics"


def _grafana_user(spec: dict[str, Any]) -> tuple[ET.Element, ET.Element]:
    """The read-only user's <user> element and its <profile> element from the users.d file the
    compose ClickHouse mounts, for the user the provisioned data source logs in as."""
    clickhouse = spec["services"]["clickhouse"]
    files = {target: REPO_ROOT / source for target, source in _mounts(clickhouse).items()
             if target.startswith(CLICKHOUSE_USERS_D)}
    assert files, "the compose ClickHouse mounts no users.d file (the read-only user)"
    (datasource,) = load_yaml_docs(GRAFANA_DIR / "provisioning" / "datasources" / "clickhouse.yaml")[0]["datasources"]
    username = datasource["jsonData"]["username"]
    for path in files.values():
        root = ET.parse(path).getroot()
        user = root.find(f"users/{username}")
        if user is not None:
            profile_name = user.findtext("profile")
            profile = root.find(f"profiles/{profile_name}")
            assert profile is not None, f"{path.name}: profile {profile_name!r} of {username} is not defined there"
            return user, profile
    raise AssertionError(f"no users.d file mounted into ClickHouse defines the data source's user {username!r}")


def test_grafana_reads_clickhouse_as_a_read_only_user_not_the_sinks(spec: dict[str, Any]) -> None:
    ch_env = compose_env(spec["services"]["clickhouse"])
    grafana_env = compose_env(spec["services"]["grafana"])
    (datasource,) = load_yaml_docs(GRAFANA_DIR / "provisioning" / "datasources" / "clickhouse.yaml")[0]["datasources"]
    sink_url = urlsplit(compose_env(spec["services"]["sink"])["GPULENS_CLICKHOUSE__URL"])
    username = datasource["jsonData"]["username"]
    assert username != ch_env["CLICKHOUSE_USER"] and username != sink_url.username, "Grafana uses the sink's user"
    assert "CLICKHOUSE_PASSWORD" not in grafana_env, "Grafana holds the sink's password"

    user, profile = _grafana_user(spec)
    assert profile.findtext("readonly") == "1", "the read-only user's profile must set readonly = 1"
    for limit in ("max_execution_time", "max_memory_usage", "max_result_rows"):
        assert profile.findtext(limit), f"the read-only profile sets no {limit}"
    limits = ReadLimits()
    assert int(profile.findtext("max_memory_usage") or 0) == limits.max_memory_bytes
    for spill in ("max_bytes_before_external_group_by", "max_bytes_before_external_sort"):
        assert int(profile.findtext(spill) or 0) == limits.spill_bytes == limits.engine_settings()[spill], spill
    # Grafana's driver sends max_execution_time with every query: changeable, but capped
    constraint = profile.find("constraints/max_execution_time")
    assert constraint is not None and constraint.find("changeable_in_readonly") is not None
    assert constraint.findtext("max") == profile.findtext("max_execution_time")
    assert user.findtext("access_management") in (None, "0")
    grants = [query.text or "" for query in user.findall("grants/query")]
    assert grants == [f"GRANT SELECT, SHOW ON {ch_env['CLICKHOUSE_DB']}.*"], grants

    # the password: the same variable in ClickHouse's environment and Grafana's data source
    password = user.find("password")
    assert password is not None and password.get("from_env")
    variable = password.get("from_env")
    assert variable in ch_env and variable in grafana_env and ch_env[variable] == grafana_env[variable]
    assert datasource["secureJsonData"]["password"].lstrip("$").strip("{}") == variable


def test_grafana_has_no_anonymous_access_unless_asked(spec: dict[str, Any]) -> None:
    grafana = spec["services"]["grafana"]
    raw = grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"]
    assert str(raw).startswith("${") and "GRAFANA_ANONYMOUS_ENABLED" in str(raw), "a user setting, not a constant"
    assert compose_env(grafana)["GF_AUTH_ANONYMOUS_ENABLED"] == "false", "anonymous access is off by default"
    assert compose_env(grafana).get("GF_AUTH_ANONYMOUS_ORG_ROLE", "Viewer") == "Viewer", "never more than Viewer"
