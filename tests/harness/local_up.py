"""A whole `gswarm up` (or `gswarm host start`) in a temporary GSWARM_HOME, as a user starts it, for the tests that need
the real supervisor: its API, its token, and what it started."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from gswarm_web.cli.up import free_port
from tests.harness.procs import Proc, wait_for

GSWARM = str(Path(sys.executable).with_name("gswarm"))


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's shell with GSWARM_HOME set and no other gswarm setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSWARM_")}
    env.update(GSWARM_HOME=str(home), GSWARM_HEARTBEAT_INTERVAL="1", PYTHONUNBUFFERED="1", **extra)
    return env


@dataclass
class LocalUp:
    proc: Proc
    home: Path
    env: dict[str, str]
    port: int
    redis_port: int
    node: str | None
    children: list[psutil.Process] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {(self.home / 'token').read_text().strip()}"}

    def wait_healthy(self, timeout: float = 60.0) -> None:
        def healthy() -> bool:
            if self.proc.proc is not None and self.proc.proc.poll() is not None:
                raise AssertionError(f"{self.proc.name} exited:\n{self.proc.log()[-3000:]}")
            body = requests.get(f"{self.api}/health", timeout=2).json()
            nodes = body["workers"]["nodes"]["healthy"] if self.node else 1
            return bool(body["status"] == "healthy" and nodes)

        wait_for(healthy, timeout, "gswarm to be healthy")
        self.proc.wait_log("Press Ctrl-C to stop.", timeout=timeout)
        self.children = psutil.Process(self.proc.pid).children(recursive=True)


def start_up(tmp: Path, node: str | None = "upnode", *, port: int | None = None, redis_port: int | None = None,
             home: Path | None = None, name: str = "up", **env: str) -> LocalUp:  # fmt: skip
    """`gswarm up --port P --redis-port R --node NODE` (or `gswarm host start` when `node` is None), started."""
    home = home or tmp / "home"
    port, redis_port = port or free_port(), redis_port or free_port()
    if node is None:
        argv = [
            GSWARM,
            "host",
            "start",
            "--http-port",
            str(port),
            "--port",
            str(redis_port),
            "--model-port",
            "0",
        ]
    else:
        argv = [GSWARM, "up", "--port", str(port), "--redis-port", str(redis_port), "--node", node]
    proc = Proc(name, argv, clean_env(home, **env), tmp).start()
    return LocalUp(proc, home, proc.env, port, redis_port, node)


def descendants_alive(children: list[psutil.Process]) -> list[str]:
    """The command lines of those of `children` that still run (the same processes: psutil checks start times)."""
    left = []
    for p in children:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline()))
        except psutil.NoSuchProcess:
            continue
    return left
