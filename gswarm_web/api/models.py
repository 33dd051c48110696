"""`/models`: the registry, locations, and the download / move / copy operations."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks import names
from gswarm_tasks.devices import Device, parse_target, safe_name
from gswarm_tasks.errors import Conflict, InvalidRequest
from gswarm_tasks.sources import parse_source
from gswarm_tasks.storage import prefix as storage_prefix

from ..control import model_state, service_state
from ..control.dispatch import active_conflict, peer_source, require_node, send_recorded
from ..control.model_state import STATUSES, get_model, ready_location, require_gpu, start_operation
from ..control.placement import choose
from ..extensions import db, settings
from ..tables import Model, ModelLocation, Replica, Service, TaskRecord
from .pagination import PageArgsSchema, PageSchema, page_of
from .queue import TaskSchema

blp = Blueprint("models", __name__, url_prefix="/api/v1", description="Models: registry, placement and copies")
PRIORITY = ma.fields.String(load_default="normal", validate=ma.validate.OneOf(names.PRIORITY_NAMES))


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
        rows = db.session.scalars(
            db.select(Replica).join(Service).where(Service.model_id == m.id, Replica.status == "running")
        )
        return {r.device: r.url for r in rows if r.url}


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


class ModelListSchema(PageSchema):
    models = ma.fields.List(ma.fields.Nested(ModelSchema))


class DeleteArgsSchema(ma.Schema):
    force = ma.fields.Boolean(load_default=False)


class DownloadSchema(ma.Schema):
    source_url = ma.fields.String()
    target_device = ma.fields.String(
        load_default="auto", metadata={"description": "a device, or auto / auto:<tier> (default)"}
    )
    priority = PRIORITY


class MoveSchema(ma.Schema):
    source_device = ma.fields.String(load_default="auto", metadata={"description": "a copy, or auto (the best)"})
    target_device = ma.fields.String(
        load_default="auto", metadata={"description": "a device, or auto / auto:<tier> (default)"}
    )
    keep_source = ma.fields.Boolean(load_default=False)
    priority = PRIORITY


class CopySchema(ma.Schema):
    source_device = ma.fields.String(load_default="auto", metadata={"description": "a copy, or auto (the best)"})
    target_device = ma.fields.String(
        load_default="auto", metadata={"description": "a device, or auto / auto:<tier> (default)"}
    )
    bandwidth_limit = ma.fields.Integer(validate=ma.validate.Range(min=1), metadata={"description": "bytes/s"})
    priority = PRIORITY


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
        return page_of("models", query, args)

    @blp.arguments(ModelCreateSchema)
    @blp.response(201, ModelDetailSchema)
    def post(self, args: dict[str, Any]) -> Model:
        """Register a model"""
        parse_source(args["source_url"], settings().allowed_roots)
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
                    Service.model_id == model.id, Service.status.not_in(("stopping", "stopped", "failed"))
                )
            )
        )
        if running and not args["force"]:
            raise Conflict(
                f"{name} is served by {len(running)} service(s); stop them or pass force=true",
                {"services": [s.id for s in running]},
            )
        tasks = [t for s in running for t in service_state.stop(s)]
        if not model.locations:
            db.session.delete(model)
            db.session.commit()
            send_recorded()
            return tasks, 202
        model.status_message = "deleting"
        tasks += [model_state.delete_copy(model, loc.device) for loc in list(model.locations)]
        db.session.commit()
        send_recorded()
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
        rec = model_state.delete_copy(model, str(dev))
        db.session.commit()
        send_recorded()
        return rec


@blp.route("/models/<string:name>/download")
class Download(MethodView):
    @blp.arguments(DownloadSchema)
    @blp.response(202, TaskSchema)
    def post(self, args: dict[str, Any], name: str) -> TaskRecord:
        """Download a model onto a node's disk or dram"""
        model = get_model(name)
        target, decision = _target(model, "download", args.get("target_device"), files=True)
        url = args.get("source_url") or model.source_url
        if not url:
            raise InvalidRequest("source_url: the model has no registered source; give one", {"field": "source_url"})
        parse_source(url, settings().allowed_roots)
        require_node(str(target.node), "target_device")
        active_conflict(name, str(target))
        kwargs = {"model": name, "source_url": url, "tier": target.tier}
        return start_operation(
            model, "download", str(target.node), names.MODEL_DOWNLOAD, kwargs, args["priority"], source="web",
            target=str(target), extra_params=decision,
        )  # fmt: skip


