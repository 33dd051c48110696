"""`gswarm up` on SQLite and an embedded Redis: healthy, its node registered, and nothing left after SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import requests

from gswarm_web.cli.up import free_port
from tests.integration.procs import Proc, wait_for


def test_gswarm_up_comes_up_healthy_and_stops_clean(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port, rport = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSWARM_")}
    env.update(GSWARM_HOME=str(home), GSWARM_HEARTBEAT_INTERVAL="1", PYTHONUNBUFFERED="1")
    gswarm = str(Path(sys.executable).with_name("gswarm"))
    up = Proc(
        "up", [gswarm, "up", "--port", str(port), "--redis-port", str(rport), "--node", "upnode"], env, tmp_path
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
        assert f"http://127.0.0.1:{port}/api/v1/docs" in out and f"redis://127.0.0.1:{rport}/0" in out
        assert str(home / "token") in out
        assert requests.get(f"{api}/nodes", timeout=2).status_code == 401

        # The CLI reads the token from $GSWARM_HOME/token and talks to GSWARM_API_URL.
        cli_env = {**env, "GSWARM_API_URL": f"http://127.0.0.1:{port}"}
        out = subprocess.run([gswarm, "nodes", "--json"], env=cli_env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert [n["name"] for n in json.loads(out.stdout)["nodes"]] == ["upnode"]
        out = subprocess.run([gswarm, "health"], env=cli_env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "healthy" in out.stdout
        # A bad token: the server's message on one line, no traceback.
        out = subprocess.run(
            [gswarm, "nodes"], env={**cli_env, "GSWARM_TOKEN": "nope"}, capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 1
        assert "UNAUTHORIZED" in out.stderr and "not valid" in out.stderr and "Traceback" not in out.stderr

        children = psutil.Process(up.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        for part in ("redis-server", "gunicorn", "gswarm_web.celery_app", "beat", "-Q upnode"):
            assert part in names, part

        os.kill(up.pid, signal.SIGTERM)
        assert up.proc is not None
        up.proc.wait(timeout=60)
        assert up.proc.returncode == 0
        alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        assert alive == [], [c.cmdline() for c in alive]
    finally:
        up.stop()


def test_host_start_runs_the_control_plane_only(tmp_path: Path, redis_url: str, pg_url: str) -> None:
    home = tmp_path / "head"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSWARM_")}
    env.update(GSWARM_HOME=str(home), GSWARM_REDIS_URL=redis_url, GSWARM_DATABASE_URL=pg_url, PYTHONUNBUFFERED="1")
    gswarm = str(Path(sys.executable).with_name("gswarm"))
    head = Proc("head", [gswarm, "host", "start", "--port", str(port)], env, tmp_path).start()
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
