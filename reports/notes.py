"""What the reader of ``report`` and ``advise`` must know about the figures beside them.

GPU models of the history without a list price (``gpu_prices``, filled by the sink from
``GPULENS_PRICES_USD_PER_GPU_HOUR``): the stream and the SQL count their GPU-hours at $0, so every
money figure that includes them is a lower bound that would read as "free". :class:`PriceGaps`
names what they touch (pods, nodes, teams), and :func:`unknown_money` turns each such figure into
``None`` (JSON ``null``, "unknown" in text and HTML); a figure over the whole fleet is unknown as soon
as one model is unpriced. The notes name the models and how to price them; they go to the text
output after the figures, and to stderr beside ``--json``.

Records of the period that the pipeline refused (dead letters, by reason code) are not in any
figure: :func:`dead_letter_note` says how many, from the counts the CLI reads on Kafka, or that
they could not be counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reports.advise import headline_text
from reports.analyses import NONE
from reports.reader import IN_CLUSTER, WHOLE_HISTORY, Period, SqlReader, query_rows
from sinks.rollups import GPU_DAILY, POD_DAILY


def _unpriced(period: Period) -> str:
    return f"""
SELECT s.gpu_model AS gpu_model, sum(s.samples) AS samples
FROM {period.rows(GPU_DAILY)} AS s
WHERE s.{IN_CLUSTER} AND s.gpu_model != '' AND s.mig_parent_uuid = ''
  AND s.gpu_model NOT IN (SELECT gpu_model FROM gpu_prices)
GROUP BY gpu_model ORDER BY gpu_model"""


def _gap_pods(period: Period) -> str:
    return f"""
SELECT DISTINCT namespace, pod, if(team = '', {NONE}, team) AS team
FROM {period.rows(POD_DAILY)} WHERE {IN_CLUSTER} AND has({{models:Array(String)}}, gpu_model)"""


def _gap_nodes(period: Period) -> str:
    return f"""
SELECT DISTINCT node FROM {period.rows(GPU_DAILY)} WHERE {IN_CLUSTER} AND has({{models:Array(String)}}, gpu_model)"""

POD_CATEGORIES = frozenset({"reclaim", "right_size", "queue", "scale_to_zero"})
"""Categories of the report's advisor rows whose ``subject`` names one pod (``ns/pod``) or node."""


@dataclass(frozen=True)
class PriceGaps:
    """What the unpriced GPU models of a period touch: a money figure over any of it is unknown."""

    models: tuple[str, ...] = ()
    pods: frozenset[tuple[str, str]] = frozenset()
    teams: frozenset[str] = frozenset()
    nodes: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.models)

    def touches(self, row: dict[str, Any]) -> bool:
        """Whether ``row``'s money may include unpriced GPU-hours: a pod's, a node's or a team's row
        when it is theirs, any other row (a total, a time bucket, a pool) as soon as a gap exists."""
        if not self:
            return False
        if "namespace" in row and "pod" in row:
            return (row["namespace"], row["pod"]) in self.pods
        if "node" in row:
            return row["node"] in self.nodes
        if "subject" in row:
            named = row["subject"] in self.nodes or tuple(str(row["subject"]).split("/", 1)) in self.pods
            return named or row.get("category") not in POD_CATEGORIES
        for key in ("team", "team_label"):
            if key in row:
                return row[key] in self.teams
        return True


def price_gaps(reader: SqlReader, period: Period = WHOLE_HISTORY) -> PriceGaps:
    """The price gaps of the cluster ``reader`` is bound to over ``period`` (empty when every model it
    sampled then has a price)."""
    models = unpriced_models(reader, period)
    if not models:
        return PriceGaps()
    params = {"models": models, **period.parameters}
    pods = query_rows(reader, _gap_pods(period), params)
    return PriceGaps(tuple(models), frozenset((str(r["namespace"]), str(r["pod"])) for r in pods),
                     frozenset(str(r["team"]) for r in pods),
                     frozenset(str(r["node"]) for r in query_rows(reader, _gap_nodes(period), params)))


