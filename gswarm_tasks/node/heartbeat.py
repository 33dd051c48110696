"""What a node worker says about itself, and the heartbeat thread that says it to the control plane."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil
import redis

from .. import names
from ..profiling.nvml import GpuSource, list_gpus

log = logging.getLogger(__name__)

try:
    from importlib.metadata import version as _pkg_version

    VERSION = _pkg_version("gswarm")
except Exception:  # running from a source tree that was never installed
    VERSION = "0+unknown"


def route_address(redis_url: str) -> str:
    """The local address that routes to the broker; no packet is sent."""
    host = urlparse(redis_url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def disk_usage(path: Path) -> dict[str, Any] | None:
    try:
        u = psutil.disk_usage(str(path))
    except OSError:
        return None
    return {"path": str(path), "total_bytes": u.total, "used_bytes": u.used, "free_bytes": u.free}


def node_info(
    node: str,
    storage_root: Path,
    dram_root: Path | None,
    address: str,
    gpu_source: GpuSource | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A snapshot of this host as the node registry records it (all numbers in bytes / percent)."""
    vm = psutil.virtual_memory()
    storage: dict[str, Any] = {"disk": disk_usage(storage_root)}
    if dram_root is not None and dram_root.parent.exists():
        storage["dram"] = disk_usage(dram_root if dram_root.exists() else dram_root.parent)
    info = {
        "node": node,
        "hostname": socket.gethostname(),
        "address": address,
        "pid": os.getpid(),
        "version": VERSION,
        "cpu_count": psutil.cpu_count() or 0,
        "cpu_percent": psutil.cpu_percent(interval=None),
        "dram_total_bytes": vm.total,
        "dram_available_bytes": vm.available,
        "storage": storage,
        "gpus": list_gpus(gpu_source),
    }
    if extra:
        info.update(extra)
    return info


class Heartbeat:
    """Appends this node's info to the heartbeat stream every `interval_s`, on its own thread.

    The stream entry id (Redis server time) becomes `last_seen`, so node clocks never matter.
    """

    def __init__(
        self,
        client: redis.Redis,
        node: str,
        storage_root: Path,
        dram_root: Path | None,
        address: str,
        interval_s: float,
        extra: dict[str, Any] | None = None,
        stats: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.client = client
        self.node = node
        self.storage_root = storage_root
        self.dram_root = dram_root
        self.address = address
        self.interval_s = interval_s
        self.extra = dict(extra or {})
        self.stats = stats  # numbers that change between beats (frames dropped)
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def payload(self, state: str) -> dict[str, Any]:
        extra = {**self.extra, "state": state, "started_at": self.started_at, "sent_at": time.time()}
        if self.stats is not None:
            extra.update(self.stats())
        return node_info(self.node, self.storage_root, self.dram_root, self.address, extra=extra)

    def beat(self, state: str = "up") -> bool:
        try:
            self.client.xadd(
                names.HEARTBEAT_STREAM,
                {"node": self.node, "data": json.dumps(self.payload(state))},
                maxlen=names.HEARTBEAT_MAXLEN,
                approximate=True,
            )
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("heartbeat of %s failed, will keep trying: %s", self.node, exc)
            self._failing = True
            return False
        if self._failing:
            log.info("heartbeat of %s delivered again", self.node)
        self._failing = False
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.beat()
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self.storage_root.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name=f"gswarm-heartbeat-{self.node}", daemon=True)
        self._thread.start()

    def stop(self, announce: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1)
        if announce:
            self.beat("stopped")
