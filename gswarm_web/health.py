"""`/health`: database, broker and workers, answered without a token so probes can use it."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import redis
from flask import current_app
from flask.views import MethodView
from flask_smorest import Blueprint
from sqlalchemy import text

from gswarm_tasks import defaults

from .extensions import db
from .models import Node
from .registry import node_status

blp = Blueprint("health", __name__, url_prefix="/api/v1", description="Health of the control plane")

CONTROL_ALIVE_S = 15.0


def redis_client() -> redis.Redis:
    client = current_app.extensions.get("gswarm_redis")
    if client is None:
        url = current_app.config["GSWARM_SETTINGS"].effective_redis_url
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        current_app.extensions["gswarm_redis"] = client
    return client


def _timed(fn: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        fn()
        return {"ok": True, "latency_ms": round((time.perf_counter() - t0) * 1000, 2)}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


def health_report() -> tuple[dict[str, Any], int]:
    settings = current_app.config["GSWARM_SETTINGS"]
    database = _timed(lambda: db.session.execute(text("SELECT 1")))
    broker = _timed(lambda: redis_client().ping())
    control: list[str] = []
    if broker["ok"]:
        now = time.time()
        try:
            seen: dict[bytes, bytes] = redis_client().hgetall(defaults.CONTROL_ALIVE_KEY)  # type: ignore[assignment]
            control = sorted(k.decode() for k, v in seen.items() if now - float(v) < CONTROL_ALIVE_S)
        except redis.RedisError:
            pass
    nodes: Counter[str] = Counter()
    if database["ok"]:
        now_dt = datetime.now(UTC)
        for node in db.session.scalars(db.select(Node)):
            nodes[node_status(node, now_dt, settings.heartbeat_timeout_s, settings.offline_after_s)] += 1
    else:
        db.session.rollback()
    if not (database["ok"] and broker["ok"]):
        status, code = "unhealthy", 503
    elif not control:
        status, code = "degraded", 200
    else:
        status, code = "healthy", 200
    body = {
        "status": status,
        "time": datetime.now(UTC).isoformat(),
        "database": database,
        "broker": broker,
        "workers": {
            "control": control,
            "nodes": {s: nodes.get(s, 0) for s in ("healthy", "unhealthy", "offline")},
        },
    }
    return body, code


@blp.route("/health")
class Health(MethodView):
    @blp.response(200)
    @blp.alt_response(503, description="The database or the broker cannot be reached")
    def get(self) -> Any:
        """Health of database, broker, control workers and nodes"""
        body, code = health_report()
        return body, code
