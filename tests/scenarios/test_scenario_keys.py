"""Every key of the scenario format is declared once, as a field of :mod:`simulation.scenario`'s
models; this test ties each field to what a new key also needs: a ``before`` validator with the
format's own message, and its place in docs/scenarios.md."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic.dataclasses import is_pydantic_dataclass

from simulation.scenario import Scenario

DOC = Path(__file__).resolve().parents[2] / "docs" / "scenarios.md"


def _models_in(annotation: object) -> Iterator[type]:
    if isinstance(annotation, type) and is_pydantic_dataclass(annotation):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _keys(model: type, path: str = "") -> Iterator[tuple[str, str, bool]]:
    """``(path, key, validated)`` of every key, ``pods[].allocator.from`` style; ``validated``: a
    ``before`` validator parses it, or it is a mapping (a model) of its own."""
    assert is_pydantic_dataclass(model)
    validators = model.__pydantic_decorators__.field_validators.values()
    for name, info in model.__pydantic_fields__.items():
        key = info.alias or name
        inner = list(_models_in(info.annotation))
        parsed = any(name in v.info.fields and v.info.mode == "before" for v in validators)
        yield f"{path}{key}", key, parsed or bool(inner)
        listed = typing.get_origin(info.annotation) is tuple
        for each in inner:
            yield from _keys(each, f"{path}{key}{'[]' if listed else ''}.")


def _documented(doc: str, path: str, key: str) -> bool:
    """Named in backticks by its path (``pods[].owner``), among its list's keys
    (``faults: [{node, gpu, at, xid}]``), or written in an example file (``  gpus: 8``, ``{count: 2}``)."""
    examples = "\n".join(re.findall(r"```.*?```", doc, re.DOTALL))
    spans = re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", doc, flags=re.DOTALL))
    parent = path.rpartition(".")[0].removesuffix("[]")
    if any(span == path or span.startswith((f"{path}:", f"{path} ")) for span in spans):
        return True
    if parent and any(span.startswith(f"{parent}:") and re.search(rf"\b{key}\b", span) for span in spans):
        return True
    return re.search(rf"(^\s*(- )?|[{{,]\s*){key}:", examples, re.MULTILINE) is not None


def test_every_key_is_documented_and_validated_by_the_format() -> None:
    doc = DOC.read_text(encoding="utf-8")
    keys = list(_keys(Scenario))
    undocumented = [path for path, key, _ in keys if not _documented(doc, path, key)]
    unvalidated = [path for path, _, validated in keys if not validated]
    assert len(keys) > 80
    assert undocumented == [], f"keys missing from {DOC.name}: {undocumented}"
    assert unvalidated == [], f"keys without a before validator (the format's message): {unvalidated}"
