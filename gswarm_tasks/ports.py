"""Free TCP ports on the node's address: for replicas (serving) and the GPU holder (models)."""

from __future__ import annotations

import socket

from .errors import ResourceUnavailable


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
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
