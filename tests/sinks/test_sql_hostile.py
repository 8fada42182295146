"""``gpulens sql`` and the sink's query endpoint under attack: no file read or written, no network
connection, no setting changed, one statement, limits on every query (real chDB engine, no broker).

Every hostile query runs twice: with no sink (the CLI opens the engine itself) and relayed through a
running query endpoint. Each must end with one line on stderr and exit 2 within its limit, while a
loopback listener records any connection and the files around the data directory are fingerprinted.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from gpulens.cli import main
from sinks.clickhouse import ClickHouseStore, StoreError, open_store
from sinks.migrations import migrate
from sinks.query_server import QueryServer, RemoteReader, endpoint_file
from sinks.readonly import ReadLimits, ReadOnlyViolation, check_canonical, lex
from sinks.service import load_prices

SECRET = "gpulens-secret-7f3a91"
LIMIT_S = 3.0
LIMITS = ReadLimits(max_execution_time_s=LIMIT_S, max_memory_bytes=128 * 1024**2, max_result_rows=1000)


class Listener:
    """A loopback TCP server that counts every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def hostile_queries(port: int, secret: Path, outfile: Path, metadata: Path) -> list[str]:
    host = f"127.0.0.1:{port}"
    reads = [
        f"SELECT * FROM file('{secret}', 'RawBLOB')",
        f"select * from FILE('{secret}', 'RawBLOB')",
        f"SELECT file('{secret}')",
        "SELECT * FROM file('/proc/self/environ', 'RawBLOB')",
        f"WITH x AS (SELECT * FROM file('{secret}', 'RawBLOB')) SELECT * FROM x",
        f"SELECT * FROM view(SELECT * FROM file('{secret}', 'RawBLOB'))",
        f"DESCRIBE TABLE file('{secret}', 'RawBLOB')",
        f"SELECT * FROM fileCluster('default', '{secret}')",
        f"SELECT * FROM sqlite('{secret}', 't')",
        f"SELECT * FROM executable('cat {secret}', 'TSV', 'x String')",
        "SELECT * FROM input('x String')",
    ]
    network = [
        f"SELECT * FROM url('http://{host}/x', 'RawBLOB')",
        f"SELECT * FROM urlCluster('default', 'http://{host}/x', 'RawBLOB')",
        f"SELECT * FROM remote('{host}', system.one)",
        f"SELECT * FROM remoteSecure('{host}', system.one)",
        f"SELECT * FROM mysql('{host}', 'db', 't', 'u', 'p')",
        f"SELECT * FROM postgresql('{host}', 'db', 't', 'u', 'p')",
        f"SELECT * FROM hdfs('hdfs://{host}/x', 'TSV', 'a String')",
        f"SELECT * FROM s3('http://{host}/bucket/x', 'RawBLOB')",
        f"SELECT * FROM mongodb('{host}', 'db', 'c', 'u', 'p', 'x String')",
        f"SELECT * FROM redis('{host}', 'k', 'k String, v String')",
        f"SELECT * FROM azureBlobStorage('http://{host}/acct', 'c', 'b')",
        f"SELECT * FROM iceberg('http://{host}/bucket/t')",
        f"SELECT * FROM jdbc('jdbc:mysql://{host}/db', 't')",
        "SELECT * FROM odbc('DSN=x', 't')",
    ]
    out = f"'{outfile}'"
    writes = [
        f"SELECT * FROM gpu_prices INTO OUTFILE {out}",
        f"SELECT 1 /* /* */ ' */ INTO OUTFILE {out} --'",
        f"SELECT 1 INTO OUTFILE {out} APPEND",
        f"SELECT 1 INTO OUTFILE '{metadata}' TRUNCATE FORMAT RawBLOB",
        f"SELECT $$;$$ INTO OUTFILE {out}",
        f"SELECT 1 -- a comment\n INTO OUTFILE {out}",
        f"SELECT 1 INTO/* c */OUTFILE {out}",
        f"SHOW TABLES INTO OUTFILE {out}",
        f"EXPLAIN SELECT 1 INTO OUTFILE {out}",
        "INSERT INTO gpu_prices VALUES ('x', 1, now())",
        "DROP TABLE gpu_prices",
        "TRUNCATE TABLE gpu_prices",
        "ALTER TABLE gpu_prices DELETE WHERE 1",
        "CREATE TABLE x (a UInt8) ENGINE = Memory",
        "OPTIMIZE TABLE gpu_prices FINAL",
        "KILL QUERY WHERE 1",
        "SYSTEM SHUTDOWN",
        "GRANT ALL ON *.* TO default",
    ]
    settings_and_statements = [
        "SELECT 1 SETTINGS max_execution_time = 0",
        "SELECT 1 SETTINGS readonly = 0",
        "SELECT count() FROM numbers(10) SETTINGS max_result_rows = 0",
        "SET max_memory_usage = 0",
        "SET readonly = 0",
        "SELECT 1; SELECT 2",
        "SELECT $$SELECT 1; SELECT 2$$; SELECT 2",
        "SELECT 1; DROP TABLE gpu_prices",
        "SELECT 1 /* unterminated",
    ]
    limits = [
        "SELECT count() FROM numbers(1e12)",
        "SELECT groupArray(number) FROM numbers(1e10)",
        "SELECT number FROM numbers(10000000)",
        "SELECT " + "+".join(["1"] * 150_000),
    ]
    return reads + network + writes + settings_and_statements + limits


