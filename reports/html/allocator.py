"""The report's section on the pods' caching allocators: VRAM reserved but unused inside the pods,
with their allocation retries and OOMs (``reports.timeseries.allocator_by_pod``)."""

from __future__ import annotations

from reports.html.charts import hbar_chart
from reports.html.format import as_number, fmt_gib, fmt_number
from reports.html.pieces import Column, ReportData, cell_text, legend, no_data, section, table

SEGMENTS = [("allocated", "#4e79a7"), ("reserved but unused", "#e15759")]


def allocator_section(data: ReportData) -> str:
    rows = data.get("allocator_by_pod") or []
    title = "VRAM reserved but unused inside the pods (caching allocator)"
    lede = ("What the pods' own allocators (PyTorch's caching allocator) hold without using, per pod and GPU, "
            "from the statistics they report to the node agent: reserved but unused memory with allocation "
            "retries or OOMs is fragmentation (the allocator_fragmentation alert; docs/alerts.md says what to "
            "do), without them it is a cache.")
    if not rows:
        return section("allocator", title, lede, no_data("no pod reported allocator statistics."))
    rows = [r | {"pod_label": f"{r.get('namespace')}/{r.get('pod')}"} for r in rows]
    labels = [f"{r['pod_label']} {str(r.get('gpu_uuid') or '')[:12]}" for r in rows]
    values: dict[tuple[str, str], float] = {}
    for label, row in zip(labels, rows, strict=True):  # the last report: reserved = allocated + unused
        reserved, allocated = as_number(row.get("reserved_bytes")) or 0.0, as_number(row.get("allocated_bytes")) or 0.0
        values[(label, "allocated")] = allocated / 2**30
        values[(label, "reserved but unused")] = max(reserved - allocated, 0.0) / 2**30
    chart = hbar_chart("allocator", title, labels, SEGMENTS, values, "GiB reserved at the last report", " GiB",
                       value_format=fmt_number)
    columns: list[Column] = [("pod_label", "pod", cell_text), ("team", "team", cell_text), ("node", "node", cell_text),
                             ("gpu_uuid", "GPU", cell_text),
                             ("max_reserved_unused_bytes", "most reserved but unused", fmt_gib),
                             ("reserved_bytes", "reserved (last)", fmt_gib),
                             ("allocated_bytes", "allocated (last)", fmt_gib),
                             ("alloc_retries", "allocation retries", fmt_number), ("alloc_ooms", "OOMs", fmt_number)]
    body = legend(SEGMENTS) + chart + table(columns, rows, "Caching allocator per pod")
    return section("allocator", title, lede, body)
