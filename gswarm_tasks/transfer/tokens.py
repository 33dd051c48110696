"""Transfer tokens: an HMAC-signed claim that lets its holder read the files under one prefix of one node."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Any

import redis

from .. import names
from ..settings import Settings
from ..storage import prefix as storage_prefix


def transfer_secret(client: redis.Redis, configured: str | None) -> bytes:
    """The signing key: configured, else generated once and shared through Redis (which every node trusts)."""
    if configured:
        return configured.encode()
    client.set(names.TRANSFER_SECRET_KEY, secrets.token_hex(32), nx=True)
    value = client.get(names.TRANSFER_SECRET_KEY)
    assert value is not None
    return bytes(value) if not isinstance(value, str) else value.encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_token(secret: bytes, node: str, prefix: str, ttl_s: float) -> str:
    """A token that lets its holder read files under `prefix` (`disk/models/NAME`) of `node` until it expires."""
    body = _b64(json.dumps({"node": node, "prefix": prefix, "exp": time.time() + ttl_s}).encode())
    sig = _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())
    return f"{body}.{sig}"


def verify_token(secret: bytes, token: str, node: str, path: str) -> None:
    """Raise PermissionError unless `token` is genuine, unexpired, for this node and covers `path`."""
    try:
        body, sig = token.split(".", 1)
        want = _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(want, sig):
            raise PermissionError("bad signature")
        claims = json.loads(_unb64(body))
    except (ValueError, json.JSONDecodeError) as exc:
        raise PermissionError("malformed token") from exc
    if claims.get("exp", 0) < time.time():
        raise PermissionError("token expired")
    if claims.get("node") != node:
        raise PermissionError("token is for another node")
    prefix = str(claims.get("prefix", "")).strip("/")
    if not prefix or not (path == prefix or path.startswith(prefix + "/")):
        raise PermissionError("token does not cover this path")


def read_grant(
    client: redis.Redis, settings: Settings, source: dict[str, Any], kind: str, name: str
) -> tuple[str, str]:
    """(prefix, token) to read model or chunk `name` (`kind`: models or data) from the peer `source` names: signed
    on the reading node, for that one prefix and a few minutes, so no token travels in a task's arguments (where
    Flower and the broker would show it)."""
    prefix = storage_prefix(str(source["tier"]), kind, name)
    secret = transfer_secret(client, settings.transfer_secret)
    return prefix, sign_token(secret, str(source["node"]), prefix, settings.transfer_token_ttl_s)
