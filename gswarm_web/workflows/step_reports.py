"""Step reports into step rows: the intake's route for workflow steps.

A batch is applied in one transaction: each step's reports in the order its node sent them (a terminal status is
final), what a finished step made is recorded (model copies, services, chunks), dependents of a failed step are
skipped, and the chains that became ready are sent once the batch is committed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import defer

from ..control import task_state
from ..control.data import state as chunk_state
from ..control.report import Report
from ..control.serving import state as service_state
from ..extensions import db
from ..tables import TaskRecord, WorkflowRun
from .actions import DATA_ACTIONS, MODEL_ACTIONS
from .cancel import cancel_workflow
from .chains import TERMINAL, Sends, advance, send


def _at(value: Any) -> datetime | None:
    return datetime.fromtimestamp(float(value), UTC) if isinstance(value, int | float) else None


def _succeeded(s: TaskRecord, data: dict[str, Any], at: datetime) -> None:
    outputs = dict(data.get("outputs") or {})
    s.state, s.finished_at, s.error = "succeeded", at, None
    s.started_at = s.started_at or _at(data.get("started_at")) or at
    s.outputs = {k: v for k, v in outputs.items() if k != "manifest"}
    s.result = s.outputs
    if s.kind in MODEL_ACTIONS:
        task_state.record_result(s, outputs)
    elif s.kind in DATA_ACTIONS:
        chunk_state.record_step_chunk(s, outputs)


def apply(s: TaskRecord, r: Report) -> bool:
    """One report on one step; terminal states are final. Returns True when the step failed now."""
    if s.state in TERMINAL:
        if s.kind == "serve" and r.event == "succeeded":
            service_state.on_succeeded(s, r.data)  # it started after it was cancelled: stopped, not orphaned
        return False
    at = datetime.fromtimestamp(r.time, UTC)
    if r.event in ("started", "retrying", "succeeded", "failed"):
        s.attempts = max(s.attempts or 0, int(r.data.get("attempt") or 1))
    if r.event == "started":
        s.state, s.started_at = "running", s.started_at or at
    elif r.event == "retrying":
        s.error = r.data.get("error")
    elif r.event == "succeeded":
        _succeeded(s, r.data, at)
    elif r.event == "failed":
        s.state, s.finished_at, s.error = "failed", at, r.data.get("error")
        if s.kind == "serve":
            service_state.on_failed(s)
        return True
    elif r.event == "cancelled":
        s.state, s.finished_at = "cancelled", at
        if s.kind == "serve":
            service_state.serve_step_ended(s, sent=False)  # its node saw the mark before it started anything
    return False


def _apply_workflow(run: WorkflowRun, reports: list[Report]) -> Sends:
    # Only the reporting steps are loaded; the whole workflow only when something may change beyond them.
    touched = {
        s.id: s
        for s in db.session.scalars(db.select(TaskRecord).where(TaskRecord.id.in_({r.id for r in reports})))
    }
    failed = full = ended = False
    limit = bool((run.queue_config or {}).get("max_concurrent_tasks"))
    for r in reports:
        s = touched.get(r.id)
        if s is None:
            continue
        before = s.state
        failed |= apply(s, r)
        if s.state != before and s.state in TERMINAL:
            ended = True
            p = s.params or {}
            full |= s.state != "succeeded" or bool(p.get("fanout")) or (limit and bool(p.get("tail")))
    if failed and run.fail_fast and run.status == "running":
        cancel_workflow(run, None, reason="fail_fast: a step failed")
        full = True
    if not full and ended:
        db.session.flush()
        left = db.session.scalar(
            db.select(db.func.count())
            .select_from(TaskRecord)
            .where(TaskRecord.workflow_id == run.id, TaskRecord.state.not_in(TERMINAL))
        )
        full = not left
    if not full:
        return []
    db.session.flush()
    steps = {
        s.id: s for s in db.session.scalars(db.select(TaskRecord).where(TaskRecord.workflow_id == run.id))
    }
    return advance(run, steps)


def apply_reports(reports: list[Report]) -> Callable[[], None] | None:
    """The intake's route for step reports; returns the sending of the chains that became ready."""
    by_workflow: dict[str, list[Report]] = defaultdict(list)
    for r in reports:
        if r.workflow_id:
            by_workflow[r.workflow_id].append(r)
    sends: Sends = []
    for wf_id, evs in by_workflow.items():
        # The run is locked without its document (a large workflow's YAML would be decoded for every batch).
        run = db.session.get(WorkflowRun, wf_id, with_for_update=True, options=[defer(WorkflowRun.document)])
        if run is not None:
            sends.extend(_apply_workflow(run, evs))
    return (lambda: send(sends)) if sends else None
