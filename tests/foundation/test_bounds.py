"""Bounded contracts (issue 49): every input value is bounded, a record beyond a bound is refused
with the reason code its dead letter carries, by every decoder alike, and the bounds are data
(``schemas.messages.BOUNDS``) that the committed JSON Schemas and docs/schemas.md both show."""

from __future__ import annotations

import json
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas import codec
from schemas import messages as m
from schemas.examples import all_examples, gpu_sample
from schemas.json_schema import schema_document
from schemas.messages import BOUNDS, GpuSample, Message, PodState, WorkloadProgress
from schemas.outputs import DeadLetterReason
from schemas.topics import ALL_TOPICS, by_suffix

INPUT_SUFFIXES = ("gpu.samples.v1", "k8s.pods.v1", "k8s.nodes.v1", "k8s.events.v1", "k8s.workloads.v1",
                  "workload.progress.v1", "workload.allocator.v1")
DECODERS: dict[str, Callable[[bytes, type[Message]], Any]] = {
    "decode": codec.decode,
    "decode_plain": codec.decode_plain,
    "decode_plain_canonical": codec.decode_plain_canonical,
}


def _example(suffix: str) -> dict[str, Any]:
    return orjson.loads(codec.encode(all_examples()[suffix]))


def _verdicts(payload: bytes, message_type: type[Message]) -> dict[str, tuple[str, str, str] | None]:
    """What each decoder makes of ``payload``: None (accepted) or (code, field path, reason)."""
    verdicts: dict[str, tuple[str, str, str] | None] = {}
    for name, decode in DECODERS.items():
        try:
            decode(payload, message_type)
            verdicts[name] = None
        except codec.MessageError as exc:
            verdicts[name] = (exc.code.value, exc.field_path, exc.reason)
    return verdicts


def _refused(payload: bytes, message_type: type[Message], code: DeadLetterReason, path: str) -> None:
    verdicts = _verdicts(payload, message_type)
    first = verdicts["decode"]
    assert first is not None, "accepted"
    assert (first[0], first[1]) == (code.value, path), first
    assert set(map(repr, verdicts.values())) == {repr(first)}, verdicts


# ----------------------------------------------------------------------- the findings of issue 49, item 7 (and 1-2)


def test_a_sample_keyed_by_one_node_that_claims_another_is_inconsistent() -> None:
    payload = codec.encode(gpu_sample(node="gpu-b"))
    with pytest.raises(codec.MessageError) as excinfo:
        codec.decode_keyed(payload, b"gpu-a", GpuSample)
    assert (excinfo.value.code, excinfo.value.field_path) == (DeadLetterReason.INCONSISTENT, "node")
    assert "gpu-a" in excinfo.value.reason and "gpu-b" in excinfo.value.reason
    # its own key, no key (a keyless record), a cluster-scoped key and the bare node name (what
    # agents before clusters wrote: the same node of the record's cluster) are accepted
    assert codec.decode_keyed(payload, b"gpu-b", GpuSample).node == "gpu-b"
    assert codec.decode_keyed(payload, None, GpuSample).node == "gpu-b"
    scoped = codec.encode(gpu_sample(node="gpu-b").model_copy(update={"cluster": "eu-1"}))
    assert codec.decode_keyed(scoped, b"eu-1/gpu-b", GpuSample).cluster == "eu-1"
    assert codec.decode_keyed(scoped, b"gpu-b", GpuSample).cluster == "eu-1"
    for other in (b"eu-1/gpu-a", b"eu-2/gpu-b", b"gpu-a"):
        with pytest.raises(codec.MessageError):
            codec.decode_keyed(scoped, other, GpuSample)
    # the plain data the sink decodes is checked the same way
    plain = codec.decode_plain(payload, GpuSample)
    with pytest.raises(codec.MessageError) as excinfo:
        codec.check_key(b"gpu-a", plain, GpuSample)
    assert excinfo.value.code == DeadLetterReason.INCONSISTENT
    codec.check_key(b"gpu-b", plain, GpuSample)
    # types whose key is not a field of theirs are not checked
    codec.check_key(b"anything", all_examples()["k8s.pods.v1"])


