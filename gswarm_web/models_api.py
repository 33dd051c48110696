"""`/models`: the registry, locations, and the download / move / copy operations."""

from __future__ import annotations

import uuid
from typing import Any

import marshmallow as ma
from flask import current_app
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.celery_app import priority_value
from gswarm_tasks.devices import Device, safe_name
from gswarm_tasks.errors import Conflict, InvalidRequest, ModelNotFound, ResourceUnavailable
from gswarm_tasks.sources import parse_source

from .extensions import db
from .models import Model, ModelLocation, Node, Service, TaskRecord
from .operations import active_conflict, dispatch, require_node, source_spec
from .pagination import PageArgsSchema, paginate
from .queue_api import TaskSchema

blp = Blueprint("models", __name__, url_prefix="/api/v1", description="Models: registry, placement and copies")

PRIORITIES = ("critical", "high", "normal", "low")
STATUSES = ("registered", "queued", "downloading", "copying", "moving", "verifying", "ready", "failed")


def _name(value: str) -> None:
    safe_name(value, "model_name")


class LocationSchema(ma.Schema):
    device = ma.fields.String()
    node = ma.fields.String()
    tier = ma.fields.String()
    path = ma.fields.String(allow_none=True)
    size_bytes = ma.fields.Integer(allow_none=True)
    status = ma.fields.String()
    created_at = ma.fields.DateTime()


class ModelSchema(ma.Schema):
    model_name = ma.fields.String(attribute="name")
    model_type = ma.fields.String()
    model_size = ma.fields.Integer(allow_none=True)
    source_url = ma.fields.String(allow_none=True)
    metadata = ma.fields.Dict(attribute="meta")
    trust_remote_code = ma.fields.Boolean()
    status = ma.fields.String()
    status_message = ma.fields.String(allow_none=True)
    locations = ma.fields.Method("get_locations")
    services = ma.fields.Method("get_services")
    created_at = ma.fields.DateTime()
    updated_at = ma.fields.DateTime()

    def get_locations(self, m: Model) -> list[str]:
        return [loc.device for loc in m.locations if loc.status == "ready"]

    def get_services(self, m: Model) -> dict[str, str]:
        rows = db.session.scalars(db.select(Service).where(Service.model_id == m.id, Service.status == "running"))
        return {s.device: s.url for s in rows if s.url}


class ModelDetailSchema(ModelSchema):
    manifest = ma.fields.Dict(allow_none=True)
    location_details = ma.fields.List(ma.fields.Nested(LocationSchema), attribute="locations")


class ModelCreateSchema(ma.Schema):
    model_name = ma.fields.String(required=True, validate=_name)
    model_type = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=64))
    source_url = ma.fields.String(required=True)
    model_size = ma.fields.Integer(validate=ma.validate.Range(min=0))
    metadata = ma.fields.Dict(load_default=dict)
    trust_remote_code = ma.fields.Boolean(load_default=False)


class ModelListArgsSchema(PageArgsSchema):
    type = ma.fields.String()
    location = ma.fields.String()
    status = ma.fields.String(validate=ma.validate.OneOf(STATUSES))


class ModelListSchema(ma.Schema):
    models = ma.fields.List(ma.fields.Nested(ModelSchema))
    total = ma.fields.Integer()
    page = ma.fields.Integer()
    per_page = ma.fields.Integer()


class DeleteArgsSchema(ma.Schema):
    force = ma.fields.Boolean(load_default=False)


class DownloadSchema(ma.Schema):
    source_url = ma.fields.String()
    target_device = ma.fields.String(required=True)
    priority = ma.fields.String(load_default="normal", validate=ma.validate.OneOf(PRIORITIES))


class MoveSchema(ma.Schema):
    source_device = ma.fields.String(required=True)
    target_device = ma.fields.String(required=True)
    keep_source = ma.fields.Boolean(load_default=False)
    priority = ma.fields.String(load_default="normal", validate=ma.validate.OneOf(PRIORITIES))


class CopySchema(ma.Schema):
    source_device = ma.fields.String(required=True)
    target_device = ma.fields.String(required=True)
    bandwidth_limit = ma.fields.Integer(validate=ma.validate.Range(min=1), metadata={"description": "bytes/s"})
    priority = ma.fields.String(load_default="normal", validate=ma.validate.OneOf(PRIORITIES))


def get_model(name: str) -> Model:
    safe_name(name, "model_name")
    model = db.session.scalar(db.select(Model).where(Model.name == name))
    if model is None:
        raise ModelNotFound(f"model {name!r} is not registered", {"model_name": name})
    return model


