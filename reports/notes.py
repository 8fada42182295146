"""What the reader of ``report`` and ``advise`` must know about the figures beside them.

Today: the GPU models of the history that have no list price (``gpu_prices``, filled by the sink
from ``GPULENS_PRICES_USD_PER_GPU_HOUR``). Their GPU-hours are counted at $0 in every ``*_cost_usd``
figure, so a missing price reads as "free" unless it is said: the note names the models and how to
price them. The notes go to the text output after the figures, and to stderr beside ``--json`` (the
JSON stays as it is).
"""

from __future__ import annotations

from reports.analyses import IN_CLUSTER, SqlReader, query_rows

_UNPRICED = f"""
SELECT s.gpu_model AS gpu_model, count() AS samples
FROM gpu_samples AS s
WHERE s.{IN_CLUSTER} AND s.gpu_model != '' AND s.mig_parent_uuid = ''
  AND s.gpu_model NOT IN (SELECT gpu_model FROM gpu_prices)
GROUP BY gpu_model ORDER BY gpu_model"""


def unpriced_models(reader: SqlReader) -> list[str]:
    """GPU models in the cluster's GPU samples without a list price (``reader``: bound to a cluster)."""
    return [str(row["gpu_model"]) for row in query_rows(reader, _UNPRICED)]


def price_note(models: list[str]) -> str | None:
    if not models:
        return None
    example = ", ".join(f'"{m}": 2.5' for m in models[:2])
    return (f"note: no list price for GPU model(s) {', '.join(models)}: their GPU-hours count as $0 in every cost "
            "figure (cost unknown, not free). Price them for the sink: "
            f"GPULENS_PRICES_USD_PER_GPU_HOUR='{{{example}}}' (USD per GPU-hour; the sink loads them into gpu_prices "
            "at start)")


def reader_notes(reader: SqlReader) -> list[str]:
    """Every note for a reader bound to one cluster (empty when there is nothing to say)."""
    notes = [price_note(unpriced_models(reader))]
    return [note for note in notes if note]
