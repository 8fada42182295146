"""CLI commands contributed by each part of the product (agent, watcher, worker, sink, ...).

Each module defines click commands; :func:`register` adds those that exist to the main group.
"""

from __future__ import annotations

import importlib

import click

_MODULES = ("agent", "watch", "worker", "replay", "sink", "analysis", "demo")


def register(group: click.Group) -> None:
    for name in _MODULES:
        try:
            module = importlib.import_module(f"gpulens.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"gpulens.commands.{name}":
                continue
            raise
        for command in getattr(module, "COMMANDS", ()):
            group.add_command(command)
