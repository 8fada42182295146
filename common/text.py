"""Cluster text made safe for a terminal.

Pod names, labels, team values, scheduler messages and alert summaries come from tenants and GPU
nodes. Printed as they are, an escape sequence in one of them (``ESC]0;title BEL``, ``ESC[2J``, the
8-bit CSI ``\\x9b``) would drive the reader's terminal. :func:`printable` is the one rule every
text output of the CLI applies (``top``, ``report``, ``sql``'s table, ``advise``, ``replay``): each
C0 control character, DEL and each C1 control character is shown escaped as ``\\xNN`` (visible, so
a hostile value is seen for what it is), except the newline and tab of a multi-line text's layout.
Machine formats (``--json``, ``--format csv``) stay the data as stored.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LAYOUT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def printable(text: str, *, multiline: bool = False) -> str:
    """``text`` with every C0 / DEL / C1 control character shown as ``\\xNN``; ``multiline`` keeps
    newline and tab (the layout of a whole output), otherwise they are escaped too (one cell, one line)."""
    return (_CONTROL_BUT_LAYOUT if multiline else _CONTROL).sub(_escaped, text)
