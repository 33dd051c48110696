"""A real node worker registers through a real control worker into Postgres; killed, it turns unhealthy."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from flask.testing import FlaskClient

from gswarm_tasks.settings import Settings
from tests.harness.app import bearer, build_app
from tests.harness.procs import wait_for


def api_client(settings: Settings) -> tuple[Any, FlaskClient, str]:
    from gswarm_web.api.auth import create_token

    app = build_app(settings)
    ctx = app.app_context()
    ctx.push()
    return ctx, app.test_client(), create_token("t", "admin")


def get_node(client: FlaskClient, token: str, name: str) -> dict[str, Any] | None:
    r = client.get(f"/api/v1/nodes/{name}", headers=bearer(token))
    return r.json if r.status_code == 200 else None


def test_node_registers_then_turns_unhealthy_and_offline_after_sigkill(
    fleet_settings: Settings, start_worker: Any, home: Path
) -> None:
    ctx, client, token = api_client(fleet_settings)
    try:
        start_worker("gswarm_web.celery_app", "control", "control")
        t0 = time.monotonic()
        node = start_worker("gswarm_tasks", "nodex", "nodex")

        info = wait_for(lambda: get_node(client, token, "nodex"), 10, "nodex in /api/v1/nodes")
        assert time.monotonic() - t0 < 10
        assert info["status"] == "healthy"
        assert info["gpus"] == []  # no NVML on this host: an empty list, not an error
        disk = info["storage"]["disk"]
        assert disk["path"] == str(home / "storage" / "nodex")
        assert disk["total_bytes"] > 0 and 0 <= disk["free_bytes"] <= disk["total_bytes"]
        assert info["cpu_count"] >= 1 and info["dram_total_bytes"] > 0
        assert (home / "storage" / "nodex").is_dir()

        listed = client.get("/api/v1/nodes", headers=bearer(token)).json
        assert [n["name"] for n in listed["nodes"]] == ["nodex"]
        health = client.get("/api/v1/health").json
        assert health["status"] == "healthy" and health["workers"]["nodes"]["healthy"] == 1

        node.kill_group(signal.SIGKILL)  # the worker and its pool, no goodbye heartbeat
        killed_at = time.monotonic()
        wait_for(lambda: get_node(client, token, "nodex")["status"] == "unhealthy", 10, "nodex unhealthy")
        # Not before the heartbeat timeout (3 s) has passed since its last beat.
        assert time.monotonic() - killed_at >= 3 - 0.5 - 0.2
        wait_for(lambda: get_node(client, token, "nodex")["status"] == "offline", 10, "nodex offline")
    finally:
        ctx.pop()


def test_graceful_stop_marks_offline_at_once(fleet_settings: Settings, start_worker: Any) -> None:
    ctx, client, token = api_client(fleet_settings)
    try:
        start_worker("gswarm_web.celery_app", "control", "control")
        node = start_worker("gswarm_tasks", "nodey", "nodey")
        wait_for(lambda: get_node(client, token, "nodey"), 10, "nodey registered")
        node.stop()
        # Well before the 3 s heartbeat timeout could have made it unhealthy.
        wait_for(
            lambda: get_node(client, token, "nodey")["status"] == "offline", 2.5, "nodey offline after stop"
        )
    finally:
        ctx.pop()


def test_client_connect_starts_a_node_worker_with_its_storage_root(
    fleet_settings: Settings, fleet_env: dict[str, str], start_worker: Any, procs: list, tmp_path: Path
) -> None:
    import sys

    from tests.harness.procs import Proc

    ctx, client, token = api_client(fleet_settings)
    try:
        start_worker("gswarm_web.celery_app", "control", "control")
        root = tmp_path / "custom-root"
        gswarm = str(Path(sys.executable).with_name("gswarm"))
        env = {k: v for k, v in fleet_env.items() if k != "GSWARM_REDIS_URL"}
        redis_url = fleet_env["GSWARM_REDIS_URL"]
        p = Proc(
            "connect",
            [gswarm, "client", "connect", redis_url, "--node", "nodec", "--storage-root", str(root)],
            env,
            tmp_path,
        ).start()
        procs.append(p)
        info = wait_for(lambda: get_node(client, token, "nodec"), 20, "nodec registered via client connect")
        assert info["storage"]["disk"]["path"] == str(root.resolve())
        assert root.is_dir()
    finally:
        ctx.pop()
