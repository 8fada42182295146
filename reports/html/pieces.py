"""Page pieces of the HTML report: legends, tables, empty-section notes, section frames and the
team filter (pure CSS)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from reports.html.format import DASH, LONG_TABLE_ROWS, PALETTE, as_number, esc
from reports.reader import Rows

# --------------------------------------------------------------------------- page pieces


def legend(items: Iterable[tuple[str, str]], dashed: Iterable[str] = ()) -> str:
    dashed_names = set(dashed)
    entries = []
    for name, color in items:
        kind = " dashed" if name in dashed_names else ""
        entries.append(f'<li><span class="swatch{kind}" style="background:{color}"></span>{esc(name)}</li>')
    return f'<ul class="legend">{"".join(entries)}</ul>'


ReportData = dict[str, Any]
"""What the HTML report draws: analysis or series name -> its rows, and ``advice`` (the advisor's
answer), ``cluster``, ``bucket_s``."""

Column = tuple[str, str, Callable[[object], str]]
"""(row key, header, cell formatter)."""


def cell_text(value: object) -> str:
    if value is None or value == "":
        return DASH
    if isinstance(value, list):
        return "; ".join(str(v) for v in value) or DASH
    return str(value)


def wrapped_cell(value: object) -> str:
    """Like :func:`cell_text`, for long free text that may wrap in a table cell."""
    return cell_text(value)


def table(columns: Sequence[Column], rows: Rows, caption: str) -> str:
    classes = {key: "num" if fmt not in (cell_text, wrapped_cell) else "wrap" if fmt is wrapped_cell else ""
               for key, _, fmt in columns}

    def attr(key: str) -> str:
        return f' class="{classes[key]}"' if classes[key] else ""

    head = "".join(f'<th scope="col"{attr(key)}>{esc(header)}</th>' for key, header, _ in columns)
    body = []
    for row in rows:
        cells = "".join(f'<td{attr(key)}>{esc(fmt(row.get(key)))}</td>' for key, _, fmt in columns)
        team = row.get("team", row.get("team_label"))
        body.append(f'<tr data-team="{esc(team)}">{cells}</tr>' if team is not None else f"<tr>{cells}</tr>")
    markup = (f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
    if len(rows) > LONG_TABLE_ROWS:
        return (f'<details class="table"><summary>{esc(caption or "Table")} ({len(rows)} rows)</summary>'
                f'<div class="scroll">{markup}</div></details>')
    heading = f'<div class="caption">{esc(caption)}</div>' if caption else ""
    return f'<div class="table">{heading}<div class="scroll">{markup}</div></div>'


Card = tuple[str, str, str]
"""A headline figure: (label, value, note)."""


def kpi_cards(cards: Iterable[Card]) -> str:
    """Headline figures as a row of cards."""
    markup = "".join(f'<div class="kpi" data-kpi="{esc(label)}"><div class="kpi-label">{esc(label)}</div>'
                     f'<div class="kpi-value">{esc(value)}</div><div class="kpi-note">{esc(note)}</div></div>'
                     for label, value, note in cards)
    return f'<div class="kpis">{markup}</div>'


def no_data(message: str) -> str:
    return f'<p class="no-data" role="note">No data: {esc(message)}</p>'


def section(anchor: str, title: str, lede: str, body: str) -> str:
    return (f'<section class="card" id="{esc(anchor)}"><h2>{esc(title)}</h2>'
            f'<p class="lede">{esc(lede)}</p>{body}</section>')


def team_colors(data: ReportData) -> dict[str, str]:
    """A stable colour per team: biggest GPU consumer first, then by name; the same in every chart."""
    hours: dict[str, float] = {}
    for key in ("top_teams", "cost_by_team", "idle_by_team_and_class"):
        for row in data.get(key) or []:
            team = str(row.get("team"))
            hours[team] = hours.get(team, 0.0) + (as_number(row.get("gpu_hours")) or 0.0)
    for row in data.get("utilisation_by_team") or []:
        hours.setdefault(str(row.get("team_label")), 0.0)
    ordered = sorted(hours, key=lambda t: (-hours[t], t))
    return {team: PALETTE[i % len(PALETTE)] for i, team in enumerate(ordered)}


def css_string(value: str) -> str:
    """``value`` as a quoted CSS string: anything but letters, digits, '-' and '_' hex-escaped, so a
    team name can neither end the string nor the <style> element."""
    return '"' + "".join(c if (c.isalnum() and c.isascii()) or c in "-_" else f"\\{ord(c):x} " for c in value) + '"'


TEAM_CHARTS = (("utilisation", "data-series"), ("idle", "data-label"), ("cost", "data-label"))
"""Charts whose marks each belong to one team, and the attribute that names it."""


def team_filter(teams: Sequence[str]) -> tuple[str, str]:
    """A team filter without scripts: ``report.html#team-N`` (a link per team in the header) hides
    every table row, and the marks of the per-team charts, of the other teams. Returns the anchors
    (to place before ``main``) and the CSS rules."""
    anchors = "".join(f'<span class="team-anchor" id="team-{i}"></span>' for i in range(len(teams)))
    rules = []
    for i, team in enumerate(teams):
        name = css_string(team)
        hide = [f"#team-{i}:target ~ main tr[data-team]:not([data-team={name}])"]
        hide += [f"#team-{i}:target ~ main #{chart} .mark:not([{attribute}={name}])"
                 for chart, attribute in TEAM_CHARTS]
        rules.append(",".join(hide) + "{display:none}")
        rules.append(f"#team-{i}:target ~ header a[href=\"#team-{i}\"]{{background:#fff;color:#1f2d3d}}")
    return anchors, "\n".join(rules)


def team_links(teams: Sequence[str]) -> str:
    if not teams:
        return ""
    links = "".join(f'<a href="#team-{i}">{esc(team)}</a>' for i, team in enumerate(teams))
    return f'<div class="teams">Team: <a href="#">all</a>{links}</div>'

