"""Every command the deployment files run is a real ``gpulens`` command with flags it accepts.

The container entrypoint is ``gpulens`` (Dockerfile), so a compose ``command`` or a Kubernetes
``args`` list is a gpulens command line; click parses each one here exactly as the container
would, without running it.
"""

from __future__ import annotations

import click
import pytest

from gpulens.commands import _MODULES
from producers.agent.main import build_parser
from tests.deploy.helpers import (
    DOCKERFILE,
    LEAN_AGENT,
    component_args,
    compose,
    compose_command,
    containers,
    gpulens_services,
    manifests,
    pod_template,
    workloads,
)


def _command_lines() -> list[tuple[str, list[str]]]:
    lines = [(f"compose:{name}", compose_command(svc)) for name, svc in gpulens_services(compose()).items()]
    for workload in workloads(manifests()):
        for container in containers(pod_template(workload)["spec"]):
            lean = " (python -m producers.agent)" if container.get("command") == LEAN_AGENT else ""
            lines.append((f"k8s:{workload['metadata']['name']}{lean}", component_args(container)))
    return lines


@pytest.fixture(scope="module")
def cli() -> click.Group:
    from gpulens.cli import _register_part_commands
    from gpulens.cli import cli as group

    _register_part_commands()
    return group


def _parse(group: click.Group, args: list[str]) -> None:
    """Parse ``args`` down the command tree as click would, raising on unknown commands/flags."""
    command: click.Command = group
    ctx = click.Context(group, info_name="gpulens")
    rest = list(args)
    while isinstance(command, click.Group):
        assert rest, f"`{ctx.command_path}` needs a sub-command"
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            raise click.UsageError(f"no such command {rest[0]!r} under `{ctx.command_path}`")
        ctx = click.Context(sub, info_name=rest[0], parent=ctx)
        command, rest = sub, rest[1:]
    command.make_context(ctx.info_name, rest, parent=ctx.parent)


def test_entrypoint_is_gpulens() -> None:
    text = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["gpulens"]' in text


@pytest.mark.parametrize(("where", "args"), _command_lines(), ids=lambda v: v if isinstance(v, str) else None)
def test_deployed_command_lines_parse(cli: click.Group, where: str, args: list[str]) -> None:
    name = args[0]
    if where.endswith("(python -m producers.agent)"):  # the lean entry point's own parser must accept them
        try:
            build_parser().parse_args(args[1:])
        except SystemExit:
            pytest.fail(f"{where}: `{' '.join(LEAN_AGENT + args[1:])}` does not parse")
    if name not in cli.commands:
        # a part whose command module is not in the tree yet: it must be one the CLI will load
        assert name in _MODULES, f"{where}: `gpulens {name}` is no gpulens command (known: {sorted(cli.commands)})"
        return
    try:
        _parse(cli, args)
    except click.UsageError as exc:
        pytest.fail(f"{where}: `gpulens {' '.join(args)}`: {exc.format_message()}")
