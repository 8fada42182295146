"""``gpulens schemas export DIRECTORY``: one JSON Schema document per topic
(:mod:`schemas.json_schema`), for producers written outside gpulens."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("schemas")
def schemas() -> None:
    """JSON Schema documents of every topic."""


@schemas.command("export")
@click.argument("directory", type=click.Path(path_type=Path))
def schemas_export(directory: Path) -> None:
    """Write one JSON Schema per topic into DIRECTORY."""
    from schemas.json_schema import export as export_schemas

    for path in export_schemas(directory):
        click.echo(str(path))


COMMANDS = [schemas]
