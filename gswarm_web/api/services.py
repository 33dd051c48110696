"""`/services`: served models. A service is a group of replicas with one status, behind the gateway (`/v1`)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import marshmallow as ma
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.devices import Auto, Device, parse_target
from gswarm_tasks.errors import InvalidRequest, NetworkError

from ..control import reconciler, service_state
from ..control.dispatch import require_node, send_recorded
from ..control.model_state import get_model, require_gpu
from ..control.service_state import REPLICA_STATES, SERVICE_STATES, get_service
from ..extensions import db
from ..tables import Replica, Service, TaskRecord
from .pagination import PageArgsSchema, PageSchema, page_of
from .queue import TaskSchema

blp = Blueprint("services", __name__, url_prefix="/api/v1", description="Model services and their replicas")


def first_replica(s: Service) -> Replica | None:
    """The replica that speaks for a service in its flat fields: a running one, else a live one, else the newest."""
    for wanted in (("running",), service_state.LIVE, REPLICA_STATES):
        found = [r for r in s.members if r.status in wanted]
        if found:
            return found[0] if wanted != REPLICA_STATES else found[-1]
    return None


def _of_first(key: str) -> Any:
    return lambda s: getattr(first_replica(s), key, None)


class ReplicaSchema(ma.Schema):
    id = ma.fields.String()
    node = ma.fields.String()
    device = ma.fields.String()
    port = ma.fields.Integer(allow_none=True)
    url = ma.fields.String(allow_none=True)
    pid = ma.fields.Integer(allow_none=True)
    status = ma.fields.String(metadata={"enum": list(REPLICA_STATES)})
    status_message = ma.fields.String(allow_none=True)
    healthy = ma.fields.Boolean(allow_none=True)
    placement = ma.fields.Dict(allow_none=True, metadata={"description": "the chosen device, candidates, reasons"})
    last_check_at = ma.fields.DateTime(allow_none=True)
    started_at = ma.fields.DateTime(allow_none=True)
    stopped_at = ma.fields.DateTime(allow_none=True)


class ServiceSchema(ma.Schema):
    id = ma.fields.String()
    model_name = ma.fields.Function(lambda s: s.model.name)
    requested_device = ma.fields.String(attribute="device", metadata={"description": "a device, or auto[:gpu|cpu]"})
    node = ma.fields.Function(_of_first("node"), allow_none=True)
    device = ma.fields.Function(lambda s: getattr(first_replica(s), "device", None) or s.device)
    port = ma.fields.Function(_of_first("port"), allow_none=True)
    url = ma.fields.Function(_of_first("url"), allow_none=True)
    pid = ma.fields.Function(_of_first("pid"), allow_none=True)
    healthy = ma.fields.Function(_of_first("healthy"), allow_none=True)
    last_check_at = ma.fields.Function(lambda s: _iso(getattr(first_replica(s), "last_check_at", None)))
    started_at = ma.fields.Function(lambda s: _iso(getattr(first_replica(s), "started_at", None)))
    replicas = ma.fields.Integer(metadata={"description": "the count the service is kept at"})
    ready_replicas = ma.fields.Function(lambda s: sum(r.status == "running" for r in s.members))
    instances = ma.fields.List(ma.fields.Nested(ReplicaSchema), attribute="members")
    backend = ma.fields.String()
    config = ma.fields.Dict()
    status = ma.fields.String(metadata={"enum": list(SERVICE_STATES)})
    status_message = ma.fields.String(allow_none=True)
    idle_timeout_s = ma.fields.Float(allow_none=True)
    cold_start_timeout_s = ma.fields.Float()
    gateway_model = ma.fields.Function(
        lambda s: s.model.name, metadata={"description": "`model` at /v1 of the gateway"}
    )
    stopped_at = ma.fields.DateTime(allow_none=True)
    created_at = ma.fields.DateTime()


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


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
    replicas = ma.fields.Integer()
    ready_replicas = ma.fields.Integer()


class ServiceCreateSchema(ma.Schema):
    model_name = ma.fields.String(required=True)
    device = ma.fields.String(
        load_default="auto", metadata={"description": "node1:gpu0, node1:cpu, or auto / auto:gpu / auto:cpu (default)"}
    )
    replicas = ma.fields.Integer(load_default=1, validate=ma.validate.Range(min=1, max=64))
    port = ma.fields.Integer(validate=ma.validate.Range(min=1024, max=65535))
    config = ma.fields.Dict(load_default=dict)
    idle_timeout_s = ma.fields.Float(validate=ma.validate.Range(min=1, max=30 * 86400))
    cold_start_timeout_s = ma.fields.Float(load_default=120.0, validate=ma.validate.Range(min=1, max=3600))


class ServiceUpdateSchema(ma.Schema):
    replicas = ma.fields.Integer(validate=ma.validate.Range(min=1, max=64))
    idle_timeout_s = ma.fields.Float(allow_none=True, validate=ma.validate.Range(min=1, max=30 * 86400))


class ServiceListArgsSchema(PageArgsSchema):
    status = ma.fields.String(validate=ma.validate.OneOf(SERVICE_STATES))
    model_name = ma.fields.String()
    node = ma.fields.String()


class ServiceListSchema(PageSchema):
    services = ma.fields.List(ma.fields.Nested(ServiceSchema))


def _send(svc: Service) -> None:
    try:
        send_recorded()
    except NetworkError as exc:
        for rep in svc.members:
            rep.status, rep.status_message = "failed", exc.message
        service_state.refresh(svc)
        db.session.commit()
        raise


def _check_config(config: dict[str, Any]) -> None:
    """The built-in server's numbers, checked here rather than failing on the node."""
    for key, low in (("threads", 0), ("max_batch_size", 1)):
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 4096):
            raise InvalidRequest(f"config.{key}: an integer from {low} to 4096", {"field": f"config.{key}"})


