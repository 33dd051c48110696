"""`gswarm up` (and what `gswarm host start` shares with it): bring the control plane, a broker and a node up on this
host, supervised, until a signal."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import requests
from rich.console import Console

from gswarm_tasks.devices import validate_node_name
from gswarm_tasks.settings import Settings, load_settings

from .broker import (
    PASSWORD_FILE,
    broker_password,
    broker_url,
    embedded_redis_spec,
    hide_password,
    write_private,
)
from .guardian import RECORDS
from .local import claim_run, private_home, record_node, release_run, update_run
from .supervisor import ProcSpec, Supervisor

console = Console(soft_wrap=True)
PY = sys.executable


def free_port(host: str = "127.0.0.1", preferred: int | None = None) -> int:
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError("no free port")


def ensure_admin_token(settings: Settings) -> str:
    """The admin token in $GSWARM_HOME/token (made once, mode 0600), recorded in the database."""
    from gswarm_web import create_app
    from gswarm_web.api.auth import ensure_token

    path = settings.token_file
    if path.is_file() and path.read_text().strip():
        token = path.read_text().strip()
    else:
        token = "gsw_" + secrets.token_urlsafe(32)
        write_private(path, token + "\n")
    with create_app(settings).app_context():
        ensure_token("gswarm-up-admin", token, "admin")
    return token


def _http_ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/api/v1/health", timeout=1).status_code in (200, 503)
    except requests.RequestException:
        return False


# The API's server, the same in docker-compose.yml (tests/unit/test_compose.py holds them equal): gevent workers give
# no thread to an idle or slow socket, so 64 idle connections cannot stall it as they did 4 x 2 gthread threads, and
# a waiting gateway request costs a greenlet; 4 processes for the CPU-bound answers (bench/api_load.py).
WEB_OPTIONS = [
    "--workers",
    "4",
    "--worker-class",
    "gevent",
    "--worker-connections",
    "1000",
    "--graceful-timeout",
    "2",
    "--access-logfile",
    "-",
]
WEB_APP = "gswarm_web:create_app()"


def web_argv(host: str, port: int, model_port: int = 0) -> list[str]:
    """The API's command line: gunicorn with WEB_OPTIONS bound to host:port (and host:model_port, the same API for
    clients of the original's model API, when it is not 0)."""
    second = ["--bind", f"{host}:{model_port}"] if model_port else []
    return [PY, "-m", "gunicorn", "--bind", f"{host}:{port}", *second, *WEB_OPTIONS, WEB_APP]


def control_plane_specs(
    settings: Settings, env: dict[str, str], host: str, port: int, model_port: int = 0
) -> list[ProcSpec]:
    logs = Path(settings.home) / "logs"
    api = f"http://{host}:{port}"
    return [
        ProcSpec(
            "web", web_argv(host, port, model_port), env, logs / "web.log", ready=lambda: _http_ready(api)
        ),
        ProcSpec(
            "control",
            [
                PY,
                "-m",
                "celery",
                "-A",
                "gswarm_web.celery_app",
                "worker",
                "-Q",
                "control",
                "-n",
                "control@%h",
                "-c",
                "2",
                "--loglevel",
                settings.log_level,
            ],
            env,
            logs / "control.log",
        ),
        ProcSpec(
            "beat",
            [PY, "-m", "celery", "-A", "gswarm_tasks", "beat", "--loglevel", settings.log_level],
            env,
            logs / "beat.log",
        ),
    ]


def node_worker_argv(node: str, concurrency: int, loglevel: str) -> list[str]:
    """The node worker's command line: the same one a user types by hand."""
    return [
        PY,
        "-m",
        "celery",
        "-A",
        "gswarm_tasks",
        "worker",
        "-Q",
        node,
        "-n",
        f"{node}@%h",
        "-c",
        str(concurrency),
        "--loglevel",
        loglevel,
    ]


def node_spec(settings: Settings, env: dict[str, str], node: str, storage_root: Path) -> ProcSpec:
    node_env = {**env, "GSWARM_NODE_NAME": node, "GSWARM_STORAGE_ROOT": str(storage_root)}
    argv = node_worker_argv(node, settings.max_concurrent_tasks, settings.log_level)
    return ProcSpec(f"node-{node}", argv, node_env, Path(settings.home) / "logs" / f"node-{node}.log")


