"""The sink's fast decoding (schemas.structs): a mirror accepts less than the model, never other
values, and whatever it refuses gets the model's verdict and reason."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson
import pytest
from pydantic import field_validator

from schemas import codec
from schemas.examples import all_examples, gpu_sample
from schemas.messages import GpuSample, Message
from schemas.structs import as_plain, decode_struct, from_plain, mirror, mirror_decoder
from schemas.topics import ALL_TOPICS
from tests.foundation.test_contracts import ACCEPTED_SAMPLES, BROKEN_SAMPLES, PARSER_EDGES

MIRRORED = [spec for spec in ALL_TOPICS if spec.suffix != "alerts.v1"]


def _verdict(payload: bytes, decoder: Any) -> dict[str, Any] | tuple[str, str]:
    """The plain data ``decoder`` gives, or the (field, reason) of its refusal."""
    try:
        result = decoder(payload)
    except codec.MessageError as exc:
        return (exc.field_path or "", exc.reason)
    return result if isinstance(result, dict) else as_plain(result)


def _both(payload: bytes, message_type: type[Message] = GpuSample) -> tuple[Any, Any]:
    by_struct = _verdict(payload, lambda p: decode_struct(p, message_type))
    by_plain = _verdict(payload, lambda p: codec.decode_plain(p, message_type))
    return by_struct, by_plain


def _fast_accepts_only_what_the_model_gives(payload: bytes, message_type: type[Message] = GpuSample) -> bool:
    """Whether the mirror alone accepted ``payload`` (asserting it then gave the model's data)."""
    try:
        fast = as_plain(mirror_decoder(message_type)(payload))
    except (msgspec.MsgspecError, ValueError):
        return False
    assert fast == codec.decode_plain(payload, message_type)
    return True


def test_every_topic_but_the_free_form_alerts_has_a_mirror() -> None:
    assert [spec.suffix for spec in ALL_TOPICS if spec not in MIRRORED] == ["alerts.v1"]
    with pytest.raises(TypeError, match="Any"):
        mirror(next(spec.message for spec in ALL_TOPICS if spec.suffix == "alerts.v1"))


@pytest.mark.parametrize("spec", MIRRORED, ids=lambda s: s.suffix)
def test_a_mirror_reads_every_topics_example_as_the_model_does(spec) -> None:  # type: ignore[no-untyped-def]
    encoded = codec.encode(all_examples()[spec.suffix])
    assert _fast_accepts_only_what_the_model_gives(encoded, spec.message)
    assert as_plain(decode_struct(encoded, spec.message)) == codec.decode(encoded, spec.message).model_dump()
    model = codec.decode(encoded, spec.message)
    assert as_plain(from_plain(spec.message, model.model_dump())) == model.model_dump()


@pytest.mark.parametrize("mutate", BROKEN_SAMPLES + ACCEPTED_SAMPLES, ids=lambda m: m.__name__)
def test_broken_and_coerced_samples_get_the_models_verdict(mutate: Any) -> None:
    data = orjson.loads(codec.encode(gpu_sample()))
    mutate(data)
    payload = orjson.dumps(data)
    by_struct, by_plain = _both(payload)
    assert by_struct == by_plain
    _fast_accepts_only_what_the_model_gives(payload)


@pytest.mark.parametrize("edge", PARSER_EDGES, ids=lambda v: v.decode(errors="replace"))
def test_inputs_json_parsers_read_differently_get_the_models_verdict(edge: bytes) -> None:
    data = orjson.loads(codec.encode(gpu_sample(gpus=1)))
    data["node"], data["seq"] = "node-000", 0
    data["gpus"][0].update(gpu_util_pct=42.0, mem_used_bytes=1024)
    payload = orjson.dumps(data)
    field = edge.split(b":")[0]
    original = next(part for part in (b'"node":"node-000"', b'"seq":0', b'"gpu_util_pct":42.0',
                                      b'"mem_used_bytes":1024') if part.startswith(field))
    edged = payload.replace(original, edge, 1)
    assert edged != payload
    by_struct, by_plain = _both(edged)
    assert by_struct == by_plain
    _fast_accepts_only_what_the_model_gives(edged)


def test_timestamps_and_patterned_strings_are_read_by_pydantic() -> None:
    base = {"node": "n", "agent_boot_id": "b", "seq": 1, "sample_interval_s": 10}
    shifted = orjson.dumps(base | {"ts": "2026-01-05T11:00:00+02:00"})
    assert decode_struct(shifted, GpuSample).ts == datetime(2026, 1, 5, 9, tzinfo=UTC)
    assert _fast_accepts_only_what_the_model_gives(shifted)
    for refused in ({"ts": "2026-01-05T11:00:00"}, {"ts": "2026-01-05T09:00:00Z", "cluster": "east\n"},
                    {"ts": "2026-01-05T09:00:00Z", "cluster": "East"}):
        payload = orjson.dumps(base | refused)
        by_struct, by_plain = _both(payload)
        assert isinstance(by_struct, tuple) and by_struct == by_plain
        assert not _fast_accepts_only_what_the_model_gives(payload)


def test_models_with_behaviour_outside_their_fields_get_no_mirror() -> None:
    class Checked(Message):
        count: int

        @field_validator("count")
        @classmethod
        def even(cls, value: int) -> int:
            return value

    with pytest.raises(TypeError, match="behaviour outside its fields"):
        mirror(Checked)


_ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 7, 2**31, 2**32, 2**63, 2**64, -(2**63) - 1, 10**30, 0.0, -0.0, 0.5, 99.999, 100.0,
    100.0001, 1e308, -1e-308, 3.0, "", "0", "5", "-3", "1e3", "ok", "lost", "nope", "true", "2026-01-05T09:00:00Z",
    "2026-01-05T09:00:00.1234567Z", "2026-01-05t09:00:00z", "2026-01-05 09:00:00Z", "2026-01-05T09:00:00+02:00",
    "2026-01-05T09:00:00", "1700000000", 1700000000, 1700000000.5, [], [1], ["x"], {}, {"a": 1}, "\u00e9\u6f22",
]


