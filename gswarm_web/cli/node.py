"""`gswarm node status [NAME]` (the original's node-specific health) and the verbose view `gswarm nodes -v` shares."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console

from gswarm_tasks.settings import load_settings

from .client import ApiClient
from .local import local_node

console = Console(soft_wrap=True, highlight=False)
STYLE = {"healthy": "green", "unhealthy": "yellow", "offline": "red", "missing": "red"}


def _bytes(n: Any) -> str:
    return f"{n / 1e9:.1f} GB" if isinstance(n, int | float) else "-"


def print_node(n: dict[str, Any]) -> None:
    """One node in full: status, where it is, its GPUs, CPU, DRAM, storage tiers, and what config.yaml declares."""
    style = STYLE.get(n["status"], "")
    console.print(f"[bold]{n['name']}[/] [{style}]{n['status']}[/]")
    age = n.get("seconds_since_seen")
    seen = (
        f"{n.get('last_seen')} ({age:.0f} s ago)"
        if isinstance(age, int | float)
        else "never (not joined yet)"
    )
    console.print(f"  address     {n.get('address') or '-'}   host {n.get('hostname') or '-'}")
    console.print(f"  last seen   {seen}")
    if n.get("worker"):
        console.print(f"  worker      {n['worker']} (gswarm {n.get('version') or '?'})")
    for g in n.get("gpus") or []:
        console.print(f"  gpu{g['index']:<8} {g.get('name') or '-'}  {_bytes(g.get('memory_total_bytes'))}")
    if n.get("cpu_count") is not None:
        console.print(f"  CPU         {n['cpu_count']} cores, {n.get('cpu_percent') or 0:.0f}% busy")
    if n.get("dram_total_bytes") is not None:
        avail = _bytes(n.get("dram_available_bytes"))
        console.print(f"  DRAM        {_bytes(n['dram_total_bytes'])} ({avail} available)")
    for tier, info in sorted((n.get("storage") or {}).items()):
        if isinstance(info, dict):
            free = _bytes(info.get("free_bytes"))
            console.print(
                f"  {tier:<11} {info.get('path') or '-'}  {free} free of {_bytes(info.get('total_bytes'))}"
            )
    declared = n.get("declared")
    if declared:
        caps = declared.get("capabilities") or {}
        gpus = ", ".join(caps.get("gpus") or []) or "-"
        sizes = ", ".join(f"{k} {_bytes(v)}" for k, v in (caps.get("storage") or {}).items()) or "-"
        console.print(f"  declared    address {declared.get('address') or '-'}, GPUs {gpus}, storage {sizes}")


@click.group("node")
def node() -> None:
    """One node of the fleet."""


@node.command("status")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
def status(name: str | None, as_json: bool) -> None:
    """A node's health: status, resources, models and services (default: this host's node); exit 1 unless it is
    healthy."""
    settings = load_settings()
    name = name or local_node(settings)
    if not name:
        raise click.UsageError("name the node (no node runs on this host): gswarm node status NAME")
    c = ApiClient.from_settings(settings)
    n = c.get(f"nodes/{name}")
    models = c.get("models", location=name, per_page=500)["models"] if n["status"] != "missing" else []
    services = c.get("services", node=name, per_page=500)["services"] if n["status"] != "missing" else []
    if as_json:
        click.echo(json.dumps({**n, "models": models, "services": services}, indent=2))
    else:
        print_node(n)
        for m in models:
            here = [loc for loc in m["locations"] if loc.split(":")[0] == name]
            console.print(f"  model       {m['model_name']} on {', '.join(here) or '-'} ({m['status']})")
        for s in services:
            mine = [
                r for r in s["instances"] if r["node"] == name and r["status"] not in ("stopped", "failed")
            ]
            for r in mine:
                console.print(
                    f"  service     {s['model_name']} {r['device']} {r['status']} {r.get('url') or ''}"
                )
    if n["status"] != "healthy":
        sys.exit(1)
