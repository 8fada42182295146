"""GPU readings that repeat from one sample of a node to the next are encoded once (``schemas.codec``
``encode``): what it reuses gives the bytes a fresh encode gives, as readings repeat, change, come
and go and as nodes share reading objects, and what is kept stays bounded."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from schemas import codec
from schemas.codec import LastReadings, decode, encode
from schemas.examples import gpu_sample
from schemas.messages import GpuReading, GpuSample
from schemas.topics import GPU_SAMPLES

SUFFIX = GPU_SAMPLES.suffix


def _fresh_bytes(sample: GpuSample) -> bytes:
    """What ``encode`` writes with nothing remembered: the whole model dumped at once."""
    return orjson.dumps({"schema_version": sample.schema_version, "cluster": sample.cluster}
                        | sample.model_dump(mode="json", exclude_defaults=True))


def _with(sample: GpuSample, **fields: Any) -> GpuSample:
    return sample.model_copy(update=fields)


def _changed(reading: GpuReading, **fields: Any) -> GpuReading:
    return GpuReading.model_validate(reading.model_dump() | fields)


def test_an_encoded_sample_is_byte_for_byte_a_fresh_encode_as_its_readings_repeat_and_change() -> None:
    first = gpu_sample(gpus=4, node="enc-a")
    readings = list(first.gpus)
    second = _with(first, seq=43)  # the same reading objects
    third = _with(first, seq=44, gpus=[readings[0], _changed(readings[1], gpu_util_pct=12.5), *readings[2:]])
    fourth = _with(first, seq=45, gpus=readings[:2])  # a GPU gone
    fifth = _with(first, seq=46, gpus=[*readings[:2], _changed(readings[3], index=7, uuid="GPU-new")])
    for sample in (first, second, third, fourth, fifth, first):
        assert encode(sample) == _fresh_bytes(sample)
        assert decode(encode(sample), GpuSample) == sample


def test_a_repeated_reading_reuses_its_json_and_only_the_last_samples_readings_are_kept() -> None:
    sample = gpu_sample(gpus=3, node="enc-b")
    encode(sample)
    kept = codec._ENCODED_READINGS.get(sample.cluster, sample.node)
    assert kept is not None
    fragments = {id(reading): kept[id(reading)][1] for reading in sample.gpus}
    encode(_with(sample, seq=50))
    again = codec._ENCODED_READINGS.get(sample.cluster, sample.node)
    assert again is not None
    assert all(again[id(reading)][1] is fragments[id(reading)] for reading in sample.gpus)
    fewer = _with(sample, seq=51, gpus=sample.gpus[:1])
    assert encode(fewer) == _fresh_bytes(fewer)
    assert list(codec._ENCODED_READINGS.get(sample.cluster, sample.node) or {}) == [id(sample.gpus[0])]


def test_two_nodes_with_the_same_reading_objects_encode_each_their_own_sample() -> None:
    one = gpu_sample(gpus=2, node="enc-c")
    other = _with(one, node="enc-d", cluster="eu-1", seq=9)
    for sample in (one, other, one, other):
        assert encode(sample) == _fresh_bytes(sample)


def test_a_sample_without_readings_encodes_as_before() -> None:
    sample = _with(gpu_sample(gpus=1, node="enc-e"), gpus=[])
    assert encode(sample) == _fresh_bytes(sample)


def test_the_kept_readings_stay_bounded_over_many_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec._ENCODED_READINGS, "max_nodes", 16)
    for number in range(100):
        sample = gpu_sample(gpus=2, node=f"many-{number:03d}")
        assert encode(sample) == _fresh_bytes(sample)
        assert len(codec._ENCODED_READINGS) <= 16
    kept = codec._ENCODED_READINGS.get("default", "many-099")
    assert kept is not None and len(kept) == 2  # the node's last sample only


def test_last_readings_forgets_all_nodes_beyond_its_limit_and_replaces_a_nodes_readings() -> None:
    last: LastReadings[list[int]] = LastReadings(max_nodes=3)
    for node in "abc":
        last.keep("default", node, [1])
    last.keep("default", "a", [2])
    assert len(last) == 3 and last.get("default", "a") == [2]
    last.keep("default", "d", [3])
    assert len(last) == 1 and last.get("default", "a") is None and last.get("default", "d") == [3]
