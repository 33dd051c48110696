"""The `gswarm` command line (click + rich)."""

from __future__ import annotations

import importlib
import json
import sys
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from gswarm_tasks.errors import GswarmError
from gswarm_tasks.settings import load_settings

if TYPE_CHECKING:
    from .client import ApiClient

console = Console(soft_wrap=True)
err_console = Console(stderr=True)

# Command groups are imported when they are run (or listed): `gswarm schedule simulate` does not import the HTTP
# client, Redis, SQLAlchemy and Flask that other commands need (half a second of CPU at every start).
SUBCOMMANDS = {
    "up": ".up:up",
    "host": ".host:host",
    "client": ".join:client",
    "model": ".model:model",
    "node": ".node:node",
    "workflow": ".workflow:workflow",
    "queue": ".workflow:queue",
    "profiler": ".profiler:profiler",
    "data": ".data:data",
    "schedule": ".schedule:schedule",
    "placement": ".placement:placement",
    "import": ".importer:import_",
}


def _load_command(name: str) -> click.Command:
    module, attr = SUBCOMMANDS[name].split(":")
    command: click.Command = getattr(importlib.import_module(module, __name__), attr)
    if name == "model":
        from .serving import COMMANDS as SERVING_COMMANDS

        for sub in SERVING_COMMANDS:
            if isinstance(command, click.Group) and sub.name not in command.commands:
                command.add_command(sub)
    return command


def api() -> ApiClient:
    from .client import ApiClient

    return ApiClient.from_settings(load_settings())


def human_bytes(n: Any) -> str:
    if not isinstance(n, int | float):
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


STATUS_STYLE = {
    "healthy": "green",
    "unhealthy": "yellow",
    "offline": "red",
    "degraded": "yellow",
    "missing": "red",
}


class GswarmGroup(click.Group):
    """Prints gswarm and API errors as one line, never a traceback."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in SUBCOMMANDS and cmd_name not in self.commands:
            self.add_command(_load_command(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(SUBCOMMANDS))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GswarmError as exc:
            code = f"[{exc.code}] " if exc.code else ""
            err_console.print(f"[red]error:[/] {code}{exc.message}", highlight=False)
            sys.exit(1)
        except Exception as exc:
            sa = sys.modules.get(
                "sqlalchemy.exc"
            )  # only a command that imported SQLAlchemy can raise its errors
            if sa is None or not isinstance(exc, sa.SQLAlchemyError):
                raise
            first = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            err_console.print(
                f"[red]database error:[/] {first} (is it migrated? `gswarm db upgrade`)", highlight=False
            )
            sys.exit(1)


@click.group(cls=GswarmGroup)
@click.version_option(package_name="gswarm")
def main() -> None:
    """gswarm: manage a fleet of GPU hosts."""


def seen_text(age: Any) -> str:
    return f"{age:.0f} s ago" if isinstance(age, int | float) else "never"


def nodes_table(nodes: list[dict[str, Any]]) -> Table:
    table = Table("node", "status", "address", "GPUs", "CPU", "DRAM", "disk free", "engines", "last seen")
    for n in nodes:
        disk = (n.get("storage") or {}).get("disk") or {}
        style = STATUS_STYLE.get(n["status"], "")
        table.add_row(
            n["name"],
            f"[{style}]{n['status']}[/]",
            n.get("address") or "-",
            str(len(n.get("gpus") or [])),
            f"{n.get('cpu_count') or '-'} ({n.get('cpu_percent') or 0:.0f}%)",
            human_bytes(n.get("dram_total_bytes")),
            human_bytes(disk.get("free_bytes")),
            engines_text(n.get("engines")),
            seen_text(n.get("seconds_since_seen")),
        )
    return table


def engines_text(engines: Any) -> str:
    """`builtin, vllm 0.32.0, llama.cpp 0.7.0`: what a node can serve with, each with its version."""
    if not isinstance(engines, dict):
        return "-"
    return ", ".join(f"{name} {info.get('version')}".strip() if info.get("version") else name
                     for name, info in sorted(engines.items())) or "none"  # fmt: skip


@main.command()
@click.option(
    "--status",
    type=click.Choice(["healthy", "unhealthy", "offline", "missing"]),
    default=None,
    help="missing: declared in config.yaml's nodes, not joined yet.",
)
@click.option(
    "--verbose", "-v", is_flag=True, help="Each node in full: GPUs, storage tiers, what config.yaml declares."
)
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
def nodes(status: str | None, verbose: bool, as_json: bool) -> None:
    """List the nodes of the fleet (and the ones config.yaml declares that have not joined: missing)."""
    body = api().get("nodes", status=status, per_page=500)
    if as_json:
        click.echo(json.dumps(body, indent=2))
    elif verbose:
        from .node import print_node

        for n in body["nodes"]:
            print_node(n)
    else:
        console.print(nodes_table(body["nodes"]))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
def health(as_json: bool) -> None:
    """Health of database, broker and workers; exit code 1 when unhealthy."""
    body = api().get("health")
    if as_json:
        click.echo(json.dumps(body, indent=2))
    else:
        style = STATUS_STYLE.get(body["status"], "green")
        console.print(f"status    [{style}]{body['status']}[/]")
        for part in ("database", "broker"):
            p = body[part]
            console.print(
                f"{part:<9} " + (f"ok ({p['latency_ms']} ms)" if p["ok"] else f"[red]{p['error']}[/]")
            )
        console.print(f"control   {', '.join(body['workers']['control']) or '[yellow]no control worker[/]'}")
        console.print("nodes     " + ", ".join(f"{k} {v}" for k, v in body["workers"]["nodes"].items()))
    if body["status"] == "unhealthy":
        sys.exit(1)


@main.command()
def status() -> None:
    """Overall status: health and nodes."""
    c = api()
    h = c.get("health")
    style = STATUS_STYLE.get(h["status"], "green")
    console.print(f"gswarm at {c.base_url}: [{style}]{h['status']}[/]")
    console.print(nodes_table(c.get("nodes", per_page=500)["nodes"]))


@main.group()
def token() -> None:
    """API tokens."""


@token.command("create")
@click.option("--name", default="cli", help="A label for the token.")
@click.option("--read-only", is_flag=True, help="A token that can only read.")
@click.option(
    "--role",
    type=click.Choice(["admin", "read-only", "inference"]),
    default=None,
    help="admin (the default), read-only, or inference (the gateway at /v1 and nothing else).",
)
@click.option(
    "--model", "models", multiple=True, help="An inference token's model (repeat it); default: every one."
)
def token_create(name: str, read_only: bool, role: str | None, models: tuple[str, ...]) -> None:
    """Create a token in the database of this host's settings and print it (shown once)."""
    from gswarm_web import create_app
    from gswarm_web.api.auth import create_token

    with create_app(load_settings()).app_context():
        click.echo(create_token(name, role or ("read-only" if read_only else "admin"), list(models) or None))


@main.group()
def db() -> None:
    """The state database."""


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (default head)."""
    from gswarm_web.migrate import current_revision, upgrade

    url = load_settings().effective_database_url
    upgrade(url, revision)
    console.print(f"database at revision {current_revision(url) or 'base'}")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Revert migrations down to REVISION (`base` for an empty database)."""
    from gswarm_web.migrate import current_revision, downgrade

    url = load_settings().effective_database_url
    downgrade(url, revision)
    console.print(f"database at revision {current_revision(url) or 'base'}")


@db.command("current")
def db_current() -> None:
    """Print the database's migration revision."""
    from gswarm_web.migrate import current_revision

    click.echo(current_revision(load_settings().effective_database_url) or "base")


if __name__ == "__main__":
    main()
