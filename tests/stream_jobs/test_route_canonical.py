"""The route's shortcut for GPU samples (``pipeline.route_canonical``): it must route exactly as
decoding does, and leave every sample it cannot vouch for to the decoder's verdict."""

from __future__ import annotations

import orjson
import pytest

from schemas.codec import MessageError, encode
from schemas.examples import all_examples, gpu_sample
from schemas.topics import GPU_SAMPLES
from stream_jobs.pipeline import decode_record, route, route_canonical
from stream_jobs.scoping import node_key

SUFFIX = GPU_SAMPLES.suffix


def _routes(value: bytes) -> tuple[object, object]:
    return route_canonical(SUFFIX, value), route(decode_record(SUFFIX, value))


def test_a_canonical_sample_is_routed_as_decoding_routes_it() -> None:
    for cluster in ("default", "eu-west"):
        value = encode(gpu_sample(node="gpu-z").model_copy(update={"cluster": cluster}))
        shortcut, decoded = _routes(value)
        assert shortcut == decoded == [("node", node_key(cluster, "gpu-z"))]


def test_a_version_1_sample_without_cluster_goes_to_the_default_cluster() -> None:
    data = orjson.loads(encode(gpu_sample(node="gpu-v1")))
    del data["cluster"]
    data["schema_version"] = 1
    shortcut, decoded = _routes(orjson.dumps(data))
    assert shortcut is not None and shortcut == decoded


def test_what_it_cannot_vouch_for_is_left_to_the_decoder() -> None:
    data = orjson.loads(encode(gpu_sample(node="gpu-q")))
    data["gpus"][0]["index"] = "0"  # lax validation coerces it, strict does not
    coerced = orjson.dumps(data)
    assert route_canonical(SUFFIX, coerced) is None
    assert route(decode_record(SUFFIX, coerced)) == [("node", "gpu-q")]
    del data["node"]
    invalid = orjson.dumps(data)
    assert route_canonical(SUFFIX, invalid) is None
    with pytest.raises(MessageError, match="node"):
        decode_record(SUFFIX, invalid)
    assert route_canonical(SUFFIX, b"not json") is None
    assert route_canonical(SUFFIX, None) is None


def test_other_topics_are_always_decoded() -> None:
    for suffix, message in all_examples().items():
        if suffix != SUFFIX:
            assert route_canonical(suffix, encode(message)) is None
