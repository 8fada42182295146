"""A small event-time reorder buffer driven by a watermark.

Pods, nodes and samples reach a stage on different topics, so their arrival order says little.
Each stage buffers inputs and, when told that input up to a watermark is complete
(``advance(ts)``), applies them in event-time order: by timestamp, then by kind (node state before
pod state before derived data before samples, so a sample sees the allocation made at the same
instant), then by arrival within a kind (one key's messages keep their partition order). Input
older than the last applied watermark is *late*: the stage decides what to do with it and counts
it. The buffer is plain data so a stage's state can be checkpointed.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

from stream_jobs.json_types import JsonDict, JsonObject, JsonValue, as_array, as_float, as_int, as_str

Item = TypeVar("Item", bound=BaseModel)

Source = Sequence[str | int | None]
"""Where an item came from, as its stage was given it: ``[topic, partition, offset, ...]`` (plain data,
kept with the item in checkpoints)."""

_Entry = tuple[float, int, int, str, Item, Source | None]
"""A heap entry: (ts, rank, seq, kind, item, source)."""


class ReorderBuffer(Generic[Item]):
    def __init__(self) -> None:
        self._heap: list[_Entry[Item]] = []
        self._seq = 0
        self._dumped: dict[int, JsonValue] = {}
        """Items as checkpoints write them, by sequence number: an item waits through several
        checkpoints and is dumped once."""
        self.unrestorable: list[tuple[JsonValue, Source | None, str]] = []
        """Items of a restored checkpoint that no longer validate (payload, source, error): dropped
        from the buffer, for the stage to dead-letter (a checkpoint written before a bound existed)."""

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, ts: float, rank: int, kind: str, item: Item, source: Source | None = None) -> None:
        """``source``: where the item came from (plain data, kept with it in checkpoints), or None."""
        heapq.heappush(self._heap, (ts, rank, self._seq, kind, item, source))
        self._seq += 1

    def pop_until(self, watermark: float) -> list[tuple[float, str, Item, Source | None]]:
        """Every buffered item with ``ts <= watermark``, in event-time order: (ts, kind, item, source)."""
        heap, dumped = self._heap, self._dumped
        out = []
        while heap and heap[0][0] <= watermark:
            ts, _rank, seq, kind, item, source = heapq.heappop(heap)
            if dumped:  # written by a checkpoint only
                dumped.pop(seq, None)
            out.append((ts, kind, item, source))
        return out

    def to_dict(self) -> JsonDict:
        dumped = self._dumped
        for _ts, _rank, seq, _kind, item, _source in self._heap:
            if seq not in dumped:
                dumped[seq] = item.model_dump(mode="json")
        return {
            "seq": self._seq,
            "items": [[ts, rank, seq, kind, dumped[seq], *([] if source is None else [source])]
                      for ts, rank, seq, kind, _item, source in sorted(self._heap, key=_order)],
        }

    @classmethod
    def from_dict(cls, data: JsonObject, types: Mapping[str, type[Item]]) -> ReorderBuffer[Item]:
        buf: ReorderBuffer[Item] = cls()
        buf._seq = as_int(data.get("seq", 0))
        for entry in as_array(data.get("items", [])):
            ts, rank, seq, kind, payload, *rest = as_array(entry)
            source = _source(rest[0]) if rest else None
            try:
                item = types[as_str(kind)].model_validate(payload)
            except ValidationError as exc:  # a record the stage took before a bound existed
                buf.unrestorable.append((payload, source, f"restored from a checkpoint: {exc.errors()[0]['msg']} "
                                                          f"({'.'.join(map(str, exc.errors()[0]['loc']))})"))
                continue
            buf._heap.append((float(as_float(ts)), as_int(rank), as_int(seq), as_str(kind), item, source))
            buf._dumped[as_int(seq)] = payload
        heapq.heapify(buf._heap)
        return buf


def _source(value: JsonValue) -> Source | None:
    if value is None:
        return None
    return [part if part is None or isinstance(part, str) else as_int(part) for part in as_array(value)]


def _order(entry: _Entry[Item]) -> tuple[float, int, int]:
    """Heap order (``seq`` is unique: the item and its source are never compared)."""
    return entry[0], entry[1], entry[2]
