"""`/models`: the registry, locations, and the download / move / copy operations."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask import request
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks import names
from gswarm_tasks.devices import safe_name
from gswarm_tasks.errors import Conflict
from gswarm_tasks.models.sources import parse_source
from gswarm_tasks.transfer.client import COMPRESSIONS

from ..control.dispatch import send_recorded
from ..control.models import ops as model_ops
from ..control.models import state as model_state
from ..control.models.state import (
    STATUSES,
    get_model,
    locked_model,
    offline_nodes,
    refuse_busy,
    status_is,
    status_of,
)
from ..control.nodes import targets
from ..control.nodes.devices import by_address, node_by_address
from ..control.serving import state as service_state
from ..extensions import db, settings
from ..tables import Model, ModelLocation, Replica, Service, TaskRecord
from .pagination import PageArgsSchema, PageSchema, page_of
from .queue import QueuedTaskSchema, TaskSchema

blp = Blueprint(
    "models", __name__, url_prefix="/api/v1", description="Models: registry, placement and copies"
)
PRIORITY = ma.fields.String(load_default="normal", validate=ma.validate.OneOf(names.PRIORITY_NAMES))
VERIFY = ma.fields.Boolean(
    load_default=True,
    validate=ma.validate.Equal(
        True,
        error="gswarm verifies every copy it makes (each block's blake3, each file's hash); false is not offered",
    ),
    metadata={
        "description": "true, as always: every copy is verified before it is recorded (false is refused)"
    },
)
COMPRESSION = ma.fields.String(
    validate=ma.validate.OneOf(COMPRESSIONS),
    metadata={
        "description": "none, or zstd: the bytes are compressed between nodes (a copy within a node is not)"
    },
)


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
    status = ma.fields.Method("get_status", metadata={"enum": list(STATUSES)})
    status_message = ma.fields.String(allow_none=True)
    locations = ma.fields.Method("get_locations")
    services = ma.fields.Method("get_services")
    created_at = ma.fields.DateTime()
    updated_at = ma.fields.DateTime()

    def get_status(self, m: Model) -> str:
        cache = request.environ  # once per request, not per model (an app context may serve several requests)
        if "gswarm.offline_nodes" not in cache:
            cache["gswarm.offline_nodes"] = offline_nodes()
        return status_of(m, cache["gswarm.offline_nodes"])

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
    status = ma.fields.String(
        validate=ma.validate.OneOf(STATUSES),
        metadata={
            "description": "unavailable: every copy it has is on an offline node, or its last copy was removed"
        },
    )


class ModelListSchema(PageSchema):
    models = ma.fields.List(ma.fields.Nested(ModelSchema))


class DeleteArgsSchema(ma.Schema):
    force = ma.fields.Boolean(load_default=False, metadata={"description": "even while served or in use"})
    device = ma.fields.String(
        metadata={
            "description": "remove only this copy (`node:tier`), as DELETE /models/{name}/locations/{device}"
        }
    )


class DownloadSchema(ma.Schema):
    source_url = ma.fields.String()
    target_device = ma.fields.String(
        load_default="auto", metadata={"description": "a device, or auto / auto:<tier> (default)"}
    )
    priority = PRIORITY
    verify_checksum = VERIFY


class _FromToSchema(ma.Schema):
    """What a move and a copy both take: from which copy, to which device, how."""

    source_device = ma.fields.String(
        load_default="auto", metadata={"description": "a copy, or auto (the best)"}
    )
    target_device = ma.fields.String(
        load_default="auto", metadata={"description": "a device, or auto / auto:<tier> (default)"}
    )
    priority = PRIORITY
    compression = COMPRESSION
    verify_checksum = VERIFY


class MoveSchema(_FromToSchema):
    keep_source = ma.fields.Boolean(load_default=False)


class CopySchema(_FromToSchema):
    bandwidth_limit = ma.fields.Integer(
        validate=ma.validate.Range(min=1), metadata={"description": "bytes/s"}
    )


class LocationCreateSchema(ma.Schema):
    device = ma.fields.String(
        required=True, metadata={"description": "node:disk or node:dram (or address:tier)"}
    )
    status = ma.fields.String(
        load_default="ready",
        validate=ma.validate.Equal("ready", error="a copy is registered `ready` (verified) or not at all"),
    )


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
            query = query.where(status_is(args["status"]))
        if "location" in args:
            loc = args["location"]
            loc = by_address(loc, "location") if ":" in loc else node_by_address(loc, "location")
            cond = (
                ModelLocation.device == loc
                if ":" in loc
                else (ModelLocation.node == loc) | (ModelLocation.tier == loc)
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
        """Unregister a model and delete every copy (refused while a service runs, unless force=true); with
        `device`, remove only that copy"""
        model = locked_model(name)
        if "device" in args:
            return [model_ops.delete_copy(model, args["device"], "device", args["force"])], 202
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
        refuse_busy(model, set(), any_op=True)
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

    @blp.arguments(LocationCreateSchema)
    @blp.response(202, QueuedTaskSchema)
    @blp.alt_response(
        200, schema=QueuedTaskSchema, description="The copy is recorded already: nothing is sent"
    )
    def post(self, args: dict[str, Any], name: str) -> Any:
        """Register a copy already on a node (its files under the tier's `models/<name>`): the node verifies them
        against the model's manifest (or builds it when the model has none) and only then is the location recorded;
        GPU copies are made with move"""
        return model_ops.register_copy(name, args["device"])


@blp.route("/models/<string:name>/locations/<string:device>")
class LocationByDevice(MethodView):
    @blp.response(202, TaskSchema)
    def delete(self, name: str, device: str) -> TaskRecord:
        """Delete one copy of a model (refused while an operation or a replica uses it)"""
        return model_ops.delete_copy(locked_model(name), device, "device", force=False)


@blp.route("/models/<string:name>/download")
class Download(MethodView):
    @blp.arguments(DownloadSchema)
    @blp.response(202, QueuedTaskSchema)
    def post(self, args: dict[str, Any], name: str) -> TaskRecord:
        """Download a model onto a node's disk or dram (the answer has its place in the node's queue)"""
        return model_ops.download(name, targets.resolve(args, "target_device"))


@blp.route("/models/<string:name>/move")
class Move(MethodView):
    @blp.arguments(MoveSchema)
    @blp.response(202, QueuedTaskSchema)
    def post(self, args: dict[str, Any], name: str) -> TaskRecord:
        """Move a model between devices (disk, dram, gpuN; across nodes too, zstd-compressed if asked)"""
        return model_ops.copy_or_move(name, targets.ends(args), args["keep_source"], "move")


@blp.route("/models/<string:name>/copy")
class Copy(MethodView):
    @blp.arguments(CopySchema)
    @blp.response(202, QueuedTaskSchema)
    def post(self, args: dict[str, Any], name: str) -> TaskRecord:
        """Copy a model to another device or node, verifying every file (zstd-compressed between nodes if asked)"""
        return model_ops.copy_or_move(name, targets.ends(args), True, "copy")
