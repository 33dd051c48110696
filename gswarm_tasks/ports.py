"""Free TCP ports on the node's address: for replicas (serving) and the GPU holder (models)."""

from __future__ import annotations

import socket

from .errors import ResourceUnavailable


def port_free(host: str, port: int) -> bool:
    """Whether `port` is free for a new replica: nothing listens on it and no connection of an earlier server waits
    in TIME_WAIT there. A server could bind such a port (they set SO_REUSEADDR), but a replica on a fresh port has a
    fresh URL, which nothing kept for the old one (the gateway's pooled connections, the keys it read) can reach."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_bindable(host: str, port: int) -> bool:
    """Whether a server can bind `port` now (they set SO_REUSEADDR): nothing listens there; connections of an
    earlier server that wait in TIME_WAIT do not count. For a port the user named: it is free as soon as the
    replica that had it stopped."""
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
