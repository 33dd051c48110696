"""`gswarm client connect HOST:8090`, as the original's Quick Start types it: this host joins the fleet as a node
worker at the host's broker, with the broker's credential; a Redis URL works as well."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from urllib.parse import quote, urlsplit

import click
import redis
from rich.console import Console

from gswarm_tasks.devices import validate_node_name
from gswarm_tasks.settings import Settings, load_settings

from . import guardian
from .broker import PASSWORD_FILE, hide_password
from .local import clear_leftovers, private_home, record_node
from .supervisor import ProcSpec, Supervisor
from .up import node_worker_argv, on_stop_signals, stop_all, supervise

err_console = Console(stderr=True, soft_wrap=True)
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
WHERE = (
    "the host printed it in its join command (`gswarm host start`); on the host it is in $GSWARM_HOME/"
    f"{PASSWORD_FILE}. Give it with --token, GSWARM_JOIN_TOKEN or cluster.join_token in config.yaml"
)


def _host_port(address: str, default_port: int) -> tuple[str, int]:
    """`HOST`, `HOST:PORT` or `[V6]:PORT` -> (host, port)."""
    try:
        parts = urlsplit(f"//{address}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or parts.path or parts.username is not None:
        raise click.BadParameter(f"{address!r} is not HOST:PORT (or a redis:// URL)", param_hint="ADDRESS")
    return host, port or default_port


def _own_password(settings: Settings, host: str) -> str | None:
    """The embedded broker's password when the broker is this host's own (`gswarm client connect` on the host)."""
    if host not in LOCAL_HOSTS and host not in (socket.gethostname(), socket.getfqdn()):
        return None
    try:
        return (Path(settings.home) / PASSWORD_FILE).read_text().strip() or None
    except OSError:
        return None


def broker_of(address: str | None, token: str | None, settings: Settings) -> tuple[str, str | None]:
    """(the broker's URL, where its credential came from) for an address as the user gave it."""

    def credential_for(host: str) -> tuple[str | None, str | None]:
        """The first credential given: --token, then GSWARM_JOIN_TOKEN / cluster.join_token, then this host's own."""
        found = [(token, "--token"), (settings.join_token, "GSWARM_JOIN_TOKEN / cluster.join_token")]
        found.append((_own_password(settings, host), str(Path(settings.home) / PASSWORD_FILE)))
        return next(((c, s) for c, s in found if c), (None, None))

    if address and "://" in address:
        parts = urlsplit(address)
        if parts.password:
            if token is not None:
                raise click.UsageError(
                    "the URL carries a password already: drop --token, or drop it from the URL"
                )
            return address, "the URL"
        credential, source = credential_for(parts.hostname or "")
        if credential is None:
            return address, None
        netloc = f"{quote(parts.username or '', safe='')}:{quote(credential, safe='')}@{parts.netloc}"
        return parts._replace(netloc=netloc).geturl(), source
    host, port = _host_port(address or f"{settings.api_host}:{settings.broker_port}", settings.broker_port)
    credential, source = credential_for(host)
    where = f"[{host}]" if ":" in host else host
    auth = f":{quote(credential, safe='')}@" if credential else ""
    return f"redis://{auth}{where}:{port}/0", source


def check_broker(url: str, source: str | None) -> None:
    """Ask the broker once before starting: a missing or refused credential is one clear error (exit 1); a broker
    that does not answer yet is waited for by the worker (it reconnects for as long as it runs)."""
    shown = hide_password(url)
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
    except redis.AuthenticationError:
        if source is None:
            err_console.print(
                f"[red]error:[/] the broker at {shown} needs its password: {WHERE}", highlight=False
            )
        else:
            err_console.print(f"[red]error:[/] the broker at {shown} refused the password from {source}: {WHERE}",
                              highlight=False)  # fmt: skip
        sys.exit(1)
    except redis.RedisError as exc:
        err_console.print(
            f"[yellow]the broker at {shown} does not answer yet ({type(exc).__name__}); the node keeps trying (a host"
            " takes nodes from other machines when started with --host 0.0.0.0 or cluster.host)[/]",
            highlight=False,
        )


@click.group("client")
def client() -> None:
    """A node of the fleet (a GPU host)."""


@client.command("connect")
@click.argument("address", required=False)
@click.option("--node", "--node-id", "node", default=None, help="This node's name (default: the host name).")
@click.option(
    "--token", default=None, help="The broker's password (or GSWARM_JOIN_TOKEN, cluster.join_token)."
)
@click.option(
    "--resilient",
    is_flag=True,
    help="Accepted: a node always reconnects to the broker and keeps its profiler frames on disk while it is away.",
)
@click.option(
    "--storage-root", type=click.Path(file_okay=False), default=None, help="Where this node stores models."
)
@click.option(
    "--concurrency", "-c", type=int, default=None, help="Tasks run at once (default from settings)."
)
@click.option("--loglevel", default=None)
def connect(
    address: str | None,
    node: str | None,
    token: str | None,
    resilient: bool,
    storage_root: str | None,
    concurrency: int | None,
    loglevel: str | None,
) -> None:
    """Join the fleet at ADDRESS (the host's HOST:PORT, default cluster.host:cluster.port, or a redis:// URL) as a
    node worker: `celery -A gswarm_tasks worker -Q NODE -n NODE@%h`."""
    settings = load_settings()
    node = validate_node_name(node or settings.effective_node_name, "--node")
    url, source = broker_of(address, token, settings)
    check_broker(url, source)
    env = dict(os.environ)
    env["GSWARM_REDIS_URL"] = url
    env["GSWARM_NODE_NAME"] = node
    if storage_root:
        env["GSWARM_STORAGE_ROOT"] = str(Path(storage_root).expanduser().resolve())
    home = Path(settings.home)
    private_home(home)
    records = guardian.node_records(home, node)
    other = guardian.supervisor_alive(records)
    if other is not None:
        raise click.ClickException(
            f"node {node} is connected from GSWARM_HOME={home} already (pid {other['pid']})"
        )
    clear_leftovers(records)
    settings = load_settings(env)
    storage = settings.effective_storage_root(node)
    err_console.print(f"node {node} joining {hide_password(url)}; storage {storage}", highlight=False)
    argv = node_worker_argv(
        node, concurrency or settings.max_concurrent_tasks, loglevel or settings.log_level
    )
    run_node(home, node, ProcSpec(f"node-{node}", argv, env, None), storage, hide_password(url))


def run_node(home: Path, node: str, spec: ProcSpec, storage: Path, broker: str) -> None:
    """The node worker, supervised: restarted when it dies; it and its model servers end with this process (a
    signal stops them, a guardian ends them when this process is killed)."""
    stop_reason = on_stop_signals()
    sup = Supervisor(records=guardian.node_records(home, node))
    sup.watch_node(storage)
    record_node(home, node, broker)
    try:
        sup.start(spec)
        supervise(sup, stop_reason)
    except RuntimeError as exc:
        err_console.print(f"[red]error:[/] {exc}", highlight=False)
        stop_reason.append("error")
    finally:
        stop_all(sup, storage)
    if stop_reason and stop_reason[0] == "error":
        raise SystemExit(1)
