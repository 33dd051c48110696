"""`/services`: model servers on nodes: start, inspect, health, stop."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import marshmallow as ma
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.devices import Device
from gswarm_tasks.errors import InvalidRequest

from ..control import service_state
from ..control.dispatch import require_node
from ..control.model_state import get_model, require_gpu
from ..control.service_state import SERVICE_STATES, get_service
from ..extensions import db
from ..tables import Service, TaskRecord
from .pagination import PageArgsSchema, PageSchema, page_of
from .queue import TaskSchema

blp = Blueprint("services", __name__, url_prefix="/api/v1", description="Model services")


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


class ServiceListSchema(PageSchema):
    services = ma.fields.List(ma.fields.Nested(ServiceSchema))


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
        return page_of("services", query, args)

    @blp.arguments(ServiceCreateSchema)
    @blp.response(202, ServiceStartedSchema)
    def post(self, args: dict[str, Any]) -> Any:
        """Serve a model on a node's GPU or CPU (port: the next free one from 8080 unless given)"""
        model = get_model(args["model_name"])
        dev = Device.parse(args["device"], field="device").expect("device", gpu=True, cpu=True)
        require_node(str(dev.node), "device")
        if dev.is_gpu:
            require_gpu(dev, "device")
        backend = str(args["config"].get("backend", "builtin"))
        if backend not in ("builtin", "command"):
            raise InvalidRequest("config.backend: must be builtin or command", {"field": "config.backend"})
        tier = service_state.serving_tier(model, str(dev.node))
        port = args.get("port")
        if port is not None and service_state.port_taken(str(dev.node), port):
            raise InvalidRequest(f"port: {port} is taken by another service on {dev.node}", {"field": "port"})
        svc, rec = service_state.start(model, dev, tier, port, backend, args["config"])
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
        return service_state.stop(svc)


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
