"""Gang recognition: which pods (and queued workloads) belong to one all-or-nothing job.

A gang is known today from labels and annotations (``gang_label_keys``, first match wins); the
batch systems a GPU fleet runs mark their groups in more ways than one key, so the other ways are
a small table of recognisers tried after the configured keys, in order:

- **label sets**: several labels joined into one group name, e.g. a LeaderWorkerSet replica is
  ``leaderworkerset.sigs.k8s.io/name`` + ``group-index`` (each leader-plus-workers group starts
  together, not the whole set);
- **single labels** the configured keys do not cover by default (Volcano's ``volcano.sh/job-name``,
  Kueue's pod groups ``kueue.x-k8s.io/pod-group-name``, LeaderWorkerSet without an index);
- **owner references** by API group and kind: JobSet, LeaderWorkerSet, Volcano Jobs and PodGroups,
  scheduler-plugins PodGroups and Kueue Workloads (a Kueue pod group's pods). Kubeflow training
  jobs are not in it: their pods carry ``training.kubeflow.org/job-name``, a configured key, and a
  pod whose only trace is the owner (e.g. a one-pod notebook-style job) is not treated as a gang.

The result is always ``<namespace>/<group>``: gang names are namespace-scoped. The same function
serves pods and Kueue ``Workload`` objects, so a workload and its pods share a gang id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from producers.watcher.kube_json import JsonDict, first_value, json_dict, json_list


@dataclass(frozen=True)
class LabelGang:
    """The values of every key in ``keys`` (labels, else annotations), joined with ``-``."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class OwnerGang:
    """An ownerReference of this ``kind`` whose apiVersion is in ``api_group``: the owner names the gang."""

    api_group: str
    kind: str


GangRecogniser = LabelGang | OwnerGang

RECOGNISERS: tuple[GangRecogniser, ...] = (
    LabelGang(("leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index")),
    LabelGang(("kueue.x-k8s.io/pod-group-name",)),
    LabelGang(("volcano.sh/job-name",)),
    LabelGang(("leaderworkerset.sigs.k8s.io/name",)),
    OwnerGang("jobset.x-k8s.io", "JobSet"),
    OwnerGang("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),
    OwnerGang("batch.volcano.sh", "Job"),
    OwnerGang("scheduling.volcano.sh", "PodGroup"),
    OwnerGang("scheduling.x-k8s.io", "PodGroup"),
    OwnerGang("kueue.x-k8s.io", "Workload"),
)
"""Tried in order after the configured label keys; the first that matches names the gang."""


def _recognise(meta: JsonDict, recogniser: GangRecogniser) -> str | None:
    if isinstance(recogniser, LabelGang):
        values = [first_value(meta, (key,)) for key in recogniser.keys]
        return "-".join(v for v in values if v) if all(values) else None
    for ref in map(json_dict, json_list(meta.get("ownerReferences"))):
        group = str(ref.get("apiVersion") or "").partition("/")[0]
        if ref.get("kind") == recogniser.kind and group == recogniser.api_group and ref.get("name"):
            return str(ref["name"])
    return None


def gang_id(meta: JsonDict, namespace: str, label_keys: Iterable[str],
            recognisers: Iterable[GangRecogniser] = RECOGNISERS) -> str | None:
    """``<namespace>/<group>`` from the configured keys, then the recognisers; None when none match."""
    value = first_value(meta, label_keys)
    if value:
        return f"{namespace}/{value}"
    for recogniser in recognisers:
        group = _recognise(meta, recogniser)
        if group:
            return f"{namespace}/{group}"
    return None
