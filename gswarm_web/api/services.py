"""`/services`: served models. A service is a group of replicas with one status, behind the gateway (`/v1`)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.devices import Auto, Device, parse_target, validate_node_name
from gswarm_tasks.errors import Conflict, InvalidRequest, NetworkError
from gswarm_tasks.serving.engines import choose, presets

from ..control.dispatch import require_node, send_recorded
from ..control.models.state import get_model, require_gpu
from ..control.nodes import placement, targets
from ..control.nodes.devices import named, node_by_address
from ..control.serving import autoscaler, reconciler
from ..control.serving import checks as serving_checks
from ..control.serving import state as service_state
from ..control.serving.config import SERVICE_KEYS, engine_config, split_config
from ..control.serving.state import get_service
from ..extensions import db, settings
from ..tables import Node, Replica, Service, TaskRecord
from .pagination import page_of
from .queue import TaskSchema
from .service_schemas import (
    ScalingSchema,
    ServiceCreateSchema,
    ServiceListArgsSchema,
    ServiceListSchema,
    ServiceSchema,
    ServiceStartedSchema,
    ServiceStatusSchema,
    ServiceUpdateSchema,
    first_replica,
)

blp = Blueprint("services", __name__, url_prefix="/api/v1", description="Model services and their replicas")


def _send(svc: Service) -> None:
    try:
        send_recorded()
    except NetworkError as exc:
        for rep in svc.members:
            rep.status, rep.status_message = "failed", exc.message
        service_state.refresh(svc)
        db.session.commit()
        raise


def _settings_of(args: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(the preset, the config the service keeps: the preset's parameters and the service's own keys); the
    original's `config.port` and `config.replicas` are folded into `args` (422 when they disagree with the top)."""
    engine_cfg, own = split_config(args["config"])
    for key in ("port", "replicas"):
        if key in own:
            if args.get(key) is not None and args[key] != own[key]:
                raise InvalidRequest(
                    f"config.{key}: {own[key]} disagrees with {key} {args[key]}", {"field": key}
                )
            args[key] = own[key]
    engine, params = choose(engine_cfg, presets(settings().serve_engines), args.get("engine"))
    kept = {k: own[k] for k in SERVICE_KEYS if k in own and k not in ("port", "replicas")}
    return engine, {**params, **kept}, args


def _update_serving(svc: Service, args: dict[str, Any]) -> None:
    """A new engine or config, checked as a new service's would be; a new generation is brought up now."""
    config = (
        args["config"] if "config" in args else {k: v for k, v in (svc.config or {}).items() if k != "nodes"}
    )
    asked = {"config": config, "engine": args.get("engine", svc.backend)}
    engine, params, _ = _settings_of(asked)
    serving_checks.check_aliases(svc.model, params.get("aliases") or [], svc.id)
    if not service_state.is_auto(svc) and (
        engine != svc.backend or engine_config(params) != engine_config(svc.config)
    ):
        raise Conflict(
            "engine: a service pinned to one device has one replica, so it cannot be updated without a gap; serve "
            "it with device auto (or `nodes`) to update it in place, or stop it and serve it again",
            {"field": "engine", "service_id": svc.id},
        )
    for rep in service_state.live_replicas(svc):
        node = db.session.get(Node, rep.node)
        if node is not None and "nodes" in (
            svc.config or {}
        ):  # pinned to nodes: each must run the new engine
            placement.require_engine(node, engine)
    if service_state.update_serving(svc, engine, params):
        reconciler.fill(svc)


def _options(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args.get(k) for k in ("idle_timeout_s", "cold_start_timeout_s")}


def _pinned(
    model: Any, dev: Device, args: dict[str, Any], engine: str, params: dict
) -> tuple[Service, TaskRecord]:
    dev = dev.expect("device", gpu=True, cpu=True)
    placement.require_engine(require_node(str(dev.node), "device"), engine)
    if dev.is_gpu:
        require_gpu(dev, "device")
    for key in ("replicas", "autoscaling"):
        if args.get(key) not in (None, 1):
            raise InvalidRequest(
                f"{key}: a service pinned to one device has one replica; ask for device auto to have more, or name "
                "`nodes`",
                {"field": key},
            )
    tier = serving_checks.check_pinned(model, dev, args.get("port"))
    svc = service_state.create(model, str(dev), 1, args.get("port"), engine, config=params, **_options(args))
    return svc, service_state.start_replica(svc, service_state.add_replica(svc, dev), tier)


def _count(args: dict[str, Any], most: int | None = None) -> int:
    """The replicas a service starts with: `replicas`, else its autoscaling's min_replicas (or 1)."""
    if args.get("autoscaling") is None:
        return int(args.get("replicas") or (most or 1))
    return autoscaler.initial_replicas(args["autoscaling"], args.get("replicas"), most)


def _auto(model: Any, target: Auto, args: dict[str, Any], engine: str, params: dict) -> tuple[Service, Any]:
    _compute("device", target)
    replicas, port = _count(args), args.get("port")
    if port is not None and (replicas > 1 or args.get("autoscaling") is not None):
        raise InvalidRequest(
            "port: several replicas take a port each; leave it out (or name `nodes`)", {"field": "port"}
        )
    svc = service_state.create(model, str(target), replicas, port, engine, config=params, **_options(args))
    svc.autoscaling = args.get("autoscaling")
    if replicas == 0:  # autoscaled from zero: placement is asked now, so a model that fits nowhere is refused
        placement.choose(model, "serve", target, placement.current_load(model), engine=engine)
        service_state.refresh(svc)
        return svc, None
    first = reconciler.place_replica(svc)[1]  # nothing fits: the request is refused and nothing is written
    reconciler.fill(svc)
    return svc, first


