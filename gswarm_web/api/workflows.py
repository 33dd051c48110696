"""`/workflows`: submit YAML or JSON, inspect steps and the graph, cancel."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask import request
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.errors import InvalidRequest, NotFound

from ..control.dispatch import send_recorded
from ..extensions import db
from ..tables import TaskRecord, WorkflowRun
from ..workflows.cancel import cancel_workflow
from ..workflows.spec import load_document
from ..workflows.submit import check, collector_held, submit
from .pagination import PageArgsSchema, PageSchema, page_of

blp = Blueprint(
    "workflows", __name__, url_prefix="/api/v1", description="Workflows: YAML DAGs run by the fleet"
)

STATES = ("running", "succeeded", "failed", "cancelled")
STEP_STATUSES = ("pending", "queued", "running", "succeeded", "failed", "cancelled", "skipped")


class StepSchema(ma.Schema):
    action_id = ma.fields.String(attribute="step_id")
    action_type = ma.fields.String(attribute="kind")
    task_id = ma.fields.String(attribute="id")
    status = ma.fields.String(attribute="state", metadata={"enum": list(STEP_STATUSES)})
    node = ma.fields.String(allow_none=True)
    device = ma.fields.String(allow_none=True)
    source_device = ma.fields.String(allow_none=True)
    target_device = ma.fields.String(allow_none=True)
    placement = ma.fields.Function(
        lambda rec: (rec.params or {}).get("placement"),
        metadata={
            "description": "per field that was `auto` (or left out): the chosen device, candidates, reasons"
        },
    )
    priority = ma.fields.String()
    dependencies = ma.fields.List(ma.fields.String(), attribute="depends_on")
    chain = ma.fields.Integer(attribute="segment")
    attempts = ma.fields.Integer()
    started_at = ma.fields.DateTime(allow_none=True)
    finished_at = ma.fields.DateTime(allow_none=True)
    outputs = ma.fields.Dict(allow_none=True)
    error = ma.fields.Dict(allow_none=True)


class WorkflowSchema(ma.Schema):
    id = ma.fields.String()
    name = ma.fields.String()
    description = ma.fields.String(allow_none=True)
    status = ma.fields.String()
    fail_fast = ma.fields.Boolean()
    queue_config = ma.fields.Dict()
    error = ma.fields.Dict(allow_none=True)
    created_at = ma.fields.DateTime()
    started_at = ma.fields.DateTime(allow_none=True)
    finished_at = ma.fields.DateTime(allow_none=True)
    step_counts = ma.fields.Method("get_counts")

    def get_counts(self, run: WorkflowRun) -> dict[str, int]:
        rows = db.session.execute(
            db.select(TaskRecord.state, db.func.count())
            .where(TaskRecord.workflow_id == run.id)
            .group_by(TaskRecord.state)
        )
        return {status: int(n) for status, n in rows}


class WorkflowDetailSchema(WorkflowSchema):
    steps = ma.fields.Method("get_steps")

    def get_steps(self, run: WorkflowRun) -> list[dict[str, Any]]:
        return step_listing(run.id)


# StepSchema's fields, each as (the key, the column it reads, how the schema writes the value): the listing is built
# from these columns' rows, neither ORM objects nor a schema dump per step (10,000 steps: 2.3 -> 0.3 s of CPU).
_AS_TEXT, _AS_INT, _AS_TIME = "text", "int", "time"
_STEP_COLUMNS: tuple[tuple[str, Any, str | None], ...] = (
    ("action_id", TaskRecord.step_id, _AS_TEXT),
    ("action_type", TaskRecord.kind, _AS_TEXT),
    ("task_id", TaskRecord.id, _AS_TEXT),
    ("status", TaskRecord.state, _AS_TEXT),
    ("node", TaskRecord.node, _AS_TEXT),
    ("device", TaskRecord.device, _AS_TEXT),
    ("source_device", TaskRecord.source_device, _AS_TEXT),
    ("target_device", TaskRecord.target_device, _AS_TEXT),
    ("placement", TaskRecord.params["placement"], None),  # the key alone: the rest of params stays unparsed
    ("priority", TaskRecord.priority, _AS_TEXT),
    ("dependencies", TaskRecord.depends_on, "list"),
    ("chain", TaskRecord.segment, _AS_INT),
    ("attempts", TaskRecord.attempts, _AS_INT),
    ("started_at", TaskRecord.started_at, _AS_TIME),
    ("finished_at", TaskRecord.finished_at, _AS_TIME),
    ("outputs", TaskRecord.outputs, "dict"),
    ("error", TaskRecord.error, "dict"),
)


def _written(value: Any, how: str | None) -> Any:
    """A column's value as StepSchema's field writes it."""
    if value is None or how is None:
        return value
    if how == _AS_TEXT:
        return str(value)
    if how == _AS_INT:
        return int(value)
    if how == _AS_TIME:
        return value.isoformat()
    if how == "list":
        return [str(v) for v in value]
    return dict(value)


def step_listing(workflow_id: str) -> list[dict[str, Any]]:
    """Every step of a workflow as StepSchema dumps it, chain by chain, in order."""
    keys = [k for k, _, _ in _STEP_COLUMNS]
    hows = [h for _, _, h in _STEP_COLUMNS]
    rows = db.session.execute(
        db.select(*(c for _, c, _ in _STEP_COLUMNS))
        .where(TaskRecord.workflow_id == workflow_id)
        .order_by(TaskRecord.segment, TaskRecord.position)
    )
    return [{k: _written(v, h) for k, v, h in zip(keys, row, hows, strict=True)} for row in rows]


class WorkflowListArgsSchema(PageArgsSchema):
    status = ma.fields.String(validate=ma.validate.OneOf(STATES))
    name = ma.fields.String()


class WorkflowListSchema(PageSchema):
    workflows = ma.fields.List(ma.fields.Nested(WorkflowSchema))


def read_document() -> dict[str, Any]:
    """The workflow from the body: YAML or JSON, or a multipart `file`."""
    if request.files:
        f = request.files.get("file")
        if f is None:
            raise InvalidRequest("file: a multipart upload needs a `file` part", {"field": "file"})
        return load_document(f.read())
    data = request.get_data()
    if not data:
        raise InvalidRequest("document: the request has no body (send YAML or JSON)", {"field": "document"})
    return load_document(data)


def get_run(workflow_id: str, locked: bool = False) -> WorkflowRun:
    run = db.session.get(WorkflowRun, workflow_id, with_for_update=True if locked else None)
    if run is None:
        raise NotFound(f"no workflow {workflow_id!r}", {"workflow_id": workflow_id})
    return run


@blp.route("/workflows")
class Workflows(MethodView):
    @blp.arguments(WorkflowListArgsSchema, location="query")
    @blp.response(200, WorkflowListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """List workflows"""
        query = db.select(WorkflowRun).order_by(WorkflowRun.created_at.desc())
        if "status" in args:
            query = query.where(WorkflowRun.status == args["status"])
        if "name" in args:
            query = query.where(WorkflowRun.name == args["name"])
        return page_of("workflows", query, args)

    @blp.response(201, WorkflowSchema)
    @blp.doc(
        requestBody={
            "content": {
                "application/yaml": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "object"}},
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "properties": {"file": {"type": "string", "format": "binary"}},
                    }
                },
            }
        }
    )
    def post(self) -> WorkflowRun:
        """Submit a workflow (YAML, JSON or a multipart `file`); 422 names the action and field"""
        with collector_held():
            return submit(read_document())


@blp.route("/workflows/validate")
class WorkflowValidate(MethodView):
    @blp.response(200)
    def post(self) -> dict[str, Any]:
        """Validate a workflow without running it: every check a submission runs (the document, the fleet's nodes,
        the registry, sources, URLs, placement, chunks), the same 4xx it would get; `steps` says where each would
        run, `warnings` what would fail when it runs unless the fleet changes first (a GPU its node lacks)"""
        with collector_held():
            return check(read_document())


@blp.route("/workflows/<string:workflow_id>")
class WorkflowById(MethodView):
    @blp.response(200, WorkflowDetailSchema)
    def get(self, workflow_id: str) -> WorkflowRun:
        """A workflow with every step: status, node, device, attempts, times, outputs, error"""
        return get_run(workflow_id)


@blp.route("/workflows/<string:workflow_id>/graph")
class WorkflowGraph(MethodView):
    @blp.response(200)
    def get(self, workflow_id: str) -> dict[str, Any]:
        """Nodes and edges with their statuses, for drawing"""
        run = get_run(workflow_id)
        steps = list(db.session.scalars(db.select(TaskRecord).where(TaskRecord.workflow_id == run.id)))
        nodes = [
            {
                "id": s.step_id,
                "type": s.kind,
                "status": s.state,
                "node": s.node,
                "device": s.device,
                "chain": s.segment,
            }
            for s in steps
        ]
        edges = [{"from": d, "to": s.step_id} for s in steps for d in (s.depends_on or [])]
        return {"workflow_id": run.id, "status": run.status, "nodes": nodes, "edges": edges}


@blp.route("/workflows/<string:workflow_id>/cancel")
class WorkflowCancel(MethodView):
    @blp.response(200, WorkflowSchema)
    def post(self, workflow_id: str) -> WorkflowRun:
        """Cancel: pending steps never start, running ones are stopped"""
        run = get_run(workflow_id, locked=True)
        if run.status != "running":
            raise InvalidRequest(f"workflow {workflow_id} is already {run.status}", {"status": run.status})
        cancel_workflow(run, reason="cancelled by request")
        db.session.commit()
        send_recorded()  # the stops of serve steps that may have started their servers
        return run
