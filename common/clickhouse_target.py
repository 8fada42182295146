"""Where the history lives: ``GPULENS_CLICKHOUSE__URL`` parsed once, and the one way it is shown.

Two kinds of target, one URL each: ``chdb:///path`` is the embedded engine on that directory (a
relative ``chdb://dir/sub`` is relative to the working directory), ``http(s)://user:password@host:port/database``
a ClickHouse server. :meth:`ClickHouseTarget.parse` is the only parser of that URL (the settings
validate with it, the sink and the readers take the embedded path and the scheme from it), and
:attr:`ClickHouseTarget.masked` (:func:`masked_url` for text that did not parse) the only form
that reaches a log line, an error message or ``gpulens config show``: the password is replaced by
:data:`MASK`, the mask pydantic's ``SecretStr`` prints, so every secret of a configuration reads the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast
from urllib.parse import unquote, urlsplit

MASK = "**********"
"""What a password is shown as (the same as pydantic's ``SecretStr``)."""

Scheme = Literal["chdb", "http", "https"]
DEFAULT_PORTS: dict[Scheme, int] = {"http": 8123, "https": 8443}
"""The port a server URL without one is reached on (what the ClickHouse client uses)."""


@dataclass(frozen=True)
class ClickHouseTarget:
    """One ClickHouse target. ``url`` (with its password) is for the driver only; show :attr:`masked`."""

    url: str = field(repr=False)
    scheme: Scheme
    path: Path | None = None
    """The embedded engine's directory (``chdb`` only: ``embedded``)."""
    host: str | None = None
    port: int | None = None
    database: str | None = None
    """The database named in the URL's path; ``None``: the user's default database."""
    user: str | None = None

    @classmethod
    def parse(cls, url: str) -> ClickHouseTarget:
        """Raises ``ValueError`` naming the accepted forms when ``url`` is neither."""
        expected = f"expected chdb:///path or http(s)://host:port/db, got {masked_url(url)!r}"
        parts = urlsplit(url)
        if parts.scheme == "chdb":
            path = unquote(parts.path if not parts.netloc else parts.netloc + parts.path)
            if not path:
                raise ValueError(expected)
            return cls(url, "chdb", path=Path(path))
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            raise ValueError(expected)
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{expected}: the port is not a number from 0 to 65535") from None
        scheme = cast(Scheme, parts.scheme)
        return cls(url, scheme, host=parts.hostname, port=port or DEFAULT_PORTS[scheme],
                   database=unquote(parts.path.strip("/")) or None,
                   user=unquote(parts.username) if parts.username else None)

    @classmethod
    def embedded_under(cls, data_dir: Path) -> ClickHouseTarget:
        """The default target: the embedded engine in ``data_dir/clickhouse``."""
        return cls.parse(f"chdb://{data_dir / 'clickhouse'}")

    @property
    def embedded(self) -> bool:
        return self.scheme == "chdb"

    @property
    def masked(self) -> str:
        """The URL with its password (if any) replaced by :data:`MASK`."""
        return masked_url(self.url)

    def __str__(self) -> str:
        return self.masked


def masked_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part replaced by :data:`MASK`; also for
    text that is no target (an error message quotes what it was given)."""
    parts = urlsplit(url)
    credentials, at, address = parts.netloc.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return parts._replace(netloc=f"{credentials.partition(':')[0]}:{MASK}@{address}").geturl()
