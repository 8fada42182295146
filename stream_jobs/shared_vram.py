"""VRAM on shared GPUs (time-slicing, MPS): free memory per GPU, its tenants, and two alerts.

Time-slicing and MPS share a GPU's memory without isolation, and Kubernetes has no memory
resource for a GPU. So memory can fragment across shared GPUs (40 GiB free over four GPUs, none
with the 20 GiB a new pod needs) and a tenant can be starved by a neighbour growing.

- Node stage (:class:`NoisyNeighbours`): per shared GPU and sample, its free VRAM and the pods on
  it with their memory now and their peak there (:class:`SharedGpuState`, sent to the cluster
  stage in ``NodeSummary.shared``); and ``noisy_neighbour``: the GPU's memory reaches
  ``vram_pressure_pct`` and one of its pods grew since the last sample below it (the one that grew
  the most is named), held for ``vram_pressure_after``.
- Cluster stage (:class:`VramTracker`): fleet figures (free, largest free, stranded VRAM) and
  ``vram_fragmentation``: a pending pod's memory need (``PodState.vram_request_bytes``) fits the
  free VRAM of the schedulable shared GPUs in total but no single one, for
  ``vram_fragmentation_after``.

A GPU is shared when its node advertises more ``nvidia.com/gpu`` units than it has GPUs
(time-slicing replicas) or the agent saw more than one pod on it (``GpuReading.shared``). Nothing
here happens on a fleet without shared GPUs. State is plain JSON-serialisable data.
"""

from __future__ import annotations

from typing import Any

from schemas.messages import Alert, GpuReading, NodeState, SharedGpuState, SharedPodVram
from stream_jobs import alerts
from stream_jobs.config import Thresholds
from stream_jobs.timeutil import elapsed, fmt_duration

GIB = 2**30
_MAX_LISTED = 20


def replicas_per_gpu(state: NodeState) -> float:
    """``nvidia.com/gpu`` (or ``.shared``) units advertised per physical GPU (1 when unknown)."""
    units = max((n for res, n in state.gpu_allocatable.items() if res in ("nvidia.com/gpu", "nvidia.com/gpu.shared")),
                default=0)
    gpus = state.gpu_count_label
    return units / gpus if gpus else 1.0


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


class NoisyNeighbours:
    """The node stage's view of its shared GPUs."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.gpus: dict[str, dict[str, Any]] = (data or {}).get("gpus", {})

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus}

    def observe(self, ts: float, node: str, reading: GpuReading, tenants: list[tuple[str, str, str, int | None]],
                th: Thresholds) -> tuple[SharedGpuState | None, list[Alert]]:
        """One shared GPU's reading with its tenants ``(uid, namespace, name, mem_bytes)``."""
        g = self.gpus.setdefault(reading.uuid, {"peak": {}, "below": None, "since": None, "noisy": None,
                                                "growth": 0, "alert": None})
        present = {uid for uid, *_ in tenants}
        g["peak"] = {uid: p for uid, p in g["peak"].items() if uid in present}
        for uid, _ns, _name, mem in tenants:
            if mem is not None:
                g["peak"][uid] = max(g["peak"].get(uid, 0), mem)
        total, used = reading.mem_total_bytes, reading.mem_used_bytes
        pods = [SharedPodVram(namespace=ns, name=name, mem_bytes=mem, peak_bytes=g["peak"].get(uid))
                for uid, ns, name, mem in tenants]
        state = None
        if total:
            state = SharedGpuState(gpu_uuid=reading.uuid, gpu_index=reading.index, model=reading.model,
                                   mem_total_bytes=total, mem_used_bytes=used, pods=pods)
        out: list[Alert] = []
        if g["alert"] is not None and g["noisy"] not in present:
            out.append(alerts.resolve(g["alert"], ts, "the pod left the GPU"))
            g.update(alert=None, since=None, noisy=None)
        if not total or used is None:
            return state, out
        pct = used / total * 100.0
        mems = {uid: mem for uid, _ns, _name, mem in tenants if mem is not None}
        if pct < th.vram_pressure_pct - 1e-6 or len(tenants) < 2:
            g["below"] = mems
            if g["alert"] is not None:
                out.append(alerts.resolve(g["alert"], ts, "below threshold", mem_used_pct=round(pct, 2)))
            g.update(alert=None, since=None, noisy=None)
            return state, out
        if g["since"] is None:
            if g["below"] is None:
                return state, out  # never seen below the threshold: who grew is unknown
            growth = {uid: mem - g["below"].get(uid, 0) for uid, mem in mems.items()}
            grown = [(n, uid) for uid, n in growth.items() if n > 0]
            if not grown:
                return state, out  # at the threshold without anyone growing: vram_pressure's business
            g["growth"], g["noisy"] = max(grown, key=lambda item: (item[0], item[1]))
            g["since"] = ts
        if g["alert"] is None and elapsed(ts, g["since"], th.vram_pressure_after):
            by_uid = {uid: (ns, name, mem) for uid, ns, name, mem in tenants}
            ns, name, mem = by_uid[g["noisy"]]
            neighbours = [p.model_dump(mode="json") for (uid, *_), p in zip(tenants, pods, strict=True)
                          if uid != g["noisy"]]
            details = {"gpu_index": reading.index, "mem_used_bytes": used, "mem_total_bytes": total,
                       "mem_used_pct": round(pct, 2), "threshold_pct": th.vram_pressure_pct,
                       "growth_bytes": g["growth"], "pod_mem_bytes": mem, "neighbours": neighbours}
            summary = (f"{ns}/{name} grew by {_gib(g['growth'])} and pushed shared GPU {reading.index} on {node} "
                       f"to {pct:.1f}% of {total / GIB:.0f} GiB VRAM for {fmt_duration(ts - g['since'])}; "
                       f"{len(neighbours)} neighbour(s) share it")
            subj = alerts.subject("pod", ns, name, node, reading.uuid)
            g["alert"], message = alerts.fire("noisy_neighbour", subj, ts, summary, details)
            out.append(message)
        return state, out

    def forget(self, present: set[str]) -> None:
        """Drop GPUs not in the latest sample (an open alert stays until its GPU is seen again)."""
        for uuid in [u for u in self.gpus if u not in present and self.gpus[u]["alert"] is None]:
            del self.gpus[uuid]


