"""What runs on a GPU host: the Celery app, node tasks, storage and the NVML wrapper.

`celery -A gswarm_tasks worker -Q node1 -n node1@%h` starts a node worker.
"""

from __future__ import annotations

from . import data_tasks, model_tasks, tasks, worker, workflow_tasks  # noqa: F401  (registers node tasks and worker hooks)
from .celery_app import app

__all__ = ["app"]
