"""``GPULENS_CLICKHOUSE__URL`` is parsed by :class:`common.clickhouse_target.ClickHouseTarget` alone,
and shown everywhere in its one masked form."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.clickhouse_target import MASK, ClickHouseTarget
from common.settings import CommonSettings, ConfigError, load_settings
from sinks.clickhouse import describe_target, embedded_path, is_embedded


def test_a_server_url_names_host_port_database_and_user() -> None:
    target = ClickHouseTarget.parse("https://writer:s3cret@ch.example:9440/gpulens")
    assert (target.scheme, target.host, target.port, target.database, target.user) == (
        "https", "ch.example", 9440, "gpulens", "writer")
    assert not target.embedded and target.path is None
    assert ClickHouseTarget.parse("http://ch").port == 8123 and ClickHouseTarget.parse("https://ch").port == 8443
    assert ClickHouseTarget.parse("http://ch").database is None


@pytest.mark.parametrize(("url", "path"), [
    ("chdb:///var/lib/gpulens/clickhouse", "/var/lib/gpulens/clickhouse"),
    ("chdb://data/clickhouse", "data/clickhouse"),
    ("chdb:///with%20space", "/with space"),
])
def test_an_embedded_url_names_its_directory(url: str, path: str) -> None:
    target = ClickHouseTarget.parse(url)
    assert target.embedded and target.path == Path(path) and target.masked == url
    assert is_embedded(url) and embedded_path(url) == path


def test_the_password_is_masked_the_same_everywhere() -> None:
    url = "https://writer:s3cret@ch.example:8443/gpulens"
    target = ClickHouseTarget.parse(url)
    shown = f"https://writer:{MASK}@ch.example:8443/gpulens"
    assert target.masked == str(target) == describe_target(url) == shown
    assert "s3cret" not in repr(target) and target.url == url
    assert ClickHouseTarget.parse("http://reader@ch:8123/db").masked == "http://reader@ch:8123/db"
    assert describe_target("mysql://u:pw@db") == f"mysql://u:{MASK}@db"  # an error message may quote any text
    with pytest.raises(ValueError) as excinfo:
        ClickHouseTarget.parse("ftp://u:pw@db")
    assert "pw" not in str(excinfo.value)


@pytest.mark.parametrize("url", ["mysql://db", "http://", "https://:8443/db", "http://ch:port/db", "chdb://", "ch"])
def test_anything_else_is_rejected_at_load_naming_the_variable(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    with pytest.raises(ValueError, match="expected chdb:///path or http"):
        ClickHouseTarget.parse(url)
    monkeypatch.setenv("GPULENS_CLICKHOUSE__URL", url)
    with pytest.raises(ConfigError, match="GPULENS_CLICKHOUSE__URL"):
        load_settings(CommonSettings)


def test_the_default_is_the_embedded_engine_under_the_data_dir(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULENS_CLICKHOUSE__URL", raising=False)
    settings = load_settings(CommonSettings, data_dir=tmp_path)
    assert settings.clickhouse_target().path == tmp_path / "clickhouse"
    assert settings.clickhouse_url() == f"chdb://{tmp_path / 'clickhouse'}"
