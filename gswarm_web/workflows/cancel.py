"""Cancelling a workflow or one of its steps: pending steps never start, running ones are stopped, dependents are
skipped. The mark lives in Redis, so it survives restarts and stops a step that was already sent."""

from __future__ import annotations

import json
import logging
from typing import Any

from gswarm_tasks import names
from gswarm_tasks.errors import Conflict, InvalidRequest

from ..control.dispatch import send_recorded
from ..control.serving import state as service_state
from ..extensions import db, redis_client, sender
from ..tables import TaskRecord, WorkflowRun
from ..tables import utcnow as now
from .chains import advance, send

log = logging.getLogger(__name__)

LIVE = ("pending", "queued", "running")


def _revoke(task_ids: list[str]) -> None:
    if task_ids:
        try:
            sender().control.revoke(
                [*task_ids, *_messages_running(task_ids)], terminate=True, signal="SIGTERM"
            )
        except Exception as exc:  # the Redis mark still stops them
            log.warning("revoke of %d step(s) failed: %s", len(task_ids), exc)


def _messages_running(task_ids: list[str]) -> list[str]:
    """The messages that run one of these steps now after their own (gswarm_tasks/workflows/inline.py): a node knows
    such a step by its message's id only. A message that has gone on to a step not cancelled is left alone."""
    client = redis_client()
    found: list[Any] = client.mget([names.inline_message_key(t) for t in task_ids])
    outers = {o.decode() if isinstance(o, bytes) else str(o) for o in found if o}
    if not outers:
        return []
    wanted = set(task_ids)
    runs = client.mget([names.inline_step_key(o) for o in outers])
    return [
        o for o, run in zip(outers, runs, strict=True) if run and json.loads(run).get("task_id") in wanted
    ]


def cancel_workflow(
    run: WorkflowRun, steps: dict[str, TaskRecord] | None = None, reason: str = "cancelled"
) -> None:
    """Cancel every step that has not ended (the caller commits)."""
    redis_client().set(names.cancel_workflow_key(run.id), reason, ex=names.KEEP_S)
    if steps is None:
        steps = {
            s.id: s for s in db.session.scalars(db.select(TaskRecord).where(TaskRecord.workflow_id == run.id))
        }
    running = []
    for s in steps.values():
        if s.state in LIVE:
            sent = s.state in ("queued", "running")
            if sent:
                running.append(s.id)
            s.state, s.finished_at = "cancelled", now()
            if s.kind == "serve":
                service_state.serve_step_ended(s, sent)
    _revoke(running)
    if run.status == "running":
        run.status, run.finished_at = "cancelled", now()
        run.error = Conflict(reason).to_dict()


def cancel_step(rec: TaskRecord) -> None:
    """Cancel one step: its dependents are skipped, the rest of the workflow goes on (commits)."""
    # Lock order as in the intake (workflow row, then its steps), or the two deadlock.
    run = db.session.get(WorkflowRun, rec.workflow_id, with_for_update=True)
    db.session.refresh(rec)
    if rec.state not in LIVE:
        raise InvalidRequest(f"task {rec.id} is already {rec.state}", {"status": rec.state})
    redis_client().set(names.cancel_task_key(rec.id), "cancelled", ex=names.KEEP_S)
    sent = rec.state in ("queued", "running")
    if sent:
        _revoke([rec.id])
    rec.state, rec.finished_at = "cancelled", now()
    if rec.kind == "serve":
        service_state.serve_step_ended(rec, sent)
    sends = []
    if run is not None:
        steps = {
            s.id: s for s in db.session.scalars(db.select(TaskRecord).where(TaskRecord.workflow_id == run.id))
        }
        sends = advance(run, steps)
    db.session.commit()
    send_recorded()
    send(sends)