def test_300_duplicate_gpu_readings_in_one_sample_are_refused() -> None:
    data = _example("gpu.samples.v1")
    data["gpus"] = [data["gpus"][0]] * 300
    _refused(orjson.dumps(data), GpuSample, DeadLetterReason.TOO_LARGE, "gpus")
    data["gpus"] = [data["gpus"][0]] * 2  # within the cap: the duplicate itself is named
    _refused(orjson.dumps(data), GpuSample, DeadLetterReason.INCONSISTENT, "gpus")


@pytest.mark.parametrize("field", ["uuid", "index"])
def test_a_gpu_twice_in_one_sample_by_uuid_or_index_is_inconsistent(field: str) -> None:
    data = _example("gpu.samples.v1")
    data["gpus"][5][field] = data["gpus"][2][field]
    _refused(orjson.dumps(data), GpuSample, DeadLetterReason.INCONSISTENT, "gpus")


def test_mig_devices_share_their_parents_index_but_not_a_uuid() -> None:
    data = _example("gpu.samples.v1")
    parent = data["gpus"][0]
    data["gpus"][1].update(index=parent["index"], mig_parent_uuid=parent["uuid"], mig_profile="1g.10gb")
    data["gpus"][2].update(index=parent["index"], mig_parent_uuid=parent["uuid"], mig_profile="1g.10gb")
    assert {v for v in _verdicts(orjson.dumps(data), GpuSample).values()} == {None}
    data["gpus"][2]["uuid"] = data["gpus"][1]["uuid"]
    _refused(orjson.dumps(data), GpuSample, DeadLetterReason.INCONSISTENT, "gpus")


def test_a_100_kb_gpu_uuid_is_too_large() -> None:
    data = _example("gpu.samples.v1")
    data["gpus"][3]["uuid"] = "GPU-" + "f" * 100_000
    _refused(orjson.dumps(data), GpuSample, DeadLetterReason.TOO_LARGE, "gpus.3.uuid")


def test_a_900_kb_label_is_too_large() -> None:
    data = _example("k8s.pods.v1")
    data["labels"] = {"app": "x" * 900_000}
    _refused(orjson.dumps(data), PodState, DeadLetterReason.TOO_LARGE, "labels.app")
    data["labels"] = {"k" * 900_000: "x"}
    _refused(orjson.dumps(data), PodState, DeadLetterReason.TOO_LARGE, f"labels.{'k' * 900_000}.[key]")


def test_a_300_kb_team_is_too_large() -> None:
    data = _example("k8s.pods.v1")
    data["team"] = "t" * 300_000
    _refused(orjson.dumps(data), PodState, DeadLetterReason.TOO_LARGE, "team")


@pytest.mark.parametrize("literal", [b"18446744073709551617", b"100000000000000000000"], ids=["2^64+1", "10^20"])
def test_pod_gpu_requests_beyond_64_bits_are_out_of_range(literal: bytes) -> None:
    payload = orjson.dumps(_example("k8s.pods.v1")).replace(b'"nvidia.com/gpu":4', b'"nvidia.com/gpu":' + literal)
    assert literal in payload
    _refused(payload, PodState, DeadLetterReason.OUT_OF_RANGE, "gpu_requests.nvidia.com/gpu")
    # whatever a reader's parser does with it (orjson: a float; json: an exact integer)
    data = _example("k8s.pods.v1")
    data["gpu_requests"] = {"nvidia.com/gpu": int(literal)}
    with pytest.raises(codec.MessageError) as excinfo:
        codec.validate(data, PodState)
    assert excinfo.value.code == DeadLetterReason.OUT_OF_RANGE


