"""A whole small fleet for model tests: Postgres, Redis, a control worker, two node workers, the real API."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import redis
from flask.testing import FlaskClient

from gswarm_tasks import names
from tests.harness.app import bearer, build_app, make_settings
from tests.harness.procs import Proc, celery_worker, wait_for
from tests.harness.redis_db import RedisDb, claim_redis_db
from tests.harness.services import PG_ADMIN


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class Fleet:
    """Processes and an API client; `api()` calls the app like an HTTP client would."""

    def __init__(
        self, tmp: Path, extra_env: dict[str, str] | None = None, redis_url: str | None = None
    ) -> None:
        """`redis_url`: a Redis of the caller's own (a server it restarts); without it the fleet claims a free database
        on the test Redis (redis_db.py) and releases it on close()."""
        self.redis_claim: RedisDb | None = None
        if redis_url is None:
            self.redis_claim = claim_redis_db()
            redis_url = self.redis_claim.url
        try:
            self._setup(tmp, extra_env, redis_url)
        except BaseException:
            if self.redis_claim is not None:
                self.redis_claim.release()
            raise

    def _setup(self, tmp: Path, extra_env: dict[str, str] | None, redis_url: str) -> None:
        self.tmp = tmp
        self.home = tmp / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.dram_base = Path("/dev/shm") / f"gswarm-test-{uuid.uuid4().hex[:8]}"
        self.dram_base.mkdir(parents=True)
        self.db_name = f"gswarm_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.db_name}"')
        base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
        self.redis_url = redis_url
        redis.Redis.from_url(self.redis_url).flushdb()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GSWARM_")}
        defaults = dict(
            GSWARM_HOME=str(self.home),
            GSWARM_CONFIG="",
            GSWARM_REDIS_URL=self.redis_url,
            GSWARM_DATABASE_URL=f"{base}/{self.db_name}",
            GSWARM_HEARTBEAT_INTERVAL="0.5",
            GSWARM_HEARTBEAT_TIMEOUT="5",
            GSWARM_OFFLINE_AFTER="60",
            GSWARM_QUEUE_RETRY_COUNT="4",
            GSWARM_QUEUE_TASK_TIMEOUT="600",
            GSWARM_QUEUE_VISIBILITY_TIMEOUT="1200",
            GSWARM_SERVE_CHECK_INTERVAL="1",
            GSWARM_SERVE_PORT_START=str(20000 + os.getpid() % 10000),
            PYTHONUNBUFFERED="1",
        )
        self.env.update({**defaults, **(extra_env or {})})
        self.settings = make_settings(
            self.home, **{k: v for k, v in self.env.items() if k.startswith("GSWARM_") and k != "GSWARM_HOME"}
        )
        self.app = build_app(self.settings)
        self.ctx = self.app.app_context()
        self.ctx.push()
        from gswarm_web.api.auth import create_token

        self.token = create_token("fleet", "admin")
        self.client: FlaskClient = self.app.test_client()
        self.procs: dict[str, Proc] = {}

    def serve_http(self) -> str:
        """Serve the API over real HTTP (for the CLI); returns its base URL."""
        import threading

        from werkzeug.serving import make_server

        self.http = make_server("127.0.0.1", 0, self.app, threaded=True)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.http.server_port}"

    def storage(self, node: str) -> Path:
        return self.home / "storage" / node

    def dram(self, node: str) -> Path:
        return self.dram_base / node

    def start(
        self, name: str, queue: str | None = None, app_module: str = "gswarm_tasks", **env: str
    ) -> Proc:
        node_env = {} if app_module != "gswarm_tasks" else {"GSWARM_DRAM_ROOT": str(self.dram(name))}
        p = celery_worker(app_module, queue or name, name, {**self.env, **node_env, **env}, self.tmp / "logs")
        self.procs[name] = p.start()
        p.wait_log("ready.", timeout=60)
        return p

    def start_beat(self) -> Proc:
        """Celery beat: the sweeps that run every few seconds (nodes, outbox, services, data collector)."""
        argv = [sys.executable, "-m", "celery", "-A", "gswarm_tasks", "beat", "--loglevel", "INFO"]
        p = Proc("beat", argv, self.env, self.tmp / "logs")
        self.procs["beat"] = p.start()
        p.wait_log("beat: Starting", timeout=60)
        return p

    def start_node(self, name: str, **env: str) -> Proc:
        p = self.start(name, **env)
        wait_for(
            lambda: self.get(f"/nodes/{name}")[0] == 200 and self.get(f"/nodes/{name}")[1]["file_port"],
            15,
            f"{name} registered with a file server",
        )
        return p

    def auth(self) -> dict[str, str]:
        return bearer(self.token)

    def redis_events(self, workflow_id: str) -> list[dict[str, Any]]:
        """Every step report of a workflow, from the reports stream (the control worker acks but never deletes)."""
        client = redis.Redis.from_url(self.redis_url)
        out = []
        for _eid, f in client.xrange(names.REPORTS_STREAM):
            doc = json.loads(f[b"event"])
            if doc["kind"] == names.REPORT_STEP and doc.get("workflow_id") == workflow_id:
                out.append({"task_id": doc["id"], "event": doc["event"]})
        return out

    def api(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        r = self.client.open(f"/api/v1{path}", method=method, headers=bearer(self.token), **kw)
        return r.status_code, r.get_json(silent=True)

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        from gswarm_web.extensions import db

        db.session.remove()  # see what the control worker committed
        return self.api("GET", path, **kw)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return self.api("POST", path, json=body)

    def wait_task(
        self, task_id: str, timeout: float = 60, states: tuple[str, ...] = ("succeeded", "failed")
    ) -> Any:
        def done() -> Any:
            code, body = self.get(f"/queue/tasks/{task_id}")
            return body if code == 200 and body["status"] in states else None

        return wait_for(done, timeout, f"task {task_id} to reach {states}")

    def register_and_download(self, name: str, source_url: str, device: str = "node1:disk") -> Any:
        code, body = self.post(
            "/models", {"model_name": name, "model_type": "embedding", "source_url": source_url}
        )
        assert code == 201, body
        code, body = self.post(f"/models/{name}/download", {"target_device": device})
        assert code == 202, body
        task = self.wait_task(body["task_id"], 120)
        assert task["status"] == "succeeded", task
        return task

    def close(self) -> None:
        try:
            if getattr(self, "http", None) is not None:
                self.http.shutdown()
            for p in reversed(list(self.procs.values())):
                p.stop()
            from gswarm_tasks.serving.replicas import ServiceRegistry

            for node in ("node1", "node2"):  # model servers outlive workers by design; not tests
                reg = ServiceRegistry(self.storage(node))
                for entry in reg.entries():
                    reg.stop(entry["service_id"], timeout_s=5)
            from gswarm_web.extensions import db

            db.session.remove()
            db.engine.dispose()
            self.ctx.pop()
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            shutil.rmtree(self.dram_base, ignore_errors=True)
            redis.Redis.from_url(self.redis_url).flushdb()
        finally:
            if self.redis_claim is not None:
                self.redis_claim.release()


@contextmanager
def running_fleet(
    tmp: Path, nodes: tuple[str, ...] = ("node1", "node2"), extra_env: dict[str, str] | None = None
) -> Iterator[Fleet]:
    """A fleet (on a Redis database of its own) with its control worker and node workers up, closed afterwards
    whatever happened."""
    f = Fleet(tmp, extra_env=extra_env)
    try:
        f.start("control", "control", app_module="gswarm_web.celery_app")
        for node in nodes:
            f.start_node(node)
        yield f
    finally:
        f.close()


def deadline(seconds: float) -> float:
    return time.monotonic() + seconds
