"""Free TCP ports on the node's address: for replicas (serving) and the GPU holder (models)."""

from __future__ import annotations

import socket

from .errors import ResourceUnavailable


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on `port` now. Servers bind with SO_REUSEADDR (werkzeug, uvicorn), so a port
    whose last connections wait in TIME_WAIT (a keep-alive server that closed them on exit) is free; on Linux the
    option never lets two listen on one port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str, start: int, taken: set[int]) -> int:
    for port in range(start, start + 1000):
        if port not in taken and port_free(host, port):
            return port
    raise ResourceUnavailable(f"no free port from {start} on {host}")