@pytest.mark.parametrize("literal", [b"1e400", b"-1e400", b"1" + b"0" * 400, b"1e300"])
def test_a_progress_total_beyond_its_bound_or_float64_is_out_of_range(literal: bytes) -> None:
    payload = orjson.dumps(_example("workload.progress.v1")).replace(b'"steps_total":1200.0',
                                                                      b'"steps_total":' + literal)
    assert literal in payload
    verdicts = _verdicts(payload, WorkloadProgress)
    assert {v[0] if v else None for v in verdicts.values()} == {"out_of_range"}, verdicts
    assert len(set(verdicts.values())) == 1


def test_cost_usd_of_1e300_is_out_of_range_by_the_bound_the_outputs_take() -> None:
    """``cost_usd`` is an output's (``pod.windows.v1``, ``pod.lifecycle.v1``); any Kafka writer can
    forge one for the sink. The bound is :data:`schemas.messages.UsdAmount`."""
    from pydantic import TypeAdapter, ValidationError

    adapter = TypeAdapter(m.UsdAmount)
    assert adapter.validate_python(1234.5) == 1234.5
    with pytest.raises(ValidationError) as excinfo:
        adapter.validate_python(1e300)
    assert codec.error_code(excinfo.value.errors()[0]["type"]) == DeadLetterReason.OUT_OF_RANGE


@pytest.mark.parametrize("suffix", ["pod.windows.v1", "pod.lifecycle.v1"])
def test_a_forged_output_with_cost_usd_1e300_is_out_of_range(suffix: str) -> None:
    data = _example(suffix)
    data["cost_usd"] = 1e300
    _refused(orjson.dumps(data), by_suffix(suffix).message, DeadLetterReason.OUT_OF_RANGE, "cost_usd")


# ----------------------------------------------------------------------- codes


@pytest.mark.parametrize("payload, code", [
    (b"\x00garbage", DeadLetterReason.INVALID), (b"[1]", DeadLetterReason.INVALID),
    (b'{"node": NaN}', DeadLetterReason.INVALID), (b'{"seq": 1e400}', DeadLetterReason.OUT_OF_RANGE),
    (b'{"node": "' + b"x" * codec.MAX_MESSAGE_BYTES + b'"}', DeadLetterReason.TOO_LARGE),
])
def test_a_record_that_does_not_parse_has_a_code_too(payload: bytes, code: DeadLetterReason) -> None:
    for decode in DECODERS.values():
        with pytest.raises(codec.MessageError) as excinfo:
            decode(payload, GpuSample)
        assert excinfo.value.code == code


def test_wrong_types_and_missing_fields_are_invalid_and_negative_numbers_out_of_range() -> None:
    data = _example("gpu.samples.v1")
    data["seq"] = "seven"
    _refused(orjson.dumps(data), GpuSample, DeadLetterReason.INVALID, "seq")
    data["seq"] = -1
    _refused(orjson.dumps(data), GpuSample, DeadLetterReason.OUT_OF_RANGE, "seq")
    del data["node"]
    data["seq"] = 1
    _refused(orjson.dumps(data), GpuSample, DeadLetterReason.INVALID, "node")


def test_encoding_a_message_over_the_size_limit_is_too_large() -> None:
    with pytest.raises(codec.MessageError) as excinfo:
        codec.encode(gpu_sample(gpus=8).model_copy(update={"errors": ["e" * codec.MAX_MESSAGE_BYTES]}))
    assert excinfo.value.code == DeadLetterReason.TOO_LARGE


def test_every_bound_names_a_reason_code_of_the_dead_letters() -> None:
    assert {bound.code for bound in BOUNDS} <= {reason.value for reason in DeadLetterReason}
    assert {code for code in codec.ERROR_CODES.values()} <= set(DeadLetterReason)


# ----------------------------------------------------------------------- in bounds, at the bounds


