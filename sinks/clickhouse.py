"""The ClickHouse adapter: the one module that imports clickhouse-connect (and, through it, chDB).

One client, two targets, same SQL: ``chdb:///path`` opens the embedded engine in this process
(a real ClickHouse engine; one process per data directory), ``http(s)://user:pass@host:port/db``
talks to a server. Everything above this module sees :class:`ClickHouseStore` and three error
kinds, so the sink's retry logic never depends on the driver:

- :class:`StoreUnavailable` — transient (connection refused, timeout, too many parts, memory):
  back off and retry the same batch with the same deduplication token;
- :class:`StoreRejected` — the data itself was refused (type, range, parse errors): retrying
  cannot help, the rows go to the dead-letter topic with the reason;
- :class:`StoreLocked` — the embedded data directory is owned by another process.

Query results come back as :class:`QueryResult` with JSON-friendly values (timestamps as ISO 8601
UTC strings, decimals as floats) so a direct chDB query and one relayed by the sink's local query
endpoint give byte-identical output.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import ipaddress
import math
import re
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import clickhouse_connect
from clickhouse_connect.driver.exceptions import (
    ClickHouseError,
    DatabaseError,
    DataError,
    OperationalError,
    ProgrammingError,
)

from common.clickhouse_target import ClickHouseTarget, masked_url
from common.errors import GpulensError, PermanentError, RetriableError
from sinks.readonly import ReadLimits, ReadOnlyViolation, guard

# ClickHouse error codes that mean "this data can never be stored as is".
DATA_ERROR_CODES = frozenset({
    6,    # CANNOT_PARSE_TEXT
    16,   # NO_SUCH_COLUMN_IN_TABLE
    27,   # CANNOT_PARSE_INPUT_ASSERTION_FAILED
    38,   # CANNOT_PARSE_DATE
    41,   # CANNOT_PARSE_DATETIME
    53,   # TYPE_MISMATCH
    69,   # ARGUMENT_OUT_OF_BOUND
    70,   # CANNOT_CONVERT_TYPE
    72,   # CANNOT_PARSE_NUMBER
    117,  # INCORRECT_DATA
    131,  # TOO_LARGE_STRING_SIZE
    190,  # SIZES_OF_ARRAYS_DONT_MATCH
    321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
    349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
    407,  # DECIMAL_OVERFLOW
    469,  # VIOLATED_CONSTRAINT
})


READ_REFUSAL_CODES = frozenset({
    46,   # UNKNOWN_FUNCTION
    47,   # UNKNOWN_IDENTIFIER
    60,   # UNKNOWN_TABLE
    62,   # SYNTAX_ERROR
    81,   # UNKNOWN_DATABASE
    159,  # TIMEOUT_EXCEEDED
    164,  # READONLY
    241,  # MEMORY_LIMIT_EXCEEDED
    394,  # QUERY_WAS_CANCELLED
    396,  # TOO_MANY_ROWS_OR_BYTES
})
"""Errors of a read query that are the query's own doing (a limit or the read-only rules), not an outage."""


JSON_DATA_ERROR_CODES = DATA_ERROR_CODES | frozenset({
    25,   # CANNOT_PARSE_ESCAPE_SEQUENCE
    26,   # CANNOT_PARSE_QUOTED_STRING
})
"""What an insert of JSON lines answers for a line the engine cannot read (or reads as another type)."""

INSERT_SETTINGS: Mapping[str, Any] = {
    # a block the deduplication token drops is dropped in the materialized views too
    "deduplicate_blocks_in_dependent_materialized_views": 1,
    # no ReplacingMergeTree collapse inside each inserted block: copies of a fact in two blocks
    # were always left to merges and FINAL (how every table is read, docs/sql.md), and copies in
    # one block are rare (a redelivery within a batch), while the collapse sorted and scanned every
    # block again, about a fifth of a GPU sample insert's time
    "optimize_on_insert": 0,
}
"""Settings of every insert."""


