"""What a node worker knows about itself (name, storage, address, services); node tasks read it here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import TaskFailed
from .serving import ServiceRegistry
from .storage import Tiers


@dataclass
class NodeContext:
    """The node this worker serves; set when the worker starts (`lifecycle`), read through `current_node()`."""

    name: str
    storage_root: Path
    dram_root: Path
    address: str
    worker: str
    tiers: Tiers
    services: ServiceRegistry
    file_port: int | None = None

    def file_server_port(self) -> int | None:
        """The file server's port: pool processes forked before it started read what the worker wrote."""
        if self.file_port:
            return self.file_port
        try:
            return int((self.storage_root / FILE_PORT_FILE).read_text())
        except (OSError, ValueError):
            return None


FILE_PORT_FILE = ".file-port"
_node: NodeContext | None = None


def set_node(node: NodeContext | None) -> None:
    global _node
    _node = node


def current_node() -> NodeContext | None:
    return _node


def require_node() -> NodeContext:
    if _node is None:
        raise TaskFailed("this worker is not a node worker (start it with -Q NODE -n NODE@%h)")
    return _node