def test_values_at_their_bounds_are_accepted() -> None:
    data = _example("k8s.pods.v1")
    data.update(namespace="n" * 63, name="p" * 253, team="t" * 253, gang_id="g" * 317, restarts=2**31 - 1,
                last_exit_code=-(2**31), labels={f"{'k' * 253}/{i:062d}x": "v" * 63 for i in range(256)},
                gpu_requests={f"r{i}": m.MAX_GPU_COUNT for i in range(64)}, vram_request_bytes=m.MAX_GPU_MEMORY_BYTES)
    assert {v for v in _verdicts(orjson.dumps(data), PodState).values()} == {None}
    sample = _example("gpu.samples.v1")
    sample["gpus"][0].update(uuid="U" * 128, mem_used_bytes=2**64 - 1)
    sample["seq"] = 2**64 - 1
    assert {v for v in _verdicts(orjson.dumps(sample), GpuSample).values()} == {None}
    progress = _example("workload.progress.v1")
    progress["tokens_total"] = 2.0**53
    assert {v for v in _verdicts(orjson.dumps(progress), WorkloadProgress).values()} == {None}


@pytest.mark.parametrize("suffix, path, value, code", [
    ("k8s.pods.v1", "namespace", "n" * 64, DeadLetterReason.TOO_LARGE),
    ("k8s.pods.v1", "name", "p" * 254, DeadLetterReason.TOO_LARGE),
    ("k8s.pods.v1", "gang_id", "g" * 318, DeadLetterReason.TOO_LARGE),
    ("k8s.pods.v1", "restarts", 2**31, DeadLetterReason.OUT_OF_RANGE),
    ("k8s.pods.v1", "last_exit_code", -(2**31) - 1, DeadLetterReason.OUT_OF_RANGE),
    ("k8s.pods.v1", "labels", {f"k{i}": "v" for i in range(257)}, DeadLetterReason.TOO_LARGE),
    ("k8s.pods.v1", "gpu_requests", {f"r{i}": 1 for i in range(65)}, DeadLetterReason.TOO_LARGE),
    ("k8s.pods.v1", "vram_request_bytes", 2**44 + 1, DeadLetterReason.OUT_OF_RANGE),
    ("k8s.pods.v1", "status_reason", "r" * 4097, DeadLetterReason.TOO_LARGE),
    ("k8s.nodes.v1", "gpu_capacity", {"nvidia.com/gpu": 2**24 + 1}, DeadLetterReason.OUT_OF_RANGE),
    ("k8s.nodes.v1", "node", "n" * 254, DeadLetterReason.TOO_LARGE),
    ("k8s.events.v1", "message", "m" * 4097, DeadLetterReason.TOO_LARGE),
    ("k8s.events.v1", "count", 2**31, DeadLetterReason.OUT_OF_RANGE),
    ("k8s.workloads.v1", "priority", 2**31, DeadLetterReason.OUT_OF_RANGE),
    ("k8s.workloads.v1", "wait_s", 1e11, DeadLetterReason.OUT_OF_RANGE),
    ("k8s.workloads.v1", "team", "t" * 254, DeadLetterReason.TOO_LARGE),
    ("workload.progress.v1", "tokens_total", 2.0**53 * 2, DeadLetterReason.OUT_OF_RANGE),
    ("workload.allocator.v1", "node", "n" * 254, DeadLetterReason.TOO_LARGE),
    ("gpu.samples.v1", "schema_version", 2**63, DeadLetterReason.OUT_OF_RANGE),
    ("gpu.samples.v1", "errors", ["e"] * 257, DeadLetterReason.TOO_LARGE),
    ("gpu.samples.v1", "agent_boot_id", "b" * 129, DeadLetterReason.TOO_LARGE),
])
def test_one_beyond_a_bound_is_refused_with_its_code(suffix: str, path: str, value: Any,
                                                     code: DeadLetterReason) -> None:
    data = _example(suffix)
    data[path] = value
    verdicts = _verdicts(json.dumps(data).encode(), by_suffix(suffix).message)
    first = verdicts["decode"]
    assert first is not None and first[0] == code.value and first[1].split(".")[0] == path, first
    assert len(set(verdicts.values())) == 1


