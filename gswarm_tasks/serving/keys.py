"""The per-service key: made by the node when it starts a server, kept in Redis by the replica's URL for the gateway
(and a node's inference step), checked by the built-in server on every request but its health probe."""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import request

from .. import names
from ..errors import InvalidRequest, Unauthorized
from .engines import KEY_HEADER


def new_key() -> str:
    """A fresh per-service secret."""
    return secrets.token_urlsafe(32)


def write_key(key_file: Path, key: str) -> None:
    """Write `key` where only this user reads it (the built-in server's --key-file); a new file each time."""
    key_file.unlink(missing_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)


def publish_key(client: Any, url: str, key: str | None) -> None:
    """Record a replica's key where the gateway (and a node's inference step) find it: by its URL, in Redis."""
    if key:
        client.hset(names.SERVICE_KEYS_KEY, url, key)


def forget_key(client: Any, url: str | None, key: str | None) -> None:
    """Remove a stopped replica's key (only its own: a later server may hold the same URL by then)."""
    if url is None or key is None:
        return
    script = "if redis.call('hget', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('hdel', KEYS[1], ARGV[1]) end"
    client.eval(script, 1, names.SERVICE_KEYS_KEY, url, key)


def read_key(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def key_for(client: Any, url: str) -> str | None:
    """The key of the replica at `url` (scheme://host:port, any path after it ignored), if one is recorded."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    value = client.hget(names.SERVICE_KEYS_KEY, f"{parts.scheme}://{parts.netloc}")
    return value.decode() if isinstance(value, bytes) else value


def require_key(key: str | None) -> Callable[[], None]:
    """Every request but the health probe carries the service's key (the gateway sends it; nobody else has it)."""

    def check() -> None:
        if key is None or request.path == "/health":
            return
        given = request.headers.get(KEY_HEADER, "")
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise Unauthorized(
                f"{KEY_HEADER}: this server answers the gswarm gateway only", {"header": KEY_HEADER}
            )

    return check


def read_key_file(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise InvalidRequest(
            f"--key-file: cannot read {path}: {exc.strerror}", {"field": "key_file"}
        ) from None
    if not key:
        raise InvalidRequest(f"--key-file: {path} is empty", {"field": "key_file"})
    return key
