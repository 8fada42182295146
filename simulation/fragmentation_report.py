"""The MIG and shared-GPU VRAM figures of a replay report, from the capacity windows emitted.

Only a fleet with MIG GPUs (windows carrying ``mig_gpus``) gets the MIG figures, and only one with
shared GPUs (``shared_gpus``) the VRAM ones, so other reports keep their shape.
``mig_unused_slices`` is the figure of empty instances: those empty for at least
``mig_unused_after`` at the last window's last instant, with the profiles pending pods asked for
meanwhile (what the layout should offer instead).
"""

from __future__ import annotations

from typing import Any

from schemas.outputs import ClusterCapacity


def mig_report(windows: list[ClusterCapacity], unused_after_s: float) -> dict[str, Any]:
    mig = [w for w in windows if w.mig_gpus is not None]
    if not mig:
        return {}
    last = mig[-1]
    unused = [
        {"node": gpu.node, "gpu_index": gpu.gpu_index, "profile": inst.profile, "start": inst.start,
         "idle_s": round(inst.idle_s or 0.0, 3)}
        for gpu in last.mig_layouts or [] for inst in gpu.instances
        if not inst.used and inst.idle_s is not None and inst.idle_s >= unused_after_s - 1e-9
    ]
    pending: dict[str, int] = {}
    for w in mig:
        for profile, n in (w.mig_pending_by_profile or {}).items():
            pending[profile] = max(pending.get(profile, 0), n)
    return {
        "mig_gpus": last.mig_gpus,
        "max_mig_free_compute_slices": max(w.mig_free_compute_slices or 0 for w in mig),
        "max_mig_free_memory_slices": max(w.mig_free_memory_slices or 0 for w in mig),
        "mig_unused_slices": {"instances": unused, "count": len(unused),
                              "pending_profiles": dict(sorted(pending.items()))},
    }


def shared_report(windows: list[ClusterCapacity]) -> dict[str, Any]:
    shared = [w for w in windows if w.shared_gpus is not None]
    if not shared:
        return {}
    return {
        "shared_gpus": shared[-1].shared_gpus,
        "max_shared_vram_stranded_bytes": max(w.shared_vram_stranded_bytes or 0 for w in shared),
        "max_shared_vram_pending_bytes": max(w.shared_vram_pending_bytes or 0 for w in shared),
    }