class VramTracker:
    """The cluster stage's view of the shared GPUs: figures and ``vram_fragmentation``."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        data = data or {}
        self.gpus: dict[str, list[dict[str, Any]]] = data.get("gpus", {})
        self.frag: dict[str, dict[str, Any]] = data.get("frag", {})
        self.snapshot: dict[str, Any] | None = data.get("snapshot")

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "frag": self.frag, "snapshot": self.snapshot}

    def on_summary(self, node: str, shared: list[SharedGpuState] | None) -> None:
        if shared:
            self.gpus[node] = [g.model_dump(mode="json") for g in shared]
        else:
            self.gpus.pop(node, None)

    def evaluate(self, t: float, live: set[str], schedulable: set[str], pending: list[dict[str, Any]],
                 th: Thresholds) -> list[Alert]:
        needs = [p for p in pending if p.get("vram_need")]
        gpus = [(node, g) for node in sorted(self.gpus) if node in live for g in self.gpus[node]]
        if not gpus and not needs:
            self.snapshot = None
            return self._resolve_gone(t, set())
        free = [(node, g, max(g["mem_total_bytes"] - (g["mem_used_bytes"] or 0), 0)) for node, g in gpus]
        usable = [(node, g, f) for node, g, f in free if node in schedulable]
        smallest = min((p["vram_need"] for p in needs), default=None)
        self.snapshot = {
            "shared_gpus": len(free),
            "shared_vram_free_bytes": sum(f for *_, f in free),
            "shared_vram_largest_free_bytes": max((f for *_, f in free), default=0),
            "shared_vram_stranded_bytes": 0 if smallest is None else sum(f for *_, f in usable if f < smallest),
            "shared_vram_pending_bytes": sum(p["vram_need"] for p in needs),
            "shared_gpu_layouts": [{"node": node, "gpu_index": g["gpu_index"], "gpu_uuid": g["gpu_uuid"],
                                    "mem_total_bytes": g["mem_total_bytes"], "mem_used_bytes": g["mem_used_bytes"],
                                    "free_bytes": f, "pods": g["pods"]} for node, g, f in free],
        }
        out: list[Alert] = []
        total_free = sum(f for *_, f in usable)
        largest = max((f for *_, f in usable), default=0)
        for pod in needs:
            need = pod["vram_need"]
            uid = pod["uid"]
            state = self.frag.get(uid)
            if not (largest < need <= total_free):
                if state is not None:
                    del self.frag[uid]
                    if state["alert"] is not None:
                        why = "a GPU has room for it" if largest >= need else "not enough free VRAM in total"
                        out.append(alerts.resolve(state["alert"], t, why))
                continue
            if state is None:
                state = self.frag[uid] = {"since": t, "alert": None}
            if state["alert"] is None and elapsed(t, state["since"], th.vram_fragmentation_after):
                ranked = sorted(usable, key=lambda item: (-item[2], item[0], item[1]["gpu_index"]))[:_MAX_LISTED]
                details = {"need_bytes": need, "free_vram_bytes": total_free, "largest_free_bytes": largest,
                           "shared_gpus": len(usable),
                           "gpus": [{"node": node, "gpu_index": g["gpu_index"], "gpu_uuid": g["gpu_uuid"],
                                     "free_bytes": f, "pods": g["pods"]} for node, g, f in ranked]}
                summary = (f"{pod['ns']}/{pod['name']} needs {_gib(need)} of VRAM on a shared GPU; "
                           f"{_gib(total_free)} are free over {len(usable)} shared GPUs but at most "
                           f"{_gib(largest)} on one, for {fmt_duration(t - state['since'])}")
                subj = alerts.subject("pod", pod["ns"], pod["name"])
                state["alert"], message = alerts.fire("vram_fragmentation", subj, t, summary, details)
                out.append(message)
        return out + self._resolve_gone(t, {p["uid"] for p in needs})

    def _resolve_gone(self, t: float, waiting: set[str]) -> list[Alert]:
        out = []
        for uid in sorted(set(self.frag) - waiting):
            state = self.frag.pop(uid)
            if state["alert"] is not None:
                out.append(alerts.resolve(state["alert"], t, "no longer pending"))
        return out
