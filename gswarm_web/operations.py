"""Sending operations to nodes and recording what they report: the only writer of model locations."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from flask import current_app

from gswarm_tasks.celery_app import make_celery, send_to_node
from gswarm_tasks.devices import Device
from gswarm_tasks.errors import Conflict, NetworkError, NotFound, ResourceUnavailable
from gswarm_tasks.transfer import sign_token, transfer_secret

from .data_pool import DATA_KINDS, on_data_failure, record_data_result
from .extensions import db
from .health import redis_client
from .models import Model, ModelLocation, Node, Service, TaskRecord
from .registry import node_status

log = logging.getLogger(__name__)

ACTIVE = ("queued", "running")
TERMINAL = ("succeeded", "failed", "cancelled")
PHASE_STATUS = {"downloading", "copying", "moving", "verifying", "deleting", "starting"}


def now() -> datetime:
    return datetime.now(UTC)


def sender() -> Any:
    """The Celery app this Flask app sends with, configured from the same settings (not import-time env)."""
    app = current_app.extensions.get("celery")
    if app is None:
        app = current_app.extensions["celery"] = make_celery(current_app.config["GSWARM_SETTINGS"])
    return app


def require_node(name: str, field: str) -> Node:
    node = db.session.get(Node, name)
    if node is None:
        raise NotFound(f"{field}: node {name!r} is not registered", {"field": field, "node": name})
    settings = current_app.config["GSWARM_SETTINGS"]
    status = node_status(node, now(), settings.heartbeat_timeout_s, settings.offline_after_s)
    if status == "offline":
        raise ResourceUnavailable(f"{field}: node {name!r} is offline", {"field": field, "node": name})
    return node


def active_conflict(model: str, device: str) -> None:
    busy = db.session.scalar(
        db.select(TaskRecord.id).where(
            TaskRecord.model_name == model,
            TaskRecord.state.in_(ACTIVE),
            (TaskRecord.target_device == device) | (TaskRecord.source_device == device),
        )
    )
    if busy:
        raise Conflict(f"{model} on {device} is busy with task {busy}", {"task_id": busy, "device": device})


def dispatch(
    kind: str,
    node: str,
    task_name: str,
    kwargs: dict[str, Any],
    priority: str = "normal",
    model: Model | None = None,
    source: str | None = None,
    target: str | None = None,
    service_id: str | None = None,
    extra_params: dict[str, Any] | None = None,
) -> TaskRecord:
    """Record an operation, then send its node task; if the broker refuses, the record says so."""
    op_id = str(uuid.uuid4())
    rec = TaskRecord(
        id=op_id,
        kind=kind,
        node=node,
        priority=priority,
        model_name=model.name if model else None,
        source_device=source,
        target_device=target,
        service_id=service_id,
        params={**{k: v for k, v in kwargs.items() if k not in ("manifest", "source")}, **(extra_params or {})},
    )
    db.session.add(rec)
    if model is not None and kind in ("download", "copy", "move"):
        model.status, model.status_message = "queued", None
    db.session.commit()
    try:
        send_to_node(sender(), node, task_name, kwargs={"op_id": op_id, **kwargs}, priority=priority, task_id=op_id)
    except Exception as exc:
        rec.state, rec.finished_at = "failed", now()
        rec.error = {"code": "NETWORK_ERROR", "message": f"broker refused the task: {exc}"[:500], "details": {}}
        if model is not None:
            settle_model_status(model, rec.error["message"])
        db.session.commit()
        raise NetworkError(f"the broker refused the task: {exc}") from exc
    return rec


def source_spec(model: Model, src: Device, dest_node: str) -> dict[str, Any]:
    """What the destination needs to pull from `src`: address, file port and a token for this model only."""
    if src.node == dest_node:
        return {"node": src.node, "tier": src.tier}
    node = require_node(str(src.node), "source_device")
    if not node.file_port or not node.address:
        raise ResourceUnavailable(
            f"source_device: {src.node} announced no file server", {"field": "source_device", "node": src.node}
        )
    return peer_source(node, src.tier, f"{src.tier}/models/{model.name}")


def peer_source(node: Node, tier: str, prefix: str, ttl_s: float | None = None) -> dict[str, Any]:
    """Where a destination pulls from a peer: its file server, and a token for files under `prefix` only."""
    settings = current_app.config["GSWARM_SETTINGS"]
    secret = transfer_secret(redis_client(), settings.transfer_secret)
    token = sign_token(secret, node.name, prefix, ttl_s or settings.transfer_token_ttl_s)
    return {
        "node": node.name,
        "tier": tier,
        "address": node.address,
        "port": node.file_port,
        "token": token,
        "prefix": prefix,
    }


def settle_model_status(model: Model, message: str | None = None) -> None:
    """After an operation ends: `ready` if a copy exists somewhere, else `failed`; the message says why."""
    busy = db.session.scalar(
        db.select(TaskRecord.id).where(TaskRecord.model_name == model.name, TaskRecord.state.in_(ACTIVE))
    )
    if busy:
        return
    has_copy = any(loc.status == "ready" for loc in model.locations)
    if message is not None:
        model.status = "ready" if has_copy else "failed"
        model.status_message = message
    else:
        model.status = "ready" if has_copy else "registered"


def _upsert_location(model: Model, result: dict[str, Any]) -> None:
    dev = Device.parse(result["device"])
    loc = db.session.get(ModelLocation, (model.id, str(dev)))
    if loc is None:
        loc = ModelLocation(model_id=model.id, device=str(dev), node=str(dev.node), tier=dev.tier)
        db.session.add(loc)
        model.locations.append(loc)
    loc.path = result.get("path")
    loc.size_bytes = result.get("size_bytes")
    loc.status = "ready"


def _drop_location(model: Model, device: str) -> None:
    loc = db.session.get(ModelLocation, (model.id, device))
    if loc is not None:
        model.locations.remove(loc)
        db.session.delete(loc)


def apply_event(op_id: str, event: str, data: dict[str, Any]) -> None:
    """Apply one report of a node task. Events may arrive twice or late; terminal states are final."""
    rec = db.session.get(TaskRecord, op_id, with_for_update=True)
    if rec is None:
        log.warning("event %s for unknown task %s", event, op_id)
        return
    if rec.state in TERMINAL and event != "succeeded":
        return
    model = db.session.scalar(db.select(Model).where(Model.name == rec.model_name)) if rec.model_name else None
    if event == "started":
        rec.state = "running"
        rec.started_at = rec.started_at or now()
        rec.attempts = int(data.get("attempt") or rec.attempts + 1)
    elif event == "phase":
        if rec.state == "queued":
            rec.state, rec.started_at = "running", now()
        if model is not None and data.get("phase") in PHASE_STATUS and rec.kind in ("download", "copy", "move"):
            model.status = data["phase"]
    elif event == "retrying":
        rec.error = data.get("error")
    elif event == "succeeded":
        if rec.state == "succeeded":
            return
        rec.state, rec.finished_at, rec.error = "succeeded", now(), None
        rec.result = {k: v for k, v in data.items() if k != "manifest"}
        record_model_result(rec, data)
    elif event == "failed":
        rec.state, rec.finished_at = "failed", now()
        rec.error = data.get("error") or {"code": "TASK_FAILED", "message": "failed", "details": {}}
        _on_failure(rec, model)
    db.session.commit()


def record_model_result(rec: TaskRecord, data: dict[str, Any]) -> None:
    """What a finished model operation (a standalone task or a workflow step) changes: locations, services."""
    model = db.session.scalar(db.select(Model).where(Model.name == rec.model_name)) if rec.model_name else None
    params = dict(rec.params or {})
    inner = dict(params.get("params") or {})  # a workflow step keeps its action's fields here
    if rec.kind in ("download", "copy", "move") and model is not None:
        if data.get("manifest") and (rec.kind == "download" or not model.manifest):
            model.manifest = data["manifest"]
            model.model_size = data["manifest"].get("total_bytes")
        _upsert_location(model, data)
        if rec.kind == "move" and data.get("source_removed") and rec.source_device:
            _drop_location(model, rec.source_device)
        cross = params.get("cross_node") or bool((params.get("source") or {}).get("address"))
        keep = params.get("keep_source", inner.get("keep_source", False))
        if rec.kind == "move" and cross and not keep and rec.source_device:
            src = Device.parse(str(rec.source_device))
            dispatch(
                "delete",
                str(src.node),
                "gswarm.node.model.delete",
                {"model": model.name, "tier": src.tier},
                model=model,
                source=str(src),
            )
        settle_model_status(model)
    elif rec.kind == "delete" and model is not None:
        device = rec.source_device or data.get("device")
        _drop_location(model, str(device))
        settle_model_status(model)
        if model.status_message == "deleting" and not model.locations:
            db.session.delete(model)
    elif rec.kind == "serve":
        svc = db.session.get(Service, rec.service_id)
        if svc is not None and svc.status in ("starting", "pending"):
            svc.status, svc.pid, svc.port, svc.url = "running", data.get("pid"), data.get("port"), data.get("url")
            svc.started_at, svc.healthy, svc.last_check_at = now(), True, now()
    elif rec.kind in DATA_KINDS:
        record_data_result(rec, data)
    elif rec.kind in ("stop_serve",):
        svc = db.session.get(Service, rec.service_id or data.get("service_id"))
        if svc is not None:
            svc.status, svc.stopped_at = "stopped", now()


def _on_failure(rec: TaskRecord, model: Model | None) -> None:
    message = (rec.error or {}).get("message")
    if rec.kind in DATA_KINDS:
        on_data_failure(rec)
    if model is not None and rec.kind in ("download", "copy", "move"):
        settle_model_status(model, f"{rec.kind} to {rec.target_device} failed: {message}")
    if rec.kind == "serve":
        svc = db.session.get(Service, rec.service_id)
        if svc is not None:
            svc.status, svc.status_message, svc.stopped_at = "failed", message, now()
    if rec.kind == "stop_serve":
        svc = db.session.get(Service, rec.service_id)
        if svc is not None:
            svc.status_message = f"stop failed: {message}"


def apply_service_reports(reports_by_node: dict[str, list[dict[str, Any]]]) -> None:
    """Health of services from a batch of heartbeats (one query for the batch).

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
