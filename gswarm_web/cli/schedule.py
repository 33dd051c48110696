"""`gswarm schedule ...`: simulate a policy on a trace, validate any schedule, generate traces, plot a Gantt chart.

Bad input exits 2 with the field it concerns; `validate` exits 1 when the schedule breaks a rule.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from gswarm_tasks.errors import GswarmError
from gswarm_web.scheduling.api import prepare, run
from gswarm_web.scheduling.config import load_config, read_document
from gswarm_web.scheduling.fleet import Fleet, load_fleet
from gswarm_web.scheduling.generator import bench_config, generate
from gswarm_web.scheduling.policies import DEFAULT_POLICY, PUBLIC_POLICIES
from gswarm_web.scheduling.validator import validate as check_schedule
from gswarm_web.scheduling.workload import MODES

console = Console(soft_wrap=True)
err_console = Console(stderr=True)
SHOWN_VIOLATIONS = 50


class ScheduleGroup(click.Group):
    """Prints input errors as one line naming the field (exit 2), never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GswarmError as exc:
            err_console.print(f"[red]error:[/] [{exc.code}] {exc.message}", highlight=False, markup=True)
            sys.exit(2)


def _inputs(config: str, requests: str, gpus: int | None, fleet: str | None, mode: str) -> tuple[Any, Fleet]:
    parsed_fleet = load_fleet(fleet) if fleet else None
    return prepare(load_config(config), read_document(requests), gpus, parsed_fleet, mode)


def summary_table(summary: dict[str, Any]) -> Table:
    """The summary of a schedule as one table row."""
    table = Table()
    for col in (
        "policy",
        "mode",
        "steps",
        "makespan (s)",
        "loads",
        "load GPU-s",
        "latency p50 (s)",
        "p99 (s)",
    ):
        table.add_column(col, no_wrap=col in ("policy", "mode"))
    table.add_row(
        summary["policy"],
        summary["mode"],
        str(summary["steps"]),
        f"{summary['makespan']:.1f}",
        str(summary["model_loads"]),
        f"{summary['load_seconds']:.0f}",
        f"{summary['request_latency_p50']:.1f}",
        f"{summary['request_latency_p99']:.1f}",
    )
    return table


@click.group("schedule", cls=ScheduleGroup)
def schedule() -> None:
    """Scheduling: simulate policies on request traces, validate schedules, generate traces, plot."""


def _trace_options(f: Any) -> Any:
    f = click.option(
        "--fleet", type=click.Path(exists=True, dir_okay=False), help="Fleet YAML (nodes, tiers)."
    )(f)
    f = click.option("--gpus", type=click.IntRange(min=1), help="GPUs on one node (needed without --fleet).")(
        f
    )
    f = click.option(
        "--requests", required=True, type=click.Path(exists=True, dir_okay=False), help="Trace YAML."
    )(f)
    return click.option(
        "--config", required=True, type=click.Path(exists=True, dir_okay=False), help="Config JSON."
    )(f)


@schedule.command("simulate")
@_trace_options
@click.option("--policy", type=click.Choice(PUBLIC_POLICIES), default=DEFAULT_POLICY, show_default=True)
@click.option("--mode", type=click.Choice(MODES), default="online", show_default=True)
@click.option(
    "--output", type=click.Path(dir_okay=False), help="Write the schedule (OUT.json); '-' for stdout."
)
def simulate_cmd(
    config: str,
    requests: str,
    gpus: int | None,
    fleet: str | None,
    policy: str,
    mode: str,
    output: str | None,
) -> None:
    """Run a policy over a request trace and write the schedule it makes."""
    workload, parsed_fleet = _inputs(config, requests, gpus, fleet, mode)
    doc = run(workload, parsed_fleet, policy)
    if output == "-":
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    if output:
        Path(output).write_text(json.dumps(doc, indent=1) + "\n")
    console.print(summary_table(doc["summary"]))


