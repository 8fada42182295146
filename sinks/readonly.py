"""The read-only guard of ``gpulens sql``, ``gpulens report`` and the sink's query endpoint.

Two layers, the engine first:

1. **The engine enforces.** Every reading client runs with ``readonly = 1`` (set last, after the
   limits): ClickHouse itself refuses writes, DDL, ``SET``/``SETTINGS`` changes (so the limits
   below cannot be raised) and every table function that touches files, processes or the network
   (``file``, ``url``, ``remote``, ``s3``, ``executable``, ...). On a server, point the reader at a
   user whose profile has ``readonly = 1`` and these limits as constraints.
2. **The engine's parser decides what the text is.** ClickHouse's own parser
   (``formatQuerySingleLine``, the SQL passed as a bound parameter, never spliced) refuses
   several statements and syntax errors and returns the canonical text: no comments, heredocs
   turned into plain literals. That canonical text is what runs. :func:`check_canonical` lexes it
   and refuses what ``readonly = 1`` does not stop: ``INTO OUTFILE`` (carried out by the embedded
   client itself), the scalar ``file()`` function, and any statement that is not a query.

Limits (:class:`ReadLimits`) go on every reading client as engine settings; with ``readonly = 1``
the caller cannot change them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.errors import PermanentError
from common.settings import ClickHouseSettings

ALLOWED_FIRST_WORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS"})

DENIED_FUNCTIONS = frozenset({
    "file", "filecluster", "url", "urlcluster", "remote", "remotesecure", "cluster", "clusterallreplicas",
    "mysql", "postgresql", "mongodb", "redis", "sqlite", "jdbc", "odbc", "hdfs", "hdfscluster",
    "s3", "s3cluster", "gcs", "oss", "cosn", "azureblobstorage", "azureblobstoragecluster",
    "executable", "executablepool", "input", "python", "arrowstream", "dictionary", "ytsaurus",
})
"""Functions and table functions that read or write files, processes or the network (lower case)."""

DENIED_PREFIXES = ("iceberg", "deltalake", "hudi", "paimon")
"""Families of lake/object-store table functions (``icebergS3``, ``deltaLakeAzure``, ...)."""


class ReadOnlyViolation(PermanentError, ValueError):
    """The SQL is not a single read-only query; the message says why in one line."""


@dataclass(frozen=True)
class ReadLimits:
    """What one read query may use; applied as engine settings the caller cannot raise."""

    max_execution_time_s: float = 60.0
    max_memory_bytes: int = 2 * 1024**3
    max_result_rows: int = 1_000_000
    max_query_bytes: int = 256 * 1024

    @classmethod
    def from_settings(cls, clickhouse: ClickHouseSettings) -> ReadLimits:
        return cls(max_execution_time_s=clickhouse.query_max_execution_time_s,
                   max_memory_bytes=clickhouse.query_max_memory_bytes,
                   max_result_rows=clickhouse.query_max_result_rows)

    @property
    def spill_bytes(self) -> int:
        """What a query's aggregation or sort may hold in memory before it continues on disk: an
        eighth of :attr:`max_memory_bytes`, so that a month of windows grouped per GPU and minute
        (the shared-GPU cost, the advisor) spills instead of failing at the limit."""
        return self.max_memory_bytes // 8

    def engine_settings(self) -> dict[str, Any]:
        """The settings of a reading client, ``readonly`` last (after it nothing can be set)."""
        return {
            "max_execution_time": self.max_execution_time_s,
            "timeout_overflow_mode": "throw",
            "max_memory_usage": self.max_memory_bytes,
            "max_bytes_before_external_group_by": self.spill_bytes,
            "max_bytes_before_external_sort": self.spill_bytes,
            "max_result_rows": self.max_result_rows,
            "result_overflow_mode": "throw",
            "max_query_size": self.max_query_bytes,
            "readonly": 1,
        }


@dataclass(frozen=True)
class Token:
    kind: str
    """``word``, ``string``, ``quoted`` (a quoted identifier), ``number`` or ``punct``."""
    text: str


def _scan_quoted(sql: str, i: int) -> int:
    """Index just past the literal or quoted identifier that starts at ``i``."""
    quote, j, n = sql[i], i + 1, len(sql)
    while j < n:
        if sql[j] == "\\":
            j += 2
            continue
        if sql[j] == quote:
            if j + 1 < n and sql[j + 1] == quote:
                j += 2
                continue
            return j + 1
        j += 1
    raise ReadOnlyViolation(f"unterminated {quote} literal")


def _comment_end(sql: str, i: int) -> int | None:
    """Where the comment at ``i`` ends (None: no comment there)."""
    if sql.startswith("--", i) or sql.startswith("#", i):
        end = sql.find("\n", i)
        return len(sql) if end < 0 else end
    if not sql.startswith("/*", i):
        return None
    depth, j, n = 1, i + 2, len(sql)
    while j < n and depth:
        if sql.startswith("/*", j):
            depth, j = depth + 1, j + 2
        elif sql.startswith("*/", j):
            depth, j = depth - 1, j + 2
        else:
            j += 1
    if depth:
        raise ReadOnlyViolation("unterminated /* comment")
    return j


def _run_end(sql: str, i: int, more: str) -> int:
    """The end of the run from ``i + 1`` of alphanumerics and characters of ``more``."""
    j, n = i + 1, len(sql)
    while j < n and (sql[j].isalnum() or sql[j] in more):
        j += 1
    return j


def _token(sql: str, i: int) -> Token:
    """The token that starts at ``i`` (not a space nor a comment)."""
    ch = sql[i]
    if ch in "'\"`":
        return Token("string" if ch == "'" else "quoted", sql[i:_scan_quoted(sql, i)])
    if ch.isalpha() or ch == "_" or ch == "$":
        return Token("word", sql[i:_run_end(sql, i, "_$")])
    if ch.isdigit():
        return Token("number", sql[i:_run_end(sql, i, "._")])
    return Token("punct", ch)


def lex(sql: str) -> list[Token]:
    """ClickHouse tokens of ``sql`` (comments dropped; literals kept whole)."""
    tokens: list[Token] = []
    i, n = 0, len(sql)
    while i < n:
        if sql[i].isspace():
            i += 1
            continue
        end = _comment_end(sql, i)
        if end is not None:
            i = end
            continue
        token = _token(sql, i)
        tokens.append(token)
        i += len(token.text)
    return tokens


def check_canonical(canonical: str) -> str:
    """Refuse what ``readonly = 1`` lets through; ``canonical`` is the engine's formatting of one statement."""
    tokens = lex(canonical)
    words = [t for t in tokens if t.kind != "punct" or t.text != "("]
    if not words:
        raise ReadOnlyViolation("empty query")
    first = words[0].text.upper() if words[0].kind == "word" else words[0].text
    if first not in ALLOWED_FIRST_WORDS:
        raise ReadOnlyViolation(
            f"read-only: {first} statements are refused; only SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, EXISTS"
        )
    for index, token in enumerate(tokens):
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        if token.kind == "punct" and token.text == ";":
            raise ReadOnlyViolation("only one statement is allowed")
        if token.kind != "word" or after is None:
            continue
        if token.text.upper() == "INTO" and after.kind == "word" and after.text.upper() == "OUTFILE":
            raise ReadOnlyViolation("read-only: INTO OUTFILE is refused")
        name = token.text.lower()
        if after.text == "(" and (name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES)):
            raise ReadOnlyViolation(f"read-only: {token.text}() reads files, processes or the network; refused")
    return canonical


def guard(sql: str, canonicalize: Callable[[str], str], limits: ReadLimits) -> str:
    """The statement to run for ``sql``: the engine's canonical text of one checked query.

    ``canonicalize`` asks the engine's parser (it raises :class:`ReadOnlyViolation` on a syntax
    error or several statements).
    """
    if not sql.strip():
        raise ReadOnlyViolation("empty query")
    size = len(sql.encode())
    if size > limits.max_query_bytes:
        raise ReadOnlyViolation(f"the query is {size} bytes; the limit is {limits.max_query_bytes}")
    return check_canonical(canonicalize(sql))
