"""What the node and cluster stages share: event-time input through a reorder buffer, the
watermark, late input, and the output queue.

Why: both stages drive their inputs the same way (``submit`` buffers an input by event time,
``advance`` applies every input up to a watermark in ``(ts, rank)`` order, ``flush`` ends a
replay, ``drain`` hands out what was produced); only what happens at each input, between
instants and when the watermark moves differs, and those are the hooks below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import orjson

from common.logs import get_logger
from schemas.codec import encode
from schemas.messages import Message
from schemas.outputs import DeadLetterReason
from stream_jobs.config import EngineConfig
from stream_jobs.internal import kept
from stream_jobs.json_types import JsonDict, JsonObject, as_object, optional_float
from stream_jobs.reorder import ReorderBuffer, Source
from stream_jobs.timeutil import epoch

log = get_logger(__name__)

Kinds = dict[str, tuple[int, type[Message]]]
"""Input kind -> (rank among inputs of one timestamp, message class)."""


@dataclass(frozen=True)
class Rejected:
    """An input a stage could not apply (its code failed on it: ``unappliable``) or could not restore
    from a checkpoint (``invalid``): the stream goes on without it, and the driver dead-letters it."""

    source: Source | None
    """Where it came from, as given to :meth:`Stage.submit` (None: an internal input)."""
    error: str
    reason: DeadLetterReason
    value: bytes | None


def message_bytes(message: Message) -> bytes:
    """The record as JSON for a dead letter, whatever it holds (never raises)."""
    try:
        return encode(message)
    except Exception:
        return orjson.dumps(str(message))


_KIND_OF: dict[tuple[type[Stage], type[Message]], str] = {}
"""A stage class's input kind of each message type (:meth:`Stage._kind_of`)."""


class Stage:
    """Base of :class:`~stream_jobs.node_stage.NodeStage` and :class:`~stream_jobs.cluster_stage.ClusterStage`."""

    KINDS: ClassVar[Kinds]
    NAME: ClassVar[str]
    """What the stage is called in errors ("node stage")."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.wm: float | None = None
        """Event time (epoch seconds) up to which every input was applied."""
        self.buffer: ReorderBuffer[Message] = ReorderBuffer()
        self._out: list[Message] = []
        self.rejected: list[Rejected] = []
        """Inputs not applied (:class:`Rejected`), until the driver takes them (:meth:`take_rejected`)."""

    # ------------------------------------------------------------------ driving

    def submit(self, message: Message, source: Source | None = None) -> None:
        """Take one input: buffered until the watermark passes it, or handed to :meth:`_late`.
        ``source``: where it came from (plain data: ``[topic, partition, offset]``), named in its dead
        letter if the stage fails to apply it."""
        message = kept(message)
        kind = self._kind_of(message)
        ts = epoch(message.ts)  # type: ignore[attr-defined]
        if self.wm is not None and ts <= self.wm:
            try:
                self._late(kind, ts, message)
            except Exception as exc:
                self._reject(message, source, exc)
            return
        self.buffer.push(ts, self.KINDS[kind][0], kind, message, source)

    def advance(self, watermark: float) -> list[Message]:
        """Apply every buffered input with ``ts <= watermark`` and return what that produced. An
        input whose application raises is taken out (:attr:`rejected`) and the rest go on."""
        for ts, kind, message, source in self.buffer.pop_until(watermark):
            self._before(ts)
            try:
                self._apply(kind, ts, message)
            except Exception as exc:
                self._reject(message, source, exc)
        self._caught_up(watermark)
        if self.wm is None or watermark > self.wm:
            self.wm = watermark
        self._watermark_moved(self.wm)
        return self.drain()

    def flush(self, end: float) -> list[Message]:
        """End of a replay at ``end``: apply everything, then :meth:`_finish`."""
        self._flushing(end)
        self._out = self.advance(end)
        self._finish(end)
        return self.drain()

    def drain(self) -> list[Message]:
        out, self._out = self._out, []
        return out

    def take_rejected(self) -> list[Rejected]:
        """The inputs not applied since the last call."""
        out, self.rejected = self.rejected, []
        return out

    def _reject(self, message: Message, source: Source | None, exc: Exception) -> None:
        error = f"the {self.NAME} failed to apply it: {type(exc).__name__}: {exc}"
        log.error("input not applied", stage=self.NAME, source=source, error=error, exc_info=True)
        self.rejected.append(Rejected(source, error, DeadLetterReason.UNAPPLIABLE, message_bytes(message)))

    # ------------------------------------------------------------------ hooks

    def _kind_of(self, message: Message) -> str:
        """The first of :attr:`KINDS` whose class ``message`` is an instance of; remembered per
        message type (an ``isinstance`` of a pydantic model goes through ``ABCMeta``: one per kind
        tried, for every input)."""
        key = (type(self), type(message))
        kind = _KIND_OF.get(key)
        if kind is None:
            kind = next((kind for kind, (_rank, cls) in self.KINDS.items() if isinstance(message, cls)), None)
            if kind is None:
                raise TypeError(f"the {self.NAME} does not take {type(message).__name__}")
            _KIND_OF[key] = kind
        return kind

    def _apply(self, kind: str, ts: float, message: Message) -> None:
        getattr(self, f"_on_{kind}")(ts, message)

    def _late(self, kind: str, ts: float, message: Message) -> None:
        """An input at or before the watermark (the stage counts it, applies or drops it)."""
        raise NotImplementedError

    def _before(self, ts: float) -> None:
        """Before applying a buffered input at ``ts``."""

    def _caught_up(self, watermark: float) -> None:
        """Every input up to ``watermark`` was applied."""

    def _watermark_moved(self, watermark: float) -> None:
        """The stage's watermark is now ``watermark``."""

    def _flushing(self, end: float) -> None:
        """A replay ends at ``end``: called before the last :meth:`advance`."""

    def _finish(self, end: float) -> None:
        """After the last :meth:`advance` of a replay."""

    # ------------------------------------------------------------------ checkpoint

    def _driving_dict(self) -> JsonDict:
        return {"wm": self.wm, "buffer": self.buffer.to_dict()}

    def _restore_driving(self, data: JsonObject) -> None:
        self.wm = optional_float(data["wm"])
        self.buffer = ReorderBuffer.from_dict(as_object(data["buffer"]), {k: v[1] for k, v in self.KINDS.items()})
        for payload, source, error in self.buffer.unrestorable:
            log.error("buffered input not restored", stage=self.NAME, source=source, error=error)
            self.rejected.append(Rejected(source, error, DeadLetterReason.INVALID, orjson.dumps(payload)))
        self.buffer.unrestorable = []
