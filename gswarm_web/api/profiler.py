"""`/profiler/sessions`, `/metrics/latest` and `/metrics` (Prometheus, with DCGM exporter names)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import marshmallow as ma
from flask import Response
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.errors import Conflict, InvalidRequest, NotFound

from ..control.frames import latest_frames
from ..control.metrics import prometheus_text
from ..control.session_state import document, frame_counts, get_session, publish, unpublish
from ..extensions import db, redis_client
from ..plots import render, step_spans
from ..tables import Node, ProfilerSession, TaskRecord

TEXT = {"text/plain": {"schema": {"type": "string"}}}
FIGURE = {kind: {"schema": {"type": "string", "format": "binary"}} for kind in ("image/png", "application/pdf")}

blp = Blueprint("profiler", __name__, url_prefix="/api/v1", description="GPU profiling sessions and metrics")
root = Blueprint("prometheus", __name__, url_prefix="/", description="Prometheus' default scrape path")


class SessionCreateSchema(ma.Schema):
    name = ma.fields.String(required=True, validate=ma.validate.Regexp(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"))
    freq_ms = ma.fields.Integer(load_default=1000, validate=ma.validate.Range(min=100, max=3_600_000))
    nodes = ma.fields.List(ma.fields.String(), load_default=list)
    enable_bandwidth = ma.fields.Boolean(load_default=True)
    enable_nvlink = ma.fields.Boolean(load_default=False)


class SessionSchema(ma.Schema):
    name = ma.fields.String()
    status = ma.fields.String(attribute="state", metadata={"enum": ["active", "stopped"]})
    freq_ms = ma.fields.Integer()
    nodes = ma.fields.List(ma.fields.String())
    enable_bandwidth = ma.fields.Boolean()
    enable_nvlink = ma.fields.Boolean()
    start_time = ma.fields.DateTime()
    end_time = ma.fields.DateTime(allow_none=True)
    frame_count = ma.fields.Integer(allow_none=True, metadata={"description": "frames with GPU readings"})
    host_frame_count = ma.fields.Integer(allow_none=True, metadata={"description": "host readings (every frame)"})
    summary_by_device = ma.fields.Dict(allow_none=True)
    summary_by_node = ma.fields.Dict(allow_none=True)


class RecordSchema(ma.Schema):
    app = ma.fields.String(required=True)
    queue_time = ma.fields.Float(required=True, validate=ma.validate.Range(min=0))
    processing_time = ma.fields.Float(required=True, validate=ma.validate.Range(min=0))


@blp.route("/profiler/sessions")
class Sessions(MethodView):
    @blp.response(200, SessionSchema(many=True))
    def get(self) -> list[ProfilerSession]:
        """Every session, newest first"""
        return list(db.session.scalars(db.select(ProfilerSession).order_by(ProfilerSession.start_time.desc())))

    @blp.arguments(SessionCreateSchema)
    @blp.response(201, SessionSchema)
    def post(self, args: dict[str, Any]) -> ProfilerSession:
        """Start a session (several may overlap; each sees exactly its own window)"""
        if db.session.get(ProfilerSession, args["name"]) is not None:
            raise Conflict(f"name: a session {args['name']!r} exists", {"field": "name"})
        known = set(db.session.scalars(db.select(Node.name)))
        for n in args["nodes"]:
            if n not in known:
                raise NotFound(f"nodes: node {n!r} is not registered", {"field": "nodes", "node": n})
        s = ProfilerSession(
            name=args["name"],
            freq_ms=args["freq_ms"],
            nodes=args["nodes"],
            enable_bandwidth=args["enable_bandwidth"],
            enable_nvlink=args["enable_nvlink"],
            start_time=datetime.now(UTC),
            state="active",
            request_time_info=[],
        )
        db.session.add(s)
        db.session.commit()
        publish(s)
        return s


@blp.route("/profiler/sessions/<string:name>")
class SessionByName(MethodView):
    @blp.response(200, SessionSchema)
    def get(self, name: str) -> Any:
        """A session: status, frame count, summaries (computed live for an active one)"""
        s = get_session(name)
        if s.state != "active":
            return s
        doc = document(s)
        out = {key: getattr(s, key) for key in (f.attribute or n for n, f in SessionSchema().fields.items())}
        out.update(
            frame_count=frame_counts(doc)[0],
            host_frame_count=frame_counts(doc)[1],
            summary_by_device=doc["summary_by_device"],
            summary_by_node=doc["summary_by_node"],
        )
        return out


@blp.route("/profiler/sessions/<string:name>/stop")
class SessionStop(MethodView):
    @blp.response(200, SessionSchema)
    def post(self, name: str) -> ProfilerSession:
        """Stop a session: its summary per device and node is computed and kept"""
        s = db.session.get(ProfilerSession, name, with_for_update=True)
        if s is None:
            raise NotFound(f"no profiling session {name!r}", {"name": name})
        if s.state != "active":
            raise InvalidRequest(f"session {name} is already {s.state}", {"status": s.state})
        s.end_time, s.state = datetime.now(UTC), "stopped"
        unpublish(name)
        doc = document(s)
        s.frame_count, s.host_frame_count = frame_counts(doc)
        s.summary_by_device, s.summary_by_node = doc["summary_by_device"], doc["summary_by_node"]
        db.session.commit()
        return s


@blp.route("/profiler/sessions/<string:name>/export")
class SessionExport(MethodView):
    @blp.response(200)
    def get(self, name: str) -> dict[str, Any]:
        """The session's GPU readings (`frames`), host readings (`host_frames`), summaries and the workflow steps
        that ran in its window (`steps`), as JSON"""
        s = get_session(name)
        doc = document(s)
        doc["request_time_info"] = s.request_time_info
        doc["steps"] = step_spans(steps_until(s.end_time), s.start_time, s.end_time)
        return doc


@blp.route("/profiler/sessions/<string:name>/record")
class SessionRecord(MethodView):
    @blp.arguments(RecordSchema)
    @blp.response(201)
    def post(self, args: dict[str, Any], name: str) -> dict[str, Any]:
        """Record one request's timings (app, queue_time, processing_time) in the session"""
        s = get_session(name)
        entry = {**args, "time": datetime.now(UTC).timestamp()}
        s.request_time_info = [*(s.request_time_info or []), entry]
        db.session.commit()
        return entry


