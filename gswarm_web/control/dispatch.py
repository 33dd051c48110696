"""Sending operations to node queues: each is recorded as a task row, then sent once its row is committed.

The row is the outbox: `record()` adds it in the caller's transaction with the message it will carry, and
`send_recorded()` sends what this session recorded once the caller committed. A row that never reached the
broker (a crash in between) is sent by `resend_unsent()`, which the beat sweep runs. Dispatch knows nodes and
tasks, never what an operation means to a model, a chunk or a service.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from gswarm_tasks.celery_app import send_to_node
from gswarm_tasks.errors import Conflict, NetworkError, NotFound, ResourceUnavailable
from gswarm_tasks.transfer.tokens import sign_token, transfer_secret

from ..extensions import db, redis_client, sender, settings
from ..tables import Node, TaskRecord
from .node_state import node_status

log = logging.getLogger(__name__)

ACTIVE = ("queued", "running")
TERMINAL = ("succeeded", "failed", "cancelled")
_OUTBOX = "gswarm_outbox"


def now() -> datetime:
    return datetime.now(UTC)


def require_node(name: str, field: str) -> Node:
    """A registered node that is not offline, else NotFound / ResourceUnavailable naming `field`."""
    node = db.session.get(Node, name)
    if node is None:
        raise NotFound(f"{field}: node {name!r} is not registered", {"field": field, "node": name})
    s = settings()
    if node_status(node, now(), s.heartbeat_timeout_s, s.offline_after_s) == "offline":
        raise ResourceUnavailable(f"{field}: node {name!r} is offline", {"field": field, "node": name})
    return node


def active_conflict(model: str, device: str) -> None:
    """Refuse a second operation on a model's copy on `device` while one is under way."""
    busy = db.session.scalar(
        db.select(TaskRecord.id).where(
            TaskRecord.model_name == model,
            TaskRecord.state.in_(ACTIVE),
            (TaskRecord.target_device == device) | (TaskRecord.source_device == device),
        )
    )
    if busy:
        raise Conflict(f"{model} on {device} is busy with task {busy}", {"task_id": busy, "device": device})


def record(
    kind: str,
    node: str,
    task_name: str,
    kwargs: dict[str, Any],
    priority: str = "normal",
    *,
    model_name: str | None = None,
    source: str | None = None,
    target: str | None = None,
    service_id: str | None = None,
    extra_params: dict[str, Any] | None = None,
) -> TaskRecord:
    """Add an operation's row to the current transaction; it is sent by `send_recorded()` after the commit."""
    op_id = str(uuid.uuid4())
    rec = TaskRecord(
        id=op_id,
        kind=kind,
        state="queued",
        node=node,
        priority=priority,
        model_name=model_name,
        source_device=source,
        target_device=target,
        service_id=service_id,
        # the row keeps what the operation is about, not what it carries (a manifest, a token, chunks' bytes)
        params={
            **{k: v for k, v in kwargs.items() if k not in ("manifest", "source", "chunks")},
            **(extra_params or {}),
        },
        message={"task": task_name, "kwargs": {"op_id": op_id, **kwargs}},
        dispatched=False,
        attempts=0,
        created_at=now(),
    )
    db.session.add(rec)
    db.session.info.setdefault(_OUTBOX, []).append(_Outgoing(rec))
    return rec


class _Outgoing:
    """A recorded operation and what its message needs, kept as plain values: the commit expires the row, and
    reading it again would cost a query per operation."""

    __slots__ = ("rec", "id", "node", "task", "kwargs", "priority")

    def __init__(self, rec: TaskRecord) -> None:
        message = rec.message or {}
        self.rec, self.id, self.node, self.priority = rec, rec.id, str(rec.node), rec.priority
        self.task, self.kwargs = message["task"], message["kwargs"]


def forget_recorded() -> None:
    """Drop what this session recorded (its transaction was rolled back)."""
    db.session.info.pop(_OUTBOX, None)


