"""`/profiler/sessions`, `/metrics/latest` and `/metrics` (Prometheus, with DCGM exporter names)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Response, current_app, stream_with_context
from flask.views import MethodView
from flask_smorest import Blueprint
from sqlalchemy.exc import IntegrityError

from gswarm_tasks import names
from gswarm_tasks.errors import Conflict, InvalidRequest, NotFound

from ..control.serving.engine_metrics import engine_text
from ..control.serving.stats import prometheus_text as serving_text
from ..control.sessions import imports as session_import
from ..control.sessions.prometheus import MetricsCache, latest_json
from ..control.sessions.recovery import recoverable, resume_archive
from ..control.sessions.state import (
    Window,
    document,
    export_page,
    get_session,
    keep_summary,
    publish,
    session_window,
    stream_document,
    summarize,
    unpublish,
)
from ..extensions import db, redis_client
from ..profiling.plots import render, step_spans
from ..tables import Node, ProfilerSession, TaskRecord
from .offload import offload
from .profiler_schemas import (
    ExportArgsSchema,
    ImportFramesSchema,
    ImportSchema,
    PlotArgsSchema,
    RecordSchema,
    RecoverableSchema,
    RecoverSchema,
    SessionCreateSchema,
    SessionSchema,
)

TEXT = {"text/plain": {"schema": {"type": "string"}}}
FIGURE = {
    kind: {"schema": {"type": "string", "format": "binary"}} for kind in ("image/png", "application/pdf")
}

blp = Blueprint("profiler", __name__, url_prefix="/api/v1", description="GPU profiling sessions and metrics")
root = Blueprint("prometheus", __name__, url_prefix="/", description="Prometheus' default scrape path")


@blp.route("/profiler/sessions")
class Sessions(MethodView):
    @blp.response(200, SessionSchema(many=True))
    def get(self) -> list[ProfilerSession]:
        """Every session, newest first"""
        return list(
            db.session.scalars(db.select(ProfilerSession).order_by(ProfilerSession.start_time.desc()))
        )

    @blp.arguments(SessionCreateSchema)
    @blp.response(201, SessionSchema)
    def post(self, args: dict[str, Any]) -> ProfilerSession:
        """Start a session (several may overlap; each sees exactly its own window); without `name`, one is made
        (`session_YYYYmmdd_HHMMSS`, local time, as the original named them)"""
        known = set(db.session.scalars(db.select(Node.name)))
        for n in args["nodes"]:
            if n not in known:
                raise NotFound(f"nodes: node {n!r} is not registered", {"field": "nodes", "node": n})
        given = args.get("name")
        stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
        for attempt in range(1 if given else 20):
            name = given or f"session_{stamp}" + (f"_{attempt + 1}" if attempt else "")
            s = ProfilerSession(
                name=name,
                freq_ms=args["freq_ms"],
                nodes=args["nodes"],
                enable_bandwidth=args["enable_bandwidth"],
                enable_nvlink=args["enable_nvlink"],
                start_time=datetime.now(UTC),
                state="active",
                request_time_info=[],
            )
            db.session.add(s)
            try:
                db.session.commit()  # the name's uniqueness is the primary key's: one of two equal starts wins
            except IntegrityError:
                db.session.rollback()
                continue
            publish(s)
            return s
        raise Conflict(f"name: a session {given or 'session_' + stamp!r} exists", {"field": "name"})


@blp.route("/profiler/sessions/<string:name>")
class SessionByName(MethodView):
    @blp.response(200, SessionSchema)
    def get(self, name: str) -> Any:
        """A session: status, frame count, summaries (computed live for an active one)"""
        s = get_session(name)
        if s.state != "active":
            return s
        summary = summarize(s)
        out = {key: getattr(s, key) for key in (f.attribute or n for n, f in SessionSchema().fields.items())}
        out.update(
            frame_count=summary.counts()[0],
            host_frame_count=summary.counts()[1],
            summary_by_device=summary.by_device(),
            summary_by_node=summary.by_node(),
        )
        return out


@blp.route("/profiler/sessions/<string:name>/stop")
class SessionStop(MethodView):
    @blp.response(200, SessionSchema)
    def post(self, name: str) -> ProfilerSession:
        """Stop a session: its summary per device and node is computed and kept; a few seconds later the control
        worker has archived its last frames and written `<name>.json` (`output_file`)"""
        s = db.session.get(ProfilerSession, name, with_for_update=True)
        if s is None:
            raise NotFound(f"no profiling session {name!r}", {"name": name})
        if s.state != "active":
            raise InvalidRequest(f"session {name} is already {s.state}", {"status": s.state})
        s.end_time, s.state = datetime.now(UTC), "stopped"
        unpublish(name)
        keep_summary(s, summarize(s))  # streamed: a session of any length stops
        db.session.commit()  # the control worker archives its last frames, then seals it and writes <name>.json
        return s


def window_of(s: ProfilerSession, args: dict[str, Any]) -> Window:
    """The session's window, or the part of it `start` and `end` ask for."""
    return session_window(s, args.get("start"), args.get("end"))


