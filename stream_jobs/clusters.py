"""Several clusters through one set of stream jobs: separate state per cluster, scoped outputs.

Node names and pod uids are unique only within a cluster, so nothing of two clusters may meet:

- a node stage is keyed by :func:`stream_jobs.scoping.node_key` (``<cluster>/<node>``; the bare node in the
  ``default`` cluster), which is also the key of the internal node-inputs topic;
- :class:`ClusterStages` holds one :class:`ClusterStage` per cluster, each seeing only its
  cluster's inputs and the same watermarks, so each cluster's figures are what a single-cluster
  run of it gives;
- :func:`stream_jobs.scoping.stamped` writes the cluster into every output and scopes its deterministic ids
  (``window_id``, alert ``id``) with :func:`schemas.messages.scoped_key`. In the ``default``
  cluster nothing changes, so a single-cluster install keeps its ids, keys and stored rows.
"""

from __future__ import annotations

from schemas.messages import DEFAULT_CLUSTER, Message, scoped_key
from stream_jobs.cluster_stage import ClusterStage
from stream_jobs.config import EngineConfig
from stream_jobs.json_types import JsonDict, JsonObject, record_map
from stream_jobs.reorder import Source
from stream_jobs.scoping import stamped
from stream_jobs.stage import Rejected
from stream_jobs.state import ClusterPod


class ClusterStages:
    """One :class:`ClusterStage` per cluster behind the interface of one (submit, advance, flush,
    checkpoint). Stages start when their cluster's first input arrives and advance in name order."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.stages: dict[str, ClusterStage] = {}

    def stage(self, cluster: str) -> ClusterStage:
        stage = self.stages.get(cluster)
        if stage is None:
            stage = self.stages[cluster] = ClusterStage(self.config)
        return stage

    def submit(self, message: Message, source: Source | None = None) -> None:
        self.stage(message.cluster).submit(message, source)

    def take_rejected(self) -> list[Rejected]:
        """The inputs the stages did not apply since the last call (:meth:`Stage.take_rejected`)."""
        return [r for name in sorted(self.stages) for r in self.stages[name].take_rejected()]

    def advance(self, watermark: float) -> list[Message]:
        return [m for name in sorted(self.stages) for m in stamped(name, self.stages[name].advance(watermark))]

    def flush(self, end: float) -> list[Message]:
        return [m for name in sorted(self.stages) for m in stamped(name, self.stages[name].flush(end))]

    @property
    def counters(self) -> dict[str, int]:
        """The stages' counters, summed."""
        total: dict[str, int] = {}
        for stage in self.stages.values():
            for name, value in stage.counters.items():
                total[name] = total.get(name, 0) + value
        return total

    @property
    def pods(self) -> dict[str, ClusterPod]:
        """Every cluster's pods, by cluster-scoped uid (a view for inspection; the stages own them)."""
        return {scoped_key(name, uid): pod for name, stage in self.stages.items() for uid, pod in stage.pods.items()}

    def to_dict(self) -> JsonDict:
        return {"clusters": {name: stage.to_dict() for name, stage in sorted(self.stages.items())}}

    @classmethod
    def from_dict(cls, data: JsonObject, config: EngineConfig) -> ClusterStages:
        """Also reads the state of a version without clusters (one stage's dict: the ``default`` cluster)."""
        stages = cls(config)
        saved = data.get("clusters", {DEFAULT_CLUSTER: data})
        stages.stages = record_map(saved, lambda state: ClusterStage.from_dict(state, config))
        return stages