def _fingerprint(root: Path, data: Path) -> dict[str, str]:
    """Content hashes of every file under ``root`` except the engine's own data and logs."""
    prints: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name == "sink-query-endpoint.json":
            continue
        inside_engine = data in path.parents
        if inside_engine and not (path.suffix == ".sql" and "metadata" in path.parts):
            continue
        prints[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return prints


@pytest.fixture
def store(store: ClickHouseStore) -> ClickHouseStore:
    migrate(store)
    load_prices(store, {"NVIDIA L4": 0.8})
    return store


@pytest.fixture
def limited_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_CLICKHOUSE__QUERY_MAX_EXECUTION_TIME_S", str(LIMIT_S))
    monkeypatch.setenv("GPULENS_CLICKHOUSE__QUERY_MAX_MEMORY_BYTES", str(LIMITS.max_memory_bytes))
    monkeypatch.setenv("GPULENS_CLICKHOUSE__QUERY_MAX_RESULT_ROWS", str(LIMITS.max_result_rows))


@pytest.mark.parametrize("through", ["engine", "endpoint"])
def test_hostile_queries_end_with_one_line_and_touch_nothing(
    through: str, store: ClickHouseStore, tmp_path: Path, limited_env: None,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # a relative OUTFILE would land here
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    data = tmp_path / "clickhouse"
    metadata = next(data.rglob("metadata/*/gpu_prices.sql"))
    listener = Listener()
    server = QueryServer(store.url, tmp_path, limits=LIMITS) if through == "endpoint" else None
    if server is not None:
        server.start()
    before = _fingerprint(tmp_path, data)
    queries = hostile_queries(listener.port, secret, cwd / "out.txt", metadata)
    assert len(queries) >= 40
    capsys.readouterr()
    try:
        for sql in queries:
            started = time.monotonic()
            code = main(["sql", sql, "--data-dir", str(tmp_path)])
            elapsed = time.monotonic() - started
            captured = capsys.readouterr()
            assert code == 2, (sql[:120], captured.out[:300])
            assert captured.out == "", sql[:120]
            assert captured.err.count("\n") == 1 and captured.err.startswith("gpulens: "), (sql[:120], captured.err)
            assert SECRET not in captured.err and "GPULENS_" not in captured.err, sql[:120]
            assert elapsed < LIMIT_S + 10, (sql[:120], elapsed)
    finally:
        if server is not None:
            server.stop()
        listener.close()
    assert listener.connections == 0
    assert _fingerprint(tmp_path, data) == before
    assert list(cwd.iterdir()) == []
    store.close()
    reopened = open_store(store.url)
    try:
        assert reopened.query("SELECT gpu_model FROM gpu_prices").rows == [["NVIDIA L4"]]
    finally:
        reopened.close()


def test_refusals_name_the_reason(store: ClickHouseStore, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "SELECT 1; SELECT 2": "Multi-statements",
        "SELECT 1 INTO OUTFILE 'x'": "INTO OUTFILE is refused",
        "DROP TABLE gpu_prices": "DROP statements are refused",
        "SELECT file('/etc/hostname')": "file() reads files",
        "SELECT 1 SETTINGS max_execution_time = 0": "readonly",
    }
    for sql, reason in cases.items():
        assert main(["sql", sql, "--data-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert reason in err, (sql, err)


def test_a_read_only_store_runs_the_engines_canonical_text(store: ClickHouseStore) -> None:
    reader = open_store(store.url, read_only=True, limits=LIMITS)
    try:
        result = reader.query("/* a /* nested */ comment */ SELECT $$a;b$$ AS s, 'INTO OUTFILE' AS t -- end")
        assert result.dicts() == [{"s": "a;b", "t": "INTO OUTFILE"}]
        assert reader.query("SELECT gpu_model FROM gpu_prices WHERE gpu_model = {m:String}",
                            {"m": "NVIDIA L4"}).rows == [["NVIDIA L4"]]
        settings = reader.query("SELECT getSetting('readonly'), getSetting('max_result_rows')").rows
        assert settings == [[1, 1000]]
    finally:
        reader.close()


@pytest.mark.parametrize("sql", [
    "SELECT 'a' AS `into`, 1 AS outfile",
    "SELECT URLHash('http://x'), path('http://x/y')",
    "SHOW TABLES",
    "DESCRIBE TABLE gpu_prices",
    "EXISTS TABLE gpu_prices",
    "WITH t AS (SELECT 1 AS a) SELECT a FROM t",
    "(SELECT 1) UNION ALL (SELECT 2)",
])
def test_ordinary_queries_pass(store: ClickHouseStore, sql: str) -> None:
    reader = open_store(store.url, read_only=True, limits=LIMITS)
    try:
        reader.query(sql)
    finally:
        reader.close()


def test_the_lexer_sees_through_comments_and_literals() -> None:
    words = [t.text for t in lex("SELECT /* /* */ ; */ 'x'';y' AS \"a;b\" -- ;\n FROM t")]
    assert words == ["SELECT", "'x'';y'", "AS", '"a;b"', "FROM", "t"]
    with pytest.raises(ReadOnlyViolation):
        check_canonical("SELECT 1 INTO OUTFILE 'x'")
    assert check_canonical("SELECT 'INTO OUTFILE' AS x") == "SELECT 'INTO OUTFILE' AS x"


def test_the_endpoint_kills_a_query_whose_client_went_away(store: ClickHouseStore, tmp_path: Path) -> None:
    server = QueryServer(store.url, tmp_path, limits=ReadLimits(max_execution_time_s=120))
    server.start()
    try:
        info = orjson.loads(endpoint_file(tmp_path).read_bytes())
        impatient = RemoteReader(int(info["port"]), str(info["token"]), timeout_s=1.0)
        with pytest.raises(StoreError):
            impatient.query("SELECT count() FROM numbers(1e12)")
        deadline = time.monotonic() + 10
        running = [[1]]
        while time.monotonic() < deadline:
            running = store.query("SELECT count() FROM system.processes WHERE query LIKE '%numbers(1e12)%' "
                                  "AND query NOT LIKE '%system.processes%'").rows
            if running == [[0]]:
                break
            time.sleep(0.2)
        assert running == [[0]]
        patient = RemoteReader(int(info["port"]), str(info["token"]), timeout_s=10.0)
        assert patient.query("SELECT 1 AS one").rows == [[1]]
    finally:
        server.stop()


def test_stopping_the_endpoint_does_not_wait_for_a_long_query(store: ClickHouseStore, tmp_path: Path) -> None:
    server = QueryServer(store.url, tmp_path, limits=ReadLimits(max_execution_time_s=300))
    server.start()
    info = orjson.loads(endpoint_file(tmp_path).read_bytes())
    errors: list[Exception] = []

    def long_query() -> None:
        try:
            RemoteReader(int(info["port"]), str(info["token"]), timeout_s=60).query(
                "SELECT count() FROM numbers(1e12)")
        except StoreError as exc:
            errors.append(exc)

    client = threading.Thread(target=long_query)
    client.start()
    time.sleep(1.0)
    started = time.monotonic()
    server.stop()
    client.join(15)
    assert time.monotonic() - started < 10
    assert not client.is_alive() and len(errors) == 1


@pytest.mark.parametrize("body", [b"[1]", b'{"sql": 1}', b'{"sql": "SELECT 1", "parameters": [1]}', b"not json"])
def test_the_endpoint_answers_bad_bodies_with_an_error(store: ClickHouseStore, tmp_path: Path, body: bytes) -> None:
    import http.client

    server = QueryServer(store.url, tmp_path, limits=LIMITS)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("POST", "/query", body=body, headers={"X-Gpulens-Token": server.token})
        response = conn.getresponse()
        assert response.status == 400
        assert "bad request" in orjson.loads(response.read())["error"]
        conn.close()
    finally:
        server.stop()


def test_ctrl_c_cancels_a_long_query_at_once(store: ClickHouseStore, tmp_path: Path) -> None:
    store.close()
    env = {**os.environ, "GPULENS_DATA_DIR": str(tmp_path), "GPULENS_CLICKHOUSE__QUERY_MAX_EXECUTION_TIME_S": "120"}
    child = subprocess.Popen([sys.executable, "-m", "gpulens", "sql", "SELECT count() FROM numbers(1e12)"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             # a user's terminal delivers Ctrl-C; a runner that ignores SIGINT passes that on
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(20.0)  # imports and the engine's start (slow on a loaded machine), then the query runs
    assert child.poll() is None
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    _out, err = child.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert child.returncode == 2 and err.strip().splitlines()[-1] == "gpulens: interrupted: the query was cancelled"
