"""Prices are matched by model whichever way the model is spelt: NVML's name in samples, the node
label GPU feature discovery writes (spaces as dashes) in node states. A pod none of whose GPUs was
ever sampled is priced by its node's label, and was charged nothing for it before (a random
scenario found it: a pod scheduled during its node's agent gap)."""

from __future__ import annotations

import pytest

from simulation.replay import run_in_process
from simulation.scenario import parse_scenario
from stream_jobs.config import EngineConfig

PRICES = {"NVIDIA L4": 0.8, "NVIDIA H100 80GB HBM3": 2.5, "NVIDIA A100-SXM4-40GB": 1.5}


@pytest.mark.parametrize(("model", "usd"), [
    ("NVIDIA L4", 0.8), ("NVIDIA-L4", 0.8), ("nvidia l4", 0.8),
    ("NVIDIA A100-SXM4-40GB", 1.5), ("NVIDIA-A100-SXM4-40GB", 1.5),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 2.5), ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 2.5),
    ("NVIDIA-H100-80GB-HBM3", 2.5), ("Tesla T4", 0.0), ("", 0.0), (None, 0.0),
])
def test_a_model_is_priced_whichever_way_it_is_spelt(model: str | None, usd: float) -> None:
    assert EngineConfig(prices_usd_per_gpu_hour=PRICES).price(model) == usd


def test_a_price_of_its_own_wins_over_the_parent_gpus() -> None:
    config = EngineConfig(prices_usd_per_gpu_hour={"NVIDIA H100 80GB HBM3": 2.5,
                                                   "NVIDIA H100 80GB HBM3 MIG 1g.10gb": 0.0})
    assert config.price("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == 0.0
    assert config == EngineConfig.from_dict(config.to_dict())


def test_a_pod_whose_gpus_were_never_sampled_is_charged_by_its_nodes_model() -> None:
    scenario = parse_scenario({
        "name": "unsampled", "start": "2026-01-05T09:00:00Z", "duration": "20m",
        "prices": {"NVIDIA L4": 0.8},
        "nodes": [{"name": "gpu-a", "gpus": 2, "model": "NVIDIA L4", "memory_gib": 24}],
        "pods": [{"name": "sampled", "gpus": 1, "util": 50},
                 {"name": "silent", "gpus": 1, "create": "12m", "util": 50}],
        "agent_gaps": [{"node": "gpu-a", "from": "10m", "to": "25m"}],
    })
    rows = {row["name"]: row for row in run_in_process(scenario).report["pods"]}
    assert rows["silent"]["running_s"] == 480 and rows["silent"]["peak_mem_bytes"] is None  # no sample seen
    assert rows["silent"]["cost_usd"] == pytest.approx(480 / 3600 * 0.8, abs=1e-4)
    assert rows["sampled"]["cost_usd"] == pytest.approx(1200 / 3600 * 0.8, abs=1e-4)
