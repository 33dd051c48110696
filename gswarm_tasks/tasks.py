"""Node tasks of the spine: liveness and self-description. Each is a thin wrapper over a plain function."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from .celery_app import NodeTask, app
from .node import node_info
from .worker import current_node


def _here() -> dict[str, Any]:
    node = current_node()
    return {"node": node.name if node else None, "hostname": socket.gethostname(), "pid": os.getpid()}


@app.task(name="gswarm.node.ping", base=NodeTask)
def ping() -> dict[str, Any]:
    """Answer from the node that ran it: proves routing and liveness."""
    return {**_here(), "time": time.time()}


@app.task(name="gswarm.node.info", base=NodeTask)
def info() -> dict[str, Any]:
    """This node's current info, as its heartbeat reports it."""
    node = current_node()
    if node is None:
        return _here()
    return node_info(node.name, node.storage_root, node.dram_root, node.address)
