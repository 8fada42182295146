"""The topic contracts: every type round-trips, JSON Schemas are committed and current, bad
messages are rejected with the field path, unknown fields are tolerated, size is bounded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator
from pydantic import ConfigDict, ValidationError, model_validator

from schemas import codec
from schemas.examples import all_examples, gpu_sample
from schemas.json_schema import COMMITTED_DIR, render
from schemas.messages import SCHEMA_VERSION, GpuSample, Message, PodState
from schemas.outputs import KNOWN_ALERT_TYPES, Alert
from schemas.topics import ALL_TOPICS, by_suffix


def test_registry_covers_the_topics_of_the_design() -> None:
    assert {spec.name() for spec in ALL_TOPICS} == {
        "gpulens.gpu.samples.v1", "gpulens.k8s.pods.v1", "gpulens.k8s.nodes.v1", "gpulens.k8s.events.v1",
        "gpulens.workload.progress.v1", "gpulens.pod.windows.v1", "gpulens.cluster.capacity.v1",
        "gpulens.pod.lifecycle.v1", "gpulens.alerts.v1", "gpulens.deadletter.v1", "gpulens.k8s.workloads.v1",
        "gpulens.workload.allocator.v1",
    }
    assert by_suffix("k8s.pods.v1").cleanup_policy == "compact"
    assert by_suffix("k8s.workloads.v1").cleanup_policy == "compact"
    assert by_suffix("k8s.nodes.v1").cleanup_policy == "compact"
    assert by_suffix("gpu.samples.v1").cleanup_policy == "delete"
    assert by_suffix("gpu.samples.v1").name("team-a") == "team-a.gpu.samples.v1"


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.suffix)
def test_every_message_type_round_trips(spec) -> None:  # type: ignore[no-untyped-def]
    example = all_examples()[spec.suffix]
    assert isinstance(example, spec.message)
    encoded = codec.encode(example)
    assert codec.decode(encoded, spec.message) == example
    assert orjson.loads(encoded)["schema_version"] == SCHEMA_VERSION == 2
    assert orjson.loads(encoded)["cluster"] == "default"


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.suffix)
def test_committed_json_schema_is_current_and_validates_messages(spec) -> None:  # type: ignore[no-untyped-def]
    committed = COMMITTED_DIR / f"{spec.suffix}.schema.json"
    assert committed.exists(), f"missing {committed}: run `gpulens schemas export schemas/json`"
    assert committed.read_bytes() == render(spec), (
        f"{committed.name} drifted from the code: run `gpulens schemas export schemas/json` and commit"
    )
    validator = Draft202012Validator(orjson.loads(committed.read_bytes()))
    validator.validate(orjson.loads(codec.encode(all_examples()[spec.suffix])))


def test_schemas_declare_date_time_and_reject_a_free_text_timestamp() -> None:
    spec = by_suffix("alerts.v1")
    validator = Draft202012Validator(orjson.loads(render(spec)), format_checker=Draft202012Validator.FORMAT_CHECKER)
    alert = orjson.loads(codec.encode(all_examples()["alerts.v1"]))
    assert not list(validator.iter_errors(alert))
    alert["at"] = "yesterday"
    assert [e.message for e in validator.iter_errors(alert)] == ["'yesterday' is not a 'date-time'"]


def test_alert_type_is_open_to_new_types_but_not_to_garbage() -> None:
    """A consumer validating with the committed schema keeps working when gpulens adds an alert type."""
    spec = by_suffix("alerts.v1")
    schema = orjson.loads(render(spec))
    assert schema["properties"]["type"]["x-known-values"] == list(KNOWN_ALERT_TYPES)
    validator = Draft202012Validator(schema)
    alert = orjson.loads(codec.encode(all_examples()["alerts.v1"]))
    alert["type"] = "mig_fragmentation"
    assert not list(validator.iter_errors(alert))
    assert codec.decode(orjson.dumps(alert), Alert).type == "mig_fragmentation"
    alert["type"] = "Idle GPU!"
    assert list(validator.iter_errors(alert))
    with pytest.raises(codec.MessageError) as excinfo:
        codec.decode(orjson.dumps(alert), Alert)
    assert excinfo.value.field_path == "type"


def test_timestamps_are_utc_with_z_suffix() -> None:
    data = orjson.loads(codec.encode(gpu_sample()))
    assert data["ts"] == "2026-01-05T09:00:00Z"


def test_malformed_message_names_the_field_path() -> None:
    data = orjson.loads(codec.encode(gpu_sample()))
    data["gpus"][3]["mem_used_bytes"] = -5
    with pytest.raises(codec.MessageError) as excinfo:
        codec.decode(orjson.dumps(data), GpuSample)
    assert excinfo.value.field_path == "gpus.3.mem_used_bytes"
    assert "greater than or equal to 0" in str(excinfo.value)

    del data["gpus"][3]["mem_used_bytes"]
    del data["node"]
    with pytest.raises(codec.MessageError) as excinfo:
        codec.decode(orjson.dumps(data), GpuSample)
    assert excinfo.value.field_path == "node"


def test_naive_timestamps_and_non_json_are_rejected() -> None:
    data = orjson.loads(codec.encode(gpu_sample()))
    data["ts"] = "2026-01-05T09:00:00"
    with pytest.raises(codec.MessageError, match="timezone"):
        codec.decode(orjson.dumps(data), GpuSample)
    with pytest.raises(codec.MessageError, match="not valid JSON"):
        codec.decode(b"\x00garbage", GpuSample)
    with pytest.raises(codec.MessageError, match="JSON object"):
        codec.decode(b"[1, 2]", GpuSample)
    with pytest.raises(codec.MessageError, match="tombstone"):
        codec.decode(None, PodState)


def test_unknown_fields_from_newer_producers_are_tolerated() -> None:
    data = orjson.loads(codec.encode(gpu_sample()))
    data["added_in_v2"] = {"anything": 1}
    data["gpus"][0]["new_counter"] = 7
    decoded = codec.decode(orjson.dumps(data), GpuSample)
    assert decoded.node == "gpu-a"
    assert "added_in_v2" not in orjson.loads(codec.encode(decoded))


def test_oversized_messages_are_rejected_both_ways() -> None:
    huge = b'{"node": "' + b"x" * (codec.MAX_MESSAGE_BYTES + 1) + b'"}'
    with pytest.raises(codec.MessageError, match="exceeds limit"):
        codec.decode(huge, GpuSample)
    with pytest.raises(codec.MessageError, match="exceeds limit"):
        codec.encode(gpu_sample(gpus=8).model_copy(update={"errors": ["e" * codec.MAX_MESSAGE_BYTES]}))


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.suffix)
def test_plain_decoding_gives_exactly_the_models_data(spec) -> None:  # type: ignore[no-untyped-def]
    encoded = codec.encode(all_examples()[spec.suffix])
    assert codec.decode_plain(encoded, spec.message) == codec.decode(encoded, spec.message).model_dump()


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = data
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is _DELETE:  # absent either way (the compact encoding already leaves out defaults)
            target.pop(last, None)
        else:
            target[int(last) if last.isdigit() else last] = value
    mutate.__name__ = f"{path}={value!r}"[:60]
    return mutate


_DELETE = object()
BROKEN_SAMPLES = [
    _set("node", _DELETE), _set("node", 7), _set("ts", "2026-01-05T09:00:00"), _set("ts", "yesterday"),
    _set("seq", -1), _set("seq", "seven"), _set("sample_interval_s", 0), _set("gpus", {"0": 1}),
    _set("gpus.0.uuid", None), _set("gpus.1.gpu_util_pct", 100.5), _set("gpus.2.mem_used_bytes", -5),
    _set("gpus.3.health", "melted"), _set("gpus.0.processes", [{"pid": 2**32}]),
    _set("gpus.0.processes", [{"container_id": "c"}]), _set("gpus.0.assigned_to", [{"namespace": "a"}]),
    _set("gpus.0.xids", [{"xid": 79, "at": "2026-01-05T09:00:00", "critical": True}]),
    _set("gpus.0.shared", "maybe"), _set("gpus.0.power_w", -1.0),
]
ACCEPTED_SAMPLES = [
    _set("seq", "5"), _set("ts", "2026-01-05T11:00:00+02:00"), _set("gpus.0.index", 0.0),
    _set("gpus.0.added_in_v2", {"x": 1}), _set("gpus.1.health", _DELETE), _set("gpus.1.processes", _DELETE),
]


def _mutated(mutate: Callable[[dict[str, Any]], None]) -> tuple[dict[str, Any], bytes]:
    """A sample's JSON after ``mutate``: the data and its bytes."""
    data = orjson.loads(codec.encode(gpu_sample()))
    mutate(data)
    return data, orjson.dumps(data)


