"""How many dead letters a process writes: a token bucket over them (``rate`` a second, ``burst``
at once), so a flood of poison from a compromised writer cannot become a flood of dead letters.
What the bucket refuses is counted by (source topic, reason code) and said in one log line per
``say_every_s``; the services count it in a metric too. The stream workers and the sink use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common.logs import get_logger

log = get_logger(__name__)


@dataclass
class LetterBudget:
    """The dead letters one process may write: :meth:`allow` one, :meth:`summary` of the refused."""

    rate: float = 100.0
    burst: float = 1000.0
    say_every_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    stamp: float = field(init=False)
    suppressed: dict[tuple[str, str], int] = field(default_factory=dict)
    said_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.stamp = self.said_at = self.clock()
        self.tokens = self.burst

    def allow(self, topic: str, reason: str) -> bool:
        """Whether the letter of a record of ``topic`` refused for ``reason`` may be written now;
        one that may not is counted in :attr:`suppressed`."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.suppressed[(topic, reason)] = self.suppressed.get((topic, reason), 0) + 1
        return False

    def summary(self, force: bool = False) -> dict[str, int] | None:
        """What was suppressed since the last summary, once ``say_every_s`` has passed (``force``: now)."""
        now = self.clock()
        if not self.suppressed or (not force and now - self.said_at < self.say_every_s):
            return None
        out = {f"{topic}/{reason}": count for (topic, reason), count in sorted(self.suppressed.items())}
        self.suppressed = {}
        self.said_at = now
        return out

    def say(self, force: bool = False) -> None:
        """Log :meth:`summary` as one line, when there is one to say."""
        summary = self.summary(force)
        if summary is not None:
            log.warning("dead letters suppressed (over deadletter_rate_per_s; counted, not written)",
                        suppressed=summary, rate_per_s=self.rate, burst=self.burst)
