"""What the watcher publishes is bounded, so that no object can hide itself by being too large.

Tenants write labels, annotations, event texts and resource quantities; Kubernetes caps each
label (key 253 + 63 characters, value 63) but not how many there are, so ~9,000 long labels make
a pod whose state is over the message limit (``schemas.codec.MAX_MESSAGE_BYTES``). Such a state
used to fail to encode and the pod was never published. Now every translation cuts what it
publishes to the budgets below, deterministically (the same object always gives the same
message, so the change filter still works), sets ``truncated`` on the message, and names what it
cut in a :class:`Trim`, which the service counts (``watcher_trimmed_total{topic,what}``) and logs
once per object. A state is never dropped for its size.

- **labels**: the keys gpulens reads come first (the configured team / project / gang keys, the
  gang recognisers' and owner chain's keys; on nodes the ``nvidia.com/`` and accelerator labels),
  then the others in key order, while they fit ``MAX_LABELS`` entries (the contract's bound,
  ``schemas.messages``) and :data:`LABELS_BUDGET_BYTES`; a label beyond Kubernetes' own limits
  is left out. Team, project
  and gang are extracted from the full labels and annotations before the cut, so they never
  change because of it. Annotations are not published (only read for those values, progress and
  VRAM), so they need no budget beyond the text caps.
- **text** (condition and event messages, reasons, images, names): cut to the contract's bound
  of the field (``MAX_TEXT_CHARS``, ``MAX_NAME_CHARS``, ... of ``schemas.messages``).
- **lists** (containers, conditions, owners, taints, pod sets): at most ``MAX_LIST_ITEMS``
  entries, in their order; GPU resources at most ``MAX_RESOURCES``, in name order.
- **quantities**: a GPU count above :data:`MAX_GPU_QUANTITY` (``100E`` GPUs, 10^20) is clamped
  to it, so the pod is still published as the pending pod it is, with a request no cluster can
  satisfy, and flagged; any quantity is clamped to int64 (:data:`MAX_QUANTITY`), a VRAM request
  to ``MAX_GPU_MEMORY_BYTES``; an int32 field (exit code, restarts, priority) out of range is
  left out.
- a last guard measures the encoded message (:func:`over_budget`); above
  :data:`MESSAGE_BUDGET_BYTES` the service keeps only the labels gpulens reads and cuts every
  list to a few entries (``what="size"``), so the budgets above cannot combine into a message
  that does not fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import orjson

from schemas.codec import MAX_MESSAGE_BYTES
from schemas.messages import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    MAX_GPU_COUNT,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_LIST_ITEMS,
    MAX_QUALIFIED_NAME_CHARS,
    MAX_TEXT_CHARS,
    Message,
)

T = TypeVar("T")

LABELS_BUDGET_BYTES = 64 * 1024
"""UTF-8 bytes of the published labels' keys and values together (besides ``MAX_LABELS`` entries)."""
MAX_GPU_QUANTITY = MAX_GPU_COUNT
"""A GPU resource's count per pod, pod set, workload or node (the contract's bound)."""
MAX_QUANTITY = INT64_MAX
"""Any parsed Kubernetes quantity."""
MESSAGE_BUDGET_BYTES = MAX_MESSAGE_BYTES // 2
"""Above this encoded size the last guard cuts the message further (half the hard limit)."""
SIZE_GUARD_ITEMS = 16
"""Entries per list that the last guard keeps."""

WHAT = ("labels", "text", "items", "quantity", "size")
"""The words ``watcher_trimmed_total{what}`` counts by."""


