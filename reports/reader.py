"""How every report query reads the sink's store: one cluster at a time, rows as plain dicts.

``gpulens report`` (:mod:`reports.analyses`), the advisor (:mod:`reports.advise`), the time
series and the notes all run SQL through a :class:`SqlReader` (chDB or a ClickHouse server, the
same SQL on both) and read the answer with :func:`query_rows`.

Every query sees one cluster (``cluster = {cluster:String}``, :data:`IN_CLUSTER`, bound by
:class:`ClusterScope`): node names and pod uids repeat across clusters, and a figure summed over
several would mean nothing. :func:`scoped` picks the cluster: the one asked for, else the only
one in the store; with several and none asked for it refuses (:class:`ClusterError`), so a
report never silently mixes or picks clusters.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from common.errors import UserError

if TYPE_CHECKING:  # the ClickHouse client only where queries run: `gpulens report --help` stays fast
    from sinks.clickhouse import QueryResult
    from sinks.rollups import Rollup


class SqlReader(Protocol):
    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult: ...


Row = dict[str, Any]
"""One row of a query's answer: column name -> value (JSON-friendly: numbers, text, ISO times, lists)."""
Rows = list[Row]

IN_CLUSTER = "cluster = {cluster:String}"
"""The condition each analysis query applies to every table and view it reads."""

_CLUSTERS_SQL = """
SELECT DISTINCT cluster FROM (
    SELECT DISTINCT cluster FROM node_states UNION ALL SELECT DISTINCT cluster FROM pod_states
    UNION ALL SELECT DISTINCT cluster FROM cluster_capacity UNION ALL SELECT DISTINCT cluster FROM team_daily
) ORDER BY cluster"""
"""The clusters a store holds data of; the windows' clusters from their daily rollup, which has them
all (it is kept longer) in a few rows per day instead of one per pod, GPU and minute."""


def sql_time(value: datetime) -> str:
    """``value`` as the ``String`` a query parameter gives ``toDateTime64(..., 3, 'UTC')``."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def utc_time(value: object) -> datetime:
    """A time of a query's answer (a ``datetime``, naive meaning UTC, or ISO text) as an aware ``datetime``."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


START = "toDateTime64({start:String}, 3, 'UTC')"
"""The period's start in a query (the ``start`` parameter of :attr:`Period.parameters`)."""


@dataclass(frozen=True)
class Period:
    """A report's period: the rows at or after :attr:`start` (None: the whole history), up to the
    latest data, :attr:`end` (information). Each query takes the rows of its tables through it and
    binds :attr:`parameters`."""

    start: datetime | None = None
    end: datetime | None = None

    @property
    def seconds(self) -> float | None:
        """Its length (None: the whole history)."""
        return None if self.start is None or self.end is None else (self.end - self.start).total_seconds()

    @property
    def parameters(self) -> dict[str, str]:
        return {} if self.start is None else {"start": sql_time(self.start)}

    def rows(self, rollup: Rollup) -> str:
        """The rollup's rows of the period (:meth:`~sinks.rollups.Rollup.rows_since`)."""
        return rollup.rows_since(None if self.start is None else "start")

    def at_or_after(self, time: str) -> str:
        """`` AND time >= start``, or nothing for the whole history."""
        return "" if self.start is None else f" AND {time} >= {START}"

    def after(self, time: str) -> str:
        """`` AND time > start`` (an end: what ended at the start had no time in the period), or nothing."""
        return "" if self.start is None else f" AND {time} > {START}"


WHOLE_HISTORY = Period()


class ClusterError(UserError, ValueError):
    """No one cluster to report on: the store holds several and none was named, or the named one has
    no data (the message lists the clusters there are)."""


class ClusterScope:
    """A reader whose queries are bound to one cluster (the ``cluster`` query parameter)."""

    def __init__(self, reader: SqlReader, cluster: str) -> None:
        self.reader = reader
        self.cluster = cluster

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        if "{cluster:String}" in sql:
            parameters = {"cluster": self.cluster, **(parameters or {})}
        return self.reader.query(sql, parameters)


def clusters(reader: SqlReader) -> list[str]:
    """The clusters the store holds data of, by name."""
    base = reader.reader if isinstance(reader, ClusterScope) else reader
    return [str(row[0]) for row in base.query(_CLUSTERS_SQL).rows]


def scoped(reader: SqlReader, cluster: str | None = None) -> ClusterScope:
    """``reader`` bound to ``cluster``, else to the store's only cluster (``default`` when empty).

    Raises :class:`ClusterError` when the store holds several and none is named, or for a named
    cluster the store has no data of."""
    from schemas.messages import DEFAULT_CLUSTER

    if isinstance(reader, ClusterScope) and cluster in (None, reader.cluster):
        return reader
    names = clusters(reader)
    if cluster is None:
        if len(names) > 1:
            raise ClusterError(f"the store holds {len(names)} clusters ({', '.join(names)}): name one with "
                                  "--cluster (each cluster's figures are separate; they are never summed)")
        return ClusterScope(reader, names[0] if names else DEFAULT_CLUSTER)
    if names and cluster not in names:
        raise ClusterError(f"no data of cluster {cluster!r}; the store holds: {', '.join(names)}")
    return ClusterScope(reader.reader if isinstance(reader, ClusterScope) else reader, cluster)


_DATA_END = f"""
SELECT maxOrNull(e) AS data_end FROM (
    SELECT max(last_end) AS e FROM pod_hourly WHERE {IN_CLUSTER}
    UNION ALL SELECT max(window_end) AS e FROM cluster_capacity WHERE {IN_CLUSTER}
) WHERE e > toDateTime64(0, 3, 'UTC')"""


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""Where a period longer than the data starts (the store holds nothing earlier)."""


def data_period(reader: SqlReader, since_s: float) -> tuple[datetime, datetime] | None:
    """The last ``since_s`` seconds of the data: counted back from the latest window stored (pod or
    capacity; not the wall clock, so a replayed or lagging history reads the same), from
    :data:`EPOCH` at the earliest; None: no data."""
    rows = query_rows(reader, _DATA_END)
    end = rows[0]["data_end"] if rows else None
    if not end:
        return None
    data_end = utc_time(end)
    longest_s = (data_end - EPOCH).total_seconds()
    return (EPOCH if since_s >= longest_s else data_end - timedelta(seconds=since_s)), data_end


def query_rows(reader: SqlReader, sql: str, parameters: dict[str, Any] | None = None) -> Rows:
    """Rows of ``sql`` as dicts; a query that names ``{cluster:String}`` reads :func:`scoped` ``reader``."""
    if "{cluster:String}" in sql:
        return scoped(reader).query(sql, parameters).dicts()
    return reader.query(sql, parameters).dicts()


def round_floats(rows: Rows, digits: int = 6) -> Rows:
    """``rows`` with every float rounded to ``digits`` places (in place, and returned)."""
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float):
                row[key] = round(value, digits)
    return rows
