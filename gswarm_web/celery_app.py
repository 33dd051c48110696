"""The control worker's Celery entry point: `celery -A gswarm_web.celery_app worker -Q control`."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_process_init

from gswarm_tasks import app as celery
from gswarm_tasks.celery_app import settings_of

from . import (
    control_tasks,  # noqa: F401  (registers control tasks)
    create_app,
)
from .consumers import ControlConsumersStep

flask_app = create_app(settings_of(celery))
celery.steps["worker"].add(ControlConsumersStep)


@worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    # A forked pool child must not reuse the parent's database connections.
    from .extensions import db

    with flask_app.app_context():
        db.engine.dispose(close=False)


__all__ = ["celery", "flask_app"]