def _options(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args.get(k) for k in ("config", "idle_timeout_s", "cold_start_timeout_s")}


def _pinned(model: Any, dev: Device, args: dict[str, Any]) -> tuple[Service, TaskRecord]:
    dev = dev.expect("device", gpu=True, cpu=True)
    require_node(str(dev.node), "device")
    if dev.is_gpu:
        require_gpu(dev, "device")
    if args["replicas"] != 1:
        raise InvalidRequest(
            "replicas: a service pinned to one device has one replica; ask for device auto to have more",
            {"field": "replicas"},
        )
    backend = str(args["config"].get("backend", "builtin"))
    tier = service_state.check_pinned(model, dev, args.get("port"), backend)
    svc = service_state.create(model, str(dev), 1, args.get("port"), backend, **_options(args))
    return svc, service_state.start_replica(svc, service_state.add_replica(svc, dev), tier)


def _auto(model: Any, target: Auto, args: dict[str, Any]) -> tuple[Service, TaskRecord]:
    if target.kind in ("dram", "disk"):
        raise InvalidRequest(
            f"device: {target} is not a compute device (auto, auto:gpu or auto:cpu)", {"field": "device"}
        )
    if args.get("port") is not None and args["replicas"] > 1:
        raise InvalidRequest("port: several replicas take a port each; leave it out", {"field": "port"})
    backend = str(args["config"].get("backend", "builtin"))
    if backend not in ("builtin", "command"):
        raise InvalidRequest("config.backend: must be builtin or command", {"field": "config.backend"})
    svc = service_state.create(model, str(target), args["replicas"], args.get("port"), backend, **_options(args))
    first = reconciler.place_replica(svc)[1]  # nothing fits: the request is refused and nothing is written
    reconciler.fill(svc)
    return svc, first


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
            query = query.where(Service.id.in_(db.select(Replica.service_id).where(Replica.node == args["node"])))
        if "model_name" in args:
            query = query.where(Service.model_id == get_model(args["model_name"]).id)
        return page_of("services", query, args)

    @blp.arguments(ServiceCreateSchema)
    @blp.response(202, ServiceStartedSchema)
    def post(self, args: dict[str, Any]) -> Any:
        """Serve a model: on a named GPU or CPU, or `auto` with `replicas` placed where the weights are and there
        is room (the decision is in each instance's `placement`)"""
        model = get_model(args["model_name"])
        _check_config(args["config"])
        target = parse_target(args["device"], "device")
        svc, rec = _auto(model, target, args) if isinstance(target, Auto) else _pinned(model, target, args)
        task_id = rec.id
        db.session.commit()
        _send(svc)
        svc.task_id = task_id  # not a column: the task that starts (or places) its first replica
        return svc, 202


@blp.route("/services/<string:service_id>")
class ServiceById(MethodView):
    @blp.response(200, ServiceSchema)
    def get(self, service_id: str) -> Service:
        """One service with its instances (replicas)"""
        return get_service(service_id)

    @blp.arguments(ServiceUpdateSchema)
    @blp.response(200, ServiceSchema)
    def patch(self, args: dict[str, Any], service_id: str) -> Service:
        """Change a service's replica count (an auto service) or its idle timeout"""
        svc = get_service(service_id)
        if svc.status in ("stopping", "stopped"):
            raise InvalidRequest(f"service {service_id} is {svc.status}", {"status": svc.status})
        if "replicas" in args and args["replicas"] != svc.replicas:
            if not service_state.is_auto(svc):
                raise InvalidRequest("replicas: a service pinned to one device has one replica", {"field": "replicas"})
            svc.replicas = args["replicas"]
            if svc.status != "idle":
                reconciler.fill(svc)
        if "idle_timeout_s" in args:
            svc.idle_timeout_s = args["idle_timeout_s"]
        db.session.commit()
        _send(svc)
        return svc

    @blp.response(202, TaskSchema)
    def delete(self, service_id: str) -> TaskRecord:
        """Stop a service: every replica, and its ports are freed"""
        svc = get_service(service_id)
        if svc.status in ("stopped", "failed"):
            raise InvalidRequest(f"service {service_id} is already {svc.status}", {"status": svc.status})
        tasks = service_state.stop(svc)
        if not tasks:  # nothing was running (an idle service): stopped now
            rec = TaskRecord(id=str(uuid.uuid4()), kind="stop_serve", state="succeeded", service_id=svc.id,
                             params={}, result={"noop": True}, attempts=0, created_at=datetime.now(UTC))  # fmt: skip
            db.session.add(rec)
            tasks = [rec]
        first = tasks[0]
        db.session.commit()
        send_recorded()
        return first


@blp.route("/services/<string:service_id>/status")
class ServiceStatus(MethodView):
    @blp.response(200, ServiceStatusSchema)
    def get(self, service_id: str) -> dict[str, Any]:
        """Health, uptime, last check and ready replicas of a service"""
        svc = get_service(service_id)
        running = [r for r in svc.members if r.status in ("running", "unhealthy")]
        first = first_replica(svc)
        started = [r.started_at for r in running if r.started_at]
        checks = [r.last_check_at for r in svc.members if r.last_check_at]
        return {
            "id": svc.id,
            "status": svc.status,
            "healthy": all(r.healthy for r in running) if running else (first.healthy if first else None),
            "uptime_s": (datetime.now(UTC) - min(started)).total_seconds() if started else None,
            "last_check_at": max(checks) if checks else None,
            "url": first.url if first else None,
            "message": svc.status_message or (first.status_message if first else None),
            "replicas": svc.replicas,
            "ready_replicas": sum(r.status == "running" for r in svc.members),
        }
