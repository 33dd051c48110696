"""`gswarm host start|stop|status`, as the original's Quick Start types them: the host is the control plane (API,
control worker, beat) and the broker nodes join; stop and status act on the one running under GSWARM_HOME."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import requests
from rich.console import Console

from gswarm_tasks.settings import Settings, load_settings

from .guardian import RECORDS
from .local import alive, clear_leftovers, refuse_second, running
from .up import Launch, port_in_use, run_supervised

console = Console(soft_wrap=True)
PORT = click.IntRange(1, 65535)
STOP_WAIT_S = (
    20.0  # everything is gone within 5 s of the signal; a start still migrating takes longer to notice
)


def _ports(
    settings: Settings, broker: int | None, http: int | None, model: int | None
) -> tuple[int, int, int]:
    """(broker, API, model API) ports, checked: distinct, and --port only where it places the embedded broker."""
    if broker is not None and settings.redis_url:
        parts = urlsplit(settings.redis_url)
        if parts.port != broker:
            raise click.UsageError(
                f"--port {broker}: the broker is GSWARM_REDIS_URL ({parts.hostname}:{parts.port or 6379}), which "
                "nodes join; --port places the embedded Redis only: drop it or unset GSWARM_REDIS_URL"
            )
    ports = {
        "--port": broker or settings.broker_port,
        "--http-port": http or settings.api_port,
        "--model-port": settings.model_port if model is None else model,
    }
    for a, b in (("--port", "--http-port"), ("--port", "--model-port"), ("--http-port", "--model-port")):
        if ports[a] and ports[a] == ports[b] and not (a == "--port" and settings.redis_url):
            raise click.UsageError(
                f"{a} and {b} are both {ports[a]}: the broker (--port, cluster.port), the API (--http-port, "
                "cluster.http_port) and the model API (--model-port, cluster.model_port) each need a port"
            )
    return ports["--port"], ports["--http-port"], ports["--model-port"]


@click.group("host")
def host() -> None:
    """The host: the control plane of the fleet (API, control worker, beat) and the broker its nodes join."""


@host.command("start")
@click.option(
    "--port",
    "--redis-port",
    "broker",
    type=PORT,
    default=None,
    help="Where nodes connect: the broker; the embedded Redis listens here when GSWARM_REDIS_URL is unset "
    "(8090, cluster.port).",
)
@click.option(
    "--http-port", type=PORT, default=None, help="The REST API and dashboard (8091, cluster.http_port)."
)
@click.option(
    "--model-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="The same API on a second port, for clients of the original's model API (9010, cluster.model_port; 0: off).",
)
@click.option(
    "--host", "bind", default=None, help="Address the API and broker bind to (cluster.host, 127.0.0.1)."
)
def start(broker: int | None, http_port: int | None, model_port: int | None, bind: str | None) -> None:
    """Start the host: API, control worker, beat, and the embedded broker when GSWARM_REDIS_URL is unset."""
    settings = load_settings()
    refuse_second(Path(settings.home))
    bport, hport, mport = _ports(settings, broker, http_port, model_port)
    address = bind or settings.api_host
    for flag, port in (("--http-port", hport), ("--model-port", mport)):
        if port and port_in_use("0.0.0.0" if address in ("0.0.0.0", "") else address, port):
            raise click.ClickException(
                f"port {port} ({flag}) is in use on {address}; give another with {flag}"
            )
    launch = Launch(address, hport, None, bport, True, mport, "gswarm host", "host start")
    run_supervised(settings, launch)


def _home() -> Path:
    return Path(load_settings().home)


@host.command("stop")
def stop() -> None:
    """Stop the `gswarm host start` or `gswarm up` running under GSWARM_HOME (every process it started)."""
    home = _home()
    run = running(home)
    if run is None:
        if clear_leftovers(home / RECORDS):
            return
        console.print(f"no gswarm is running under GSWARM_HOME={home} (nothing to stop)")
        sys.exit(1)
    try:
        os.kill(int(run["pid"]), signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + STOP_WAIT_S
    while alive(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(run):
        console.print(f"[red]gswarm (pid {run['pid']}) is still stopping after {STOP_WAIT_S:.0f} s[/]")
        sys.exit(1)
    console.print(f"stopped gswarm ({run.get('command')}, pid {run['pid']})")


def _health(api: str | None) -> dict[str, Any] | None:
    if not api:
        return None
    try:
        body = requests.get(f"{api}/api/v1/health", timeout=3).json()
    except (requests.RequestException, ValueError):
        return None
    return body if isinstance(body, dict) else None


@host.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
def status(as_json: bool) -> None:
    """Whether a host runs under GSWARM_HOME, where its API and broker are, and its health; exit 1 when none runs."""
    home = _home()
    run = running(home)
    health = _health(run.get("api")) if run else None
    if as_json:
        click.echo(
            json.dumps({"running": run is not None, "home": str(home), **(run or {}), "health": health})
        )
        sys.exit(0 if run else 1)
    if run is None:
        console.print(f"not running (no gswarm under GSWARM_HOME={home}; start one with `gswarm host start`)")
        sys.exit(1)
    since = datetime.fromtimestamp(float(run.get("created") or 0), UTC).isoformat(timespec="seconds")
    console.print(f"gswarm {run.get('command')}: [bold]{run.get('state')}[/], pid {run['pid']} since {since}")
    console.print(f"  home        {home}")
    for label, key in (("API", "api"), ("model API", "model_api"), ("broker", "broker"), ("node", "node")):
        if run.get(key):
            console.print(f"  {label:<11} {run[key]}", highlight=False)
    if health is not None:
        nodes = ", ".join(f"{k} {v}" for k, v in health.get("workers", {}).get("nodes", {}).items())
        console.print(f"  health      {health.get('status')}   nodes: {nodes or '-'}")
    elif run.get("api"):
        console.print("  health      [yellow]the API does not answer[/]")