def test_random_mutations_of_a_sample_get_the_models_verdict() -> None:
    """Hostile: 3,000 seeded mutations (odd values put into random fields, fields removed, unknown
    fields added); each must decode to the model's data or be refused with the model's reason."""
    rng = random.Random(20261201)
    template = orjson.loads(codec.encode(gpu_sample(gpus=2)))
    for gpu in template["gpus"]:
        gpu.setdefault("xids", [{"xid": 79, "at": "2026-01-05T09:00:00Z", "critical": True}])
        gpu["processes"] = gpu.get("processes") or [{"pid": 5, "mem_used_bytes": 10}]
    accepted_fast = refused = 0
    for _ in range(3000):
        data = orjson.loads(orjson.dumps(template))
        for _ in range(rng.randint(1, 3)):
            target, key = _random_slot(rng, data)
            roll = rng.random()
            if roll < 0.1:
                target.pop(key, None)
            elif roll < 0.15:
                target["unknown_" + str(rng.randint(0, 9))] = rng.choice(_ODD_VALUES)
            else:
                target[key] = rng.choice(_ODD_VALUES)
        payload = json.dumps(data).encode()  # integers beyond 64 bits included
        by_struct, by_plain = _both(payload)
        assert by_struct == by_plain, payload
        accepted_fast += _fast_accepts_only_what_the_model_gives(payload)
        refused += isinstance(by_plain, tuple)
    # the mutations reach both outcomes, and the mirror takes most valid records itself
    assert refused > 1000 and accepted_fast > 300


def _random_slot(rng: random.Random, data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    parts: list[dict[str, Any]] = [data]
    for gpu in _dicts(data.get("gpus")):
        parts += [gpu, *_dicts(gpu.get("xids")), *_dicts(gpu.get("processes")), *_dicts(gpu.get("assigned_to"))]
    target = rng.choice(parts)
    return target, rng.choice(sorted(target) or ["node"])


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
