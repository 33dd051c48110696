"""What a node worker knows about itself (name, storage, address, services), and the free TCP ports on its address
(for replicas and the GPU holder); node tasks read it here."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ResourceUnavailable, TaskFailed
from .settings import Settings
from .storage import Tiers

if TYPE_CHECKING:  # the registry is serving's; the node worker makes it and hands it in
    from .serving.replicas import ServiceRegistry


def private_dir(path: Path, anchor: Path, device: str) -> Path:
    """`path` as a directory only this user can use: each part below `anchor` (which must exist) is made 0700 when
    missing (mkdir never follows a symlink) and checked with lstat; a symlink, a directory of another user or one
    open to group or others is refused with RESOURCE_UNAVAILABLE, never used or repaired."""
    details = {"device": device, "path": str(path)}
    try:
        rel = path.relative_to(anchor)
        top = os.stat(anchor)
    except (ValueError, OSError) as exc:
        raise ResourceUnavailable(f"{device} is not available: no tmpfs at {anchor}", details) from exc
    if not stat.S_ISDIR(top.st_mode):
        raise ResourceUnavailable(f"{device} is not available: {anchor} is not a directory", details)
    if top.st_mode & stat.S_IWOTH and not top.st_mode & stat.S_ISVTX:
        # Without the sticky bit anyone could rename our directory away and put theirs in its place.
        raise ResourceUnavailable(
            f"{device} is not available: {anchor} is writable by all users and not sticky", details
        )
    cur = anchor
    for part in rel.parts:
        cur = cur / part
        try:
            os.mkdir(cur, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ResourceUnavailable(
                f"{device} is not available: cannot create {cur}: {exc.strerror}", details
            ) from exc
        st = os.lstat(cur)
        problem = _not_private(st)
        if problem:
            raise ResourceUnavailable(
                f"{device} is not available: {cur} {problem}; the dram tier needs a directory private to uid"
                f" {os.geteuid()} (remove it, or set GSWARM_DRAM_ROOT)",
                {**details, "refused": str(cur)},
            )
    return path


def _not_private(st: os.stat_result) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}"
    if st.st_mode & 0o077:
        return f"has group or other permissions ({stat.S_IMODE(st.st_mode):04o})"
    return None


@dataclass(frozen=True)
class NodeTiers(Tiers):
    """A node's tiers whose `dram` root is checked to be private each time it is used (`private_dir`)."""

    dram_anchor: Path = Path("/dev/shm")

    def root(self, tier: str) -> Path:
        if tier == "dram":
            return private_dir(self.dram, self.dram_anchor, f"{self.node}:dram")
        return super().root(tier)

    def dram_available(self) -> bool:
        try:
            self.root("dram")
        except ResourceUnavailable:
            return False
        return True


@dataclass
class NodeContext:
    """The node this worker serves; set when the worker starts (`lifecycle`), read through `current_node()`."""

    name: str
    storage_root: Path
    dram_root: Path
    address: str
    worker: str
    tiers: NodeTiers
    services: ServiceRegistry
    file_port: int | None = None

    @classmethod
    def create(
        cls,
        settings: Settings,
        name: str,
        worker: str,
        address: str,
        services: Callable[[Path], ServiceRegistry],
    ) -> NodeContext:
        """The context of node `name`, its disk root made (the dram root is made on first use); `services` makes
        the registry of its replicas from the disk root."""
        storage_root = settings.effective_storage_root(name)
        dram_root = settings.effective_dram_root(name)
        tiers = NodeTiers(name, storage_root, dram_root, settings.effective_dram_anchor())
        storage_root.mkdir(parents=True, exist_ok=True)
        return cls(name, storage_root, dram_root, address, worker, tiers, services(storage_root))

    def dram_available(self) -> bool:
        """Whether the dram tier's root is (or could be made) a private directory of this user."""
        return self.tiers.dram_available()

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
