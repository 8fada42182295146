"""Offset bookkeeping between the Kafka consumer and the stages: which consumed record a stage may
process, and when its offset may be acknowledged (so committed).

Why this exists: faust (0.15) commits the highest run of acknowledged offsets and treats a forward
jump in a partition's offsets as a *gap it considers acknowledged*. A consumer whose fetch
position moves past records it never delivered (seen after restarts and rebalances: a seek while
table recovery completes, records buffered before a revocation) would therefore commit past
records no stage applied. Two rules keep every input record applied exactly once:

- :class:`Positions`: per owned partition, the next offset a stage must see. After an assignment
  it starts at the partition's *committed* offset (read from the broker; the log start when
  nothing is committed), never at the first record fetched. A record past that position means the
  consumer skipped records: the caller seeks back and the early records are dropped unprocessed
  until the re-read arrives. A record before it was already admitted (a redelivery): dropped.
  Records of partitions this worker does not own (buffered before a revocation) are dropped.
  Compacted topics have real holes: a jump there is verified once by the same seek — if the
  re-read starts at the same offset again, the hole is real and accepted. Inside a run that began
  at a verified position, a hole after a record older than the topic's ``min.compaction.lag.ms``
  is accepted without a seek (a seek per compaction hole would make reading a compacted log cost
  one fetch per record); a hole after a younger record cannot be compaction (Kafka's cleaner stops
  at the first segment holding a record younger than the lag), so it is a skip and is read again.
  faust does skip inside a run (records dropped with its stream buffers, a seek undone; chaos runs
  log 10-20 skips on the sample topic): a CI chaos run lost two pods' states before this rule,
  most likely that way.
- :class:`AckOrder`: acknowledgements are released strictly in offset order per partition.

A skip at the tail of a partition (no later record arrives to reveal it) and a seek back the
consumer undoes are caught by time, not by offsets: ``OffsetGuard.watch`` in the faust adapter.

Both are plain code (no Kafka): the faust adapter calls them for every consumed record.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from common.errors import RetriableError
from schemas.topics import COMPACTION_LAG_S

T = TypeVar("T")

EXIT_STALLED = 70
"""Exit status of a worker that stopped itself to be restarted (a partition stalled, or an agent
failed mid-mark): it resumes from its checkpoints; nothing is lost."""


class TopicPartition(Protocol):
    """A partition of a topic as the consumer names it (faust's ``TP``, a hashable named tuple)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


class PartitionStalled(RetriableError, RuntimeError):
    """A partition's records did not come although the log holds them, and seeking back did not
    help: the worker must restart."""


@dataclass(frozen=True)
class Admission:
    """What to do with a consumed record: process it (``accept``), and/or seek the partition back
    to ``seek`` (the caller also drops what the consumer counted as read beyond it). ``reason``
    says why a record is dropped (for logs and counters)."""

    accept: bool
    seek: int | None = None
    reason: str = ""


@dataclass
class _Position:
    next: int
    """The offset the next admitted record must have."""
    verified: bool
    """Whether ``next`` follows a record admitted in this assignment (False: it comes from the
    committed offset, or a seek back is in progress)."""
    rewind_from: int | None = None
    """While a seek back is in progress: the offset whose arrival revealed the skip."""
    stale_max: int = -1
    """While a seek back is in progress: the highest offset dropped since the seek (records
    fetched before it, still on their way)."""
    last_timestamp: float | None = None
    """The (broker) timestamp of the last record admitted, in epoch seconds; None: unknown."""


@dataclass
class Positions:
    """The next offset to process per owned partition (see the module docstring)."""

    owned: set[TopicPartition] = field(default_factory=set)
    _at: dict[TopicPartition, _Position] = field(default_factory=dict)
    compaction_lag_s: float = COMPACTION_LAG_S
    """The compacted topics' ``min.compaction.lag.ms``, in seconds: younger records are never
    compacted away. A topic configured lower only costs seeks (its holes are verified)."""
    clock_margin_s: float = 3600.0
    """Allowance for this host's clock running ahead of the broker's."""
    wall_clock: Callable[[], float] = time.time

    def assign(self, assignment: AbstractSet[TopicPartition]) -> None:
        """The worker's new assignment (all its partitions): positions of partitions it keeps
        are kept; a partition assigned again starts from its committed offset."""
        for tp in set(self._at) - set(assignment):
            del self._at[tp]
        self.owned = set(assignment)

    def revoke(self, revoked: AbstractSet[TopicPartition]) -> None:
        for tp in revoked:
            self.owned.discard(tp)
            self._at.pop(tp, None)

    def needs_start(self, tp: TopicPartition) -> bool:
        """True when ``tp`` is owned but has no position yet: call :meth:`start` with its
        committed offset before :meth:`admit`."""
        return tp in self.owned and tp not in self._at

    def start(self, tp: TopicPartition, committed: int) -> None:
        """``committed``: the next offset to read as committed for the consumer group (or the
        log start offset when nothing is committed). Ignored for a partition revoked meanwhile."""
        if tp not in self.owned:
            return
        self._at[tp] = _Position(next=committed, verified=False)

    def next_offset(self, tp: TopicPartition) -> int | None:
        """The offset the next admitted record of ``tp`` must have (None: no position yet)."""
        pos = self._at.get(tp)
        return None if pos is None else pos.next

    def reverify(self, tp: TopicPartition) -> None:
        """The consumer is being sought back to :meth:`next_offset` (records went missing): a
        jump is verified by a seek again, also inside a compacted topic's run."""
        pos = self._at.get(tp)
        if pos is not None and pos.rewind_from is None:
            pos.verified = False

    def rewinding(self) -> dict[TopicPartition, int]:
        """Partitions with a seek back in progress: ``{tp: offset sought}`` (a seek can be undone;
        the faust adapter's watch repeats it when the partition stalls)."""
        return {tp: pos.next for tp, pos in self._at.items() if pos.rewind_from is not None}

    def _may_be_compacted(self, pos: _Position) -> bool:
        """Whether records right after the last one admitted may have been compacted away: only
        when that record is older than the compaction lag (with a margin for clock skew)."""
        return (pos.last_timestamp is not None
                and pos.last_timestamp <= self.wall_clock() - self.compaction_lag_s - self.clock_margin_s)

    def admit(self, tp: TopicPartition, offset: int, compacted: bool, timestamp: float | None = None) -> Admission:
        """``timestamp``: the record's broker timestamp in epoch seconds (None: unknown, taken as
        young, so a hole after it is verified by a seek)."""
        if tp not in self.owned:
            return Admission(False, reason="partition not owned")
        pos = self._at.get(tp)
        if pos is None:
            raise KeyError(f"no start position for {tp!r}: call start() first")
        if pos.rewind_from is not None:
            return self._admit_rewinding(pos, offset, compacted, timestamp)
        if offset < pos.next:
            return Admission(False, reason="already admitted")
        if offset > pos.next and not (compacted and pos.verified and self._may_be_compacted(pos)):
            pos.rewind_from, pos.stale_max, pos.verified = offset, offset, False
            return Admission(False, seek=pos.next, reason="skipped records")
        pos.next, pos.verified, pos.last_timestamp = offset + 1, True, timestamp
        return Admission(True)

    def _admit_rewinding(self, pos: _Position, offset: int, compacted: bool, timestamp: float | None) -> Admission:
        assert pos.rewind_from is not None
        # on a compacted topic the re-read may begin past the wanted offset: the records before
        # it were compacted away (it begins before the offset that revealed the jump, or restarts
        # at or below what was dropped since the seek) — unless the record before them is too
        # young to have been compacted. Elsewhere only the wanted offset will do (records deleted
        # by retention: see restart()).
        hole = (compacted and pos.next < offset and (offset < pos.rewind_from or offset <= pos.stale_max)
                and (pos.last_timestamp is None or self._may_be_compacted(pos)))
        if offset != pos.next and not hole:
            pos.stale_max = max(pos.stale_max, offset)
            return Admission(False, reason="fetched before the seek back")
        pos.rewind_from, pos.stale_max = None, -1
        pos.next, pos.verified, pos.last_timestamp = offset + 1, True, timestamp
        return Admission(True)

    def restart(self, tp: TopicPartition, offset: int) -> None:
        """Give up waiting for records before ``offset`` (they no longer exist: the log starts
        there) and continue from it."""
        if tp in self._at:
            self._at[tp] = _Position(next=offset, verified=False)


class _InFlight(Generic[T]):
    """A record in flight: its token, and whether it is processed."""

    __slots__ = ("finished", "token")

    def __init__(self, token: T) -> None:
        self.token = token
        self.finished = False


class AckOrder(Generic[T]):
    """Acknowledges consumed records strictly in offset order per partition.

    Stages finish records out of order (a parked record is done only when a later mark releases
    it), but a consumer may only commit past a record once it *and every record before it* are
    done. faust commits the highest run of acknowledged offsets without checking that the run
    starts at the committed position, so out-of-order acks could commit past a parked record and
    lose it in a crash. Here a record's ack is held back until everything before it on its
    partition is done too; what :meth:`done` returns may be acknowledged right away.
    """

    def __init__(self) -> None:
        self._open: dict[TopicPartition, OrderedDict[int, _InFlight[T]]] = {}
        """Per partition, the records in flight by offset, oldest first. An ``OrderedDict``: each
        acknowledgement takes the finished records off the front, which is O(1) there; a plain
        dict's keys were copied at every acknowledgement, O(records in flight), and a partition
        read far ahead of its marks holds thousands."""

    def track(self, tp: TopicPartition, offset: int, token: T) -> bool:
        """Start tracking a consumed record; False if this offset is already in flight (a
        redelivery of a record still being processed: ignore it, the first copy gets acked)."""
        entries = self._open.get(tp)
        if entries is None:
            entries = self._open[tp] = OrderedDict()
        if offset in entries:
            return False
        entries[offset] = _InFlight(token)
        return True

    def done(self, tp: TopicPartition, offset: int, token: T) -> list[T]:
        """``token`` is processed; the tokens now acknowledgeable, in offset order. A token not
        tracked (any more: its partition was revoked) releases nothing, even when the same offset
        is tracked again for a new assignment."""
        entries = self._open.get(tp)
        if not entries or offset not in entries or entries[offset].token is not token:
            return []
        entries[offset].finished = True
        out: list[T] = []
        while entries:  # insertion order = consumption order = offset order
            tracked = entries[next(iter(entries))]
            if not tracked.finished:
                break
            out.append(tracked.token)
            entries.popitem(last=False)
        return out

    def forget(self, tp: TopicPartition) -> None:
        self._open.pop(tp, None)

    def waiting(self) -> int:
        return sum(len(entries) for entries in self._open.values())
