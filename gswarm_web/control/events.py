"""Changes as events: what a transaction changed in nodes, tasks, workflow steps, workflows, services, replicas,
models (and their copies) and profiler sessions is published on `names.EVENTS_CHANNEL` once it is committed, never
for a rollback.

Every process that commits (the control worker as it applies reports, a web process for what a request changed)
publishes its own changes, so no bookkeeping module has to remember to: a session hook looks at the rows a flush
wrote and keeps an event for each one whose status changed or that is new, and the commit sends them in one
pipeline. Heartbeats reach the nodes table as one bulk upsert, which no flush sees; a node's first heartbeat in
this process, and a change of its state (up, stopped), become events there. Publishing is best effort: pub/sub
keeps nothing for a listener that is away, so the dashboard refetches when its socket comes back.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import redis
from flask import current_app, has_app_context
from sqlalchemy import event, inspect
from sqlalchemy.orm import Session

from gswarm_tasks import names

from ..extensions import db, redis_client
from ..tables import Model, ModelLocation, Node, ProfilerSession, Replica, Service, TaskRecord, WorkflowRun

log = logging.getLogger(__name__)

PENDING = "gswarm_events"  # session.info key: the events of the transaction in progress
RETRY_AFTER_S = (
    5.0  # after Redis refused a publish, the next try waits this long (a commit never waits on it)
)
# The attribute whose change is an event, per table.
STATUS = {
    TaskRecord: "state",
    WorkflowRun: "status",
    Service: "status",
    Replica: "status",
    Node: "status_recorded",
}
STATUS.update({ProfilerSession: "state", Model: "status", ModelLocation: "status"})
_down_until = 0.0
_node_states: dict[str, str] = {}  # what this process last published per node (heartbeat upserts)
_node_lock = threading.Lock()


def describe(obj: Any) -> dict[str, Any] | None:
    """The event of one row, or None for a row that is not published."""
    at = time.time()
    if isinstance(obj, TaskRecord):
        if obj.workflow_id:
            return {"type": "step", "id": obj.step_id, "workflow_id": obj.workflow_id, "task_id": obj.id,
                    "status": obj.state, "node": obj.node, "action_type": obj.kind, "time": at}  # fmt: skip
        return {"type": "task", "id": obj.id, "kind": obj.kind, "status": obj.state, "node": obj.node,
                "model_name": obj.model_name, "time": at}  # fmt: skip
    if isinstance(obj, WorkflowRun):
        return {"type": "workflow", "id": obj.id, "name": obj.name, "status": obj.status, "time": at}
    if isinstance(obj, Service):
        return {"type": "service", "id": obj.id, "status": obj.status, "device": obj.device, "time": at}
    if isinstance(obj, Replica):
        return {"type": "replica", "id": obj.id, "service_id": obj.service_id, "status": obj.status,
                "node": obj.node, "device": obj.device, "time": at}  # fmt: skip
    if isinstance(obj, Node):
        return {"type": "node", "id": obj.name, "status": obj.status_recorded, "time": at}
    if isinstance(obj, ProfilerSession):
        return {"type": "profiler_session", "id": obj.name, "status": obj.state, "time": at}
    if isinstance(obj, Model):
        return {"type": "model", "id": obj.name, "status": obj.status, "time": at}
    if isinstance(
        obj, ModelLocation
    ):  # a copy: its model's name when it is at hand (no query inside a flush)
        model = obj.__dict__.get("model")
        name = model.name if model is not None else obj.model_id
        return {"type": "model", "id": name, "device": obj.device, "status": obj.status, "time": at}
    return None


def _changed(obj: Any, new: bool) -> bool:
    attr = next((a for cls, a in STATUS.items() if isinstance(obj, cls)), None)
    if attr is None:
        return False
    return new or inspect(obj).attrs[attr].history.has_changes()


def _after_flush(session: Session, _context: Any) -> None:
    pending = session.info.setdefault(PENDING, {})
    for new, objs in ((True, session.new), (False, session.dirty), (True, session.deleted)):
        for obj in objs:
            if _changed(obj, new) and (ev := describe(obj)) is not None:
                if obj in session.deleted:
                    ev["status"] = "deleted"
                key = (ev["type"], ev["id"], ev.get("workflow_id") or ev.get("device"))
                pending[key] = ev  # the last status of a row wins


def _on_execute(state: Any) -> None:
    """Heartbeats' bulk upsert: a node this process has not published yet, or whose state changed."""
    stmt = state.statement
    if not state.is_insert or getattr(stmt, "table", None) is not Node.__table__:
        return
    rows = state.parameters if isinstance(state.parameters, list) else [state.parameters or {}]
    pending = state.session.info.setdefault(PENDING, {})
    with _node_lock:
        for row in rows:
            name, status = row.get("name"), "stopped" if row.get("state") == "stopped" else "healthy"
            if isinstance(name, str) and _node_states.get(name) != status:
                _node_states[name] = status
                pending[("node", name, None)] = {
                    "type": "node",
                    "id": name,
                    "status": status,
                    "time": time.time(),
                }


def _after_commit(session: Session) -> None:
    pending = session.info.pop(PENDING, None)
    if pending:
        publish(list(pending.values()))


def _after_rollback(session: Session) -> None:
    session.info.pop(PENDING, None)


def publish(events: list[dict[str, Any]]) -> None:
    """Send events on the channel; a Redis that is away costs one refused connection, then none for a while."""
    global _down_until
    if not events or not has_app_context() or time.monotonic() < _down_until:
        return
    try:
        client = redis_client()
        pipe, where = client.pipeline(transaction=False), names.channel(names.EVENTS_CHANNEL, client)
        for ev in events:
            pipe.publish(where, json.dumps(ev, default=str))
        pipe.execute()
    except redis.RedisError as exc:
        _down_until = time.monotonic() + RETRY_AFTER_S
        log.warning("events not published (%d): %s", len(events), exc)


def add(ev: dict[str, Any]) -> None:
    """Publish `ev` with the current transaction's changes (a change no flush sees, such as a bulk insert)."""
    ev.setdefault("time", time.time())
    db.session.info.setdefault(PENDING, {})[(ev["type"], ev["id"], ev.get("workflow_id"))] = ev


_installed = False


def install() -> None:
    """Hook the session once per process (every app of the process shares `db.session`)."""
    global _installed
    if _installed:
        return
    _installed = True
    target = db.session
    event.listen(target, "after_flush", _after_flush)
    event.listen(target, "after_commit", _after_commit)
    event.listen(target, "after_rollback", _after_rollback)
    event.listen(target, "do_orm_execute", _on_execute)
    log.debug("change events hooked for %s", current_app.name if has_app_context() else "the session")
