"""JSON Schema documents for every topic, generated from the message types.

The committed copies under ``schemas/json`` let downstream consumers validate without Python;
``tests/test_schemas.py`` fails when they drift from the code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from schemas.topics import ALL_TOPICS, TopicSpec

COMMITTED_DIR = Path(__file__).parent / "json"


def schema_document(spec: TopicSpec) -> dict[str, Any]:
    document = spec.message.model_json_schema(mode="serialization")
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["$id"] = f"gpulens/{spec.suffix}.schema.json"
    document["x-gpulens-topic"] = {
        "suffix": spec.suffix,
        "key": spec.key,
        "cleanup_policy": spec.cleanup_policy,
    }
    return document


def render(spec: TopicSpec) -> bytes:
    return orjson.dumps(schema_document(spec), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def export(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in ALL_TOPICS:
        path = directory / f"{spec.suffix}.schema.json"
        path.write_bytes(render(spec))
        written.append(path)
    return written
