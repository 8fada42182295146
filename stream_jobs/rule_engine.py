"""The engine behind :mod:`stream_jobs.rules`: how a declared sustained condition fires and resolves.

Why a module of its own: the rules module is the catalogue a new alert type is added to; the
timing below is written once for every type and rarely changes.

The timing rule of a sustained condition (DESIGN.md's alert catalogue):

- the condition turns true at ``t``: the timer starts at ``t`` (or at :attr:`SustainedRule.since`
  of the context, when the rule measures from a time in the data, like a pod's creation);
- it fires at the first evaluation ``t`` with ``t - since >= threshold`` (``timeutil.elapsed``);
  the alert's id hashes its type, subject and that ``t`` (``stream_jobs.alerts``);
- the condition is false: the timer stops and an open alert resolves with the rule's reason;
- the condition is unknown (``None``: no data at this evaluation) changes nothing;
- the subject is gone (a pod ended, a gang formed): the stage calls :func:`sweep` or :func:`close`
  with the reason it knows.

The engine keeps one :class:`RuleState` per subject key in a plain dict the stage owns and
persists (``to_dict`` form: ``{"since": float | None, "alert": OpenAlert.to_dict() | None}``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from schemas.outputs import Alert, AlertSubject
from stream_jobs import alerts
from stream_jobs.alerts import AlertKind, Details, IdleCost, OpenAlert
from stream_jobs.config import Thresholds
from stream_jobs.json_types import JsonDict, JsonObject, as_object, optional_float, optional_object
from stream_jobs.timeutil import elapsed

C = TypeVar("C")

ThresholdOf = Callable[[Thresholds], float]
"""A typed reference to one field of :class:`Thresholds` (``lambda th: th.idle_after``)."""


@dataclass(frozen=True)
class Resolution:
    """Why a rule's alert resolved, and figures added to its details (``util_pct`` when busy again)."""

    reason: str
    extra: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class SustainedRule(Generic[C]):
    """An alert type that fires when ``condition`` has held for the threshold ``after``: its one
    declaration (name and severity in ``kind``, the docs section at ``kind.docs_anchor``)."""

    kind: AlertKind
    after: ThresholdOf
    """The :class:`Thresholds` field (seconds) the condition must hold for."""
    condition: Callable[[C], bool | None]
    """True / false at this evaluation; ``None`` when the context has no data for it."""
    subject: Callable[[C], AlertSubject]
    describe: Callable[[C, float, float], tuple[str, Details]]
    """``(context, since, t) -> (summary, details)`` of the firing alert."""
    resolution: Callable[[C, OpenAlert, float], Resolution]
    """``(context, open alert record, t)``: why the alert resolves when the condition turns false."""
    since: Callable[[C], float] | None = None
    """When the timer starts, if from the data (read at every evaluation) rather than when the
    condition was first seen."""
    remember: Callable[[C, float], IdleCost] | None = None
    """What the kept alert record remembers from its firing for a later resolution."""

    @property
    def alert_type(self) -> str:
        return self.kind.name


@dataclass(frozen=True)
class EventRule:
    """An alert type that fires on an event and resolves after a quiet period (``gpu_health``,
    ``crashloop_gpu``): its declaration; the node stage holds its logic and reads ``quiet`` from it."""

    kind: AlertKind
    quiet: ThresholdOf
    """The :class:`Thresholds` field (seconds) without a new event after which the alert resolves."""

    @property
    def alert_type(self) -> str:
        return self.kind.name


class Declaration(Protocol):
    """One alert type's declaration (:class:`SustainedRule` or :class:`EventRule`)."""

    @property
    def kind(self) -> AlertKind: ...

    @property
    def alert_type(self) -> str: ...


@dataclass
class RuleState:
    """One subject's timer and open alert for one rule."""

    since: float | None = None
    alert: OpenAlert | None = None

    def to_dict(self) -> JsonDict:
        return {"since": self.since, "alert": None if self.alert is None else self.alert.to_dict()}

    @classmethod
    def from_dict(cls, data: JsonObject) -> RuleState:
        alert = optional_object(data["alert"])
        return cls(since=optional_float(data["since"]), alert=None if alert is None else OpenAlert.from_dict(alert))


RuleTable = dict[str, RuleState]
"""A rule's states by subject key (a pod|gpu key, a pod uid, a gang id...)."""


def step(rule: SustainedRule[C], table: RuleTable, key: str, context: C, t: float,
         thresholds: Thresholds) -> list[Alert]:
    """Evaluate ``rule`` for the subject ``key`` at ``t``; returns the transitions (0 or 1)."""
    holds = rule.condition(context)
    if holds is None:
        return []
    state = table.get(key)
    if not holds:
        if state is None:
            return []
        del table[key]
        if state.alert is None:
            return []
        resolution = rule.resolution(context, state.alert, t)
        return [alerts.resolve(state.alert, t, resolution.reason, **resolution.extra)]
    if state is None:
        state = table[key] = RuleState()
    if rule.since is not None:
        state.since = rule.since(context)
    elif state.since is None:
        state.since = t
    if state.alert is not None or not elapsed(t, state.since, rule.after(thresholds)):
        return []
    summary, details = rule.describe(context, state.since, t)
    cost = None if rule.remember is None else rule.remember(context, state.since)
    state.alert, message = alerts.fire(rule.kind, rule.subject(context), t, summary, details, cost)
    return [message]


def restart(table: RuleTable, keys: Iterable[str]) -> None:
    """Restart the timers of ``keys`` (a gap in the data): open alerts stay open."""
    for key in keys:
        state = table.get(key)
        if state is None:
            continue
        state.since = None
        if state.alert is None:
            del table[key]


def close(table: RuleTable, key: str, t: float, reason: str, **extra: float | None) -> list[Alert]:
    """Forget ``key``; its open alert resolves with ``reason`` and ``extra`` details."""
    state = table.pop(key, None)
    if state is None or state.alert is None:
        return []
    return [alerts.resolve(state.alert, t, reason, **extra)]


def sweep(table: RuleTable, live: Iterable[str], t: float, reason: Callable[[str], str]) -> list[Alert]:
    """Forget every subject not in ``live`` (in key order), resolving open alerts with ``reason(key)``."""
    out: list[Alert] = []
    for key in sorted(set(table) - set(live)):
        out += close(table, key, t, reason(key))
    return out


def table_to_dict(table: RuleTable) -> JsonDict:
    return {key: state.to_dict() for key, state in table.items()}


def table_from_dict(data: JsonObject) -> RuleTable:
    return {key: RuleState.from_dict(as_object(value)) for key, value in data.items()}