class StoreError(GpulensError):
    """Base of the adapter's errors; ``code`` is ClickHouse's numeric error code when known."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class StoreUnavailable(StoreError, RetriableError):
    """Transient: retry later with the same data and deduplication token."""


class StoreRejected(StoreError, PermanentError):
    """Permanent: ClickHouse refuses this data; retrying the same rows cannot succeed."""


class StoreLocked(StoreError, PermanentError):
    """The embedded data directory is owned by another running process."""


@dataclass
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]] = field(default_factory=list)

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "types": self.types, "rows": self.rows}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueryResult:
        return cls(list(data["columns"]), list(data["types"]), [list(r) for r in data["rows"]])


_PLAIN_TYPES = frozenset({str, int, bool, type(None)})
"""Driver value types that are JSON-friendly as they are."""
_INF = float("inf")


def plain_column(values: Sequence[Any], type_name: str) -> list[Any]:
    """:func:`plain_value` of each value of a result column of ClickHouse type ``type_name``.

    A large result has millions of values, nearly all plain strings, integers and finite floats, so
    those are let through inline (by the column's type: floats or the rest) and only the others go
    through :func:`plain_value`; either way each value comes out as :func:`plain_value` gives it."""
    if "Float" in type_name:
        return [v if type(v) is float and -_INF < v < _INF else plain_value(v) for v in values]
    return [v if type(v) in _PLAIN_TYPES else plain_value(v) for v in values]


def plain_value(value: Any) -> Any:
    """A JSON-friendly form of one driver value (recursively for arrays, tuples and maps)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, uuid.UUID | ipaddress.IPv4Address | ipaddress.IPv6Address):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    if isinstance(value, Mapping):
        return {str(plain_value(k)): plain_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_value(v) for v in value]
    return str(value)


def describe_target(url: str) -> str:
    """The URL as logs and messages show it (:func:`common.clickhouse_target.masked_url`)."""
    return masked_url(url)


def is_embedded(url: str) -> bool:
    return ClickHouseTarget.parse(url).embedded


def embedded_path(url: str) -> str:
    return str(ClickHouseTarget.parse(url).path)


def _load_insert_dependencies() -> None:
    """Import what clickhouse-connect loads lazily on the first insert (pandas, about a second).

    A writing store pays it when it opens rather than inside its first batch, whose latency (and the
    sink's throughput figure) it would otherwise carry. Only a warm-up: a driver without these
    lazy attributes changes nothing.
    """
    with contextlib.suppress(ImportError, AttributeError):
        from clickhouse_connect.driver import options

        _ = options.pd, options.np


_DATETIME64 = re.compile(r"^(?:Nullable\()?DateTime64\((\d+)")


def datetime_ticks(value: dt.datetime, scale: int) -> int:
    """An aware datetime as ``scale`` ticks per second since the epoch, floored: what the driver sends
    for a DateTime64 column of that scale."""
    return (math.floor(value.timestamp()) * 1_000_000 + value.microsecond) * scale // 1_000_000


def _ticks_once(values: list[Any], type_name: str) -> list[Any]:
    """A DateTime64 column's aware datetimes as the integer ticks the driver would send, each
    distinct object converted once; any other column, or one holding anything else, as it is."""
    precision = _DATETIME64.match(type_name)
    if precision is None:
        return values
    scale = 10 ** int(precision.group(1))
    memo: dict[int, int] = {}
    ticks: list[Any] = []
    for value in values:
        if value is None:
            ticks.append(None)
            continue
        tick = memo.get(id(value))
        if tick is None:
            if type(value) is not dt.datetime or value.tzinfo is None:
                return values
            tick = memo[id(value)] = datetime_ticks(value, scale)
        ticks.append(tick)
    return ticks


