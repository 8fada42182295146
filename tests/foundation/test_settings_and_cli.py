"""Configuration is validated at start-up with messages that name the setting; secrets never show;
the CLI reports user errors in one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from common.settings import AgentSettings, CommonSettings, ConfigError, SinkSettings, load_settings, redacted
from tests.child_process import free_port

GPULENS = str(Path(sys.executable).parent / "gpulens")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    full_env.update(env or {})
    return subprocess.run([GPULENS, *args], capture_output=True, text=True, env=full_env, timeout=120, check=False)


def test_env_prefix_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_KAFKA__BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    monkeypatch.setenv("GPULENS_TOPIC_PREFIX", "team-a")
    settings = load_settings(CommonSettings)
    assert settings.kafka.bootstrap_servers == "k1:9092,k2:9092"
    assert settings.topic_prefix == "team-a"
    assert settings.kafka.to_aiokafka()["bootstrap_servers"] == ["k1:9092", "k2:9092"]


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_SAMPLE_INTERVAL_S", "30")
    assert load_settings(AgentSettings).sample_interval_s == 30
    assert load_settings(AgentSettings, sample_interval_s=5).sample_interval_s == 5


def test_invalid_value_names_the_variable_and_accepted_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_KAFKA__SECURITY_PROTOCOL", "TLS")
    with pytest.raises(ConfigError) as excinfo:
        load_settings(CommonSettings)
    message = str(excinfo.value)
    assert "GPULENS_KAFKA__SECURITY_PROTOCOL" in message
    assert "'PLAINTEXT', 'SSL', 'SASL_PLAINTEXT' or 'SASL_SSL'" in message
    assert "TLS" in message


def test_bad_clickhouse_url_and_bootstrap_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_CLICKHOUSE__URL", "mysql://db")
    with pytest.raises(ConfigError, match="GPULENS_CLICKHOUSE__URL"):
        load_settings(SinkSettings)
    monkeypatch.delenv("GPULENS_CLICKHOUSE__URL")
    monkeypatch.setenv("GPULENS_KAFKA__BOOTSTRAP_SERVERS", "no-port-here")
    with pytest.raises(ConfigError, match="GPULENS_KAFKA__BOOTSTRAP_SERVERS"):
        load_settings(SinkSettings)


def test_sasl_maps_to_librdkafka_and_secrets_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("GPULENS_KAFKA__SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("GPULENS_KAFKA__SASL_USERNAME", "gpulens")
    monkeypatch.setenv("GPULENS_KAFKA__SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("GPULENS_CLICKHOUSE__URL", "https://writer:s3cret@ch.example:8443/gpulens")
    settings = load_settings(SinkSettings)
    conf = settings.kafka.to_librdkafka()
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512" and conf["sasl.password"] == "hunter2"
    assert settings.kafka.to_aiokafka()["sasl_plain_password"] == "hunter2"
    shown = orjson.dumps(redacted(settings)).decode()
    assert "hunter2" not in shown and "s3cret" not in shown
    assert "writer:**********@ch.example" in shown


def test_config_show_masks_secrets() -> None:
    result = run_cli("config", "show", "--service", "sink",
                     env={"GPULENS_KAFKA__SASL_PASSWORD": "hunter2"})
    assert result.returncode == 0, result.stderr
    assert "hunter2" not in result.stdout
    assert orjson.loads(result.stdout)["kafka"]["sasl_password"] == "**********"


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["topics", "create"], {"GPULENS_KAFKA__SECURITY_PROTOCOL": "bogus"}, "GPULENS_KAFKA__SECURITY_PROTOCOL"),
        (["topics", "create", "--bootstrap-servers", "127.0.0.1:1"], {}, "no Kafka broker at 127.0.0.1:1"),
        (["topics", "nonsense"], {}, "No such command"),
        (["kafka", "up", "--port", "notanumber"], {}, "not a valid integer"),
        (["config", "show", "--service", "worker"], {"GPULENS_PRICES_USD_PER_GPU_HOUR": "{bad"},
         "GPULENS_PRICES_USD_PER_GPU_HOUR: not valid JSON"),
        (["sql", "SELECT 1"], {"GPULENS_DATA_DIR": "/etc/passwd"}, "GPULENS_DATA_DIR: Value error, /etc/passwd exists"),
        (["kafka", "up"], {"GPULENS_DATA_DIR": "/proc/nope", "GPULENS_LOCAL_KAFKA__PORT": "1"},
         "cannot use /proc/nope: No such file or directory"),
        (["topics", "create"], {"GPULENS_KAFKA__SECURITY_PROTOCOL": "bogus", "GPULENS_METRICS_PORT": "-1"},
         "GPULENS_METRICS_PORT"),
    ],
)
def test_cli_user_errors_are_one_clear_line_without_traceback(
    args: list[str], env: dict[str, str], expected: str
) -> None:
    result = run_cli(*args, env=env)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_missing_java_names_the_alternatives(tmp_path: Path) -> None:
    env = {"PATH": str(Path(sys.executable).parent), "GPULENS_DATA_DIR": str(tmp_path),
           "GPULENS_LOCAL_KAFKA__PORT": str(free_port()), "GPULENS_LOCAL_KAFKA__CACHE_DIR": str(tmp_path / "cache")}
    result = run_cli("kafka", "up", env=env)
    assert result.returncode == 2
    assert "java and mvn not found" in result.stderr
    assert "GPULENS_KAFKA__BOOTSTRAP_SERVERS" in result.stderr and "docker compose" in result.stderr


def test_ssl_settings_reach_aiokafka_as_a_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    monkeypatch.setenv("GPULENS_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("GPULENS_KAFKA__SASL_MECHANISM", "PLAIN")
    kwargs = load_settings(CommonSettings).kafka.to_aiokafka()
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert kwargs["ssl_context"].verify_mode == ssl.CERT_REQUIRED


def test_nested_flags_fold_over_the_environment_of_their_section(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulens.commands.base import NESTED_FLAGS, settings_from_flags

    monkeypatch.setenv("GPULENS_KAFKA__SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("GPULENS_CLICKHOUSE__QUERY_MAX_RESULT_ROWS", "5")
    monkeypatch.setenv("GPULENS_CLICKHOUSE__URL", "mysql://not-this-one")
    settings = settings_from_flags(SinkSettings, bootstrap_servers="k9:9092", clickhouse_url="http://ch:8123/db",
                                   topic_prefix=None)
    assert (settings.kafka.bootstrap_servers, settings.kafka.security_protocol) == ("k9:9092", "SSL")
    assert (settings.clickhouse.url, settings.clickhouse.query_max_result_rows) == ("http://ch:8123/db", 5)
    assert set(NESTED_FLAGS) == {"bootstrap_servers", "clickhouse_url"}


@pytest.mark.parametrize("args", [["sink"], ["sql", "SELECT 1"], ["report"], ["advise"], ["check", "--only", "kafka"]])
def test_every_clickhouse_url_flag_is_validated_as_the_variable(args: list[str]) -> None:
    result = run_cli(*args, "--clickhouse-url", "mysql://db")
    assert result.returncode == 2, result.stderr
    assert "GPULENS_CLICKHOUSE__URL: Value error, expected chdb:///path or http(s)://host:port/db" in result.stderr
