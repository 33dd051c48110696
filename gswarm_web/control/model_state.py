"""Models' state: the registry rows, where each model's verified copies are, and its status while operations run.

A location is recorded only when a node reports the copy complete and verified; a model is `ready` while it has
one, and its status follows the phase of the operation under way.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from gswarm_tasks import names
from gswarm_tasks.devices import Device, safe_name
from gswarm_tasks.errors import InvalidRequest, ModelNotFound, NetworkError, ResourceUnavailable

from ..extensions import db
from ..tables import Model, ModelLocation, Node, TaskRecord
from .dispatch import ACTIVE, dispatch, record

MODEL_KINDS = ("download", "copy", "move", "delete")
PHASE_STATUS = {"downloading", "copying", "moving", "verifying", "deleting", "starting"}
STATUSES = ("registered", "queued", "downloading", "copying", "moving", "verifying", "ready", "failed")


def now() -> datetime:
    return datetime.now(UTC)


def get_model(name: str, field: str = "model_name") -> Model:
    safe_name(name, field)
    model = db.session.scalar(db.select(Model).where(Model.name == name))
    if model is None:
        raise ModelNotFound(f"{field}: model {name!r} is not registered", {"field": field, "model_name": name})
    return model


def find_model(name: str | None) -> Model | None:
    return db.session.scalar(db.select(Model).where(Model.name == name)) if name else None


def ready_location(model: Model, device: Device, field: str) -> ModelLocation:
    loc = db.session.get(ModelLocation, (model.id, str(device)))
    if loc is None or loc.status != "ready":
        have = ", ".join(loc.device for loc in model.locations) or "nowhere"
        raise InvalidRequest(
            f"{field}: {model.name} is not on {device} (it is on: {have})", {"field": field, "device": str(device)}
        )
    return loc


def require_gpu(dev: Device, field: str) -> None:
    """A GPU the node's heartbeats never reported is refused before anything is sent."""
    node = db.session.get(Node, dev.node)
    have = sorted(g.index for g in node.gpus) if node is not None else []
    if dev.gpu_index not in have:
        raise ResourceUnavailable(
            f"{field}: {dev} is not available: {dev.node} has {'GPUs ' + str(have) if have else 'no GPU'}",
            {"field": field, "device": str(dev), "gpus": have},
        )


def start_operation(
    model: Model, kind: str, node: str, task_name: str, kwargs: dict[str, Any], priority: str = "normal", **kw: Any
) -> TaskRecord:
    """Send a download, copy or move of `model`; its status is `queued` until the node reports a phase."""
    model.status, model.status_message = "queued", None
    try:
        return dispatch(kind, node, task_name, kwargs, priority, model_name=model.name, **kw)
    except NetworkError as exc:
        settle(model, exc.message)
        db.session.commit()
        raise


def already_there(model: Model, kind: str, src: Device, dst: Device) -> TaskRecord:
    """A copy or move whose target already holds the model: recorded as done, nothing is sent."""
    rec = TaskRecord(
        id=str(uuid.uuid4()),
        kind=kind,
        node=dst.node,
        model_name=model.name,
        source_device=str(src),
        target_device=str(dst),
        state="succeeded",
        result={"noop": True, "device": str(dst)},
        params={},
        attempts=0,
        created_at=now(),
        finished_at=now(),
    )
    db.session.add(rec)
    db.session.commit()
    return rec


def delete_copy(model: Model, device: str) -> TaskRecord:
    """Record the removal of one copy (sent after the caller commits)."""
    dev = Device.parse(device)
    return record(
        "delete",
        str(dev.node),
        names.MODEL_DELETE,
        {"model": model.name, "tier": dev.tier},
        model_name=model.name,
        source=device,
    )


def settle(model: Model, message: str | None = None) -> None:
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


def on_phase(rec: TaskRecord, phase: str) -> None:
    model = find_model(rec.model_name)
    if model is not None and phase in PHASE_STATUS and rec.kind in ("download", "copy", "move"):
        model.status = phase


def on_succeeded(rec: TaskRecord, data: dict[str, Any]) -> None:
    """What a finished model operation (a standalone one or a workflow step) changes: locations, manifest, status."""
    model = find_model(rec.model_name)
    if model is None:
        return
    if rec.kind == "delete":
        _drop_location(model, str(rec.source_device or data.get("device")))
        settle(model)
        if model.status_message == "deleting" and not model.locations:
            db.session.delete(model)
        return
    params = dict(rec.params or {})
    inner = dict(params.get("params") or {})  # a workflow step keeps its action's fields here
    if data.get("manifest") and (rec.kind == "download" or not model.manifest):
        model.manifest = data["manifest"]
        model.model_size = data["manifest"].get("total_bytes")
    _upsert_location(model, data)
    if rec.kind == "move" and data.get("source_removed") and rec.source_device:
        _drop_location(model, rec.source_device)
    cross = params.get("cross_node") or bool((params.get("source") or {}).get("address"))
    keep = params.get("keep_source", inner.get("keep_source", False))
    if rec.kind == "move" and cross and not keep and rec.source_device:
        delete_copy(model, rec.source_device)  # a move across nodes: the source goes once the copy is in place
    settle(model)


def on_failed(rec: TaskRecord) -> None:
    model = find_model(rec.model_name)
    if model is not None and rec.kind in ("download", "copy", "move"):
        message = (rec.error or {}).get("message")
        settle(model, f"{rec.kind} to {rec.target_device} failed: {message}")


def on_cancelled(rec: TaskRecord) -> None:
    model = find_model(rec.model_name)
    if model is not None:
        settle(model, f"{rec.kind} cancelled")
