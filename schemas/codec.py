"""Encode, decode and validate topic messages.

JSON on the wire (orjson: fast, strict UTF-8) so any consumer can read it; validation through the
pydantic models, with errors that name the field path and the reason. A size limit guards every
decode so one giant record cannot exhaust a consumer.
"""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import ValidationError

from schemas.messages import SCHEMA_VERSION, Message

M = TypeVar("M", bound=Message)

MAX_MESSAGE_BYTES = 1024 * 1024

CONTENT_TYPE = "application/json"
WIRE_HEADERS: tuple[tuple[str, bytes], ...] = (
    ("content-type", CONTENT_TYPE.encode()),
    ("gpulens-schema-version", str(SCHEMA_VERSION).encode()),
)
"""Kafka headers on every gpulens message, so a consumer can route or reject by format and version
without parsing the value (tombstones carry none: they have no content)."""


class MessageError(ValueError):
    """A message that cannot be accepted; ``field_path`` names where, ``reason`` says why."""

    def __init__(self, reason: str, field_path: str = "") -> None:
        self.reason = reason
        self.field_path = field_path
        super().__init__(f"{field_path}: {reason}" if field_path else reason)


def encode(message: Message) -> bytes:
    data = orjson.dumps(message.model_dump(mode="json"))
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"encoded size {len(data)} bytes exceeds limit {MAX_MESSAGE_BYTES}")
    return data


def decode(payload: bytes | str | None, message_type: type[M]) -> M:
    """Parse and validate one message; raise :class:`MessageError` naming the failing field."""
    if payload is None:
        raise MessageError("empty value (tombstone) where a message was expected")
    raw = payload.encode() if isinstance(payload, str) else payload
    if len(raw) > MAX_MESSAGE_BYTES:
        raise MessageError(f"message of {len(raw)} bytes exceeds limit {MAX_MESSAGE_BYTES}")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MessageError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MessageError(f"expected a JSON object, got {type(data).__name__}")
    return validate(data, message_type)


def validate(data: dict[str, object], message_type: type[M]) -> M:
    try:
        return message_type.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise MessageError(f"{first['msg']}{more}", path) from None