class Trim:
    """What one translation cut (fixed words of :data:`WHAT`); false while nothing was cut."""

    def __init__(self) -> None:
        self.what: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.what)

    def note(self, what: str) -> None:
        self.what.add(what)

    def text(self, value: Any, limit: int = MAX_TEXT_CHARS) -> str | None:
        """``value`` as text of at most ``limit`` characters (None stays None)."""
        if value is None:
            return None
        text = str(value)
        if len(text) > limit:
            self.note("text")
            return text[:limit]
        return text

    def items(self, values: Sequence[T], limit: int = MAX_LIST_ITEMS) -> list[T]:
        if len(values) > limit:
            self.note("items")
            return list(values[:limit])
        return list(values)

    def quantity(self, value: int, limit: int = MAX_GPU_QUANTITY) -> int:
        if value > limit:
            self.note("quantity")
            return limit
        return value

    def int32(self, value: Any) -> int | None:
        """A Kubernetes int32 (exit code, restart count, priority): None when it is no integer in range."""
        if value is None or isinstance(value, bool) or not isinstance(value, int):
            return None
        if not INT32_MIN <= value <= INT32_MAX:
            self.note("quantity")
            return None
        return value

    def labels(self, raw: Mapping[Any, Any], keep: Iterable[str] = (), keep_prefixes: tuple[str, ...] = (),
               budget_bytes: int = LABELS_BUDGET_BYTES, max_labels: int = MAX_LABELS) -> dict[str, str]:
        """The labels to publish: all of them when they fit, else the kept keys first (``keep`` in
        its order, then keys starting with ``keep_prefixes``), then the others in key order, while
        they fit ``max_labels`` and ``budget_bytes``. A label beyond Kubernetes' limits is left out."""
        labels: dict[str, str] = {}
        for key, value in raw.items():
            k, v = str(key), str(value)
            if len(k) > MAX_QUALIFIED_NAME_CHARS or len(v) > MAX_LABEL_VALUE_CHARS:
                self.note("labels")
                continue
            labels[k] = v
        size = sum(_entry_bytes(k, v) for k, v in labels.items())
        if len(labels) <= max_labels and size <= budget_bytes:
            return labels
        self.note("labels")
        wanted = list(dict.fromkeys(k for k in keep if k in labels))
        first = set(wanted)
        prefixed = sorted(k for k in labels if k not in first and k.startswith(keep_prefixes)) if keep_prefixes else []
        first.update(prefixed)
        order = wanted + prefixed + sorted(k for k in labels if k not in first)
        kept: dict[str, str] = {}
        used = 0
        for key in order:
            cost = _entry_bytes(key, labels[key])
            if len(kept) >= max_labels or used + cost > budget_bytes:
                continue  # a smaller label after this one may still fit
            kept[key] = labels[key]
            used += cost
        return kept


def _entry_bytes(key: str, value: str) -> int:
    return len(key.encode()) + len(value.encode())


def encoded_size(message: Message) -> int:
    """About the size ``schemas.codec.encode`` gives (the same dump; never raises for size)."""
    return len(orjson.dumps(message.model_dump(mode="json", exclude_defaults=True))) + 64


def over_budget(message: Message, budget_bytes: int = MESSAGE_BUDGET_BYTES) -> bool:
    return encoded_size(message) > budget_bytes


def shrink(message: Message, keep: Iterable[str] = (), keep_prefixes: tuple[str, ...] = ()) -> Message:
    """The last guard: only the kept labels, every list cut to :data:`SIZE_GUARD_ITEMS`, ``truncated``."""
    trim = Trim()
    update: dict[str, Any] = {"truncated": True}
    for name in type(message).model_fields:
        value = getattr(message, name)
        if name == "labels" and isinstance(value, Mapping):
            wanted = set(keep)
            kept = {k: v for k, v in value.items() if k in wanted or k.startswith(keep_prefixes)}
            update[name] = trim.labels(kept, keep, keep_prefixes, budget_bytes=4096, max_labels=SIZE_GUARD_ITEMS)
        elif isinstance(value, list):
            update[name] = value[:SIZE_GUARD_ITEMS]
        elif isinstance(value, dict) and len(value) > SIZE_GUARD_ITEMS:
            update[name] = dict(list(value.items())[:SIZE_GUARD_ITEMS])
    return message.model_copy(update=update)