def is_money(column: str) -> bool:
    return column.endswith("_usd")


def unknown_money(rows: Iterable[dict[str, Any]], gaps: PriceGaps) -> None:
    """Set every money figure of ``rows`` that the gaps touch to ``None`` (in place)."""
    for row in rows:
        if gaps.touches(row):
            for column in row:
                if is_money(column):
                    row[column] = None


def unknown_money_in_report(data: dict[str, Any], gaps: PriceGaps) -> None:
    """:func:`unknown_money` over every section of a report (``run_report``'s or the HTML's data)."""
    for rows in data.values():
        if isinstance(rows, list):
            unknown_money((r for r in rows if isinstance(r, dict)), gaps)


def unknown_money_in_advice(advice: dict[str, Any], gaps: PriceGaps) -> None:
    """:func:`unknown_money` over the advisor's lists, and its totals and headline money when any gap
    exists (they sum over the fleet)."""
    if not gaps or advice.get("headline") is None:
        return
    fits = advice["headline_text"] == headline_text(advice["headline"], advice["period"]["team"])
    for key in ("reclaim", "scale_to_zero", "right_size", "pack", "queue"):
        unknown_money(advice.get(key, []), gaps)
    advice["totals"] = {k: (None if is_money(k) else v) for k, v in advice["totals"].items()}
    advice["headline"]["usd_per_month"] = None
    if fits:
        advice["headline_text"] = headline_text(advice["headline"], advice["period"]["team"])


def unpriced_models(reader: SqlReader, period: Period = WHOLE_HISTORY) -> list[str]:
    """GPU models in the cluster's GPU samples (of ``period``) without a list price (``reader``: bound
    to a cluster)."""
    return [str(row["gpu_model"]) for row in query_rows(reader, _unpriced(period), period.parameters)]


def price_note(models: list[str]) -> str | None:
    if not models:
        return None
    example = ", ".join(f'"{m}": 2.5' for m in models[:2])
    return (f"note: no list price for GPU model(s) {', '.join(models)}: every cost figure that includes their "
            "GPU-hours is shown as unknown. Price them for the workers and the sink: "
            f"GPULENS_PRICES_USD_PER_GPU_HOUR='{{{example}}}' (USD per GPU-hour; the sink loads them into gpu_prices "
            "at start)")


def gap_notes(gaps: PriceGaps) -> list[str]:
    """Every note for the gaps of one cluster (empty when there is nothing to say)."""
    notes = [price_note(list(gaps.models))]
    return [note for note in notes if note]


_PERIOD_START = f"""
SELECT min(start) AS start FROM (
    SELECT min(first_start) AS start FROM team_daily WHERE {IN_CLUSTER}
    UNION ALL SELECT min(window_start) AS start FROM cluster_capacity WHERE {IN_CLUSTER})"""


def period_start(reader: SqlReader) -> datetime | None:
    """The start of the history of the cluster ``reader`` is bound to (None: no windows yet)."""
    rows = query_rows(reader, _PERIOD_START)
    start = rows[0]["start"] if rows else None
    if isinstance(start, str):
        start = datetime.fromisoformat(start.replace("Z", "+00:00"))
    return start if isinstance(start, datetime) and start.year > 1970 else None


def dead_letter_note(counts: Mapping[str, int] | None, topic: str, since: datetime, where: str) -> str | None:
    """The note for the dead letters written to ``topic`` since ``since``: ``counts`` by reason code,
    or None when Kafka (``where``) could not be asked; no note when there are none."""
    when = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    if counts is None:
        return (f"note: dead letters since {when} not counted: Kafka at {where} did not answer (records the "
                "pipeline refused are not in these figures; `gpulens check` counts them)")
    total = sum(counts.values())
    if not total:
        return None
    reasons = ", ".join(f"{reason or 'unknown'} {n}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return (f"note: {total} record(s) were dead-lettered on {topic} since {when} ({reasons}): the figures above "
            "do not include them; `gpulens check` says what to change for each reason")
