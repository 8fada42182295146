"""``gpulens demo`` (the whole product on a simulated live fleet) and ``gpulens top`` (the live view)."""

from __future__ import annotations

import contextlib
from typing import Any

import click

from gpulens.commands.base import settings_from_flags, with_common_options


@click.command("demo")
@with_common_options
@click.option("--duration", default=None, help="stop after this wall-clock time, e.g. 3m (default: until Ctrl-C)")
@click.option("--speed", type=click.FloatRange(0.1, 120), default=6.0, show_default=True,
              help="simulated seconds per wall-clock second")
@click.option("--nodes", type=click.IntRange(4, 512), default=16, show_default=True, help="simulated GPU nodes")
@click.option("--gpus-per-node", type=click.IntRange(4, 16), default=8, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True, help="seed of the workload mix")
@click.option("--no-view", is_flag=True, help="print progress lines instead of the live view")
@click.option("--print-scenario", is_flag=True, help="print the demo fleet as a scenario file and exit")
def demo(duration: str | None, speed: float, nodes: int, gpus_per_node: int, seed: int, no_view: bool,
         print_scenario: bool, **flags: Any) -> None:
    """Run everything on a simulated live fleet: Kafka, agents, watcher, workers, sink, live view."""
    from simulation.demo_fleet import demo_scenario

    if print_scenario:
        import yaml

        click.echo(yaml.safe_dump(demo_scenario(nodes, gpus_per_node, seed=seed), sort_keys=False))
        return
    from common.settings import CommonSettings
    from gpulens.demo import DemoOptions, run_demo
    from simulation.scenario import parse_duration

    settings = settings_from_flags(CommonSettings, **flags)
    duration_s = None if duration is None else parse_duration(duration, "--duration", allow_zero=False)
    run_demo(settings, DemoOptions(nodes=nodes, gpus_per_node=gpus_per_node, speed=speed, duration_s=duration_s,
                                   seed=seed, live_view=not no_view))


@click.command("top")
@with_common_options
@click.option("--duration", default=None, help="exit after this long, e.g. 30s (default: until Ctrl-C)")
@click.option("--once", is_flag=True, help="read the topics to their end, print the view once as JSON figures, exit")
@click.option("--cluster", default=None, help="the cluster to show (default: the first one seen)")
def top(duration: str | None, once: bool, cluster: str | None, **flags: Any) -> None:
    """Live terminal view of the fleet, read from the pipeline's topics."""
    import orjson

    from common.settings import CommonSettings
    from gpulens.top import prefixes_with_data, read_view_once, run_top
    from simulation.scenario import parse_duration

    settings = settings_from_flags(CommonSettings, **flags)
    if once:
        view = read_view_once(settings.kafka, settings.topic_prefix, cluster=cluster)
        if len(view.clusters_seen) > 1:
            click.echo(f"gpulens top: cluster {view.cluster} of {', '.join(sorted(view.clusters_seen))} "
                       "(choose with --cluster)", err=True)
        if view.messages_seen == 0:
            # a demo's per-run prefix extends ours; the newest first
            others = sorted(p for p in prefixes_with_data(settings.kafka) if p != settings.topic_prefix)
            mine = sorted((p for p in others if p.startswith(settings.topic_prefix)), reverse=True)
            shown = (mine + [p for p in others if p not in mine])[:5]
            hint = f"; data under: {', '.join(shown)} (use --topic-prefix)" if shown else ""
            click.echo(f"gpulens top: no pipeline output under the topic prefix {settings.topic_prefix!r}{hint}",
                       err=True)
        click.echo(orjson.dumps({
            "gpus_by_state": view.gpus_by_state(),
            "usage_by_team": [{"team": t, "gpus": g, "busy_share": round(b, 4)} for t, g, b in view.usage_by_team()],
            "pending": [{"namespace": p.namespace, "name": p.name, "reason": r} for p, r in view.pending_pods()],
            "active_alerts": [{"type": a.type, "summary": a.summary} for a in view.active_alerts()],
        }, option=orjson.OPT_INDENT_2).decode())
        return
    duration_s = None if duration is None else parse_duration(duration, "--duration", allow_zero=False)
    with contextlib.suppress(KeyboardInterrupt):
        run_top(settings.kafka, settings.topic_prefix, duration_s=duration_s, cluster=cluster)


COMMANDS = [demo, top]
