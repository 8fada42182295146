"""The one retry schedule: exponential, jittered, capped. The watcher's informers, the sink
while ClickHouse is down, the alert forwarder and the agent's source re-initialisation (without
jitter) all wait by it.

A client that retries in a tight loop hammers an API server that is already struggling, and many
clients retrying in lock-step make it worse; so each failure doubles the wait (from ``base_s``),
a random factor in ``[1 - jitter, 1]`` spreads clients apart, and ``cap_s`` (about 30 s) bounds
how stale we get once the server is back. The schedule is a pure function of the attempt number
and a random source, so tests check it directly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


def backoff_delay_s(
    attempt: int, base_s: float = 0.5, cap_s: float = 30.0, jitter: float = 0.5, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``attempt`` (1 = first retry); always in (0, cap_s]."""
    if attempt < 1:
        return 0.0
    ceiling = min(cap_s, base_s * 2 ** min(attempt - 1, 32))
    factor = 1.0 - jitter * (rng or random).random()
    return max(ceiling * factor, min(base_s, cap_s) * (1.0 - jitter))


@dataclass
class Backoff:
    """Counts consecutive failures and gives the next delay; ``reset`` after a success."""

    base_s: float = 0.5
    cap_s: float = 30.0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next_delay_s(self) -> float:
        self.failures += 1
        return backoff_delay_s(self.failures, self.base_s, self.cap_s, self.jitter, self.rng)

    def reset(self) -> None:
        self.failures = 0