def _target(
    model: Model, action: str, text: str | None, files: bool = False, gpu: bool = False, on_node: str | None = None
) -> tuple[Device, dict[str, Any] | None]:
    """A named device (checked), or the one placement chooses for `auto` / nothing, with its decision."""
    target = parse_target(text, "target_device")
    if isinstance(target, Device):
        return target.expect("target_device", files=files, gpu=gpu), None
    if target.kind == "gpu" and not gpu:
        raise InvalidRequest(
            f"target_device: {target} is not a storage tier for a {action}", {"field": "target_device"}
        )
    decision = choose(model, action, target, on_node=on_node if target.kind == "gpu" else None)
    return Device.parse(decision["chosen"]), {"placement": decision}


def _source(model: Model, text: str | None, dst_node: str | None) -> Device:
    """A named copy, or with `auto` (or nothing) the best ready one: the target's node first, dram before disk."""
    target = parse_target(text, "source_device")
    if isinstance(target, Device):
        return target.expect("source_device", files=True)
    ready = [loc for loc in model.locations if loc.status == "ready" and loc.tier in ("dram", "disk")]
    if not ready:
        raise InvalidRequest(f"source_device: {model.name} has no copy on any node", {"field": "source_device"})
    best = sorted(ready, key=lambda loc: (loc.node != dst_node, loc.tier != "dram", loc.device))[0]
    return Device.parse(best.device)


def _check_copy(model: Model, src: Device, dst: Device) -> None:
    ready_location(model, src, "source_device")
    require_node(str(dst.node), "target_device")
    if not model.manifest:
        raise Conflict(f"{model.name} has no manifest yet", {"model_name": model.name})
    if dst.is_gpu and dst.node != src.node:
        raise InvalidRequest("target_device: a GPU is loaded from a copy on its own node", {"field": "target_device"})
    if src == dst:
        raise InvalidRequest("target_device: same as source_device", {"field": "target_device"})
    if dst.is_gpu:
        require_gpu(dst, "target_device")
    active_conflict(model.name, str(dst))


def _copy_or_move(name: str, args: dict[str, Any], keep_source: bool, kind: str) -> TaskRecord:
    model = get_model(name)
    explicit_src = parse_target(args.get("source_device"), "source_device")
    node_of_src = explicit_src.node if isinstance(explicit_src, Device) else None
    dst, decision = _target(model, kind, args.get("target_device"), files=True, gpu=True, on_node=node_of_src)
    src = _source(model, args.get("source_device"), dst.node)
    _check_copy(model, src, dst)
    existing = db.session.get(ModelLocation, (model.id, str(dst)))
    if existing is not None and existing.status == "ready" and (kind == "copy" or keep_source):
        return model_state.already_there(model, kind, src, dst)
    ends = {"source": str(src), "target": str(dst)}
    if (src.node == dst.node and kind != "copy") or dst.is_gpu:
        kwargs = {
            "model": name,
            "manifest": model.manifest,
            "source_tier": src.tier,
            "target_tier": dst.tier,
            "keep_source": keep_source,
        }
        return start_operation(
            model, "move", str(dst.node), names.MODEL_MOVE, kwargs, args["priority"], extra_params=decision, **ends
        )
    source = {"node": src.node, "tier": src.tier}
    if src.node != dst.node:
        peer = require_node(str(src.node), "source_device")
        source = peer_source(peer, src.tier, storage_prefix(src.tier, "models", name))
    kwargs = {
        "model": name,
        "manifest": model.manifest,
        "target_tier": dst.tier,
        "source": source,
        "bandwidth_limit": args.get("bandwidth_limit"),
    }
    real_move = kind == "move" and src.node != dst.node
    extra = {**({"cross_node": True, "keep_source": keep_source} if real_move else {}), **(decision or {})} or None
    op = "move" if real_move else "copy"
    return start_operation(
        model, op, str(dst.node), names.MODEL_COPY, kwargs, args["priority"], extra_params=extra, **ends
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
