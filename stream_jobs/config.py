"""Engine configuration: alert thresholds, window length, prices.

One frozen object shared by both stages so the in-process replay and the faust workers apply the
same rules. Threshold names are those of DESIGN.md's alert catalogue (durations in seconds here;
the scenario parser and the settings loader convert duration strings).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

_MIG_SUFFIX = re.compile(r"[\s-]+MIG[\s-]+\S+\s*$")


def model_key(model: str) -> str:
    """A GPU model's name as prices are matched: NVML's name (``NVIDIA A100-SXM4-40GB``, what samples
    carry) and the node label GPU feature discovery writes (``NVIDIA-A100-SXM4-40GB``, what the
    cluster stage has for a pod none of whose GPUs was sampled) name one model; so do two spellings
    that differ only in case."""
    return " ".join(model.replace("-", " ").split()).casefold()


@dataclass(frozen=True)
class Thresholds:
    """Alert thresholds (DESIGN.md catalogue defaults); durations are seconds."""

    idle_util_pct: float = 5.0
    idle_after: float = 600.0
    vram_pressure_pct: float = 95.0
    vram_pressure_after: float = 60.0
    pending_after: float = 300.0
    fragmentation_after: float = 120.0
    gang_after: float = 300.0
    idle_node_after: float = 1800.0
    crashloop_restarts: float = 3.0
    crashloop_window: float = 600.0
    gpu_health_clear_after: float = 300.0
    gap_intervals: float = 3.0
    """A silence longer than this many sample intervals is a gap (not idle)."""
    allocator_unused_pct: float = 30.0
    """``allocator_fragmentation``: reserved-but-unused VRAM of a pod's caching allocator, as a share
    of the GPU's memory, at or above which the condition holds."""
    allocator_fragmentation_after: float = 300.0
    """``allocator_fragmentation``: how long the condition must hold, and the window in which
    allocation retries or OOMs must occur."""

    mig_fragmentation_after: float = 120.0
    """A pending MIG pod no empty instance can host while free slices exist: alert after this long."""
    mig_unused_after: float = 1800.0
    """An empty MIG instance counts as unused slices in the report after this long."""
    vram_fragmentation_after: float = 120.0
    """A pending pod's VRAM need fits the shared GPUs' free VRAM in total but none alone: alert after this long."""

    DURATIONS = (
        "idle_after", "vram_pressure_after", "pending_after", "fragmentation_after", "gang_after",
        "idle_node_after", "crashloop_window", "gpu_health_clear_after", "mig_fragmentation_after",
        "mig_unused_after", "vram_fragmentation_after", "allocator_fragmentation_after",
    )

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def with_overrides(self, overrides: Mapping[str, Any]) -> Thresholds:
        """Apply ``{name: value}``; names may carry a ``_s`` suffix for durations. Raises
        ``ValueError`` naming the unknown threshold or bad value."""
        known = set(self.names())
        changes: dict[str, float] = {}
        for raw_name, value in overrides.items():
            name = raw_name[:-2] if raw_name.endswith("_s") and raw_name[:-2] in self.DURATIONS else raw_name
            if name not in known:
                raise ValueError(f"unknown threshold {raw_name!r}; known: {', '.join(sorted(known))}")
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"threshold {raw_name!r} must be a number, got {value!r}")
            if value < 0:
                raise ValueError(f"threshold {raw_name!r} must not be negative, got {value!r}")
            changes[name] = float(value)
        return replace(self, **changes)

    def to_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in self.names()}


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "sample_interval_s": self.sample_interval_s,
            "prices_usd_per_gpu_hour": dict(self.prices_usd_per_gpu_hour),
            "thresholds": self.thresholds.to_dict(),
            "max_skew_s": self.max_skew_s,
            "horizon_s": self.horizon_s,
        } | ({} if self.accept_clusters is None else {"accept_clusters": sorted(self.accept_clusters)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineConfig:
        return cls(
            window_s=float(data.get("window_s", 60.0)),
            sample_interval_s=float(data.get("sample_interval_s", 10.0)),
            prices_usd_per_gpu_hour=dict(data.get("prices_usd_per_gpu_hour", {})),
            thresholds=Thresholds().with_overrides(data.get("thresholds", {})),
            max_skew_s=float(data.get("max_skew_s", 600.0)),
            horizon_s=float(data.get("horizon_s", 86400.0)),
            accept_clusters=None if data.get("accept_clusters") is None else frozenset(data["accept_clusters"]),
        )
