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

from typing import TYPE_CHECKING, Any, Protocol

from common.errors import UserError

if TYPE_CHECKING:  # the ClickHouse client only where queries run: `gpulens report --help` stays fast
    from sinks.clickhouse import QueryResult


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
