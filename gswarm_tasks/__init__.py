"""What runs on a GPU host: the Celery app, node tasks, storage tiers, transfers and the NVML wrapper.

`celery -A gswarm_tasks worker -Q node1 -n node1@%h` starts a node worker. Importing a module of this package
(say `gswarm_tasks.devices`) loads nothing else: the app with its tasks and hooks is built when `app` is asked for.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from .node.worker import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