@blp.route("/profiler/sessions/<string:name>/export")
class SessionExport(MethodView):
    @blp.arguments(ExportArgsSchema, location="query")
    @blp.response(200)
    def get(self, args: dict[str, Any], name: str) -> Any:
        """The session's GPU readings (`frames`), host readings (`host_frames`), summaries and the workflow steps
        that ran in its window (`steps`), as JSON, from the archive and the streams: at most
        profiling.export_max_readings readings a page; `next_cursor` asks for the next (`?cursor=`) and is null on
        the last page, which carries the summaries of the whole window; `all=true` streams the whole window as one
        document"""
        s = get_session(name)
        window = window_of(s, args)
        if args["all"]:
            tail = {"request_time_info": s.request_time_info, "steps": step_spans(steps_in(window), *window)}
            text = stream_with_context(stream_document(s, window, tail))
            return Response(text, mimetype="application/json")
        doc = export_page(s, window, args.get("cursor"), whole=not (args.get("start") or args.get("end")))
        doc["request_time_info"] = s.request_time_info
        doc["steps"] = step_spans(steps_in(window), *window) if doc["next_cursor"] is None else []
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
    @blp.response(200, RecoverableSchema(many=True))
    def get(self) -> list[dict[str, Any]]:
        """Sessions a stopped control plane left behind: every active one (and each stopped one not yet sealed),
        with its frames (archived, and still only in the streams), whether the nodes sample for it and when the
        archiver last ran; `interrupted` says what `POST` would resume"""
        return recoverable()

    @blp.arguments(RecoverSchema)
    @blp.response(200, SessionSchema(many=True))
    def post(self, args: dict[str, Any]) -> list[ProfilerSession]:
        """Resume active sessions (`name`: that one): published to the nodes again and their frames archived now,
        whether the control worker runs or not"""
        query = db.select(ProfilerSession).where(ProfilerSession.state == "active")
        if args.get("name"):
            s = get_session(args["name"])
            if s.state != "active":
                raise Conflict(f"name: session {s.name} is {s.state}, not running: nothing to resume",
                               {"field": "name", "status": s.state})  # fmt: skip
            query = query.where(ProfilerSession.name == s.name)
        active = list(db.session.scalars(query))
        for s in active:
            publish(s)
            resume_archive(s)
        return active


@blp.route("/profiler/imports")
class Imports(MethodView):
    @blp.arguments(ImportSchema)
    @blp.response(201, SessionSchema)
    def post(self, args: dict[str, Any]) -> ProfilerSession:
        """Begin importing a session (the original gswarm's, or an export from elsewhere): `importing` until
        finished; its frames follow in `POST .../frames`; an unfinished import of that name starts over"""
        return session_import.start_import(args)


@blp.route("/profiler/imports/<string:name>/frames")
class ImportFrames(MethodView):
    @blp.arguments(ImportFramesSchema)
    @blp.response(200)
    def post(self, args: dict[str, Any], name: str) -> dict[str, Any]:
        """Add frames to an import (each host's in time order, after those sent before; at most 10,000)"""
        return {"name": name, "frames": session_import.add_frames(name, args["frames"])}


@blp.route("/profiler/imports/<string:name>/finish")
class ImportFinish(MethodView):
    @blp.response(200, SessionSchema)
    def post(self, name: str) -> ProfilerSession:
        """Finish an import: its summaries are computed; it reads (export, plot) like a stopped session"""
        return session_import.finish(name)


@blp.route("/metrics/latest")
class MetricsLatest(MethodView):
    @blp.response(200)
    def get(self) -> Response:
        """The newest frame of every node"""
        raw: Any = redis_client().hgetall(names.METRICS_LATEST_KEY)
        return Response(latest_json(raw, datetime.now(UTC).timestamp()), content_type="application/json")


CONTENT_TYPE = (
    "text/plain; version=0.0.4; charset=utf-8"  # the text format every Prometheus takes, 3.x included
)


def _prometheus() -> Response:
    client = redis_client()  # the fleet's GPUs and hosts, then what the gateway measured (serve_stats)
    cache: MetricsCache = current_app.extensions.setdefault(
        "gswarm.metrics", MetricsCache()
    )  # this app's frames
    frames = cache.text(lambda: client.hgetall(names.METRICS_LATEST_KEY))  # type: ignore[arg-type,return-value]
    return Response(frames + serving_text(client) + engine_text(client), content_type=CONTENT_TYPE)


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


MAX_SPANS = 10_000


def steps_in(window: Window) -> list[TaskRecord]:
    """Workflow steps that ran inside the window (the first MAX_SPANS of them)."""
    lo, hi = window
    return list(
        db.session.scalars(
            db.select(TaskRecord)
            .where(
                TaskRecord.workflow_id.is_not(None),
                TaskRecord.started_at.is_not(None),
                TaskRecord.started_at <= hi,
                db.or_(TaskRecord.finished_at.is_(None), TaskRecord.finished_at >= lo),
            )
            .order_by(TaskRecord.started_at)
            .limit(MAX_SPANS)
        )
    )


@blp.route("/profiler/sessions/<string:name>/plot")
class SessionPlot(MethodView):
    @blp.arguments(PlotArgsSchema, location="query")
    @blp.doc(responses={"200": {"description": "The figure", "content": FIGURE}})
    def get(self, args: dict[str, Any], name: str) -> Response:
        """GPU utilization, memory, bandwidth and a heatmap, host CPU, DRAM, disk and network over time, with the
        workflow steps as spans (PNG or PDF); bounded as the export is"""
        s = get_session(name)
        window = window_of(s, args)
        doc, spans = document(s, window), step_spans(steps_in(window), *window)
        data, panels = offload(render, doc, spans, args["format"])  # matplotlib: seconds of CPU
        resp = Response(data, mimetype="image/png" if args["format"] == "png" else "application/pdf")
        resp.headers["X-Panels"] = str(panels)
        return resp
