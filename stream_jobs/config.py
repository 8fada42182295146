"""Engine configuration: alert thresholds, window length, prices.

One frozen object shared by both stages so the in-process replay and the faust workers apply the
same rules. The thresholds are the workers' settings model itself (:class:`common.settings.Thresholds`:
names, units and bounds, validated where they are read: the settings loader, a scenario file);
:meth:`EngineConfig.from_settings` is the one conversion from a worker's settings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.settings import Thresholds as Thresholds
from common.settings import WorkerSettings
from stream_jobs.json_types import JsonDict, JsonObject, as_array, as_float, as_object, as_str

_MIG_SUFFIX = re.compile(r"[\s-]+MIG[\s-]+\S+\s*$")

WORKER_GC_THRESHOLDS = (50_000, 20, 100)
"""The worker's cyclic garbage collector runs after 50,000 net allocations instead of 700, and a
full collection comes about 14x less often. A worker holds its stages' state (every pod, GPU and
buffered sample) and faust's buffers, and each collection scanned them: with the default
thresholds, collections took 3 of 25 s of a benchmark run (64 nodes), and throughput rose about 8 %
without them at the same peak memory. What the stream jobs free is freed by reference counting;
the collector is only for cycles (asyncio futures, exceptions). The in-process replay runs its
stages under the same thresholds (``simulation.replay.run_in_process``)."""


def model_key(model: str) -> str:
    """A GPU model's name as prices are matched: NVML's name (``NVIDIA A100-SXM4-40GB``, what samples
    carry) and the node label GPU feature discovery writes (``NVIDIA-A100-SXM4-40GB``, what the
    cluster stage has for a pod none of whose GPUs was sampled) name one model; so do two spellings
    that differ only in case."""
    return " ".join(model.replace("-", " ").split()).casefold()


@dataclass(frozen=True)
class EngineConfig:
    window_s: float = 60.0
    sample_interval_s: float = 10.0
    """Expected sampling interval; samples carry their own and that one wins."""
    prices_usd_per_gpu_hour: Mapping[str, float] = field(default_factory=dict)
    thresholds: Thresholds = field(default_factory=Thresholds)
    max_skew_s: float = 600.0
    """An input whose event time is further ahead of the stream's clock is dead-lettered."""
    horizon_s: float = 86400.0
    """An input whose event time is further behind the stream's clock is dead-lettered."""
    accept_clusters: frozenset[str] | None = None
    """The clusters whose inputs the stream takes (``GPULENS_ACCEPT_CLUSTERS``); another cluster's
    record is dead-lettered (``unknown_cluster``). None: every cluster."""

    _prices_by_key: dict[str, float] = field(init=False, repr=False, compare=False)
    _price_of: dict[str, float] = field(init=False, repr=False, compare=False)
    """Each model name's price once found (the stages ask per GPU reading)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_prices_by_key", {model_key(model): float(usd)
                                                    for model, usd in self.prices_usd_per_gpu_hour.items()})
        object.__setattr__(self, "_price_of", {})

    def price(self, model: str | None) -> float:
        """USD per GPU-hour of ``model`` (matched by :func:`model_key`); a MIG device falls back to its
        parent's model."""
        if not model:
            return 0.0
        usd = self._price_of.get(model)
        if usd is None:
            prices = self._prices_by_key
            usd = prices.get(model_key(model))
            if usd is None:
                usd = prices.get(model_key(_MIG_SUFFIX.sub("", model)), 0.0)
            self._price_of[model] = usd
        return usd

    def to_dict(self) -> JsonDict:
        data: JsonDict = {
            "window_s": self.window_s,
            "sample_interval_s": self.sample_interval_s,
            "prices_usd_per_gpu_hour": dict(self.prices_usd_per_gpu_hour),
            "thresholds": self.thresholds.to_dict(),
            "max_skew_s": self.max_skew_s,
            "horizon_s": self.horizon_s,
        }
        if self.accept_clusters is not None:
            data["accept_clusters"] = sorted(self.accept_clusters)
        return data

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> EngineConfig:
        """A stream worker's engine configuration (``GPULENS_*``, validated by ``load_settings``)."""
        return cls(window_s=settings.window_s, sample_interval_s=settings.sample_interval_s,
                   prices_usd_per_gpu_hour=dict(settings.prices_usd_per_gpu_hour), thresholds=settings.thresholds,
                   max_skew_s=settings.max_skew_s, horizon_s=settings.horizon_s,
                   accept_clusters=settings.accepted_clusters())

    @classmethod
    def from_dict(cls, data: JsonObject) -> EngineConfig:
        accept = data.get("accept_clusters")
        return cls(
            window_s=float(as_float(data.get("window_s", 60.0))),
            sample_interval_s=float(as_float(data.get("sample_interval_s", 10.0))),
            prices_usd_per_gpu_hour={model: as_float(usd) for model, usd
                                     in as_object(data.get("prices_usd_per_gpu_hour", {})).items()},
            thresholds=Thresholds.model_validate(data.get("thresholds", {})),
            max_skew_s=float(as_float(data.get("max_skew_s", 600.0))),
            horizon_s=float(as_float(data.get("horizon_s", 86400.0))),
            accept_clusters=None if accept is None else frozenset(as_str(name) for name in as_array(accept)),
        )
