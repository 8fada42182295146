"""The HTML report's "MIG and VRAM fragmentation over time" section (``reports.html.page``).

Two charts from ``reports.fragmentation_series``: MIG slices (free compute and memory slices, empty
instances, pending MIG devices) and shared-GPU VRAM (free, largest free piece, stranded, pending).
A store without MIG or shared GPUs gets no section at all, so such reports stay as they were.
"""

from __future__ import annotations

from reports.html.charts import Series, line_chart
from reports.html.format import as_number, fmt_number, fmt_ts, parse_ts
from reports.html.pieces import Column, ReportData, legend, section, table
from reports.html.sections import _bucket_label as bucket_label


def fragmentation_section(data: ReportData, bucket_s: int) -> str:
    rows = data.get("fragmentation_series") or []
    if not rows:
        return ""
    title = "MIG and VRAM fragmentation over time"
    lede = (f"Per {bucket_label(bucket_s)} bucket. MIG: free compute and memory slices (an empty instance's "
            f"slices count as free: a re-layout can take them), empty instances and the MIG devices pending "
            f"pods ask for. Shared GPUs: free VRAM, the largest free piece on one GPU, VRAM stranded on GPUs "
            f"with less than the smallest pending need, and the VRAM pending pods declare.")
    buckets = [parse_ts(r["bucket"]) or 0.0 for r in rows]
    half = bucket_s / 2
    x_range = (buckets[0], buckets[-1] + bucket_s)

    def points(key: str) -> list[tuple[float, float | None]]:
        return [(at + half, as_number(r.get(key))) for at, r in zip(buckets, rows, strict=True)]

    body = ""
    if any(r.get("max_mig_gpus") is not None for r in rows):
        mig = [Series("free compute slices (peak)", "#4e79a7", points("max_mig_free_compute_slices"), unit=" slices"),
               Series("free memory slices (peak)", "#76b7b2", points("max_mig_free_memory_slices"), unit=" slices"),
               Series("empty instances (peak)", "#8c959f", points("max_mig_empty_instances"), dashed=True,
                      unit=" instances"),
               Series("pending MIG devices (peak)", "#b07aa1", points("max_mig_pending_devices"), dashed=True,
                      unit=" devices")]
        body += (legend(((s.name, s.color) for s in mig), dashed=[s.name for s in mig if s.dashed])
                 + line_chart("mig-fragmentation", "MIG slices", mig, "slices / devices", x_range, integer=True))
    if any(r.get("max_shared_gpus") is not None for r in rows):
        vram = [Series("free VRAM (peak)", "#8c959f", points("max_shared_vram_free_gib"), unit=" GiB"),
                Series("largest free on one GPU (min)", "#76b7b2", points("min_shared_vram_largest_free_gib"),
                       dashed=True, unit=" GiB"),
                Series("stranded VRAM (peak)", "#e15759", points("max_shared_vram_stranded_gib"), unit=" GiB"),
                Series("pending VRAM need (peak)", "#b07aa1", points("max_shared_vram_pending_gib"), dashed=True,
                       unit=" GiB")]
        body += (legend(((s.name, s.color) for s in vram), dashed=[s.name for s in vram if s.dashed])
                 + line_chart("vram-fragmentation", "Shared-GPU VRAM", vram, "GiB", x_range))
    columns: list[Column] = [
        ("bucket", "bucket start (UTC)", fmt_ts), ("max_mig_gpus", "MIG GPUs", fmt_number),
        ("max_mig_free_compute_slices", "free compute slices", fmt_number),
        ("max_mig_free_memory_slices", "free memory slices", fmt_number),
        ("max_mig_empty_instances", "empty instances", fmt_number),
        ("max_mig_pending_devices", "pending MIG devices", fmt_number),
        ("max_shared_gpus", "shared GPUs", fmt_number), ("max_shared_vram_free_gib", "free VRAM (GiB)", fmt_number),
        ("min_shared_vram_largest_free_gib", "largest free (GiB)", fmt_number),
        ("max_shared_vram_stranded_gib", "stranded VRAM (GiB)", fmt_number),
        ("max_shared_vram_pending_gib", "pending need (GiB)", fmt_number)]
    return section("mig-vram", title, lede, body + table(columns, rows, "MIG and VRAM fragmentation per bucket"))
