"""`gswarm placement MODEL`: where placement would put a model, and why every other candidate lost."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from gswarm_tasks.settings import load_settings

from .client import ApiClient

console = Console(soft_wrap=True)


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 1024**3:.1f} GiB"


@click.command("placement")
@click.argument("model")
@click.option(
    "--action",
    default="serve",
    show_default=True,
    type=click.Choice(["serve", "load", "download", "copy", "move", "data"]),
)
@click.option(
    "--kind", default=None, type=click.Choice(["gpu", "cpu", "dram", "disk"]), help="As in auto:<kind>."
)
@click.option("--json", "as_json", is_flag=True)
def placement(model: str, action: str, kind: str | None, as_json: bool) -> None:
    """Show the device `auto` would choose for MODEL (nothing is changed)."""
    plan = ApiClient.from_settings(load_settings()).get("placement", model=model, action=action, kind=kind)
    if as_json:
        click.echo(json.dumps(plan, indent=2))
        return
    need = f", needs {_gib(plan['need_bytes'])}" if plan.get("need_bytes") else ""
    console.print(
        f"{action} {model}{need}: [bold green]{plan['chosen']}[/] (weights from {plan['loaded_from']})"
    )
    table = Table("device", "weights from", "load s", "free", "replicas", "verdict")
    for c in plan["candidates"]:
        verdict = "[green]chosen[/]" if c.get("chosen") else c.get("lost", "")
        table.add_row(
            c["device"],
            c.get("loaded_from", "-"),
            f"{c['load_seconds']:.1f}" if c.get("load_seconds") is not None else "-",
            _gib(c.get("free_bytes")),
            str(c.get("replicas", 0)),
            verdict,
        )
    console.print(table)
