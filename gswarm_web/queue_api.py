"""`/queue/tasks/{id}`: the state, progress and outcome of one operation sent to the fleet."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
import redis
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.ops import read_progress

from .extensions import db
from .health import redis_client
from .models import TaskRecord

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


@blp.route("/queue/tasks/<string:task_id>")
class TaskById(MethodView):
    @blp.response(200, TaskSchema)
    def get(self, task_id: str) -> TaskRecord:
        """One task: state, progress (bytes done / total), attempts, result or error"""
        from gswarm_tasks.errors import NotFound

        rec = db.session.get(TaskRecord, task_id)
        if rec is None:
            raise NotFound(f"no task {task_id!r}", {"task_id": task_id})
        return rec
