"""One migrator at a time: a claim table in the store itself, since ClickHouse has no transactions.

Why: a rollup migration (:meth:`sinks.rollups.Rollup.migration`) deletes the rollup, back-fills it
from the raw table and then creates the view that every later insert feeds. That is exact only if
no sink inserts into the raw table meanwhile and only one sink runs it: two sinks starting together
would both see it missing, and the second one's delete and back-fill, running after the first one's
view exists and the first one consumes, would count windows twice or drop them.

How: a sink that finds a migration missing inserts a claim into ``schema_migration_claims``
(claimant, ``claimed_at`` and ``expires_at`` from the server's clock), waits :attr:`ClaimTiming.settle_s`
so that every concurrent claim is visible, then reads the unexpired claims: the earliest one (ties:
the smaller claimant) holds the lock. The holder migrates, renewing its claim between statements
(a new row with a later ``expires_at``; before each renewal it checks it still holds the lock, else
:class:`MigrationClaimLost`), and deletes its claim when done. Every other sink withdraws its claim
and waits, polling with backoff and logging ``waiting for another sink's migrations``, until
``schema_migrations`` lists every version (it goes on without migrating) or no unexpired claim is
left (the holder crashed or gave up: it claims again). Migrations are idempotent, so a holder that
crashed half-way is simply repeated by the next one.

Assumptions, documented in docs/sink.md:

- one statement of a migration finishes within :attr:`ClaimTiming.expiry_s` (renewals happen between
  statements); a sink whose claim expired mid-statement stops at its next renewal;
- a claim insert is visible within :attr:`ClaimTiming.settle_s` of the server evaluating its
  ``claimed_at``. On one server (and on the embedded engine, whose statements this process
  serializes) an insert is visible when it returns. In cluster mode claims and ``schema_migrations``
  rows are inserted with ``insert_quorum = 'auto'`` (written to a majority of replicas before the
  insert returns) and read with ``select_sequential_consistency = 1`` (a replica that lacks a quorum
  write refuses the read, which is retried): no claim is missed through replication lag; replicas'
  clocks are assumed to agree to well within the settle time (NTP).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from common.errors import RetriableError
from common.logs import get_logger
from sinks.clickhouse import ClickHouseStore, StoreUnavailable
from sinks.tables import SCHEMA_MIGRATION_CLAIMS

log = get_logger(__name__)

T = TypeVar("T")

CLAIMS = SCHEMA_MIGRATION_CLAIMS.name

CREATE_CLAIMS = SCHEMA_MIGRATION_CLAIMS.create(
    "ENGINE = MergeTree\nORDER BY (claimant, expires_at)\nTTL expires_at + INTERVAL 1 DAY\n"
    "SETTINGS non_replicated_deduplication_window = 10000")
"""The claim table: created before anything else a sink does to the store; a claim is dropped by
the TTL a day after it expired (one a holder crashed with)."""

QUORUM_INSERT: dict[str, Any] = {"insert_quorum": "auto", "insert_quorum_parallel": 0}
"""Cluster mode: an insert of a claim or a ``schema_migrations`` row returns once a majority of the
replicas holds it."""

SEQUENTIAL_READ: dict[str, Any] = {"select_sequential_consistency": 1}
"""Cluster mode: a read of claims or ``schema_migrations`` sees every quorum insert, or is refused."""


@dataclass(frozen=True)
class ClaimTiming:
    settle_s: float
    """Wait after claiming before reading the claims, so that concurrent claims are all visible."""
    expiry_s: float = 900.0
    """A claim not renewed for this long is given up: another sink takes over (a holder that
    crashed holds the migrations up for at most this long)."""
    renew_every_s: float = 30.0
    """The holder renews its claim between statements at most this often."""
    poll_initial_s: float = 0.5
    """First wait between two looks of a waiting sink; doubles up to :attr:`poll_max_s`."""
    poll_max_s: float = 10.0


SERVER_TIMING = ClaimTiming(settle_s=2.0)
"""A ClickHouse server (one or a cluster): concurrent claims travel over the network."""

EMBEDDED_TIMING = ClaimTiming(settle_s=0.0)
"""The embedded engine: one process owns the directory and its statements run one at a time, so a
claim is visible when its insert returns (only threads of that process can race)."""


def timing_for(store: ClickHouseStore) -> ClaimTiming:
    return EMBEDDED_TIMING if store.embedded else SERVER_TIMING


class MigrationClaimLost(RetriableError):
    """The migrating sink's claim expired and another sink holds the lock: this one stops (it restarts
    and waits for the other's migrations)."""