# ----------------------------------------------------------------------- the bounds as data


def _facts(document: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(``Model.field`` with ``{key}``/``{value}``/``[]``, kind, limit) of every upper bound a JSON
    Schema document declares."""
    models = {**document.get("$defs", {}), document["title"]: document}
    facts: list[tuple[str, str, float]] = []

    def walk(where: str, node: dict[str, Any]) -> None:
        for option in node.get("anyOf", []):
            walk(where, option)
        for keyword, kind in (("maxLength", "chars"), ("maxItems", "items"), ("maxProperties", "items"),
                              ("maximum", "max")):
            if keyword in node:
                facts.append((where, kind, node[keyword]))
        if isinstance(node.get("items"), dict):
            walk(where + "[]", node["items"])
        if isinstance(node.get("propertyNames"), dict):
            walk(where + "{key}", node["propertyNames"])
        if isinstance(node.get("additionalProperties"), dict):
            walk(where + "{value}", node["additionalProperties"])

    for name, model in models.items():
        for field, node in model.get("properties", {}).items():
            walk(f"{name}.{field}", node)
    return facts


@pytest.mark.parametrize("suffix", INPUT_SUFFIXES)
def test_every_bound_of_an_input_schema_is_a_row_of_the_bounds_table(suffix: str) -> None:
    """The committed JSON Schemas carry the bounds (``maxLength``, ``maxItems``, ``maximum``), and
    every one of them is in ``BOUNDS`` with its limit: the table is complete."""
    facts = _facts(schema_document(by_suffix(suffix)))
    assert facts
    for where, kind, limit in facts:
        rows = [b for b in BOUNDS if b.kind == kind and b.limit == limit and any(fnmatch(where, f) for f in b.fields)]
        assert rows, f"{suffix}: {where} {kind} {limit} is not in schemas.messages.BOUNDS"


def test_every_row_of_the_bounds_table_is_in_a_schema() -> None:
    """And no row names a field that does not have the bound (a stale row)."""
    facts = {fact for spec in ALL_TOPICS for fact in _facts(schema_document(spec))}
    for bound in BOUNDS:
        if bound.kind not in ("chars", "items", "max"):
            continue
        for pattern in bound.fields:
            if "." not in pattern or " " in pattern:
                continue  # prose: "every message", "outputs: every count"
            assert any(fnmatch(where, pattern) and (kind, limit) == (bound.kind, bound.limit)
                       for where, kind, limit in facts), f"{bound.name}: {pattern}"


def _limit_text(bound: m.Bound) -> str:
    if bound.limit is None:
        return {"finite": "finite", "distinct": "distinct", "key": "= the key"}[bound.kind]
    limit = bound.limit
    exact = isinstance(limit, int) or (limit.is_integer() and abs(limit) < 1e16)
    number = f"{int(limit):,}" if exact else f"{limit:g}"
    unit = {"chars": " characters", "items": " items"}.get(bound.kind, "")
    return f"≤ {number}{' bytes' if bound.name == 'MAX_MESSAGE_BYTES' else unit}"


def _bounds_markdown() -> str:
    """The table docs/schemas.md shows, rendered from ``BOUNDS``."""
    lines = ["| bound | limit | fields | why | reason code |", "|---|---|---|---|---|"]
    for bound in BOUNDS:
        fields = ", ".join(f"`{f}`" for f in bound.fields)
        lines.append(f"| `{bound.name}` | {_limit_text(bound)} | {fields} | {bound.why} | `{bound.code}` |")
    return "\n".join(lines) + "\n"


def test_docs_list_every_bound() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "schemas.md").read_text()
    assert _bounds_markdown() in docs, "docs/schemas.md's bounds table differs from schemas.messages.BOUNDS: " \
        "paste tests.foundation.test_bounds._bounds_markdown()"
