"""The read-only guard of ``gpulens sql`` and the query endpoint.

A syntactic check gives a clear one-line refusal before anything reaches ClickHouse: exactly one
statement, and it must be a query (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, EXISTS) without
``INTO OUTFILE``. The engine enforces the same (``readonly = 2`` on every reading client), so a
statement that slips past this parser still cannot write.
"""

from __future__ import annotations

ALLOWED_FIRST_WORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS"})


class ReadOnlyViolation(ValueError):
    """The SQL is not a single read-only query; the message says why in one line."""


def _strip(sql: str) -> str:
    """The SQL with comments removed and string/identifier literals blanked (same statement shape)."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        line_comment = sql.startswith("--", i) or sql.startswith("#!", i) or sql.startswith("# ", i)
        if line_comment:
            end = sql.find("\n", i)
            i = n if end < 0 else end
            out.append(" ")
            continue
        if ch == "/" and sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            if end < 0:
                raise ReadOnlyViolation("unterminated /* comment")
            i = end + 2
            out.append(" ")
            continue
        if ch in ("'", '"', "`"):
            j = i + 1
            while j < n:
                if sql[j] == "\\":
                    j += 2
                    continue
                if sql[j] == ch:
                    if j + 1 < n and sql[j + 1] == ch:  # doubled quote escapes itself
                        j += 2
                        continue
                    break
                j += 1
            if j >= n:
                raise ReadOnlyViolation(f"unterminated {ch} literal")
            out.append(ch + "x" + ch)
            i = j + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def check_read_only(sql: str) -> str:
    """Return the single query (trailing semicolon removed) or raise :class:`ReadOnlyViolation`."""
    if not sql.strip():
        raise ReadOnlyViolation("empty query")
    shape = _strip(sql)
    body = shape.rstrip().rstrip(";").rstrip()
    if ";" in body:
        raise ReadOnlyViolation("only one statement is allowed (found ';' between statements)")
    words = body.split()
    if not words:
        raise ReadOnlyViolation("empty query")
    first = words[0].lstrip("(").upper()
    if first not in ALLOWED_FIRST_WORDS:
        raise ReadOnlyViolation(
            f"read-only: {first} statements are refused; only SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, EXISTS"
        )
    upper = " ".join(body.upper().split())
    if "INTO OUTFILE" in upper:
        raise ReadOnlyViolation("read-only: INTO OUTFILE is refused")
    # drop the trailing semicolon(s) from the original text, keeping literals intact
    text = sql.rstrip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    return text
