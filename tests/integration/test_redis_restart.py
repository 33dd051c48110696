"""Redis restarted in the middle of a workflow (append-only file on, as docker-compose.yml runs it): the step that was
running when Redis went away is not failed for it; it runs again once Redis answers, and the workflow finishes with
every step succeeded and every report applied. Real Redis (a server of the test's own, stopped and started again),
Postgres, control worker and node worker."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import redis

from tests.harness.fleet import Fleet
from tests.harness.procs import wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis_server(port: int, data: Path) -> subprocess.Popen[bytes]:
    argv = [
        shutil.which("redis-server") or "redis-server",
        *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)),
        *("--appendonly", "yes", "--appendfsync", "always", "--save", ""),
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _noop(aid: str, *deps: str, **kw: Any) -> dict[str, Any]:
    return {"action_id": aid, "action_type": "noop", "node": "node1", "dependencies": list(deps), **kw}


def _steps(f: Fleet, wf_id: str) -> dict[str, dict[str, Any]]:
    code, body = f.get(f"/workflows/{wf_id}")
    assert code == 200, body
    return {s["action_id"]: s for s in body["steps"]}


def test_a_workflow_finishes_across_a_redis_restart(tmp_path: Path) -> None:
    port = _free_port()
    data = tmp_path / "redis"
    data.mkdir()
    server = _redis_server(port, data)
    url = f"redis://127.0.0.1:{port}/0"
    wait_for(lambda: redis.Redis.from_url(url).ping(), 10, "the test's redis")
    f = Fleet(tmp_path / "fleet", redis_url=url)
    try:
        f.start("control", "control", app_module="gswarm_web.celery_app")
        f.start_node("node1")
        actions = [
            _noop("a", duration_s=0.2),
            _noop("b", "a", duration_s=4),  # running while Redis is away; no retries of its own
            _noop("c", "b", outputs={"after": "restart"}),
            _noop("d", "c", duration_s=0.2),
        ]
        code, wf = f.post("/workflows", {"name": "redis-restart", "actions": actions})
        assert code == 201, wf
        wait_for(lambda: _steps(f, wf["id"])["b"]["status"] == "running", 60, "step b running")
        server.terminate()  # SIGTERM: Redis writes its append-only file and exits, as `docker restart` does
        server.wait(10)
        server = _redis_server(port, data)
        wait_for(lambda: redis.Redis.from_url(url).ping(), 10, "redis back")

        def finished() -> dict[str, Any] | None:
            code, body = f.get(f"/workflows/{wf['id']}")
            return body if code == 200 and body["status"] != "running" else None

        body = wait_for(finished, 120, "the workflow to finish after the restart")
        assert body["status"] == "succeeded", body
        steps = {s["action_id"]: s for s in body["steps"]}
        assert {k: s["status"] for k, s in steps.items()} == dict.fromkeys("abcd", "succeeded"), steps
        assert steps["c"]["outputs"] == {"after": "restart"}
    finally:
        f.close()
        server.terminate()
        server.wait(10)
