"""`/services`: model servers on nodes: start, inspect, health, stop."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import marshmallow as ma
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.devices import Device
from gswarm_tasks.errors import InvalidRequest, NotFound

from .extensions import db
from .models import Service, TaskRecord
from .models_api import get_model, require_gpu, stop_service
from .operations import dispatch, require_node
from .pagination import PageArgsSchema, paginate
from .queue_api import TaskSchema

blp = Blueprint("services", __name__, url_prefix="/api/v1", description="Model services")

SERVICE_STATES = ("starting", "running", "unhealthy", "stopping", "stopped", "failed")


class ServiceSchema(ma.Schema):
    id = ma.fields.String()
    model_name = ma.fields.Function(lambda s: s.model.name)
    node = ma.fields.String()
    device = ma.fields.String()
    port = ma.fields.Integer(allow_none=True)
    url = ma.fields.String(allow_none=True)
    pid = ma.fields.Integer(allow_none=True)
    backend = ma.fields.String()
    config = ma.fields.Dict()
    status = ma.fields.String()
    status_message = ma.fields.String(allow_none=True)
    healthy = ma.fields.Boolean(allow_none=True)
    last_check_at = ma.fields.DateTime(allow_none=True)
    started_at = ma.fields.DateTime(allow_none=True)
    stopped_at = ma.fields.DateTime(allow_none=True)
    created_at = ma.fields.DateTime()


class ServiceStartedSchema(ServiceSchema):
    task_id = ma.fields.String()


class ServiceStatusSchema(ma.Schema):
    id = ma.fields.String()
    status = ma.fields.String()
    healthy = ma.fields.Boolean(allow_none=True)
    uptime_s = ma.fields.Float(allow_none=True)
    last_check_at = ma.fields.DateTime(allow_none=True)
    url = ma.fields.String(allow_none=True)
    message = ma.fields.String(allow_none=True)


class ServiceCreateSchema(ma.Schema):
    model_name = ma.fields.String(required=True)
    device = ma.fields.String(required=True, metadata={"description": "node1:gpu0 or node1:cpu"})
    port = ma.fields.Integer(validate=ma.validate.Range(min=1024, max=65535))
    config = ma.fields.Dict(load_default=dict)


class ServiceListArgsSchema(PageArgsSchema):
    status = ma.fields.String(validate=ma.validate.OneOf(SERVICE_STATES))
    model_name = ma.fields.String()
    node = ma.fields.String()


class ServiceListSchema(ma.Schema):
    services = ma.fields.List(ma.fields.Nested(ServiceSchema))
    total = ma.fields.Integer()
    page = ma.fields.Integer()
    per_page = ma.fields.Integer()


def get_service(service_id: str) -> Service:
    svc = db.session.get(Service, service_id)
    if svc is None:
        raise NotFound(f"no service {service_id!r}", {"service_id": service_id})
    return svc


@blp.route("/services")
class Services(MethodView):
    @blp.arguments(ServiceListArgsSchema, location="query")
    @blp.response(200, ServiceListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """List services"""
        query = db.select(Service).order_by(Service.created_at.desc())
        if "status" in args:
            query = query.where(Service.status == args["status"])
        if "node" in args:
            query = query.where(Service.node == args["node"])
        if "model_name" in args:
            query = query.where(Service.model_id == get_model(args["model_name"]).id)
        items, total = paginate(query, args["page"], args["per_page"])
        return {"services": items, "total": total, "page": args["page"], "per_page": args["per_page"]}

    @blp.arguments(ServiceCreateSchema)
    @blp.response(202, ServiceStartedSchema)
    def post(self, args: dict[str, Any]) -> Any:
        """Serve a model on a node's GPU or CPU (port: the next free one from 8080 unless given)"""
        model = get_model(args["model_name"])
        dev = Device.parse(args["device"], field="device")
        if not (dev.is_gpu or dev.tier == "cpu") or dev.index is not None:
            raise InvalidRequest(
                f"device: {dev} is not a compute device (nodeN:gpuN or nodeN:cpu)", {"field": "device"}
            )
        require_node(str(dev.node), "device")
        if dev.is_gpu:
            require_gpu(dev, "device")
        backend = str(args["config"].get("backend", "builtin"))
        if backend not in ("builtin", "command"):
            raise InvalidRequest("config.backend: must be builtin or command", {"field": "config.backend"})
        locs = {loc.tier: loc for loc in model.locations if loc.node == dev.node and loc.status == "ready"}
        tier = "dram" if "dram" in locs else "disk" if "disk" in locs else None
        if tier is None:
            raise InvalidRequest(
                f"model_name: {model.name} has no copy on {dev.node}'s disk or dram; copy it there first",
                {"field": "model_name", "node": dev.node},
            )
        port = args.get("port")
        if port is not None and db.session.scalar(
            db.select(Service.id).where(
                Service.node == dev.node, Service.port == port, Service.status.in_(("starting", "running", "unhealthy"))
            )
        ):
            raise InvalidRequest(f"port: {port} is taken by another service on {dev.node}", {"field": "port"})
        svc = Service(
            id=str(uuid.uuid4()),
            model_id=model.id,
            node=str(dev.node),
            device=str(dev),
            port=port,
            backend=backend,
            config=args["config"],
            status="starting",
        )
        db.session.add(svc)
        db.session.commit()
        rec = dispatch(
            "serve",
            str(dev.node),
            "gswarm.node.service.start",
            {
                "service_id": svc.id,
                "model": model.name,
                "tier": tier,
                "device": str(dev),
                "port": port,
                "backend": backend,
                "config": args["config"],
                "trust_remote_code": model.trust_remote_code,
            },
            "high",
            service_id=svc.id,
            target=str(dev),
        )
        svc.task_id = rec.id  # not a column: the task that starts it
        return svc, 202


@blp.route("/services/<string:service_id>")
class ServiceById(MethodView):
    @blp.response(200, ServiceSchema)
    def get(self, service_id: str) -> Service:
        """One service"""
        return get_service(service_id)

    @blp.response(202, TaskSchema)
    def delete(self, service_id: str) -> TaskRecord:
        """Stop a service and free its port"""
        svc = get_service(service_id)
        if svc.status in ("stopped", "failed"):
            raise InvalidRequest(f"service {service_id} is already {svc.status}", {"status": svc.status})
        return stop_service(svc)


@blp.route("/services/<string:service_id>/status")
class ServiceStatus(MethodView):
    @blp.response(200, ServiceStatusSchema)
    def get(self, service_id: str) -> dict[str, Any]:
        """Health, uptime and last check of a service"""
        svc = get_service(service_id)
        uptime = None
        if svc.started_at and svc.status in ("running", "unhealthy"):
            uptime = (datetime.now(UTC) - svc.started_at).total_seconds()
        return {
            "id": svc.id,
            "status": svc.status,
            "healthy": svc.healthy,
            "uptime_s": uptime,
            "last_check_at": svc.last_check_at,
            "url": svc.url,
            "message": svc.status_message,
        }
