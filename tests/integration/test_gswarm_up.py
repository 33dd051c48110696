"""`gswarm up` on SQLite and an embedded Redis: healthy, its node registered, private (a Redis that needs its password,
0700/0600 under GSWARM_HOME, a private dram root), and nothing of it left 5 s after SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import redis
import requests

from gswarm_web.cli.up import free_port
from tests.harness.procs import Proc, wait_for

pytestmark = pytest.mark.serial  # see pyproject.toml: runs alone after the parallel part


def assert_private(home: Path) -> None:
    """Every directory under `home` is 0700 and every file 0600 (owned by this user)."""
    found = []
    for path in [home, *home.rglob("*")]:
        st = path.lstat()
        want = 0o700 if path.is_dir() else 0o600
        assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == want, f"{path}: {oct(st.st_mode & 0o777)}"
        found.append(path.relative_to(home).as_posix())
    for part in (
        "gswarm.db",
        "token",
        "redis.password",
        "redis/redis.conf",
        "logs/web.log",
        "storage/upnode",
    ):
        assert part in found, (part, found)
    assert any(p.startswith("redis/appendonly") for p in found), found  # the AOF


def alive_after_stop(up: Proc, children: list[psutil.Process]) -> list[str]:
    """What is left of `gswarm up` (its process group and every process it started), by command line."""
    left = []
    for p in {p.pid: p for p in [*children, *psutil.process_iter()]}.values():
        try:
            ours = p in children or os.getpgid(p.pid) == up.pid
            if ours and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline()))
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return left


def test_gswarm_up_comes_up_healthy_and_stops_clean(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port, rport = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSWARM_")}
    env.update(GSWARM_HOME=str(home), GSWARM_HEARTBEAT_INTERVAL="1", PYTHONUNBUFFERED="1")
    gswarm = str(Path(sys.executable).with_name("gswarm"))
    up = Proc(
        "up",
        [gswarm, "up", "--port", str(port), "--redis-port", str(rport), "--node", "upnode"],
        env,
        tmp_path,
    ).start()
    try:
        api = f"http://127.0.0.1:{port}/api/v1"
        wait_for(
            lambda: requests.get(f"{api}/health", timeout=2).json()["status"] == "healthy",
            30,
            "gswarm up to be healthy",
        )
        token = (home / "token").read_text().strip()
        assert oct((home / "token").stat().st_mode & 0o777) == "0o600"
        auth = {"Authorization": f"Bearer {token}"}

        def registered() -> dict | None:
            r = requests.get(f"{api}/nodes/upnode", headers=auth, timeout=2)
            return r.json() if r.status_code == 200 else None

        node = wait_for(registered, 30, "upnode registered")
        assert node["status"] == "healthy"
        assert node["storage"]["disk"]["path"] == str(home / "storage" / "upnode")
        assert (home / "gswarm.db").is_file() and (home / "logs" / "web.log").is_file()
        up.wait_log("Press Ctrl-C to stop.", timeout=30)
        out = up.log()
        password = (home / "redis.password").read_text().strip()
        assert len(password) >= 32
        assert f"http://127.0.0.1:{port}/api/v1/docs" in out and f"redis://:***@127.0.0.1:{rport}/0" in out
        assert f'gswarm client connect 127.0.0.1:{rport} --token "$(cat {home / "redis.password"})"' in out
        assert (
            password not in out
        )  # the broker's password is a root credential of the fleet: only its file is shown
        assert str(home / "token") in out
        # Redis access is running tasks on nodes: the embedded Redis refuses a client without the password.
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=rport, socket_timeout=5).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=rport, password="not-it", socket_timeout=5).ping()
        assert redis.Redis(port=rport, password=password, socket_timeout=5).ping()
        assert password not in " ".join(" ".join(c.cmdline()) for c in psutil.Process(up.pid).children(True))
        assert_private(home)
        dram = Path("/dev/shm") / f"gswarm-{os.geteuid()}" / "upnode"
        for d in (dram, dram.parent):
            st = d.lstat()
            assert st.st_uid == os.geteuid() and oct(st.st_mode & 0o777) == "0o700", (d, oct(st.st_mode))
        assert requests.get(f"{api}/nodes", timeout=2).status_code == 401

        # The CLI reads the token from $GSWARM_HOME/token and talks to GSWARM_API_URL.
        cli_env = {**env, "GSWARM_API_URL": f"http://127.0.0.1:{port}"}
        out = subprocess.run(
            [gswarm, "nodes", "--json"], env=cli_env, capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        assert [n["name"] for n in json.loads(out.stdout)["nodes"]] == ["upnode"]
        out = subprocess.run([gswarm, "health"], env=cli_env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "healthy" in out.stdout
        # this host runs upnode: `node status` without a name is it, and `host status` shows what up runs
        out = subprocess.run(
            [gswarm, "node", "status"], env=cli_env, capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0 and "upnode healthy" in out.stdout, out
        out = subprocess.run(
            [gswarm, "host", "status"], env=cli_env, capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0 and f"pid {up.pid}" in out.stdout and "upnode" in out.stdout, out
        # A bad token: the server's message on one line, no traceback.
        out = subprocess.run(
            [gswarm, "nodes"],
            env={**cli_env, "GSWARM_TOKEN": "nope"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 1
        assert "UNAUTHORIZED" in out.stderr and "not valid" in out.stderr and "Traceback" not in out.stderr

        children = psutil.Process(up.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        for part in ("redis-server", "gunicorn", "gswarm_web.celery_app", "beat", "-Q upnode"):
            assert part in names, part

        os.kill(up.pid, signal.SIGTERM)
        proc = up.proc
        assert proc is not None
        try:
            wait_for(
                lambda: proc.poll() is not None and not alive_after_stop(up, children), 5.0, "an empty group"
            )
        except AssertionError:
            raise AssertionError(f"alive 5 s after SIGTERM: {alive_after_stop(up, children)}") from None
        assert proc.returncode == 0
    finally:
        up.stop()


def test_host_start_runs_the_control_plane_only(tmp_path: Path, redis_url: str, pg_url: str) -> None:
    home = tmp_path / "head"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSWARM_")}
    env.update(
        GSWARM_HOME=str(home), GSWARM_REDIS_URL=redis_url, GSWARM_DATABASE_URL=pg_url, PYTHONUNBUFFERED="1"
    )
    gswarm = str(Path(sys.executable).with_name("gswarm"))
    head = Proc(
        "head", [gswarm, "host", "start", "--http-port", str(port), "--model-port", "0"], env, tmp_path
    ).start()
    try:
        api = f"http://127.0.0.1:{port}/api/v1"
        health = wait_for(
            lambda: (h := requests.get(f"{api}/health", timeout=2).json())["status"] == "healthy" and h,
            30,
            "the head to be healthy",
        )
        assert health["workers"]["nodes"] == {"healthy": 0, "unhealthy": 0, "offline": 0}
        names = " ".join(" ".join(c.cmdline()) for c in psutil.Process(head.pid).children(recursive=True))
        assert "gunicorn" in names and "gswarm_web.celery_app" in names and "beat" in names
        assert "redis-server" not in names and "-Q node" not in names  # the given broker, and no node worker
        os.kill(head.pid, signal.SIGINT)
        assert head.proc is not None
        assert head.proc.wait(timeout=60) == 0
    finally:
        head.stop()