@pytest.mark.parametrize("mutate", BROKEN_SAMPLES, ids=lambda m: m.__name__)
def test_plain_decoding_refuses_what_the_models_refuse_with_the_same_reason(
        mutate: Callable[[dict[str, Any]], None]) -> None:
    data = orjson.loads(codec.encode(gpu_sample()))
    mutate(data)
    with pytest.raises(codec.MessageError) as by_model:
        codec.decode(orjson.dumps(data), GpuSample)
    with pytest.raises(codec.MessageError) as plain:
        codec.decode_plain(orjson.dumps(data), GpuSample)
    assert (plain.value.field_path, plain.value.reason) == (by_model.value.field_path, by_model.value.reason)


def test_plain_decoding_names_a_part_that_is_not_an_object_without_its_class() -> None:
    data = orjson.loads(codec.encode(gpu_sample()))
    data["gpus"][0] = 1
    with pytest.raises(codec.MessageError) as by_model:
        codec.decode(orjson.dumps(data), GpuSample)
    with pytest.raises(codec.MessageError) as plain:
        codec.decode_plain(orjson.dumps(data), GpuSample)
    assert plain.value.field_path == by_model.value.field_path == "gpus.0"
    assert by_model.value.reason == "Input should be a valid dictionary or instance of GpuReading"
    assert plain.value.reason == "Input should be a valid dictionary"


