"""A reading that repeats from one sample to the next is the same model again; a changed one is
validated afresh; either way the sample is the one a sampler seeing the node for the first time
builds (what goes on the wire does not depend on what the sampler saw before)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from producers.agent.fake_nvml import FakeGpu, FakeProcess
from schemas.codec import encode
from tests.agent.helpers import GIB, at, container, gpu_uuid, make_sampler, pod_uid, ref


def _fleet() -> list[FakeGpu]:
    return [FakeGpu(gpu_uuid(i), i, gpu_util_pct=40.0 + i, mem_used_bytes=(i + 1) * GIB,
                    processes=[FakeProcess(100 + i, (i + 1) * GIB, sm_util_pct=40.0 + i)]) for i in range(3)]


def _fresh_bytes(gpus: list[FakeGpu], seconds: float, seq: int) -> bytes:
    """What a sampler that never sampled these GPUs puts on the wire for them (with ``seq``)."""
    sampler, _, _ = make_sampler(gpus, assignments=_assignments(), pids=_pids())
    sampler.seq = seq
    sampler.sample(at(seconds - 10))  # the rates and per-process utilisation need one read before
    sampler.seq = seq
    return encode(sampler.sample(at(seconds)))


def _assignments() -> dict[str, list]:
    return {gpu_uuid(i): [ref(f"pod-{i}", uid=i + 1)] for i in range(3)}


def _pids() -> dict:
    return {100 + i: container(i + 1, i + 1) for i in range(3)}


def test_a_repeated_reading_is_the_same_model_and_a_changed_one_is_new() -> None:
    gpus = _fleet()
    sampler, _, _ = make_sampler(gpus, assignments=_assignments(), pids=_pids())
    sampler.sample(at(0))
    second = sampler.sample(at(10))
    gpus[1].gpu_util_pct = 77.0
    third = sampler.sample(at(20))
    assert third.gpus[0] is second.gpus[0] and third.gpus[2] is second.gpus[2]
    assert third.gpus[1] is not second.gpus[1] and third.gpus[1].gpu_util_pct == 77.0
    assert third.gpus[1].processes[0].pod_uid == pod_uid(2) and third.gpus[1].processes[0].pod_name == "pod-1"


def test_a_sample_of_repeated_readings_encodes_as_a_first_sample_does() -> None:
    gpus = _fleet()
    sampler, _, _ = make_sampler(gpus, assignments=_assignments(), pids=_pids())
    for seconds in (0, 10, 20):
        sampler.sample(at(seconds))
    assert encode(sampler.sample(at(30))) == _fresh_bytes(_fleet(), 30, seq=3)


def test_an_equal_value_of_another_type_gives_the_reading_of_that_type() -> None:
    """70 (int) and 70.0 are equal: the repeated reading holds what validation makes of either."""
    gpus = _fleet()
    gpus[0].power_w = 70
    sampler, _, _ = make_sampler(gpus, assignments=_assignments(), pids=_pids())
    first = sampler.sample(at(0))
    gpus[0].power_w = 70.0
    second = sampler.sample(at(10))
    assert type(first.gpus[0].power_w) is float and second.gpus[0].power_w == 70.0
    assert encode(second).count(b'"power_w":70.0') == 3


def test_an_invalid_reading_still_fails_the_sample_and_is_not_remembered() -> None:
    gpus = _fleet()
    sampler, _, _ = make_sampler(gpus, assignments=_assignments(), pids=_pids())
    sampler.sample(at(0))
    gpus[2].temperature_c = float("inf")
    with pytest.raises(ValidationError, match=r"gpus\.2\.temperature_c"):
        sampler.sample(at(10))
    with pytest.raises(ValidationError, match=r"gpus\.2\.temperature_c"):
        sampler.sample(at(20))  # the same bad value again: validated again, refused again
    gpus[2].temperature_c = 41.0
    assert sampler.sample(at(30)).gpus[2].temperature_c == 41.0
