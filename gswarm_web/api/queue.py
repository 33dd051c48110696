"""`/queue/tasks/{id}`: the state, progress and outcome of one operation sent to the fleet."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import marshmallow as ma
import redis
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.errors import NotFound
from gswarm_tasks.reporting import read_progress

from ..control import task_state
from ..control.task_state import place
from ..extensions import db, redis_client
from ..tables import TaskRecord
from ..workflows.cancel import cancel_step
from .pagination import PageArgsSchema, PageSchema, page_of

blp = Blueprint("queue", __name__, url_prefix="/api/v1", description="Tasks sent to the fleet")


class ProgressSchema(ma.Schema):
    phase = ma.fields.String(allow_none=True)
    done_bytes = ma.fields.Integer(allow_none=True)
    total_bytes = ma.fields.Integer(allow_none=True)
    percent = ma.fields.Float(allow_none=True)


class TaskSchema(ma.Schema):
    task_id = ma.fields.String(attribute="id")
    kind = ma.fields.String()
    status = ma.fields.String(attribute="state")
    node = ma.fields.String(allow_none=True)
    priority = ma.fields.String()
    model_name = ma.fields.String(allow_none=True)
    service_id = ma.fields.String(allow_none=True)
    source_device = ma.fields.String(allow_none=True)
    target_device = ma.fields.String(allow_none=True)
    attempts = ma.fields.Integer()
    placement = ma.fields.Function(
        lambda rec: (rec.params or {}).get("placement"),
        metadata={"description": "where auto placed it, and why"},
    )
    progress = ma.fields.Method("get_progress")
    result = ma.fields.Dict(allow_none=True)
    error = ma.fields.Dict(allow_none=True)
    created_at = ma.fields.DateTime()
    started_at = ma.fields.DateTime(allow_none=True)
    finished_at = ma.fields.DateTime(allow_none=True)

    def get_progress(self, rec: TaskRecord) -> dict[str, Any]:
        try:
            live = read_progress(redis_client(), rec.id)
        except redis.RedisError:
            live = {}
        done = live.get("done")
        total = live.get("total")
        if rec.state == "succeeded" and total:
            done = total
        return {
            "phase": live.get("phase") or rec.state,
            "done_bytes": int(done) if done is not None else None,
            "total_bytes": int(total) if total is not None else None,
            "percent": round(100.0 * done / total, 1) if done is not None and total else None,
        }


def _place(rec: TaskRecord, key: str) -> Any:
    cached = rec.__dict__.get("_queue_place")  # one computation for the three fields
    if cached is None:
        cached = rec.__dict__["_queue_place"] = place(rec)
    return cached[key]


class QueuedTaskSchema(TaskSchema):
    """An operation as its start answers it: with its place in its node's queue (as the original's answer)."""

    position = ma.fields.Function(
        lambda rec: _place(rec, "position"),
        metadata={"description": "its place among its node's queued operations (1: next; 0: running)"},
    )
    estimated_start = ma.fields.Function(
        lambda rec: _place(rec, "estimated_start"),
        metadata={
            "description": "seconds until it should start, from its node's recent operations; null: unknown"
        },
    )
    estimated_time = ma.fields.Function(
        lambda rec: _place(rec, "estimated_time"),
        metadata={
            "description": "seconds it should take (its bytes at the node's recent rate, or recent durations)"
        },
    )


def get_task(task_id: str) -> TaskRecord:
    rec = db.session.get(TaskRecord, task_id)
    if rec is None:
        raise NotFound(f"no task {task_id!r}", {"task_id": task_id})
    return rec


@blp.route("/queue/tasks/<string:task_id>")
class TaskById(MethodView):
    @blp.response(200, QueuedTaskSchema)
    def get(self, task_id: str) -> TaskRecord:
        """One task: status, progress (bytes done / total), attempts, result or error"""
        return get_task(task_id)


ACTIVE_STATES = ("pending", "queued", "running")
ALL_STATES = ("pending", "queued", "running", "succeeded", "failed", "cancelled", "skipped")
# The original's status words: `completed` is gswarm's `succeeded`; its `pending` (not started) is `pending` or
# `queued` (a workflow step waiting for its dependencies, an operation waiting on its node).
ALIASES = {"completed": ("succeeded",), "pending": ("pending", "queued")}
FINISHED = ("succeeded", "failed", "cancelled", "skipped")


def states_of(status: str) -> tuple[str, ...]:
    return ALIASES.get(status, (status,))


class Since(ma.fields.Field):
    """A time as epoch seconds (a number, as the original's `since`) or ISO 8601 (UTC unless it says)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> datetime:
        text = str(value).strip()
        try:
            number = float(text)
        except ValueError:
            number = None
        if number is not None:
            if not math.isfinite(number) or not 0 <= number < 253402300800:  # up to the year 9999
                raise ma.ValidationError("epoch seconds between 0 and 253402300799")
            return datetime.fromtimestamp(number, UTC)
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ma.ValidationError(
                "epoch seconds (1700000000.5) or ISO 8601 (2025-01-31T12:00:00Z)"
            ) from exc
        return when if when.tzinfo else when.replace(tzinfo=UTC)


class TaskListArgsSchema(PageArgsSchema):
    status = ma.fields.String(
        validate=ma.validate.OneOf((*ALL_STATES, "completed")),
        metadata={
            "description": "a status; the original's `completed` (succeeded) and `pending` (not started)"
        },
    )
    node = ma.fields.String()
    workflow_id = ma.fields.String()
    kind = ma.fields.String()


class HistoryArgsSchema(ma.Schema):
    limit = ma.fields.Integer(load_default=50, validate=ma.validate.Range(min=1, max=1000))
    status = ma.fields.String(
        validate=ma.validate.OneOf((*FINISHED, "completed")),
        metadata={"description": "completed = succeeded"},
    )
    since = Since(
        metadata={
            "description": "only tasks that finished at or after it: epoch seconds (a number) or ISO 8601",
            "type": "string",
        }
    )


class TaskListSchema(PageSchema):
    tasks = ma.fields.List(ma.fields.Nested(TaskSchema))


@blp.route("/queue")
class Queue(MethodView):
    @blp.response(200)
    def get(self) -> dict[str, Any]:
        """Pending / running / completed counts per node and priority"""
        rows = db.session.execute(
            db.select(TaskRecord.node, TaskRecord.priority, TaskRecord.state, db.func.count()).group_by(
                TaskRecord.node, TaskRecord.priority, TaskRecord.state
            )
        )
        per_node: dict[str, dict[str, dict[str, int]]] = {}
        totals = {"pending": 0, "running": 0, "completed": 0, "failed": 0}
        for node, priority, state, n in rows:
            bucket = {
                "pending": "pending",
                "queued": "pending",
                "running": "running",
                "succeeded": "completed",
                "failed": "failed",
            }.get(state)
            if bucket is None:
                continue
            cell = per_node.setdefault(node or "-", {}).setdefault(
                priority or "normal", {"pending": 0, "running": 0, "completed": 0, "failed": 0}
            )
            cell[bucket] += int(n)
            totals[bucket] += int(n)
        return {"totals": totals, "nodes": per_node}


@blp.route("/queue/tasks")
class Tasks(MethodView):
    @blp.arguments(TaskListArgsSchema, location="query")
    @blp.response(200, TaskListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """Tasks, newest first (filters: status, node, workflow_id, kind)"""
        query = db.select(TaskRecord).order_by(TaskRecord.created_at.desc(), TaskRecord.id)
        if "status" in args:
            query = query.where(TaskRecord.state.in_(states_of(args["status"])))
        for key, col in (
            ("node", TaskRecord.node),
            ("workflow_id", TaskRecord.workflow_id),
            ("kind", TaskRecord.kind),
        ):
            if key in args:
                query = query.where(col == args[key])
        return page_of("tasks", query, args)


@blp.route("/queue/tasks/<string:task_id>/cancel")
class TaskCancel(MethodView):
    @blp.response(200, TaskSchema)
    def post(self, task_id: str) -> TaskRecord:
        """Cancel a pending or running task (a workflow step's dependents are skipped)"""
        rec = get_task(task_id)
        if rec.workflow_id:
            cancel_step(rec)
        else:
            task_state.cancel(rec)
        return rec


@blp.route("/queue/history")
class History(MethodView):
    @blp.arguments(HistoryArgsSchema, location="query")
    @blp.response(200, TaskListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """Finished tasks, most recent first (limit, status, since)"""
        query = db.select(TaskRecord).where(TaskRecord.finished_at.is_not(None))
        if "status" in args:
            query = query.where(TaskRecord.state.in_(states_of(args["status"])))
        if "since" in args:
            query = query.where(TaskRecord.finished_at >= args["since"])
        items = list(db.session.scalars(query.order_by(TaskRecord.finished_at.desc()).limit(args["limit"])))
        return {"tasks": items, "total": len(items), "page": 1, "per_page": args["limit"]}
