"""One declaration per alert type (``stream_jobs.rules.CATALOGUE``): the wire enum, the severity
table, the stages' rule tables and the sections of docs/alerts.md all match it, so adding a type
fails here until every piece is in place."""

from __future__ import annotations

import re
from pathlib import Path

from schemas.outputs import KNOWN_ALERT_TYPES
from stream_jobs import alerts, rules

REPO_ROOT = Path(__file__).resolve().parents[2]


def _docs() -> str:
    return (REPO_ROOT / alerts.DOCS).read_text()


def _sections() -> dict[str, str]:
    return dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", _docs(), flags=re.M | re.S))


def test_the_catalogue_declares_every_wire_alert_type_once_in_order() -> None:
    assert tuple(rule.kind.name for rule in rules.CATALOGUE) == KNOWN_ALERT_TYPES
    assert alerts.TYPE_ORDER == KNOWN_ALERT_TYPES
    assert set(rules.SEVERITY) == set(KNOWN_ALERT_TYPES)


def test_every_rule_in_the_rules_module_is_in_the_catalogue() -> None:
    declared = [value for value in vars(rules).values() if isinstance(value, rules.SustainedRule | rules.EventRule)]
    missing = [rule.alert_type for rule in declared if rule not in rules.CATALOGUE]
    assert not missing, f"rules declared but not in rules.CATALOGUE: {missing}"


def test_every_declared_type_is_evaluated_by_a_stage() -> None:
    stepped = {*rules.NODE_RULES, *rules.CLUSTER_RULES}
    # allocator_fragmentation: stream_jobs.allocator (in the node stage) keeps its table; the event
    # rules are the node stage's _health and _check_crashloop
    elsewhere = {rules.ALLOCATOR_FRAGMENTATION, rules.GPU_HEALTH, rules.CRASHLOOP_GPU}
    assert set(rules.CATALOGUE) == stepped | elsewhere


def test_every_declared_type_has_its_section_in_the_docs_with_what_to_do() -> None:
    sections = _sections()
    anchors = {rule.kind.docs_anchor.partition("#")[2] for rule in rules.CATALOGUE}
    assert set(sections) == anchors, f"docs sections {sorted(sections)} != declared types {sorted(anchors)}"
    for name, body in sections.items():
        for part in ("**What it means.**", "**Details.**", "**What to do.**"):
            assert part in body, f"{alerts.DOCS}#{name} lacks {part}"



def test_the_docs_overview_gives_each_declared_type_its_severity() -> None:
    rows = dict(re.findall(r"^\| \[(\w+)\]\(#\1\) \| (\w+) \|", _docs(), flags=re.M))
    assert rows == {rule.kind.name: rule.kind.severity for rule in rules.CATALOGUE}
