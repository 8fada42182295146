"""CLI commands contributed by each part of the product (agent, watcher, worker, sink, ...).

Each module defines click commands in ``COMMANDS``. :data:`PART_COMMANDS` names them with their
one-line help, so ``gpulens --help`` lists them without importing any part (and its clients);
``gpulens.cli.LazyGroup`` imports a module when one of its commands is called.
"""

from __future__ import annotations

PART_COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("agent", "Sample every GPU of this node and produce to the gpu.samples topic."),
    "watch": ("watch", "Follow pods, nodes and scheduling events; produce k8s.pods/nodes/events."),
    "worker": ("worker", "Run the stream jobs: samples + pods -> windows, capacity, lifecycle, alerts."),
    "replay": ("replay", "Play SCENARIO (a YAML file, see docs/scenarios.md) and print what gpulens saw."),
    "alerts": ("alerts", "Alert routing: forward alerts.v1 to Alertmanager and webhooks."),
    "sink": ("sink", "Consume every gpulens topic into ClickHouse (embedded chDB by default)."),
    "sql": ("analysis", "Run one read-only SQL query (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) against ClickHouse."),
    "report": ("analysis", "Canned analyses: top consumers, idle GPU-hours, pending, fragmentation, scale-down, cost."),
    "advise": ("advise",
               "Reclaimable GPUs: idle pods, oversized pods, packing, fragmentation, empty nodes, with the money."),
    "demo": ("demo", "Run everything on a simulated live fleet: Kafka, agents, watcher, workers, sink, live view."),
    "top": ("demo", "Live terminal view of the fleet, read from the pipeline's topics."),
}
"""Command name -> (module under ``gpulens.commands``, the command's one-line help)."""

_MODULES = tuple(dict.fromkeys(module for module, _ in PART_COMMANDS.values()))
