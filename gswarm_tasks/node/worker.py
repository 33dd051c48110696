"""The node worker: the Celery app with every node task and the worker's lifecycle hooks registered.

`celery -A gswarm_tasks worker -Q node1 -n node1@%h` loads this module (through `gswarm_tasks.app`). The tasks
here are the spine's own: liveness and self-description.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from .. import names
from ..celery_app import NodeTask, app
from ..context import current_node
from ..data import tasks as data_tasks  # noqa: F401  (registers the data tasks)
from ..models import tasks as model_tasks  # noqa: F401  (registers the model tasks)
from ..serving import tasks as service_tasks  # noqa: F401  (registers the service tasks)
from ..workflows import step_task  # noqa: F401  (registers the workflow step task)
from . import lifecycle  # noqa: F401  (connects the worker's start, failure and shutdown hooks)
from .heartbeat import node_info


def _here() -> dict[str, Any]:
    node = current_node()
    return {"node": node.name if node else None, "hostname": socket.gethostname(), "pid": os.getpid()}


@app.task(name=names.NODE_PING, base=NodeTask)
def ping() -> dict[str, Any]:
    """Answer from the node that ran it: proves routing and liveness."""
    return {**_here(), "time": time.time()}


@app.task(name=names.NODE_INFO, base=NodeTask)
def info() -> dict[str, Any]:
    """This node's current info, as its heartbeat reports it."""
    node = current_node()
    if node is None:
        return _here()
    return node_info(node.name, node.storage_root, node.dram_root, node.address)


__all__ = ["app"]
