"""The one builder of dead letters: a record gpulens cannot use becomes a ``deadletter.v1``
message that names the reason, where the record came from, and the record itself (as text, or as
base64 when it is not UTF-8), so an operator can see what was rejected and replay it.

The stream jobs (a record that does not decode or validate), the sink (a row ClickHouse refuses, a
row past its TTL) and the alert forwarder (an alert no destination accepted) all build theirs here;
the Kafka headers repeat the facts so a consumer can filter without decoding.
"""

from __future__ import annotations

import base64
from datetime import datetime

from schemas.outputs import DeadLetter, DeadLetterReason

MAX_PAYLOAD_BYTES = 65536
"""A dead letter keeps at most this much of the record (a dead letter must fit in a Kafka message)."""

MAX_ERROR_CHARS = 4000
"""The reason is cut here (it also travels as a header)."""

Headers = list[tuple[str, str | bytes | None]]


def dead_letter(error: str, topic: str, value: bytes | None, at: datetime, partition: int | None = None,
                offset: int | None = None, reason: DeadLetterReason = DeadLetterReason.INVALID) -> DeadLetter:
    """The dead letter of the record at ``topic``/``partition``/``offset`` rejected for ``reason``
    (the code), with ``error`` (the detail)."""
    text: str | None = None
    b64: str | None = None
    if value is not None:
        try:
            text = value.decode("utf-8")[:MAX_PAYLOAD_BYTES]
        except UnicodeDecodeError:
            b64 = base64.b64encode(value[:MAX_PAYLOAD_BYTES]).decode()
    return DeadLetter(reason=reason, error=error[:MAX_ERROR_CHARS], source_topic=topic, source_partition=partition,
                      source_offset=offset, at=at, payload_text=text, payload_b64=b64)


def dead_letter_headers(letter: DeadLetter) -> Headers:
    """The Kafka headers of ``letter``: the reason and the source position."""
    return [
        ("reason", letter.reason.value),
        ("error", letter.error),
        ("source_topic", letter.source_topic),
        ("source_partition", str(letter.source_partition)),
        ("source_offset", str(letter.source_offset)),
    ]
