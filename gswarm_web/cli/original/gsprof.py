"""`gsprof`: the original profiler's command, as its migration table says (`gsprof` -> `gswarm profiler`).

`start` (a session; with `--port`/`--http-port` it was the head, now `gswarm host start`), `stop`, `status`,
`recover` and `stat` (`gswarm profiler analyze`) run gswarm's commands; their files are in the original's layout.
A head address given as the original took it (`gsprof stop HOST:8090`) names the API on that host. The commands of
the gRPC era (`connect`, `profile`, `http-profile`, `http-status`, `http-stop`) print what to type now and exit 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from gswarm_tasks.settings import load_settings

from .. import GswarmGroup
from ..local import broker_port, running
from ..profiler import analyze as _analyze
from ..profiler import recover as _recover
from ..profiler import start as _start
from ..profiler import status as _status
from ..profiler import stop as _stop


def _moved(now: str) -> None:
    """The one line a command of the gRPC era answers: what to type now."""
    click.echo(f"gsprof: this is now `{now}`", err=True)
    sys.exit(2)


def _head(address: str | None) -> None:
    """Talk to the API of the head at `address`, HOST[:PORT] as the original took it: PORT the head's broker (the
    original's gRPC port: cluster.port, or the one the host running here listens on) means the API on that host;
    any other PORT is the API's own."""
    if not address:
        return
    host, _, given = address.rpartition(":") if address.count(":") == 1 else (address, "", "")
    if given and not given.isdigit():
        raise click.BadParameter(f"{address!r} is not HOST[:PORT]", param_hint="ADDRESS")
    settings = load_settings()
    port = int(given) if given else settings.broker_port
    here = running(Path(settings.home)) or {}
    if port == broker_port(here.get("broker")) and here.get("api"):
        api_port = urlsplit(str(here["api"])).port or settings.api_port
    elif port == settings.broker_port:
        api_port = settings.api_port
    else:
        api_port = port
    os.environ["GSWARM_API_URL"] = f"http://{host}:{api_port}"


@click.group(cls=GswarmGroup)
@click.version_option(package_name="gswarm")
def main() -> None:
    """gsprof, the original profiler's command, running gswarm's `gswarm profiler`."""


@main.command()
@click.option(
    "--port", type=int, default=None, help="The original head's gRPC port: the head is `gswarm host start`."
)
@click.option("--http-port", type=int, default=None, help="The original head's HTTP port: see --port.")
@click.option("--name", default=None, help="Session name (default: session_YYYYmmdd_HHMMSS).")
@click.option("--freq", "freq_ms", type=int, default=None, help="Sampling period in ms.")
@click.option("--enable-bandwidth", is_flag=True, default=None, help="PCIe bandwidth.")
@click.option("--enable-nvlink", is_flag=True, default=None, help="NVLink bandwidth.")
@click.pass_context
def start(ctx: click.Context, port: int | None, http_port: int | None, **kw: Any) -> None:
    """Start a profiling session (the head itself is `gswarm host start`)."""
    if port is not None or http_port is not None:
        ports = " ".join(f"--{k} {v}" for k, v in (("port", port), ("http-port", http_port)) if v is not None)
        flags = " ".join(f for f, on in (("--enable-bandwidth", kw["enable_bandwidth"]),
                                         ("--enable-nvlink", kw["enable_nvlink"])) if on)  # fmt: skip
        freq = f" --freq {kw['freq_ms']}" if kw["freq_ms"] else ""
        _moved(f"gswarm host start {ports}` (the head), then `gswarm profiler start{freq} {flags}".rstrip())
    ctx.invoke(_start, nodes=(), **kw)


@main.command()
@click.argument("address", required=False)
@click.option("--name", default=None, help="Default: every active session.")
@click.option("--force", is_flag=True, help="Replace a <name>.json that exists.")
@click.pass_context
def stop(ctx: click.Context, address: str | None, name: str | None, force: bool) -> None:
    """Stop a session (or all) and write <name>.json (the original's layout)."""
    _head(address)
    ctx.invoke(_stop, name=name, out_dir=None, layout="original", no_file=False, force=force)


@main.command()
@click.argument("address", required=False)
@click.pass_context
def status(ctx: click.Context, address: str | None) -> None:
    """Active sessions and the newest frame of each node."""
    _head(address)
    ctx.invoke(_status)


@main.command()
@click.option(
    "--list", "list_", is_flag=True, help="Sessions that were running when the control plane stopped."
)
@click.option(
    "--name", "--session-id", "name", default=None, help="The session (its id is its name in gswarm)."
)
@click.option(
    "--export", "export_to", is_flag=False, flag_value="", default=None, help="Write its frames [to F]."
)
@click.pass_context
def recover(ctx: click.Context, list_: bool, name: str | None, export_to: str | None) -> None:
    """List sessions to recover, resume one, or export one (the original's layout)."""
    ctx.invoke(_recover, list_=list_, name=name, export_to=export_to, layout="original")


@main.command()
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False), help="A session's JSON.")
@click.option("--plot", required=True, type=click.Path(dir_okay=False), help="OUT.pdf or OUT.png")
@click.pass_context
def stat(ctx: click.Context, data: str, plot: str) -> None:
    """Statistics and a plot of a session file (`gswarm profiler analyze`)."""
    ctx.invoke(_analyze, data=data, plot=plot)


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("address", required=False)
@click.option("--resilient", is_flag=True)
def connect(address: str | None, resilient: bool) -> None:
    """A client of the original head: now a node worker (`gswarm client connect`)."""
    _moved(f"gswarm client connect {address or 'HOST:8090'} --resilient")


def _session_command(verb: str, now: str) -> None:
    @main.command(verb, help=f"The original's `{verb}`: now `{now}`.")
    @click.argument("address", required=False)
    @click.option("--name", default=None)
    def moved(address: str | None, name: str | None) -> None:
        _moved(now + (f" --name {name}" if name and not now.endswith("status") else ""))


for _verb, _now in (
    ("profile", "gswarm profiler start"),
    ("http-profile", "gswarm profiler start"),
    ("http-status", "gswarm profiler status"),
    ("http-stop", "gswarm profiler stop"),
):
    _session_command(_verb, _now)


if __name__ == "__main__":
    main()