@pytest.mark.parametrize("mutate", ACCEPTED_SAMPLES, ids=lambda m: m.__name__)
def test_plain_decoding_coerces_and_fills_defaults_as_the_models_do(mutate: Callable[[dict[str, Any]], None]) -> None:
    _, payload = _mutated(mutate)
    assert codec.decode_plain(payload, GpuSample) == codec.decode(payload, GpuSample).model_dump()


PARSER_EDGES = [
    b'"gpu_util_pct":NaN', b'"gpu_util_pct":Infinity', b'"gpu_util_pct":-Infinity', b'"gpu_util_pct":1e400',
    b'"seq":18446744073709551615', b'"seq":18446744073709551616', b'"seq":36893488147419103233', b'"seq":1e3',
    b'"mem_used_bytes":18446744073709551617', b'"mem_used_bytes":-9223372036854775809',
    b'"node":"\\ud800"', b'"node":"n\xff"', b'"node":"a","node":"b"', b'"node":"a\x01"',
]


def _edged(edge: bytes) -> bytes:
    """A one-GPU sample's bytes with the field ``edge`` names written as ``edge`` says."""
    data = orjson.loads(codec.encode(gpu_sample(gpus=1)))
    data["node"], data["seq"] = "node-000", 0
    data["gpus"][0].update(gpu_util_pct=42.0, mem_used_bytes=1024)
    payload = orjson.dumps(data)
    original = next(part for part in (b'"node":"node-000"', b'"seq":0', b'"gpu_util_pct":42.0',
                                      b'"mem_used_bytes":1024') if part.startswith(edge.split(b":")[0]))
    edged = payload.replace(original, edge, 1)
    assert edged != payload
    return edged


@pytest.mark.parametrize("edge", PARSER_EDGES, ids=lambda v: v.decode(errors="replace"))
def test_plain_decoding_in_one_pass_gives_what_the_two_step_path_gives(edge: bytes) -> None:
    """pydantic's JSON parser reads some inputs differently from orjson: the one-pass path must not show it."""
    assert codec.json_validator(GpuSample) is not None
    edged = _edged(edge)

    expected: dict[str, Any] | str
    try:
        expected = codec.plain_validator(GpuSample).validate_python(orjson.loads(edged))
    except orjson.JSONDecodeError as exc:
        expected = f"not valid JSON: {exc}"
    except ValidationError as exc:
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        expected = str(exc.errors()[0]["msg"]) + more
    got: dict[str, Any] | str
    try:
        got = codec.decode_plain(edged, GpuSample)
    except codec.MessageError as exc:
        got = exc.reason
    assert got == expected


CANONICAL = {"seq='5'": False, "gpus.0.index=0.0": False, "ts='2026-01-05T11:00:00+02:00'": True,
             "gpus.0.added_in_v2={'x': 1}": True, "gpus.1.health=<object": True, "gpus.1.processes=<object": True}


@pytest.mark.parametrize("mutate", [*ACCEPTED_SAMPLES, *BROKEN_SAMPLES], ids=lambda m: m.__name__)
def test_canonical_decoding_gives_the_plain_verdict_and_says_whether_anything_was_coerced(
        mutate: Callable[[dict[str, Any]], None]) -> None:
    _, payload = _mutated(mutate)
    try:
        expected: Any = codec.decode_plain(payload, GpuSample)
    except codec.MessageError as exc:
        expected = (exc.field_path, exc.reason)
    got: Any
    canonical: bool | None
    try:
        got, canonical = codec.decode_plain_canonical(payload, GpuSample)
    except codec.MessageError as exc:
        got, canonical = (exc.field_path, exc.reason), None
    assert got == expected
    name = next((key for key in CANONICAL if mutate.__name__.startswith(key)), None)
    assert canonical == (CANONICAL[name] if name else None)


