"""Models' state: the registry rows, where each model's verified copies are, and its status while operations run.

A location is recorded only when a node reports the copy complete and verified; a model is `ready` while it has
one, and its status follows the phase of the operation under way. A model that lost its last copy, or whose every
copy is on an offline node, reads `unavailable`.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import ColumnElement, and_, not_, or_

from gswarm_tasks import names
from gswarm_tasks.devices import Device, safe_name
from gswarm_tasks.errors import Conflict, InvalidRequest, ModelNotFound, NetworkError, ResourceUnavailable

from ...extensions import db, settings
from ...tables import Model, ModelLocation, Node, TaskRecord
from ...tables import utcnow as now
from ..dispatch import ACTIVE, dispatch, record
from ..locking import lock
from ..nodes.state import status_clause

MODEL_KINDS = ("download", "copy", "move", "delete", "register")
PHASE_STATUS = {"downloading", "copying", "moving", "verifying", "deleting", "starting"}
STATUSES = (
    "registered",
    "queued",
    "downloading",
    "copying",
    "moving",
    "verifying",
    "ready",
    "unavailable",
    "failed",
)
LOST = "its last copy was removed"


def get_model(name: str, field: str = "model_name") -> Model:
    safe_name(name, field)
    model = db.session.scalar(db.select(Model).where(Model.name == name))
    if model is None:
        raise ModelNotFound(
            f"{field}: model {name!r} is not registered", {"field": field, "model_name": name}
        )
    return model


def find_model(name: str | None, locked: bool = False) -> Model | None:
    if not name:
        return None
    if locked:
        return lock(Model, Model.name == name)
    return db.session.scalar(db.select(Model).where(Model.name == name))


def locked_model(name: str, field: str = "model_name") -> Model:
    """The model, its row locked until the caller commits: operations on one model are decided one at a time."""
    get_model(name, field)
    model = find_model(name, locked=True)
    if model is None:
        raise ModelNotFound(
            f"{field}: model {name!r} is not registered", {"field": field, "model_name": name}
        )
    return model


def _touches(rec: TaskRecord) -> tuple[set[str], set[str]]:
    """(the copies an operation under way writes or removes, the copies it reads)."""
    params = rec.params or {}
    inner = params.get("params") or {}  # a workflow step keeps its action's fields here
    source = rec.source_device or (inner.get("device") if rec.kind == "delete" else None)
    writes = {rec.target_device} if rec.target_device else set()
    reads: set[str] = set()
    if source and source != "web":
        keep = params.get("keep_source", inner.get("keep_source", False))
        if rec.kind == "delete" or (rec.kind == "move" and not keep and not params.get("cross_node")):
            writes.add(source)
        else:
            reads.add(source)
    return writes, reads


def refuse_busy(model: Model, writes: set[str], reads: set[str] | None = None, any_op: bool = False) -> None:
    """409 naming the operation under way when one writes what this one touches, or touches what this one writes
    (every one with `any_op`); call with the model locked: the check and the record that follows are one step."""
    if model.status_message == "deleting":
        raise Conflict(f"{model.name} is being deleted", {"model_name": model.name})
    busy = db.session.scalars(
        db.select(TaskRecord).where(TaskRecord.model_name == model.name, TaskRecord.state.in_(ACTIVE))
    )
    for rec in busy:
        w, r = _touches(rec)
        clash = sorted((writes & (w | r)) | ((reads or set()) & w)) or (
            [sorted(w | r or {"?"})[0]] if any_op else []
        )
        if clash:
            raise Conflict(
                f"{model.name} on {clash[0]} is busy with task {rec.id} ({rec.kind}, {rec.state})",
                {"task_id": rec.id, "device": clash[0], "kind": rec.kind, "model_name": model.name},
            )


def ready_location(model: Model, device: Device, field: str) -> ModelLocation:
    loc = db.session.get(ModelLocation, (model.id, str(device)))
    if loc is None or loc.status != "ready":
        have = ", ".join(loc.device for loc in model.locations) or "nowhere"
        raise InvalidRequest(
            f"{field}: {model.name} is not on {device} (it is on: {have})",
            {"field": field, "device": str(device)},
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
    model: Model,
    kind: str,
    node: str,
    task_name: str,
    kwargs: dict[str, Any],
    priority: str = "normal",
    **kw: Any,
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


def settle(model: Model, message: str | None = None, lost: bool = False) -> None:
    """After an operation ends: `ready` if a copy exists somewhere, else `failed` (the message says why), else
    `unavailable` when its last copy is gone (`lost`, or it was unavailable already), else `registered`."""
    busy = db.session.scalar(
        db.select(TaskRecord.id).where(TaskRecord.model_name == model.name, TaskRecord.state.in_(ACTIVE))
    )
    if busy:
        return
    has_copy = any(loc.status == "ready" for loc in model.locations)
    if message is not None:
        model.status = "ready" if has_copy else "failed"
        model.status_message = message
    elif has_copy:
        model.status = "ready"
        if model.status_message == LOST:
            model.status_message = None
    elif lost or model.status == "unavailable":
        model.status, model.status_message = "unavailable", LOST
    else:
        model.status = "registered"


def offline_nodes() -> set[str]:
    """The nodes that are offline now (stopped, or silent past offline_after)."""
    s = settings()
    clause = status_clause("offline", now(), s.heartbeat_timeout_s, s.offline_after_s)
    return set(db.session.scalars(db.select(Node.name).where(clause)))


def status_of(model: Model, offline: set[str]) -> str:
    """The status a model reads: `unavailable` while every copy it has is on an offline node."""
    ready = [loc.node for loc in model.locations if loc.status == "ready"]
    if model.status == "ready" and ready and all(node in offline for node in ready):
        return "unavailable"
    return model.status


def status_is(status: str) -> ColumnElement[bool]:
    """The SQL condition equal to `status_of(model, offline_nodes()) == status`."""
    s = settings()
    online = not_(status_clause("offline", now(), s.heartbeat_timeout_s, s.offline_after_s))
    reachable = Model.id.in_(
        db.select(ModelLocation.model_id)
        .join(Node, Node.name == ModelLocation.node)
        .where(ModelLocation.status == "ready", online)
    )
    if status == "ready":
        return and_(Model.status == "ready", reachable)
    if status == "unavailable":
        return or_(Model.status == "unavailable", and_(Model.status == "ready", not_(reachable)))
    return Model.status == status


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
    model = find_model(rec.model_name, locked=True)
    if model is None:
        return
    if rec.kind == "delete":
        _drop_location(model, str(rec.source_device or data.get("device")))
        if model.status_message == "deleting":  # being unregistered: gone with its last copy
            settle(model)
            if not model.locations:
                db.session.delete(model)
            return
        settle(model, lost=not model.locations)
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
        delete_copy(
            model, rec.source_device
        )  # a move across nodes: the source goes once the copy is in place
    settle(model)


def on_failed(rec: TaskRecord) -> None:
    model = find_model(rec.model_name)
    message = (rec.error or {}).get("message")
    if model is not None and rec.kind in ("download", "copy", "move"):
        settle(model, f"{rec.kind} to {rec.target_device} failed: {message}")
    elif model is not None and rec.kind == "delete":  # an unregistering model is not left `deleting` for ever
        settle(model, f"delete of {rec.source_device} failed: {message}")


def on_cancelled(rec: TaskRecord) -> None:
    model = find_model(rec.model_name)
    if model is not None:
        settle(model, f"{rec.kind} cancelled")
