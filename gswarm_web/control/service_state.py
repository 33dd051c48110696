"""Services' state: a model server's row follows its start and stop operations and the health its node reports."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from gswarm_tasks import names
from gswarm_tasks.devices import Device
from gswarm_tasks.errors import InvalidRequest, NetworkError, NotFound

from ..extensions import db
from ..tables import Model, Service, TaskRecord
from .dispatch import dispatch
from .report import Report

SERVICE_STATES = ("pending", "starting", "running", "unhealthy", "stopping", "stopped", "failed")
LIVE = ("starting", "running", "unhealthy")


def now() -> datetime:
    return datetime.now(UTC)


def get_service(service_id: str) -> Service:
    svc = db.session.get(Service, service_id)
    if svc is None:
        raise NotFound(f"no service {service_id!r}", {"service_id": service_id})
    return svc


def serving_tier(model: Model, node: str) -> str:
    """The tier a server on `node` loads the model from: dram before disk; refused when neither holds it."""
    tiers = {loc.tier for loc in model.locations if loc.node == node and loc.status == "ready"}
    for tier in ("dram", "disk"):
        if tier in tiers:
            return tier
    raise InvalidRequest(
        f"model_name: {model.name} has no copy on {node}'s disk or dram; copy it there first",
        {"field": "model_name", "node": node},
    )


def port_taken(node: str, port: int) -> bool:
    return bool(
        db.session.scalar(
            db.select(Service.id).where(Service.node == node, Service.port == port, Service.status.in_(LIVE))
        )
    )


def start(
    model: Model, dev: Device, tier: str, port: int | None, backend: str, config: dict[str, Any]
) -> tuple[Service, TaskRecord]:
    """Record a service (`starting`) and send its start to the node."""
    svc = Service(
        id=str(uuid.uuid4()),
        model_id=model.id,
        node=str(dev.node),
        device=str(dev),
        port=port,
        backend=backend,
        config=config,
        status="starting",
    )
    db.session.add(svc)
    kwargs = {
        "service_id": svc.id,
        "model": model.name,
        "tier": tier,
        "device": str(dev),
        "port": port,
        "backend": backend,
        "config": config,
        "trust_remote_code": model.trust_remote_code,
    }
    try:
        rec = dispatch("serve", str(dev.node), names.SERVICE_START, kwargs, "high", service_id=svc.id, target=str(dev))
    except NetworkError as exc:
        svc.status, svc.status_message, svc.stopped_at = "failed", exc.message, now()
        db.session.commit()
        raise
    return svc, rec


def stop(svc: Service) -> TaskRecord:
    """Stop a service's server (its whole process group) and free its port."""
    svc.status = "stopping"
    return dispatch(
        "stop_serve", svc.node, names.SERVICE_STOP, {"service_id": svc.id}, "high", service_id=svc.id, source=svc.device
    )


def on_succeeded(rec: TaskRecord, data: dict[str, Any]) -> None:
    if rec.kind == "serve":
        svc = db.session.get(Service, rec.service_id)
        if svc is not None and svc.status in ("starting", "pending"):
            svc.status, svc.pid, svc.port, svc.url = "running", data.get("pid"), data.get("port"), data.get("url")
            svc.started_at, svc.healthy, svc.last_check_at = now(), True, now()
    elif rec.kind == "stop_serve":
        svc = db.session.get(Service, rec.service_id or data.get("service_id"))
        if svc is not None:
            svc.status, svc.stopped_at = "stopped", now()


def on_failed(rec: TaskRecord) -> None:
    svc = db.session.get(Service, rec.service_id) if rec.service_id else None
    if svc is None:
        return
    message = (rec.error or {}).get("message")
    if rec.kind == "serve":
        svc.status, svc.status_message, svc.stopped_at = "failed", message, now()
    elif rec.kind == "stop_serve":
        svc.status_message = f"stop failed: {message}"


def apply_health(reports_by_node: dict[str, list[dict[str, Any]]]) -> None:
    """The health of services as their nodes checked it (one query for the batch).

    A dead process marks its service `failed`; so does a running service its node no longer knows.
    """
    if not reports_by_node:
        return
    rows = db.session.scalars(
        db.select(Service).where(Service.node.in_(list(reports_by_node)), Service.status.in_(("running", "unhealthy")))
    )
    for svc in rows:
        seen = {r.get("service_id"): r for r in reports_by_node[svc.node] if isinstance(r, dict)}
        rep = seen.get(svc.id)
        if rep is not None and rep.get("starting"):
            continue  # a check from before the server was ready says nothing about it
        svc.last_check_at = now()
        if rep is None:
            svc.status, svc.healthy, svc.stopped_at = "failed", False, now()
            svc.status_message = f"{svc.node} no longer runs this service"
            continue
        svc.healthy = bool(rep.get("healthy"))
        if not rep.get("alive"):
            svc.status, svc.status_message, svc.stopped_at = "failed", "the server process is gone", now()
        else:
            svc.status = "running" if rep.get("healthy") else "unhealthy"
            svc.status_message = None if rep.get("healthy") else str(rep.get("message"))[:500]


def apply_reports(reports: list[Report]) -> None:
    """The intake's route for service health: each node's newest round of checks in the batch."""
    latest: dict[str, list[dict[str, Any]]] = {}
    for r in reports:
        services = r.data.get("services")
        if isinstance(services, list):
            latest[r.id] = services
    apply_health(latest)