def _wait_healthy(api: str, node: str | None, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            last = requests.get(f"{api}/api/v1/health", timeout=2).json()
            nodes_ok = node is None or last["workers"]["nodes"]["healthy"] > 0
            if last.get("status") == "healthy" and nodes_ok:
                return last
        except (requests.RequestException, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"gswarm did not become healthy within {timeout_s:.0f} s (last health: {last})")


WILDCARDS = ("0.0.0.0", "::", "")


def public_address() -> str:
    """This host's address as other hosts reach it (the one that routes outwards; no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere, only looked up
            return str(s.getsockname()[0])
    except OSError:
        return socket.getfqdn()


def join_command(redis_url: str, password_file: Path | None = None) -> str:
    """The exact command a node joins this broker with: `gswarm client connect HOST:PORT`, with `--token` reading the
    broker's password from its file (the password itself is never printed), or the URL itself when it is more than
    host, port and password (its password hidden)."""
    parts = urlsplit(redis_url)
    if parts.scheme != "redis" or parts.username or parts.query or parts.path not in ("", "/", "/0"):
        return f"gswarm client connect {hide_password(redis_url)}"
    host = parts.hostname or "127.0.0.1"
    host = public_address() if host in WILDCARDS else host
    where = f"[{host}]" if ":" in host else host
    token = ""
    if parts.password:
        token = f' --token "$(cat {password_file})"' if password_file else " --token <the broker's password>"
    return f"gswarm client connect {where}:{parts.port or 6379}{token}"


def _print_up(
    title: str,
    api: str,
    redis_url: str,
    embedded: bool,
    settings: Settings,
    node: str | None,
    model_api: str | None,
) -> None:
    console.print(f"[bold green]{title} is up[/]")
    console.print(f"  dashboard   {api}/   (sign in with the admin token below)")
    console.print(f"  API         {api}/api/v1")
    if model_api:
        console.print(f"  model API   {model_api}/api/v1   (the same API, the original's model port)")
    console.print(f"  docs        {api}/api/v1/docs")
    where = f"   (password in {Path(settings.home) / PASSWORD_FILE})" if embedded else ""
    console.print(f"  broker      {hide_password(redis_url)}{where}")
    password_file = Path(settings.home) / PASSWORD_FILE if embedded else None
    console.print(f"  join        {join_command(redis_url, password_file)}", highlight=False)
    if embedded:
        console.print("              (on another host: copy the password in that file, and give it with --token or "
                      "GSWARM_JOIN_TOKEN)", highlight=False)  # fmt: skip
    if urlsplit(api).hostname in ("127.0.0.1", "localhost", "::1"):
        console.print(
            "              (from this machine only: start with --host 0.0.0.0, or cluster.host, for others)"
        )
    console.print(f"  admin token {settings.token_file}")
    if node:
        console.print(f"  node        {node}  storage {settings.effective_storage_root(node)}")
    console.print(f"  logs        {Path(settings.home) / 'logs'}")
    console.print("Press Ctrl-C to stop.")
    sys.stdout.flush()


def stop_all(sup: Supervisor, storage_root: Path | None) -> None:
    """Stop every child and the node's model servers at once (they outlive a worker restart by design, but not
    their supervisor): all of it is gone within about 4 s (Supervisor's budgets), then a SIGKILL for what remains."""
    from gswarm_tasks.serving.replicas import ServiceRegistry, pid_alive

    registry = ServiceRegistry(storage_root) if storage_root else None
    services = registry.entries() if registry else []
    for entry in services:
        if pid_alive(entry.get("pid"), entry.get("created")):
            try:
                os.killpg(int(entry["pid"]), signal.SIGTERM)
            except (ProcessLookupError, PermissionError, ValueError, KeyError):
                pass
    sup.stop()
    for entry in services:
        assert registry is not None
        registry.stop(entry["service_id"], timeout_s=0.2)


def supervise(sup: Supervisor, stop_reason: list[str]) -> None:
    """Keep the children running (restarts) until a signal puts its name in `stop_reason`."""
    while not stop_reason:
        sup.check()
        time.sleep(0.5)


def on_stop_signals() -> list[str]:
    """SIGINT and SIGTERM ask for a stop: their names are appended to the list returned."""
    stop_reason: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stop_reason.append(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop_reason


@dataclass
class Launch:
    """What `gswarm up` / `host start` runs: where the API listens, the embedded broker's port, a node."""

    host: str
    port: int
    node: str | None = None
    broker_port: int | None = None  # the embedded Redis's: exactly this one (`host start`), else preferred
    exact_broker_port: bool = False
    model_port: int = 0  # the API again on this port (0: not)
    title: str = "gswarm"
    command: str = "up"


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on host:port (a port a stopped gswarm left in TIME_WAIT is free, as for Redis)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def broker_bind(host: str) -> str:
    """The address the embedded Redis binds to: the API's (a wildcard or an address; a name resolved once)."""
    if host in WILDCARDS:
        return "0.0.0.0"
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise RuntimeError(f"cannot resolve {host!r} (the address to bind to): {exc}") from exc


def _start_broker(sup: Supervisor, home: Path, env: dict[str, str], launch: Launch) -> str:
    """Start the embedded Redis (its password made once) and return the URL this host's processes use."""
    bind = broker_bind(launch.host)
    if launch.exact_broker_port and launch.broker_port:
        if port_in_use(bind, launch.broker_port):
            raise RuntimeError(f"port {launch.broker_port} (the broker, --port) is in use on {bind}")
        rport = launch.broker_port
    else:
        rport = free_port(bind, launch.broker_port or 6389)
    password = broker_password(home)
    sup.start(embedded_redis_spec(home, bind, rport, env, password))
    return broker_url("127.0.0.1" if bind == "0.0.0.0" else bind, rport, password)


def _bring_up(
    sup: Supervisor, settings: Settings, env: dict[str, str], launch: Launch
) -> tuple[Settings, str]:
    """Broker, migrations, admin token, control plane and node, in order; returns the settings they run with."""
    from gswarm_web.migrate import upgrade

    home = Path(settings.home)
    redis_url = settings.redis_url or _start_broker(sup, home, env, launch)
    env["GSWARM_REDIS_URL"] = redis_url
    env["GSWARM_DATABASE_URL"] = settings.effective_database_url
    env["GSWARM_API_URL"] = f"http://{launch.host}:{launch.port}"
    settings = load_settings(env)
    upgrade(settings.effective_database_url)
    ensure_admin_token(settings)
    for spec in control_plane_specs(settings, env, launch.host, launch.port, launch.model_port):
        sup.start(spec)
    if launch.node:
        sup.watch_node(settings.effective_storage_root(launch.node))
        sup.start(node_spec(settings, env, launch.node, settings.effective_storage_root(launch.node)))
        record_node(home, launch.node, hide_password(redis_url))
    return settings, redis_url


def run_supervised(settings: Settings, launch: Launch) -> None:
    """Start the control plane (and a node worker when `launch.node` is given), then wait for a signal."""
    home = Path(settings.home)
    private_home(home)
    (home / "logs").mkdir(mode=0o700, exist_ok=True)
    claim_run(home, launch.command)
    env = {k: v for k, v in os.environ.items()}
    env["GSWARM_HOME"] = str(home)
    stop_reason = on_stop_signals()
    sup = Supervisor(records=home / RECORDS)
    try:
        embedded = not settings.redis_url
        settings, redis_url = _bring_up(sup, settings, env, launch)
        api = f"http://{launch.host}:{launch.port}"
        model_api = f"http://{launch.host}:{launch.model_port}" if launch.model_port else None
        _wait_healthy(api, launch.node)
        update_run(home, state="up", api=api, model_api=model_api, broker=hide_password(redis_url), node=launch.node,
                   embedded_broker=embedded)  # fmt: skip
        _print_up(launch.title, api, redis_url, embedded, settings, launch.node, model_api)
        supervise(sup, stop_reason)
    except RuntimeError as exc:
        console.print(f"[red]error:[/] {exc}")
        stop_reason.append("error")
    finally:
        console.print("stopping ...")
        stop_all(sup, settings.effective_storage_root(launch.node) if launch.node else None)
        release_run(home)
        console.print("stopped")
    if stop_reason and stop_reason[0] == "error":
        raise SystemExit(1)


@click.command("up")
@click.option(
    "--host", default=None, help="Address the API and the embedded Redis bind to (default 127.0.0.1)."
)
@click.option("--port", type=int, default=None, help="API port (default 8091).")
@click.option("--node", default=None, help="Name of this host's node (default: hostname).")
@click.option(
    "--redis-port", type=int, default=None, help="Port of the embedded Redis (default 6389, else free)."
)
def up(host: str | None, port: int | None, node: str | None, redis_port: int | None) -> None:
    """Run everything on this host: API, control worker, beat and a node worker."""
    settings = load_settings()
    node = validate_node_name(node or settings.effective_node_name, "--node")
    launch = Launch(host or settings.api_host, port or settings.api_port, node, broker_port=redis_port)
    run_supervised(settings, launch)