@blp.route("/profiler/recover")
class SessionRecover(MethodView):
    @blp.response(200, SessionSchema(many=True))
    def post(self) -> list[ProfilerSession]:
        """Publish every active session to the nodes again (after Redis lost them)"""
        active = list(db.session.scalars(db.select(ProfilerSession).where(ProfilerSession.state == "active")))
        for s in active:
            publish(s)
        return active


@blp.route("/metrics/latest")
class MetricsLatest(MethodView):
    @blp.response(200)
    def get(self) -> dict[str, Any]:
        """The newest frame of every node"""
        frames = latest_frames(redis_client())
        now = datetime.now(UTC).timestamp()
        return {"nodes": {n: {**f, "age_s": round(now - float(f["time"]), 3)} for n, f in sorted(frames.items())}}


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the text format every Prometheus takes, 3.x included


def _prometheus() -> Response:
    return Response(prometheus_text(latest_frames(redis_client())), content_type=CONTENT_TYPE)


@blp.route("/metrics")
class Metrics(MethodView):
    @blp.doc(responses={"200": {"description": "Prometheus text exposition format", "content": TEXT}})
    def get(self) -> Response:
        """Prometheus text format; GPU gauges named and labelled as NVIDIA's DCGM exporter does"""
        return _prometheus()


@root.route("/metrics")
class RootMetrics(MethodView):
    @root.doc(responses={"200": {"description": "Prometheus text exposition format", "content": TEXT}})
    def get(self) -> Response:
        """The same as `/api/v1/metrics`, where Prometheus looks by default (`metrics_path: /metrics`)"""
        return _prometheus()


def steps_until(end: datetime | None) -> list[TaskRecord]:
    """Workflow steps that started before `end` (now for an active session)."""
    return list(
        db.session.scalars(
            db.select(TaskRecord).where(
                TaskRecord.workflow_id.is_not(None),
                TaskRecord.started_at.is_not(None),
                TaskRecord.started_at <= (end or datetime.now(UTC)),
            )
        )
    )


class PlotArgsSchema(ma.Schema):
    format = ma.fields.String(load_default="png", validate=ma.validate.OneOf(("png", "pdf")))


@blp.route("/profiler/sessions/<string:name>/plot")
class SessionPlot(MethodView):
    @blp.arguments(PlotArgsSchema, location="query")
    @blp.doc(responses={"200": {"description": "The figure", "content": FIGURE}})
    def get(self, args: dict[str, Any], name: str) -> Response:
        """GPU utilization, memory, bandwidth and a heatmap, host CPU, DRAM, disk and network over time, with the
        workflow steps as spans (PNG or PDF)"""
        s = get_session(name)
        doc = document(s)
        data, panels = render(doc, step_spans(steps_until(s.end_time), s.start_time, s.end_time), args["format"])
        resp = Response(data, mimetype="image/png" if args["format"] == "png" else "application/pdf")
        resp.headers["X-Panels"] = str(panels)
        return resp
