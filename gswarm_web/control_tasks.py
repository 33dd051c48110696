"""Control tasks: bookkeeping that only the control worker (which alone holds database access) runs."""

from __future__ import annotations

from typing import Any

from celery import Task

from gswarm_tasks.celery_app import GswarmTask, app, settings_of


class ControlTask(GswarmTask):
    """Runs inside the Flask app context so tasks use the same models and session as the API."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .celery_app import flask_app

        with flask_app.app_context():
            return Task.__call__(self, *args, **kwargs)


@app.task(name="gswarm.control.sweep_nodes", base=ControlTask)
def sweep_nodes() -> list[list[str]]:
    """Record node status changes (healthy -> unhealthy -> offline) and log each one."""
    from .registry import sweep

    settings = settings_of(app)
    return [list(c) for c in sweep(settings.heartbeat_timeout_s, settings.offline_after_s)]


@app.task(name="gswarm.control.task_event", base=ControlTask)
def task_event(op_id: str, event: str, data: dict[str, Any]) -> None:
    """Record what a node task reported (started, phase, retrying, succeeded, failed)."""
    from .operations import apply_event

    apply_event(op_id, event, data)


@app.task(name="gswarm.control.workflow_sweep", base=ControlTask)
def workflow_sweep() -> int:
    """Send steps that were decided but never reached the broker (the dispatcher's outbox)."""
    from .workflows.engine import resend_undispatched

    return resend_undispatched()


@app.task(name="gswarm.control.data_gc", base=ControlTask)
def data_gc() -> dict[str, int]:
    """Collect unreferenced intermediate chunks past their TTL, then bring dram tiers under capacity."""
    from .data_pool import collect_garbage

    return collect_garbage()