def _classify(exc: BaseException, what: str, data_codes: frozenset[int] = DATA_ERROR_CODES) -> StoreError:
    code = getattr(exc, "code", None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = f"{what}: {text}"[:2000]
    if isinstance(exc, OperationalError):
        return StoreUnavailable(text, code)
    if isinstance(exc, DatabaseError) and not isinstance(exc, DataError):
        if code in data_codes:
            return StoreRejected(text, code)
        return StoreUnavailable(text, code)
    if isinstance(exc, DataError | ProgrammingError | ValueError | TypeError | OverflowError):
        return StoreRejected(text, code)
    if isinstance(exc, ClickHouseError | OSError):
        return StoreUnavailable(text, code)
    return StoreRejected(text, code)


class ClickHouseStore:
    """A thread-safe handle on one ClickHouse target (embedded chDB or a server)."""

    def __init__(
        self,
        url: str,
        read_only: bool = False,
        connect_timeout_s: float = 10.0,
        query_timeout_s: float = 300.0,
        limits: ReadLimits | None = None,
        engine_config: Path | None = None,
    ) -> None:
        """``engine_config``: an embedded engine's configuration file (e.g. one that turns on
        ``system.query_log``, which the history benchmark reads); ignored for a server."""
        self.url = url
        self._engine_config = engine_config
        self.embedded = is_embedded(url)
        self.read_only = read_only
        self.limits = limits or ReadLimits()
        self._lock = threading.RLock()
        self._column_type_cache: dict[str, dict[str, str]] = {}
        self._connect_timeout_s = connect_timeout_s
        self._control: Any = None
        self._control_lock = threading.Lock()
        if read_only:
            query_timeout_s = self.limits.max_execution_time_s + connect_timeout_s
        self._client = self._connect(query_timeout_s)
        if not read_only:
            _load_insert_dependencies()

    def _settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"session_timezone": "UTC"}
        if self.read_only:
            # enforced by the engine for every statement of this client (a chDB client's session
            # settings stick to its own handle, so the sink's writing client is unaffected)
            settings.update(self.limits.engine_settings())
        return settings

    def _connect(self, query_timeout_s: float) -> Any:
        url = self.url
        try:
            if self.embedded:
                options = {"config-file": str(self._engine_config)} if self._engine_config is not None else None
                return clickhouse_connect.get_client(dsn=url, settings=self._settings(), chdb_options=options)
            return clickhouse_connect.get_client(
                dsn=url,
                settings=self._settings(),
                connect_timeout=self._connect_timeout_s,
                send_receive_timeout=query_timeout_s,
                query_retries=0,
                autogenerate_session_id=False,
            )
        except (ClickHouseError, OSError) as exc:
            if "Cannot lock file" in str(exc) or "already running" in str(exc):
                raise StoreLocked(
                    f"the embedded ClickHouse directory {embedded_path(url)} is in use by another process"
                ) from None
            raise _classify(exc, f"cannot connect to {describe_target(url)}") from None

    @property
    def server_version(self) -> str:
        return str(self._client.server_version)

    def command(self, sql: str, settings: Mapping[str, Any] | None = None) -> None:
        """Run DDL or any statement without a result set."""
        with self._lock:
            try:
                self._client.command(sql, settings=dict(settings or {}))
            except Exception as exc:
                raise _classify(exc, "statement failed") from None

    def query(
        self,
        sql: str,
        parameters: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
        cancel: threading.Event | None = None,
    ) -> QueryResult:
        """Run one query. On a read-only store the SQL first passes :func:`sinks.readonly.guard` and
        the engine's canonical text runs; setting ``cancel`` kills the running query."""
        if self.read_only:
            sql = guard(sql, self._canonical, self.limits)
        with self._lock, self._cancelled_by(cancel) as tag:
            try:
                result = self._client.query(f"/* gpulens-read:{tag} */ {sql}" if tag else sql,
                                            parameters=dict(parameters or {}), settings=dict(settings or {}))
            except Exception as exc:
                if cancel is not None and cancel.is_set():
                    raise StoreRejected("query cancelled: its client went away or the sink is stopping") from None
                error = _classify(exc, "query failed")
                if self.read_only and error.code in READ_REFUSAL_CODES:
                    error = StoreRejected(str(error), error.code)
                raise error from None
            types = [t.name for t in result.column_types]
            columns = [plain_column(values, t) for values, t in zip(result.result_columns, types, strict=True)]
            return QueryResult(list(result.column_names), types, list(map(list, zip(*columns, strict=True))))

    def _canonical(self, sql: str) -> str:
        """ClickHouse's own parse of ``sql``, formatted: one statement or :class:`ReadOnlyViolation`."""
        with self._lock:
            try:
                result = self._client.query("SELECT formatQuerySingleLine({q:String})", parameters={"q": sql})
            except Exception as exc:
                error = _classify(exc, "not one valid statement")
                if error.code == 62:  # SYNTAX_ERROR
                    raise ReadOnlyViolation(str(error).split(" In scope ")[0].rstrip(": ")) from None
                raise error from None
        return str(result.result_rows[0][0])

    @contextlib.contextmanager
    def _cancelled_by(self, cancel: threading.Event | None) -> Iterator[str | None]:
        """While the body runs, a watcher kills the tagged query once ``cancel`` is set."""
        if cancel is None:
            yield None
            return
        tag = uuid.uuid4().hex
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                if cancel.wait(0.1):
                    self.kill(tag)
                    return

        watcher = threading.Thread(target=watch, name="query-cancel", daemon=True)
        watcher.start()
        try:
            yield tag
        finally:
            done.set()
            watcher.join()

    def kill(self, tag: str) -> None:
        """Cancel the running query tagged ``tag`` (from a second connection: the first is busy)."""
        # the query may have just ended: the caller's own error then says what happened
        with self._control_lock, contextlib.suppress(Exception):
            if self._control is None:
                self._control = self._connect(self._connect_timeout_s + 10)
            self._control.query(
                "KILL QUERY WHERE query LIKE {pattern:String} AND query NOT LIKE '%KILL QUERY%' SYNC",
                parameters={"pattern": f"%gpulens-read:{tag}%"},
            )

    def insert(
        self,
        table: str,
        columns: Mapping[str, Sequence[Any]],
        dedup_token: str | None = None,
        repeated_timestamps: bool = False,
    ) -> int:
        """Insert column-oriented data; a block whose ``dedup_token`` was already stored is dropped.

        ``repeated_timestamps``: the timestamp columns repeat the same objects (a sample's time on
        each of its GPU rows), so each distinct object is converted to the column's ticks once,
        not once per row by the driver (the same ticks: :func:`_ticks_once`).
        Returns the number of rows sent. Raises :class:`StoreUnavailable` or :class:`StoreRejected`.
        """
        names = tuple(columns)
        data = [list(columns[name]) for name in names]
        n_rows = len(data[0]) if data else 0
        if n_rows == 0:
            return 0
        settings: dict[str, Any] = dict(INSERT_SETTINGS)
        if dedup_token:
            settings["insert_deduplication_token"] = dedup_token
        with self._lock:
            try:
                types = self._column_types(table, names)
                if repeated_timestamps:
                    data = [_ticks_once(values, type_name) for values, type_name in zip(data, types, strict=True)]
                self._client.insert(
                    table,
                    data,
                    column_names=list(names),
                    column_type_names=types,
                    column_oriented=True,
                    settings=settings,
                )
            except StoreError:
                raise
            except Exception as exc:
                self._column_type_cache.pop(table, None)
                raise _classify(exc, f"insert into {table} failed") from None
        return n_rows

    def insert_json(self, table: str, lines: bytes, dedup_token: str) -> None:
        """Insert JSON lines (``JSONEachRow``) into ``table``; a block whose ``dedup_token`` was
        already stored is dropped, in the table's materialized views too.

        Raises :class:`StoreRejected` when the engine cannot read a line or a value does not fit its
        column (:data:`JSON_DATA_ERROR_CODES`), :class:`StoreUnavailable` otherwise.
        """
        settings: dict[str, Any] = {
            **INSERT_SETTINGS,
            "insert_deduplication_token": dedup_token,
            "input_format_skip_unknown_fields": 1,
            "input_format_json_ignore_unknown_keys_in_named_tuple": 1,
            "input_format_allow_errors_num": 0,
            "input_format_allow_errors_ratio": 0,
            "precise_float_parsing": 1,
            # the views of a block run side by side, and a large block is parsed in chunks in parallel
            "parallel_view_processing": 1,
            "min_chunk_bytes_for_parallel_parsing": 1 << 20,
        }
        with self._lock:
            try:
                self._client.raw_insert(table, None, lines, settings=settings, fmt="JSONEachRow")
            except Exception as exc:
                raise _classify(exc, f"insert into {table} failed", JSON_DATA_ERROR_CODES) from None

    def _column_types(self, table: str, names: Sequence[str]) -> list[str]:
        known = self._column_type_cache.get(table)
        if known is None or any(name not in known for name in names):
            try:
                result = self._client.query(f"DESCRIBE TABLE {table}")
            except Exception as exc:
                raise _classify(exc, f"cannot describe {table}") from None
            known = {str(row[0]): str(row[1]) for row in result.result_rows}
            self._column_type_cache[table] = known
        missing = [name for name in names if name not in known]
        if missing:
            raise StoreRejected(f"table {table} has no column(s) {', '.join(missing)}")
        return [known[name] for name in names]

    def forget_schema(self) -> None:
        """Drop cached column types (after migrations changed a table)."""
        with self._lock:
            self._column_type_cache.clear()

    def close(self) -> None:
        # closing a broken connection must not mask the real error
        with self._lock, contextlib.suppress(Exception):
            self._client.close()
        with self._control_lock, contextlib.suppress(Exception):
            if self._control is not None:
                self._control.close()


def open_store(url: str, read_only: bool = False, limits: ReadLimits | None = None) -> ClickHouseStore:
    return ClickHouseStore(url, read_only=read_only, limits=limits)