@dataclass(frozen=True)
class Claim:
    claimant: str
    claimed_at: str
    expires_at: str


def new_claimant() -> str:
    """Host, process and a random part: unique per sink start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class MigrationLock:
    """The claim of one starting sink (see the module docstring)."""

    def __init__(self, store: ClickHouseStore, timing: ClaimTiming, replicated: bool = False,
                 claimant: str | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.timing = timing
        self.replicated = replicated
        self.claimant = claimant or new_claimant()
        self._sleep = sleep
        self._renewed_at = 0.0

    @property
    def read_settings(self) -> dict[str, Any]:
        return dict(SEQUENTIAL_READ) if self.replicated else {}

    @property
    def insert_settings(self) -> dict[str, Any]:
        return dict(QUORUM_INSERT) if self.replicated else {}

    def create_table(self) -> None:
        self.store.command(CREATE_CLAIMS)

    def _insert_claim(self) -> None:
        self.store.command(
            f"INSERT INTO {CLAIMS} (claimant, claimed_at, expires_at) SELECT {_quoted(self.claimant)}, now64(3), "
            f"now64(3) + toIntervalMillisecond({round(self.timing.expiry_s * 1000)})", self.insert_settings)
        self._renewed_at = time.monotonic()

    def holder(self) -> Claim | None:
        """The unexpired claim that holds the lock: the earliest (a claim's first row's time), ties
        broken by claimant; None when every claim expired or was withdrawn."""
        for attempt in range(5):
            try:
                rows = self.store.query(
                    f"SELECT claimant, min(claimed_at) AS first_claimed, max(expires_at) AS last_expiry "
                    f"FROM {CLAIMS} GROUP BY claimant HAVING last_expiry > now64(3) "
                    "ORDER BY first_claimed, claimant LIMIT 1", settings=self.read_settings).rows
                break
            except StoreUnavailable:  # a replica that lacks a quorum write refuses the read
                if attempt == 4:
                    raise
                self._sleep(self.timing.poll_initial_s)
        return Claim(str(rows[0][0]), str(rows[0][1]), str(rows[0][2])) if rows else None

    def withdraw(self) -> None:
        self.store.command(f"DELETE FROM {CLAIMS} WHERE claimant = {_quoted(self.claimant)}")

    def renew(self) -> None:
        """Between two statements of the holder: extend the claim when :attr:`ClaimTiming.renew_every_s`
        passed, after checking that this sink still holds the lock."""
        if time.monotonic() - self._renewed_at < self.timing.renew_every_s:
            return
        holder = self.holder()
        if holder is None or holder.claimant != self.claimant:
            raise MigrationClaimLost(
                f"the migration claim of {self.claimant} expired (a statement ran longer than "
                f"{self.timing.expiry_s:g} s) and {holder.claimant if holder else 'nobody'} holds it now")
        self._insert_claim()

    def run_exclusively(self, pending: Callable[[], bool], work: Callable[[Callable[[], None]], T],
                        nothing: T) -> T:
        """Run ``work`` (given :meth:`renew` to call between its statements) while holding the lock,
        if ``pending()`` still says there is work once it is held; else wait until ``pending()`` is
        false (returns ``nothing``) or the holder's claim is gone (claims again)."""
        while True:
            self._insert_claim()
            if self.timing.settle_s:
                self._sleep(self.timing.settle_s)
            holder = self.holder()
            if holder is not None and holder.claimant == self.claimant:
                log.info("migration claim held", claimant=self.claimant)
                try:
                    return work(self.renew) if pending() else nothing
                finally:
                    self.withdraw()
            self.withdraw()
            if self._wait_for(holder, pending):
                return nothing

    def _wait_for(self, holder: Claim | None, pending: Callable[[], bool]) -> bool:
        """Wait while another sink holds the lock; True once nothing is pending, False once no
        unexpired claim is left (claim again)."""
        started = time.monotonic()
        delay = self.timing.poll_initial_s
        while holder is not None:
            log.info("waiting for another sink's migrations", holder=holder.claimant,
                     holder_claim_expires_at=holder.expires_at, waited_s=round(time.monotonic() - started, 1))
            self._sleep(delay)
            delay = min(delay * 2, self.timing.poll_max_s)
            if not pending():
                log.info("another sink applied the migrations", waited_s=round(time.monotonic() - started, 1))
                return True
            holder = self.holder()
        return not pending()
