"""Stage state as JSON documents in a changelog-backed key-value table, each record under a size
limit.

A stage's state is one document per key (a node-inputs partition, the cluster stage), written
atomically with the progress that says which inputs it holds. The broker refuses records above
its maximum message size (1 MB by default), and a worker whose state record is refused crashes on
every restart. So a document larger than ``max_record_bytes`` is split: its chunks are written
under ``<key>#<generation>#<i>`` first, then the head record under ``<key>`` naming the generation
and the chunk count, then the previous generation's chunks are deleted. The head is the commit
point: a crash before it leaves the previous head and its chunks intact (they are deleted only
after the new head), so a restored state is always one complete document. Small documents are
stored as plain JSON under ``<key>``, as before chunking existed.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import orjson

from stream_jobs.json_types import JsonValue

MAX_STATE_RECORD_BYTES = 512 * 1024
"""Default chunk size: half the broker's default maximum message size, leaving room for the key
and the record overhead."""

_HEAD = "__chunked__"
_HEAD_PREFIX = b'{"' + _HEAD.encode() + b'":'
"""How a head record begins (orjson writes its keys in order, ``_HEAD`` first); a stage's document
begins with one of its own keys."""


class ChunkedStore:
    """JSON documents in ``table`` (bytes keys and values), no record above ``max_record_bytes``."""

    def __init__(self, table: MutableMapping[bytes, bytes], max_record_bytes: int = MAX_STATE_RECORD_BYTES) -> None:
        if max_record_bytes < 64:
            raise ValueError("max_record_bytes must be at least 64")
        self.table = table
        self.max_record_bytes = max_record_bytes

    def get(self, key: str) -> JsonValue:
        raw = self.table.get(key.encode())
        if raw is None:
            return None
        head = orjson.loads(raw)
        if not (isinstance(head, dict) and _HEAD in head):
            return head
        parts: list[bytes] = []
        for i in range(int(head["n"])):
            part = self.table.get(_chunk_key(key, head[_HEAD], i))
            if part is None:
                raise ValueError(f"state {key!r}: chunk {i} of generation {head[_HEAD]} is missing")
            parts.append(part)
        return orjson.loads(b"".join(parts))

    def __setitem__(self, key: str, value: JsonValue) -> None:
        data = orjson.dumps(value)
        previous = self._head(key)
        if len(data) <= self.max_record_bytes:
            self.table[key.encode()] = data
        else:
            generation = previous[0] + 1 if previous else 1
            size = self.max_record_bytes
            count = 0
            for count, start in enumerate(range(0, len(data), size), start=1):
                self.table[_chunk_key(key, generation, count - 1)] = data[start:start + size]
            self.table[key.encode()] = orjson.dumps({_HEAD: generation, "n": count})
        if previous:
            old_generation, old_count = previous
            for i in range(old_count):
                chunk = _chunk_key(key, old_generation, i)
                if chunk in self.table:
                    del self.table[chunk]

    def _head(self, key: str) -> tuple[int, int] | None:
        """The generation and chunk count of a chunked document under ``key`` (None: none, or a
        plain document, which is not parsed: a node partition's state is parsed at every
        checkpoint otherwise)."""
        raw = self.table.get(key.encode())
        if raw is None or not raw.startswith(_HEAD_PREFIX):
            return None
        head = orjson.loads(raw)
        return int(head[_HEAD]), int(head["n"])


def _chunk_key(key: str, generation: int, index: int) -> bytes:
    return f"{key}#{generation}#{index}".encode()