@pytest.mark.parametrize("mutate", [*ACCEPTED_SAMPLES, *BROKEN_SAMPLES], ids=lambda m: m.__name__)
def test_sparse_decoding_has_the_canonical_verdict_and_values_and_leaves_defaults_out(
        mutate: Callable[[dict[str, Any]], None]) -> None:
    data, payload = _mutated(mutate)
    sparse = codec.decode_canonical_sparse(payload, GpuSample)
    try:
        full, canonical = codec.decode_plain_canonical(payload, GpuSample)
    except codec.MessageError:
        full, canonical = None, False
    assert (sparse is not None) == canonical
    if sparse is not None:
        assert GpuSample.model_validate(sparse) == GpuSample.model_validate(full)
        assert set(sparse) <= set(data)
        for gpu, sent in zip(sparse.get("gpus", []), data.get("gpus", []), strict=True):
            assert set(gpu) <= set(sent)


@pytest.mark.parametrize("edge", PARSER_EDGES, ids=lambda v: v.decode(errors="replace"))
def test_canonical_decoding_reads_parser_edges_as_plain_decoding_does(edge: bytes) -> None:
    edged = _edged(edge)
    results: list[Any] = []
    for decode in (lambda p: codec.decode_plain(p, GpuSample), lambda p: codec.decode_plain_canonical(p, GpuSample)[0]):
        try:
            results.append(decode(edged))
        except codec.MessageError as exc:
            results.append(exc.reason)
    assert results[0] == results[1]


def test_every_example_encodes_canonically() -> None:
    for spec in ALL_TOPICS:
        if spec.message is GpuSample:
            _, canonical = codec.decode_plain_canonical(codec.encode(all_examples()[spec.suffix]), GpuSample)
            assert canonical


def test_plain_decoding_refuses_models_whose_behaviour_is_not_in_their_fields() -> None:
    class Checked(Message):
        low: int
        high: int

        @model_validator(mode="after")
        def ordered(self) -> Checked:
            if self.low > self.high:
                raise ValueError("low above high")
            return self

    with pytest.raises(TypeError, match="model validator"):
        codec.plain_validator(Checked)


def test_plain_decoding_keeps_the_models_config() -> None:
    class Strict(Message):
        model_config = ConfigDict(strict=True)
        count: int

    with pytest.raises(codec.MessageError) as by_model:
        codec.decode(b'{"count": "5"}', Strict)
    with pytest.raises(codec.MessageError) as plain:
        codec.decode_plain(b'{"count": "5"}', Strict)
    assert (plain.value.field_path, plain.value.reason) == (by_model.value.field_path, by_model.value.reason)
    assert codec.decode_plain(b'{"count": 5}', Strict) == {"schema_version": 2, "cluster": "default", "count": 5}


def _two_step(payload: bytes, message_type: type[Message]) -> Any:
    """What orjson and then the model make of ``payload``: the model, or (field path, reason)."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return ("", f"not valid JSON: {exc}")
    try:
        return codec.validate(data, message_type)
    except codec.MessageError as exc:
        return (exc.field_path, exc.reason)


def _decoded(payload: bytes, message_type: type[Message]) -> Any:
    try:
        return codec.decode(payload, message_type)
    except codec.MessageError as exc:
        return (exc.field_path, exc.reason)


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.suffix)
def test_decoding_in_one_pass_builds_the_models_the_two_step_path_builds(spec) -> None:  # type: ignore[no-untyped-def]
    # an alert's details are free-form (a field of any type): alerts take the two-step path
    assert (codec.model_json_validator(spec.message) is None) == (spec.message is Alert)
    encoded = codec.encode(all_examples()[spec.suffix])
    decoded = codec.decode(encoded, spec.message)
    assert type(decoded) is spec.message
    assert decoded == _two_step(encoded, spec.message)


@pytest.mark.parametrize("edge", PARSER_EDGES, ids=lambda v: v.decode(errors="replace"))
def test_decoding_in_one_pass_reads_parser_edges_as_orjson_and_the_model_do(edge: bytes) -> None:
    edged = _edged(edge)
    assert _decoded(edged, GpuSample) == _two_step(edged, GpuSample)


@pytest.mark.parametrize("mutate", [*ACCEPTED_SAMPLES, *BROKEN_SAMPLES], ids=lambda m: m.__name__)
def test_decoding_in_one_pass_coerces_and_refuses_as_the_two_step_path_does(
        mutate: Callable[[dict[str, Any]], None]) -> None:
    _, payload = _mutated(mutate)
    assert _decoded(payload, GpuSample) == _two_step(payload, GpuSample)
