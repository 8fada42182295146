"""What the node and cluster stages share: event-time input through a reorder buffer, the
watermark, late input, and the output queue.

Why: both stages drive their inputs the same way (``submit`` buffers an input by event time,
``advance`` applies every input up to a watermark in ``(ts, rank)`` order, ``flush`` ends a
replay, ``drain`` hands out what was produced); only what happens at each input, between
instants and when the watermark moves differs, and those are the hooks below.
"""

from __future__ import annotations

from typing import Any, ClassVar

from schemas.messages import Message
from stream_jobs.config import EngineConfig
from stream_jobs.internal import kept
from stream_jobs.reorder import ReorderBuffer
from stream_jobs.timeutil import epoch

Kinds = dict[str, tuple[int, type[Message]]]
"""Input kind -> (rank among inputs of one timestamp, message class)."""


class Stage:
    """Base of :class:`~stream_jobs.node_stage.NodeStage` and :class:`~stream_jobs.cluster_stage.ClusterStage`."""

    KINDS: ClassVar[Kinds]
    NAME: ClassVar[str]
    """What the stage is called in errors ("node stage")."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.wm: float | None = None
        """Event time (epoch seconds) up to which every input was applied."""
        self.buffer = ReorderBuffer()
        self._out: list[Message] = []

    # ------------------------------------------------------------------ driving

    def submit(self, message: Message) -> None:
        """Take one input: buffered until the watermark passes it, or handed to :meth:`_late`."""
        message = kept(message)
        kind = self._kind_of(message)
        ts = epoch(message.ts)  # type: ignore[attr-defined]
        if self.wm is not None and ts <= self.wm:
            self._late(kind, ts, message)
            return
        self.buffer.push(ts, self.KINDS[kind][0], kind, message)

    def advance(self, watermark: float) -> list[Message]:
        """Apply every buffered input with ``ts <= watermark`` and return what that produced."""
        for ts, kind, message in self.buffer.pop_until(watermark):
            self._before(ts)
            self._apply(kind, ts, message)
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

    # ------------------------------------------------------------------ hooks

    def _kind_of(self, message: Message) -> str:
        for kind, (_rank, cls) in self.KINDS.items():
            if isinstance(message, cls):
                return kind
        raise TypeError(f"the {self.NAME} does not take {type(message).__name__}")

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

    def _driving_dict(self) -> dict[str, Any]:
        return {"wm": self.wm, "buffer": self.buffer.to_dict()}

    def _restore_driving(self, data: dict[str, Any]) -> None:
        self.wm = data["wm"]
        self.buffer = ReorderBuffer.from_dict(data["buffer"], {k: v[1] for k, v in self.KINDS.items()})