def ready_location(model: Model, device: Device, field: str) -> ModelLocation:
    loc = db.session.get(ModelLocation, (model.id, str(device)))
    if loc is None or loc.status != "ready":
        have = ", ".join(loc.device for loc in model.locations) or "nowhere"
        raise InvalidRequest(
            f"{field}: {model.name} is not on {device} (it is on: {have})", {"field": field, "device": str(device)}
        )
    return loc


def file_tier(device: Device, field: str, gpu_ok: bool = False) -> None:
    if device.node is None or device.tier == "cpu" or (device.is_gpu and not gpu_ok) or device.index is not None:
        allowed = "disk, dram or gpuN" if gpu_ok else "disk or dram"
        raise InvalidRequest(f"{field}: {device} is not a storage tier ({allowed})", {"field": field})


@blp.route("/models")
class Models(MethodView):
    @blp.arguments(ModelListArgsSchema, location="query")
    @blp.response(200, ModelListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """List models (filters: type, location, status)"""
        query = db.select(Model).order_by(Model.name)
        if "type" in args:
            query = query.where(Model.model_type == args["type"])
        if "status" in args:
            query = query.where(Model.status == args["status"])
        if "location" in args:
            loc = args["location"]
            cond = (
                ModelLocation.device == loc if ":" in loc else (ModelLocation.node == loc) | (ModelLocation.tier == loc)
            )
            query = query.where(Model.id.in_(db.select(ModelLocation.model_id).where(cond)))
        items, total = paginate(query, args["page"], args["per_page"])
        return {"models": items, "total": total, "page": args["page"], "per_page": args["per_page"]}

    @blp.arguments(ModelCreateSchema)
    @blp.response(201, ModelDetailSchema)
    def post(self, args: dict[str, Any]) -> Model:
        """Register a model"""
        parse_source(args["source_url"], current_app.config["GSWARM_SETTINGS"].allowed_roots)
        if db.session.scalar(db.select(Model.id).where(Model.name == args["model_name"])):
            raise Conflict(f"model {args['model_name']!r} is already registered", {"field": "model_name"})
        model = Model(
            name=args["model_name"],
            model_type=args["model_type"],
            source_url=args["source_url"],
            model_size=args.get("model_size"),
            meta=args["metadata"],
            trust_remote_code=args["trust_remote_code"],
            locations=[],
        )
        db.session.add(model)
        db.session.commit()
        return model


@blp.route("/models/<string:name>")
class ModelByName(MethodView):
    @blp.response(200, ModelDetailSchema)
    def get(self, name: str) -> Model:
        """One model with its manifest and locations"""
        return get_model(name)

    @blp.arguments(DeleteArgsSchema, location="query")
    @blp.response(202, TaskSchema(many=True))
    def delete(self, args: dict[str, Any], name: str) -> Any:
        """Unregister a model and delete every copy (refused while a service runs, unless force=true)"""
        model = get_model(name)
        running = list(
            db.session.scalars(
                db.select(Service).where(
                    Service.model_id == model.id, Service.status.in_(("starting", "running", "unhealthy"))
                )
            )
        )
        if running and not args["force"]:
            raise Conflict(
                f"{name} is served by {len(running)} service(s); stop them or pass force=true",
                {"services": [s.id for s in running]},
            )
        tasks = [stop_service(s) for s in running]
        if not model.locations:
            db.session.delete(model)
            db.session.commit()
            return tasks, 202
        model.status_message = "deleting"
        for loc in list(model.locations):
            tasks.append(
                dispatch(
                    "delete",
                    loc.node,
                    "gswarm.node.model.delete",
                    {"model": name, "tier": loc.tier},
                    model=model,
                    source=loc.device,
                )
            )
        return tasks, 202


@blp.route("/models/<string:name>/locations")
class Locations(MethodView):
    @blp.response(200, LocationSchema(many=True))
    def get(self, name: str) -> list[ModelLocation]:
        """Where a model is stored"""
        return list(get_model(name).locations)


@blp.route("/models/<string:name>/locations/<string:device>")
class LocationByDevice(MethodView):
    @blp.response(202, TaskSchema)
    def delete(self, name: str, device: str) -> TaskRecord:
        """Delete one copy of a model"""
        model = get_model(name)
        dev = Device.parse(device, field="device")
        ready_location(model, dev, "device")
        active_conflict(name, str(dev))
        return dispatch(
            "delete",
            str(dev.node),
            "gswarm.node.model.delete",
            {"model": name, "tier": dev.tier},
            model=model,
            source=str(dev),
        )


@blp.route("/models/<string:name>/download")
class Download(MethodView):
    @blp.arguments(DownloadSchema)
    @blp.response(202, TaskSchema)
    def post(self, args: dict[str, Any], name: str) -> TaskRecord:
        """Download a model onto a node's disk or dram"""
        model = get_model(name)
        target = Device.parse(args["target_device"], field="target_device")
        file_tier(target, "target_device")
        url = args.get("source_url") or model.source_url
        if not url:
            raise InvalidRequest("source_url: the model has no registered source; give one", {"field": "source_url"})
        parse_source(url, current_app.config["GSWARM_SETTINGS"].allowed_roots)
        require_node(str(target.node), "target_device")
        active_conflict(name, str(target))
        priority_value(args["priority"])
        return dispatch(
            "download",
            str(target.node),
            "gswarm.node.model.download",
            {"model": name, "source_url": url, "tier": target.tier},
            args["priority"],
            model,
            "web",
            str(target),
        )


def _copy_or_move(name: str, args: dict[str, Any], keep_source: bool, kind: str) -> TaskRecord:
    model = get_model(name)
    src = Device.parse(args["source_device"], field="source_device")
    dst = Device.parse(args["target_device"], field="target_device")
    file_tier(src, "source_device")
    file_tier(dst, "target_device", gpu_ok=True)
    ready_location(model, src, "source_device")
    require_node(str(dst.node), "target_device")
    if not model.manifest:
        raise Conflict(f"{name} has no manifest yet", {"model_name": name})
    if dst.is_gpu and dst.node != src.node:
        raise InvalidRequest("target_device: a GPU is loaded from a copy on its own node", {"field": "target_device"})
    if src == dst:
        raise InvalidRequest("target_device: same as source_device", {"field": "target_device"})
    if dst.is_gpu:
        require_gpu(dst, "target_device")
    active_conflict(name, str(dst))
    existing = db.session.get(ModelLocation, (model.id, str(dst)))
    if existing is not None and existing.status == "ready" and (kind == "copy" or keep_source):
        rec = TaskRecord(
            id=str(uuid.uuid4()),
            kind=kind,
            node=dst.node,
            model_name=name,
            source_device=str(src),
            target_device=str(dst),
            state="succeeded",
            result={"noop": True, "device": str(dst)},
            params={},
        )
        db.session.add(rec)
        db.session.commit()
        return rec
    if src.node == dst.node and kind != "copy" or dst.is_gpu:
        return dispatch(
            "move",
            str(dst.node),
            "gswarm.node.model.move",
            {
                "model": name,
                "manifest": model.manifest,
                "source_tier": src.tier,
                "target_tier": dst.tier,
                "keep_source": keep_source,
            },
            args["priority"],
            model,
            str(src),
            str(dst),
        )
    kwargs = {
        "model": name,
        "manifest": model.manifest,
        "target_tier": dst.tier,
        "source": source_spec(model, src, str(dst.node)),
        "bandwidth_limit": args.get("bandwidth_limit"),
    }
    real_move = kind == "move" and src.node != dst.node
    return dispatch(
        "move" if real_move else "copy",
        str(dst.node),
        "gswarm.node.model.copy",
        kwargs,
        args["priority"],
        model,
        str(src),
        str(dst),
        extra_params={"cross_node": True, "keep_source": keep_source} if real_move else None,
    )


@blp.route("/models/<string:name>/move")
class Move(MethodView):
    @blp.arguments(MoveSchema)
    @blp.response(202, TaskSchema)
    def post(self, args: dict[str, Any], name: str) -> TaskRecord:
        """Move a model between devices (disk, dram, gpuN; across nodes too)"""
        return _copy_or_move(name, args, args["keep_source"], "move")


@blp.route("/models/<string:name>/copy")
class Copy(MethodView):
    @blp.arguments(CopySchema)
    @blp.response(202, TaskSchema)
    def post(self, args: dict[str, Any], name: str) -> TaskRecord:
        """Copy a model to another device or node, verifying every file"""
        return _copy_or_move(name, args, True, "copy")


def require_gpu(dev: Device, field: str) -> None:
    """A GPU the node's heartbeats never reported is refused before anything is sent."""
    node = db.session.get(Node, dev.node)
    have = sorted(g.index for g in node.gpus) if node is not None else []
    if dev.gpu_index not in have:
        raise ResourceUnavailable(
            f"{field}: {dev} is not available: {dev.node} has {'GPUs ' + str(have) if have else 'no GPU'}",
            {"field": field, "device": str(dev), "gpus": have},
        )


def stop_service(svc: Service) -> TaskRecord:
    svc.status = "stopping"
    return dispatch(
        "stop_serve",
        svc.node,
        "gswarm.node.service.stop",
        {"service_id": svc.id},
        "high",
        service_id=svc.id,
        source=svc.device,
    )


__all__ = ["blp", "get_model", "ready_location", "require_gpu", "stop_service"]
