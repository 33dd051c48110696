"""`/health`: database, broker and workers, answered without a token so probes can use it."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import redis
from flask import request
from flask.views import MethodView
from flask_smorest import Blueprint
from sqlalchemy import func, text

from gswarm_tasks import names

from ..control.nodes.state import status_clause
from ..extensions import db, redis_client, settings
from ..tables import Node
from .auth import identity_of

blp = Blueprint("health", __name__, url_prefix="/api/v1", description="Health of the control plane")

CONTROL_ALIVE_S = 15.0
NODE_STATUSES = ("healthy", "unhealthy", "offline")


def _timed(fn: Any, detailed: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        fn()
        return {"ok": True, "latency_ms": round((time.perf_counter() - t0) * 1000, 2)}
    except Exception as exc:  # its text (hosts, URLs) only for a token holder; anyone may ask this endpoint
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}"[:300] if detailed else type(exc).__name__,
        }


def _token_holder() -> bool:
    """Whether the caller sent a valid token (this endpoint answers without one, with less)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and bool(token.strip()) and identity_of(token.strip()) is not None


def health_report(detailed: bool = True) -> tuple[dict[str, Any], int]:
    """The control plane's health; `detailed` (a token holder's view) adds the control workers' names and the
    errors' text, the rest sees how many control workers answer."""
    s = settings()
    database = _timed(lambda: db.session.execute(text("SELECT 1")), detailed)
    broker = _timed(lambda: redis_client().ping(), detailed)
    control: list[str] = []
    if broker["ok"]:
        now = time.time()
        try:
            seen: dict[bytes, bytes] = redis_client().hgetall(names.CONTROL_ALIVE_KEY)  # type: ignore[assignment]
            control = sorted(k.decode() for k, v in seen.items() if now - float(v) < CONTROL_ALIVE_S)
        except redis.RedisError:
            pass
    nodes: Counter[str] = Counter()
    if database["ok"]:
        # counted in SQL: loading 1,000 nodes (and their GPUs) to count them took seconds of a web worker
        now_dt = datetime.now(UTC)
        counts = [
            func.count().filter(status_clause(st, now_dt, s.heartbeat_timeout_s, s.offline_after_s))
            for st in NODE_STATUSES
        ]
        row = db.session.execute(db.select(*counts).select_from(Node)).one()
        nodes.update(dict(zip(NODE_STATUSES, row, strict=True)))
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
            "control": control if detailed else len(control),
            "nodes": {s: nodes.get(s, 0) for s in NODE_STATUSES},
        },
    }
    return body, code


@blp.route("/health")
class Health(MethodView):
    @blp.response(200)
    @blp.alt_response(503, description="The database or the broker cannot be reached")
    def get(self) -> Any:
        """Health of database, broker, control workers and nodes (without a token: how many control workers, and
        each error's kind without its text)"""
        body, code = health_report(_token_holder())
        return body, code
