"""``gpulens advise``: how many GPUs the fleet could free, the pods behind it, and the money.

Reads the history the pipeline stored (the same stores as ``gpulens report``); the analysis is
:func:`reports.advise.advise`, the method docs/advise.md. Thresholds come from ``GPULENS_ADVISE__*``
settings; the flags here override them.
"""

from __future__ import annotations

from typing import Any

import click
import orjson

from common.errors import UserError
from common.text import printable
from gpulens.commands.analysis import dead_letter_notes, echo_notes, format_table, human, open_analysis_reader
from gpulens.commands.base import clickhouse_option, duration_s, settings_from_flags, with_common_options

SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reclaim", "Reclaim: pods that held GPUs while idle",
     ("namespace", "pod", "owner", "team", "node", "gpus", "idle_class", "idle_since", "last_busy", "gpu_hours",
      "cost_usd")),
    ("scale_to_zero", "Scale to zero: nodes never allocated",
     ("node", "pool", "gpu_model", "gpus", "first_seen", "last_seen", "gpu_hours", "cost_usd")),
    ("right_size", "Right-size: pods whose demand fits a smaller unit",
     ("namespace", "pod", "owner", "team", "gpus", "recommendation", "evidence_hours", "percentile_sm_pct_per_gpu",
      "peak_sm_pct", "confidence", "freed_gpu_hours", "freed_in", "freed_cost_usd")),
    ("pack", "Pack: GPUs needed per node pool at percentile demand",
     ("pool", "pods", "held_gpu_hours", "right_size_gpu_hours", "needed_gpu_hours", "freed_gpu_hours",
      "freed_cost_usd", "packed_pods")),
    ("queue", "Queue: pending time lost to fragmentation",
     ("namespace", "pod", "team", "gpus", "pending_s", "fragmented_pending_s", "delayed_gpu_hours",
      "defrag_would_place_at", "free_gpus", "largest_free_block", "gpus_to_move")),
)
"""The advisor's lists as the text output shows them: key, title, columns."""


def render_text(advice: dict[str, Any]) -> str:
    """The advisor's findings for people: headline, pack line, reconciliation, then each list."""
    from reports.advise import pack_text, per_gpu_text

    if advice["headline"] is None:
        return printable(str(advice["headline_text"]), multiline=True)
    period, totals = advice["period"], advice["totals"]
    money_unknown = totals["capacity_cost_usd"] is None
    lines = [advice["headline_text"],
             pack_text(advice["headline"]),
             f"period: {period['start']} .. {period['end']} (--since counts back from the latest data)"
             + (f", team {period['team']}" if period["team"] else ""),
             "GPU-hours: capacity {capacity_gpu_hours:.2f} = held by pods {held_gpu_hours:.2f} + unallocated "
             "{unallocated_gpu_hours:.2f}; reclaimable {reclaimable_gpu_hours:.2f} = reclaim {reclaim_gpu_hours:.2f}"
             " + right-size {right_size_gpu_hours:.2f} + pack {pack_gpu_hours:.2f} + scale-to-zero "
             "{scale_to_zero_gpu_hours:.2f}; cost {reclaimable} of {capacity}"
             .format(**totals, reclaimable=human("cost_usd", totals["reclaimable_cost_usd"], True),
                     capacity=human("cost_usd", totals["capacity_cost_usd"], True))]
    for key, title, columns in SECTIONS:
        rows = advice[key]
        lines.append(f"\n== {title}")
        if not rows:
            lines.append("(none)")
            continue
        lines.append(format_table(list(columns), [[per_gpu_text(row[c]) if c == "percentile_sm_pct_per_gpu"
                                                   else human(c, row.get(c), money_unknown)
                                                   for c in columns] for row in rows]))
    return printable("\n".join(lines), multiline=True)


@click.command("advise")
@click.option("--since", default=None, help="period counted back from the latest data, e.g. 7d, 36h "
              "[env GPULENS_ADVISE__SINCE_S, seconds; default 7d]")
@click.option("--team", default=None, help="only this team's pods ('(none)' for pods without a team)")
@click.option("--cluster", default=None, help="the cluster to advise on; required when the store holds several")
@click.option("--json", "as_json", is_flag=True, help="one JSON object with every list and total")
@click.option("--percentile", type=float, default=None, help="SM demand percentile [GPULENS_ADVISE__PERCENTILE; 95]")
@click.option("--headroom", "headroom_pct", type=float, default=None,
              help="headroom %% over observed demand [GPULENS_ADVISE__HEADROOM_PCT; 20]")
@click.option("--min-evidence", default=None, help="active time needed for a recommendation, e.g. 1h "
              "[GPULENS_ADVISE__MIN_EVIDENCE_S; 1h]")
@click.option("--idle-stretch", default=None, help="shortest idle run to reclaim, e.g. 1h "
              "[GPULENS_ADVISE__IDLE_STRETCH_S; 1h]")
@click.option("--bucket", default=None, help="time bucket of reclaim and pack, e.g. 1h [GPULENS_ADVISE__BUCKET_S; 1h]")
@clickhouse_option
@with_common_options
def advise(since: str | None, team: str | None, cluster: str | None, as_json: bool, percentile: float | None,
           headroom_pct: float | None,
           min_evidence: str | None, idle_stretch: str | None, bucket: str | None, clickhouse_url: str | None,
           **flags: Any) -> None:
    """Reclaimable GPUs: idle pods, oversized pods, packing, fragmentation, empty nodes, with the money."""
    from pydantic import ValidationError

    from common.settings import AdvisorSettings
    from reports.advise import advise as run_advice
    from reports.analyses import ClusterError, scoped
    from reports.notes import gap_notes, price_gaps, unknown_money_in_advice
    from reports.reader import Period, utc_time
    from sinks.clickhouse import StoreError

    overrides = {"since_s": ("--since", duration_s(since, "--since")),
                 "percentile": ("--percentile", percentile), "headroom_pct": ("--headroom", headroom_pct),
                 "min_evidence_s": ("--min-evidence", duration_s(min_evidence, "--min-evidence")),
                 "idle_stretch_s": ("--idle-stretch", duration_s(idle_stretch, "--idle-stretch")),
                 "bucket_s": ("--bucket", duration_s(bucket, "--bucket"))}
    settings: AdvisorSettings = settings_from_flags(AdvisorSettings, **flags)
    given = {k: v for k, (_, v) in overrides.items() if v is not None}
    try:
        thresholds = type(settings.advise).model_validate(settings.advise.model_dump() | given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        raise UserError(f"{overrides[name][0]}: {error['msg']} (got {error.get('input')!r})") from None
    reader = open_analysis_reader(clickhouse_url, flags)
    try:
        advice = run_advice(scoped(reader, cluster), thresholds, team)
        period = (Period(utc_time(advice["period"]["start"]), utc_time(advice["period"]["end"]))
                  if advice["period"] is not None else None)
        gaps = price_gaps(scoped(reader, cluster), period) if period and advice["headline"] is not None else None
        if gaps:
            unknown_money_in_advice(advice, gaps)
        notes = gap_notes(gaps) if gaps else []
        if period is not None and period.start is not None:
            notes = dead_letter_notes(settings, period.start) + notes
    except (StoreError, ClusterError) as exc:
        raise UserError(str(exc)) from None
    finally:
        reader.close()
    if as_json:
        click.echo(orjson.dumps(advice, option=orjson.OPT_INDENT_2).decode())
        echo_notes(notes, err=True)
        return
    click.echo(render_text(advice))
    echo_notes(notes, err=False)


COMMANDS = [advise]
