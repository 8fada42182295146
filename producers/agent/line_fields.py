"""The ``key=value`` fields of the one-line reports pods send the agent (progress and allocator
lines): each field split once, checked for form, known key and repetition, with the reason words
the agent counts rejected lines by."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator


def key_value_fields(items: Iterable[str], accepted: Iterable[str], error: Callable[[str, str], Exception],
                     form: str = "key=value") -> Iterator[tuple[str, str]]:
    """Each item as (key, text), in order; raises ``error(reason, detail)`` with reason
    ``bad_field`` (no ``=``), ``unknown_key`` (not in ``accepted``) or ``duplicate_key``."""
    known = tuple(accepted)
    seen: set[str] = set()
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise error("bad_field", f"{item[:40]!r} is not {form}")
        if key not in known:
            raise error("unknown_key", f"{key[:40]!r} (accepted: {', '.join(known)})")
        if key in seen:
            raise error("duplicate_key", key)
        seen.add(key)
        yield key, text