def _batched(producer: Any) -> Any:
    """The producer's publish batch (kombu >= 5.7 pipelines its messages), else publishing one by one."""
    batch = getattr(producer, "batch", None)
    return batch() if batch is not None else contextlib.nullcontext()


def _send(app: Any, o: _Outgoing, producer: Any = None) -> None:
    # Nothing reads an operation's Celery result (its outcome comes as reports): the sender subscribes to none
    # and the worker stores none.
    send_to_node(
        app, o.node, o.task, kwargs=o.kwargs, priority=o.priority, task_id=o.id, producer=producer, ignore_result=True
    )


def send_recorded() -> list[TaskRecord]:
    """Send every operation this session recorded (call after commit). One the broker refuses is marked failed
    and the last refusal raised as NetworkError, once all were tried."""
    out: list[_Outgoing] = db.session.info.pop(_OUTBOX, [])
    if not out:
        return []
    app = sender()
    refused: Exception | None = None
    sent: list[str] = []
    try:
        with app.producer_or_acquire() as producer, _batched(producer):  # one round trip for all of them
            for o in out:
                _send(app, o, producer)
        sent = [o.id for o in out]
    except Exception:  # one by one, as if never batched: each refusal marks its own operation
        for o in out:
            try:
                _send(app, o)
                sent.append(o.id)
            except Exception as exc:
                refused = exc
                o.rec.state, o.rec.finished_at = "failed", now()
                o.rec.error = NetworkError(f"broker refused the task: {exc}"[:500]).to_dict()
    if sent:
        # A row the intake holds is taking a report of its node, which proves delivery and marks it so itself
        # (task_state.apply): skip it rather than wait for the intake's commit (29 ms on average under 8 clients
        # posting chunk batches, bench/chunks.py).
        mine = db.select(TaskRecord.id).where(TaskRecord.id.in_(sent)).with_for_update(skip_locked=True)
        db.session.execute(
            db.update(TaskRecord)
            .where(TaskRecord.id.in_(mine.scalar_subquery()))
            .values(dispatched=True)
            .execution_options(synchronize_session=False)
        )
    db.session.commit()
    if refused is not None:
        raise NetworkError(f"the broker refused the task: {refused}") from refused
    return [o.rec for o in out]


def dispatch(
    kind: str, node: str, task_name: str, kwargs: dict[str, Any], priority: str = "normal", **kw: Any
) -> TaskRecord:
    """Record an operation, commit, and send it: what an API call that starts one operation does."""
    rec = record(kind, node, task_name, kwargs, priority, **kw)
    db.session.commit()
    send_recorded()
    return rec


def resend_unsent(older_than_s: float = 5.0) -> int:
    """Send the operations that were committed but never reached the broker (a crash between commit and send)."""
    cutoff = now() - timedelta(seconds=older_than_s)
    rows = list(
        db.session.scalars(
            db.select(TaskRecord).where(
                TaskRecord.workflow_id.is_(None),
                TaskRecord.state == "queued",
                TaskRecord.dispatched.is_(False),
                TaskRecord.message.is_not(None),
                TaskRecord.created_at < cutoff,
            )
        )
    )
    for rec in rows:
        log.warning("sending operation %s (%s) again: it never reached the broker", rec.id, rec.kind)
    db.session.info[_OUTBOX] = [_Outgoing(rec) for rec in rows]
    try:
        send_recorded()
    except NetworkError as exc:
        log.warning("resending operations failed: %s", exc)
    return len(rows)


def peer_source(node: Node, tier: str, prefix: str, ttl_s: float | None = None) -> dict[str, Any]:
    """Where a destination pulls from a peer: its file server, and a token for files under `prefix` only."""
    if not node.file_port or not node.address:
        raise ResourceUnavailable(f"{node.name} announced no file server", {"node": node.name})
    s = settings()
    token = sign_token(
        transfer_secret(redis_client(), s.transfer_secret), node.name, prefix, ttl_s or s.transfer_token_ttl_s
    )
    return {
        "node": node.name,
        "tier": tier,
        "address": node.address,
        "port": node.file_port,
        "token": token,
        "prefix": prefix,
    }
