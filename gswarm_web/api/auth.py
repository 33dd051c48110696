"""Bearer-token auth: `admin` (anything), `read-only` (reads), `inference` (the gateway at /v1 and nothing else);
only token hashes are stored. A valid token is remembered for a few seconds per process, so a gateway request
costs no database round trip; a revoked one stops working everywhere within that time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from datetime import UTC, datetime
from typing import NamedTuple

from flask import Flask, current_app, g, request

from gswarm_tasks.errors import ConfigError, Forbidden, InvalidRequest, Unauthorized
from gswarm_tasks.settings import ADMIN_TOKEN_MIN_CHARS

from ..extensions import db
from ..tables import ApiToken

ROLES = ("admin", "read-only", "inference")
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
GATEWAY = "gateway"  # the blueprint of /v1
CACHE_S = 5.0
_known: dict[str, tuple[float, Identity]] = {}
_known_lock = threading.Lock()
# Reachable without a token: liveness for load balancers, the API's own description, and the dashboard's files
# (its page asks for a token and sends it with every API call).
PUBLIC_ENDPOINTS = frozenset(
    {
        "api-docs.openapi_json",
        "api-docs.openapi_swagger_ui",
        "health.Health",
        "static",
        "dashboard.index",
        "dashboard.static",
        "events.events",  # the WebSocket authenticates itself: a browser sends its token in the first message
    }
)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Identity(NamedTuple):
    """Who a valid token is: its role, its name, and for an inference token scoped to models, those models."""

    role: str
    name: str
    models: tuple[str, ...] | None = None

    def may_call(self, model: str) -> bool:
        return self.models is None or model in self.models


def create_token(name: str, role: str = "admin", models: list[str] | None = None) -> str:
    """Make a token, store its hash, and return the token itself (shown once). `models` scopes an inference token
    to those models (the gateway refuses the others, /v1/models lists only them)."""
    if role not in ROLES:
        raise InvalidRequest(f"role: must be one of {', '.join(ROLES)}", {"field": "role", "value": role})
    if models is not None and role != "inference":
        raise InvalidRequest("models: only an inference token is scoped to models", {"field": "models"})
    token = "gsw_" + secrets.token_urlsafe(32)
    scope = sorted(set(models)) if models is not None else None
    db.session.add(
        ApiToken(name=name, role=role, token_hash=hash_token(token), prefix=token[:10], models=scope)
    )
    db.session.commit()
    return token


def long_enough(token: str, role: str) -> bool:
    """An admin token has at least ADMIN_TOKEN_MIN_CHARS characters; the others are generated."""
    return role != "admin" or len(token) >= ADMIN_TOKEN_MIN_CHARS


def ensure_token(name: str, token: str, role: str = "admin") -> None:
    """Record `token` (for instance one read from a token file) if it is not known yet."""
    if not long_enough(token, role):
        raise InvalidRequest(
            f"token: an {role} token needs at least {ADMIN_TOKEN_MIN_CHARS} characters, this one has {len(token)}",
            {"field": "token", "name": name},
        )
    h = hash_token(token)
    if db.session.execute(db.select(ApiToken.id).where(ApiToken.token_hash == h)).first() is None:
        db.session.add(ApiToken(name=name, role=role, token_hash=h, prefix=token[:10]))
        db.session.commit()


def identity_of(token: str) -> Identity | None:
    """Who a valid token is; None for an unknown or revoked one."""
    fixed = current_app.config.get("GSWARM_ADMIN_TOKEN")
    # A short fixed token is refused at start-up; one set later (straight into the config) is still never accepted.
    if (
        fixed
        and long_enough(str(fixed), "admin")
        and hmac.compare_digest(token.encode(), str(fixed).encode())
    ):
        return Identity("admin", "admin-token")
    key = hash_token(token)
    with _known_lock:
        hit = _known.get(key)
    if hit is not None and hit[0] > time.monotonic():
        return hit[1]
    row = db.session.execute(
        db.select(ApiToken.role, ApiToken.name, ApiToken.revoked_at, ApiToken.models).where(
            ApiToken.token_hash == key
        )
    ).first()
    if row is None or row.revoked_at is not None:
        return None
    ident = Identity(str(row.role), str(row.name), tuple(row.models) if row.models is not None else None)
    with _known_lock:
        if len(_known) > 10_000:
            _known.clear()
        _known[key] = (time.monotonic() + CACHE_S, ident)
    return ident


def revoke_token(prefix: str) -> int:
    rows = db.session.scalars(
        db.select(ApiToken).where(ApiToken.prefix == prefix, ApiToken.revoked_at.is_(None))
    )
    n = 0
    for row in rows:
        row.revoked_at = datetime.now(UTC)
        n += 1
        with _known_lock:
            _known.pop(row.token_hash, None)
    db.session.commit()
    return n


def init_auth(app: Flask) -> None:
    fixed = app.config.get("GSWARM_ADMIN_TOKEN")
    if fixed and not long_enough(str(fixed), "admin"):
        raise ConfigError(
            f"GSWARM_ADMIN_TOKEN has {len(str(fixed))} characters; an admin token needs at least"
            f" {ADMIN_TOKEN_MIN_CHARS} (for example `openssl rand -hex 24`)",
            {"field": "GSWARM_ADMIN_TOKEN"},
        )

    @app.before_request
    def _authenticate() -> None:
        if not app.config.get("GSWARM_AUTH", True) or request.endpoint in PUBLIC_ENDPOINTS:
            return
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        ident = identity_of(token.strip())
        if ident is None:
            raise Unauthorized("the bearer token is not valid")
        g.role, g.token_name, g.token_models = ident
        g.token_hash = hash_token(token.strip())
        _authorize(g.role)


def _authorize(role: str) -> None:
    """admin: anything; read-only: reads; inference: the gateway and nothing else."""
    gateway = request.blueprint == GATEWAY
    if role == "inference" and not gateway:
        raise Forbidden(
            f"an inference token may only call the gateway (/v1), not {request.path}", {"role": role}
        )
    if role == "read-only" and request.method not in READ_METHODS:
        raise Forbidden(f"a {role} token cannot {request.method} {request.path}", {"role": role})
