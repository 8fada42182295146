"""Every ``gpulens`` command and command group, one module each (agent, watcher, worker, sink,
kafka, topics, ...).

Each module defines its click commands in ``COMMANDS``. :data:`PART_COMMANDS` is the registry: every
command by name, with its module and its one-line help, so ``gpulens --help`` lists them without
importing any part (and its clients); ``gpulens.cli.LazyGroup`` imports a module through
:func:`load_part_command` when one of its commands is called. A registered module that is missing,
or that does not define the registered command, is an ``ImportError``, never a silently absent
command; a module whose command is not registered fails ``tests/foundation/test_cli_startup.py``.
A new command: a module here (shared flags from ``base.py``), a row in the table.
"""

from __future__ import annotations

import importlib

import click

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
    "check": ("check", "Check an installation: Kafka, groups, dead letters, ClickHouse, freshness, Kubernetes."),
    "kafka": ("kafka", "Run the local Kafka (KRaft; one broker, or three with --brokers 3) for the embedded default."),
    "topics": ("topics", "Kafka topics of this install."),
    "schemas": ("schemas", "JSON Schema documents of every topic."),
    "config": ("config", "Configuration."),
}
"""Command name -> (module under ``gpulens.commands``, the command's one-line help)."""

_MODULES = tuple(dict.fromkeys(module for module, _ in PART_COMMANDS.values()))


def load_part_command(name: str) -> click.Command:
    """Import the module of the registered command ``name`` and return its click command.

    Raises ``ImportError`` when the module is missing or does not define ``name`` in ``COMMANDS``.
    """
    module_name = f"{__name__}.{PART_COMMANDS[name][0]}"
    module = importlib.import_module(module_name)
    for command in getattr(module, "COMMANDS", ()):
        if isinstance(command, click.Command) and command.name == name:
            return command
    raise ImportError(f"{module_name} does not define the command {name!r} that gpulens.commands registers",
                      name=module_name)
