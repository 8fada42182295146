"""A GPU sample the contract's narrowed one-pass validator accepts skips the stream's wire check
(``stream_jobs.pipeline.decode_record``): the check must have nothing to say about it. Samples with
the numbers the check looks for (exponents, 19 and 20 digits, the edges of 64 bits) decode to what
the full path (``schemas.codec.decode`` and ``wire_error``) gives, and samples beyond those edges
are still refused with the full path's reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas.codec import MessageError, decode, model_json_validator
from schemas.messages import GpuSample
from schemas.outputs import DeadLetterReason
from schemas.topics import GPU_SAMPLES
from stream_jobs.pipeline import _suspect, decode_record, wire_error

SUFFIX = GPU_SAMPLES.suffix


def _sample(**reading: Any) -> dict[str, Any]:
    gpu = {"uuid": "GPU-1", "index": 0, "model": "NVIDIA H100 80GB HBM3"} | reading
    return {"schema_version": 2, "cluster": "default", "node": "gpu-00", "ts": "2026-01-05T09:00:00Z",
            "agent_boot_id": "boot", "seq": 7, "sample_interval_s": 10.0, "gpus": [gpu]}


def _raw(data: dict[str, Any], **replace: str) -> bytes:
    """``data`` as JSON, with each placeholder string ``"<name>"`` replaced by the raw JSON text given."""
    text = orjson.dumps(data).decode()
    for name, number in replace.items():
        text = text.replace(f'"<{name}>"', number)
    return text.encode()


def _full_path(value: bytes) -> GpuSample:
    """What the decode gives without the shortcut: the codec, then the wire check."""
    message = decode(value, GpuSample)
    problem = wire_error(SUFFIX, value, message)
    if problem is not None:
        raise problem
    return message


EDGES = [
    _raw(_sample(power_w="<p>"), p="6.5e2"),
    _raw(_sample(power_w="<p>", temperature_c="<t>"), p="1E3", t="-2.5e-3"),
    _raw(_sample(mem_used_bytes="<m>"), m=str(2**64 - 1)),
    _raw(_sample(mem_used_bytes="<m>"), m="1234567890123456789"),
    _raw(_sample(mem_used_bytes="<m>"), m="2e10"),
    _raw(_sample(pcie_tx_bytes_per_s="<x>"), x="3.4e38"),
    _raw(_sample(ecc_sbe_volatile_total="<e>"), e="18446744073709551615"),
    _raw(_sample(processes=[{"pid": "<pid>", "mem_used_bytes": "<m>"}]), pid="4294967295", m="2e10"),
    _raw(_sample(mem_used_bytes="<m>"), m=str(2**64)),
    _raw(_sample(mem_used_bytes="<m>"), m="1e19"),
    _raw(_sample(mem_used_bytes="<m>"), m="1e20"),
    _raw(_sample(power_w="<p>"), p="1e400"),
    _raw(_sample(power_w="<p>"), p="NaN"),
    _raw(_sample(temperature_c="<t>"), t="-Infinity"),
    _raw(_sample(gpu_util_pct="<u>"), u="1e3"),
    _raw(_sample(power_w="<p>"), p="3.5e38"),
    orjson.dumps(_sample(gpu_util_pct=55.199999999999996, mem_used_bytes=64424509440)),  # as agents write them
]


def _verdict(read: Any, value: bytes) -> GpuSample | tuple[str, DeadLetterReason]:
    try:
        message: GpuSample = read(value)
    except MessageError as exc:
        return str(exc), exc.code
    return message


@pytest.mark.parametrize("value", EDGES)
def test_a_sample_with_the_numbers_the_wire_check_looks_for_reads_as_the_full_path_reads_it(value: bytes) -> None:
    assert _verdict(lambda v: decode_record(SUFFIX, v), value) == _verdict(_full_path, value)


def test_the_edges_take_both_paths_and_the_wire_check_looks_into_each() -> None:
    validator = model_json_validator(GpuSample)
    assert validator is not None
    accepted = []
    for value in EDGES:
        try:
            accepted.append(validator.validate_json(value))
        except ValueError:
            continue
    assert 5 <= len(accepted) < len(EDGES)
    assert all(_suspect(value) for value in EDGES[:-1])


def test_every_sample_of_a_scenario_reads_as_the_full_path_reads_it() -> None:
    from simulation.scenario import load_scenario
    from simulation.simulator import FleetSimulator

    scenario = load_scenario(Path(__file__).resolve().parents[2] / "simulation" / "scenarios" / "gpu-health.yaml")
    values = [record.value for tick in FleetSimulator(scenario).run() for record in tick.records
              if record.topic == SUFFIX and record.value is not None]
    assert values
    for value in values:
        assert decode_record(SUFFIX, value) == _full_path(value)