def _compute(field_: str, target: Auto) -> None:
    if target.kind in ("dram", "disk"):
        raise InvalidRequest(
            f"{field_}: {target} is not a compute device (auto, auto:gpu or auto:cpu)", {"field": field_}
        )


def _on_nodes(model: Any, args: dict[str, Any], engine: str, params: dict) -> tuple[Service, Any]:
    """One replica on each named node (the device on each chosen as `auto` would), kept there: a replica that is
    lost is placed again on its node, never elsewhere."""
    target = parse_target(named(args.get("device")), "device")
    if not isinstance(target, Auto):
        raise InvalidRequest(
            f"device: {target} names one device; with `nodes` a device is chosen on each node (leave device out, or "
            "give auto:gpu / auto:cpu)",
            {"field": "device"},
        )
    _compute("device", target)
    nodes: list[str] = []
    for i, text in enumerate(args["nodes"]):
        node = validate_node_name(node_by_address(text, f"nodes[{i}]"), f"nodes[{i}]")
        if node in nodes:
            raise InvalidRequest(f"nodes[{i}]: {node} is named twice", {"field": f"nodes[{i}]"})
        placement.require_engine(require_node(node, f"nodes[{i}]"), engine)
        if args.get("port") is not None and service_state.port_taken(node, args["port"]):
            raise InvalidRequest(
                f"port: {args['port']} is taken by another service on {node}", {"field": "port"}
            )
        nodes.append(node)
    if (
        args.get("autoscaling") is None
        and args.get("replicas") is not None
        and args["replicas"] != len(nodes)
    ):
        raise InvalidRequest(
            f"replicas: {args['replicas']} for {len(nodes)} nodes; a service on `nodes` has one replica on each",
            {"field": "replicas"},
        )
    config = {**params, "nodes": nodes}
    count = _count(args, len(nodes))
    svc = service_state.create(model, str(target), count, args.get("port"), engine, config=config,
                               **_options(args))  # fmt: skip
    svc.autoscaling = args.get("autoscaling")
    first = [
        reconciler.place_replica(svc)[1] for _ in range(count)
    ]  # one that does not fit refuses the request
    service_state.refresh(svc)
    return svc, first[0] if first else None


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
            query = query.where(
                Service.id.in_(db.select(Replica.service_id).where(Replica.node == args["node"]))
            )
        if "model_name" in args:
            query = query.where(Service.model_id == get_model(args["model_name"]).id)
        return page_of("services", query, args)

    @blp.arguments(ServiceCreateSchema)
    @blp.response(202, ServiceStartedSchema)
    def post(self, args: dict[str, Any]) -> Any:
        """Serve a model: on a named GPU or CPU, `auto` with `replicas` placed where the weights are and there is
        room, or one replica on each of `nodes` (the decision is in each instance's `placement`)"""
        model = get_model(args["model_name"])
        engine, params, args = _settings_of(targets.resolve(args, "device"))
        serving_checks.check_aliases(model, params.get("aliases") or [])
        if "nodes" in args:
            svc, rec = _on_nodes(model, args, engine, params)
        else:
            target = parse_target(named(args["device"]), "device")
            if isinstance(target, Auto):
                svc, rec = _auto(model, target, args, engine, params)
            else:
                svc, rec = _pinned(model, target, args, engine, params)
        task_id = rec.id if rec is not None else None
        db.session.commit()
        _send(svc)
        autoscaler.prewarm(svc)
        svc.task_id = (
            task_id  # not a column: the task that starts (or places) its first replica (none at zero)
        )
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
        """Change a service's replica count (an auto service; recorded as a scaling event), its autoscaling policy
        (null: off), its idle timeout, or its engine and config: another preset or other parameters are a rolling
        update (the new replicas start beside the serving ones, then those drain: no request fails)"""
        svc = get_service(service_id)
        if svc.status in ("stopping", "stopped"):
            raise InvalidRequest(f"service {service_id} is {svc.status}", {"status": svc.status})
        if "engine" in args or "config" in args:
            _update_serving(svc, args)
        autoscaler.update(svc, args)
        if "idle_timeout_s" in args:
            svc.idle_timeout_s = args["idle_timeout_s"]
        db.session.commit()
        _send(svc)
        if "autoscaling" in args:
            autoscaler.prewarm(svc)
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


@blp.route("/services/<string:service_id>/scaling")
class ServiceScaling(MethodView):
    @blp.response(200, ScalingSchema)
    def get(self, service_id: str) -> dict[str, Any]:
        """The autoscaler's view of a service: its policy, the load it sees (requests in flight per replica over
        every web process, requests waiting in the gateway's queue) and its latest decisions, newest first"""
        return autoscaler.report(get_service(service_id))


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
            "healthy": service_state.service_healthy(svc),
            "uptime_s": (datetime.now(UTC) - min(started)).total_seconds() if started else None,
            "last_check_at": max(checks) if checks else None,
            "url": first.url if first else None,
            "message": svc.status_message or (first.status_message if first else None),
            "replicas": svc.replicas,
            "ready_replicas": sum(r.status == "running" for r in svc.members),
        }