@schedule.command("validate")
@_trace_options
@click.option("--mode", type=click.Choice(MODES), help="Default: the mode the schedule's summary names.")
@click.argument("schedule_file", metavar="OUT.json", type=click.Path(exists=True, dir_okay=False))
def validate_cmd(
    config: str, requests: str, gpus: int | None, fleet: str | None, mode: str | None, schedule_file: str
) -> None:
    """Check a schedule (any policy's) against its config, trace and fleet; exit 1 on any violation."""
    doc = read_document(schedule_file)
    summary = doc.get("summary") if isinstance(doc, dict) else None
    named = summary.get("mode") if isinstance(summary, dict) else None
    mode = mode or (named if named in MODES else "online")
    workload, parsed_fleet = _inputs(config, requests, gpus, fleet, mode)
    found = check_schedule(doc, workload, parsed_fleet, mode)
    if not found:
        console.print(
            f"[green]valid[/]: {workload.steps} steps of {len(workload.request_ids)} requests, {mode} mode"
        )
        return
    for v in found[:SHOWN_VIOLATIONS]:
        console.print(f"[red]{v.check}[/]: {v.message}", highlight=False)
    more = f" (first {SHOWN_VIOLATIONS} shown)" if len(found) > SHOWN_VIOLATIONS else ""
    console.print(f"[red]invalid[/]: {len(found)} violations{more}")
    sys.exit(1)


@schedule.command("generate")
@click.option(
    "--config", "config_in", type=click.Path(exists=True, dir_okay=False), help="Draw from this config."
)
@click.option(
    "--write-config", type=click.Path(dir_okay=False), help="Write the built-in config here (JSON)."
)
@click.option("--output", default="-", show_default=True, help="Where the trace YAML goes ('-' for stdout).")
@click.option("--count", type=click.IntRange(min=1), default=500, show_default=True, help="Requests.")
@click.option(
    "--gpus", type=click.IntRange(min=1), default=8, show_default=True, help="GPUs the rate is for."
)
@click.option("--utilization", type=click.FloatRange(min=0, min_open=True), default=0.7, show_default=True)
@click.option(
    "--burst", type=click.FloatRange(min=1), default=1.0, show_default=True, help="Mean burst size."
)
@click.option("--workflow", "workflows", multiple=True, help="Only these workflows (repeatable).")
@click.option("--seed", type=int, default=0, show_default=True)
def generate_cmd(
    config_in: str | None,
    write_config: str | None,
    output: str,
    count: int,
    gpus: int,
    utilization: float,
    burst: float,
    workflows: tuple[str, ...],
    seed: int,
) -> None:
    """Generate a request trace (and the built-in config: chains, a diamond, fan-out, a 2-GPU model)."""
    if config_in:
        load_config(config_in)  # refuse a bad config before drawing from it
        config = read_document(config_in)
    else:
        config = bench_config()
    unknown = [w for w in workflows if w not in config["workflows"]]
    if unknown:
        raise click.BadParameter(f"unknown workflow(s) {', '.join(unknown)}", param_hint="--workflow")
    trace = generate(
        config,
        requests=count,
        gpus=gpus,
        utilization=utilization,
        seed=seed,
        burst=burst,
        workflows=list(workflows) or None,
    )
    if write_config:
        Path(write_config).write_text(json.dumps(config, indent=2) + "\n")
    text = yaml.safe_dump(trace, sort_keys=False)
    if output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text)
        err_console.print(f"{count} requests written to {output}")


@schedule.command("plot")
@click.argument("schedules", metavar="OUT.json...", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="gantt.png (or .pdf, .svg)."
)
@click.option("--until", type=click.FloatRange(min=0, min_open=True), help="Show only the first seconds.")
def plot_cmd(schedules: tuple[str, ...], output: str, until: float | None) -> None:
    """A Gantt chart per GPU (steps coloured by model, loads hatched); several schedules are stacked to compare."""
    from gswarm_web.scheduling.plot import gantt

    docs = []
    for path in schedules:
        doc = read_document(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("executions"), list):
            raise click.BadParameter(f"{path} is not a schedule (no executions)", param_hint="OUT.json")
        docs.append((str(doc.get("summary", {}).get("policy") or Path(path).stem), doc))
    gantt(docs, output, until)
    err_console.print(f"{len(docs)} schedule(s) plotted to {output}")
