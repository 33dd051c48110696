"""Sending operations to node queues: each is recorded as a task row, then sent once its row is committed.

The row is the outbox: `record()` adds it in the caller's transaction with the message it will carry, and
`send_recorded()` sends what this session recorded once the caller committed. A row that never reached the
broker (a crash in between) is sent by `resend_unsent()`, and one whose message reached it but no node
(`resend_untaken()`), by the beat sweep. Dispatch knows nodes and tasks, never what an operation means to a
model, a chunk or a service.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from datetime import timedelta
from typing import Any

from gswarm_tasks import names
from gswarm_tasks.celery_app import send_to_node
from gswarm_tasks.errors import NetworkError, NotFound, ResourceUnavailable
from gswarm_tasks.transfer.tokens import sign_token, transfer_secret

from ..extensions import db, redis_client, sender, settings
from ..tables import Node, TaskRecord
from ..tables import utcnow as now
from .nodes.state import node_status

log = logging.getLogger(__name__)

ACTIVE = ("queued", "running")
TERMINAL = ("succeeded", "failed", "cancelled")
_OUTBOX = "gswarm_outbox"


def require_node(name: str, field: str) -> Node:
    """A registered node that is not offline, else NotFound / ResourceUnavailable naming `field`."""
    node = db.session.get(Node, name)
    if node is None:
        raise NotFound(f"{field}: node {name!r} is not registered", {"field": field, "node": name})
    s = settings()
    if node_status(node, now(), s.heartbeat_timeout_s, s.offline_after_s) == "offline":
        raise ResourceUnavailable(f"{field}: node {name!r} is offline", {"field": field, "node": name})
    return node


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
        app,
        o.node,
        o.task,
        kwargs=o.kwargs,
        priority=o.priority,
        task_id=o.id,
        producer=producer,
        ignore_result=True,
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
    _send_again(rows)
    return len(rows)


def _send_again(rows: list[TaskRecord]) -> None:
    """Send recorded operations again, their rows unchanged."""
    if rows:
        db.session.info[_OUTBOX] = [_Outgoing(rec) for rec in rows]
        try:
            send_recorded()
        except NetworkError as exc:
            log.warning("sending operations again failed: %s", exc)


def resend_untaken(older_than_s: float, confirm_s: float = 5.0, limit: int = 200) -> int:
    """Send again the operations whose message reached the broker but no node, and return how many.

    A node worker killed during its blocking read can take a message with it: Redis hands the message to the dead
    connection, so it is in no queue and in no worker's unacknowledged set, and its row stays `queued` (dispatched)
    forever. Such a row is sent again when it is older than `older_than_s`, its node is healthy and its queue empty
    (so the message is not waiting behind others), no worker recorded a delivery of it (the deliveries key of
    `before_start`) and none holds it unacknowledged; and when all of that was already so `confirm_s` earlier (a
    live worker between reading a message and recording it is never taken for a dead one). Nothing of it ran, and
    a node runs an operation once by its id (`reporting.run_op`), so sending it again is safe.
    """
    cutoff = now() - timedelta(seconds=older_than_s)
    rows = list(
        db.session.scalars(
            db.select(TaskRecord)
            .where(
                TaskRecord.workflow_id.is_(None),
                TaskRecord.state == "queued",
                TaskRecord.dispatched.is_(True),
                TaskRecord.message.is_not(None),
                TaskRecord.created_at < cutoff,
            )
            .order_by(TaskRecord.created_at)
            .limit(limit)
        )
    )
    if not rows:
        return 0
    client = redis_client()
    pipe = client.pipeline(transaction=False)
    for rec in rows:
        pipe.exists(names.deliveries_key(rec.id, 0))
    rows = [rec for rec, delivered in zip(rows, pipe.execute(), strict=True) if not delivered]
    lost = _not_held(client, [rec for rec in rows if _healthy(rec.node)])
    due = _confirmed(client, lost, confirm_s, older_than_s)
    for rec in due:
        log.warning(
            "operation %s (%s) was taken by no worker of %s: sending it again", rec.id, rec.kind, rec.node
        )
    _send_again(due)
    return len(due)


def _healthy(name: str | None) -> bool:
    node = db.session.get(Node, name) if name else None
    s = settings()
    return (
        node is not None and node_status(node, now(), s.heartbeat_timeout_s, s.offline_after_s) == "healthy"
    )


def _not_held(client: Any, rows: list[TaskRecord]) -> list[TaskRecord]:
    """The rows whose node's queue is empty and whose message no worker holds unacknowledged."""
    if not rows:
        return []
    with sender().connection_for_write() as conn:
        channel = conn.default_channel
        nodes = {str(rec.node) for rec in rows}
        pipe = client.pipeline(transaction=False)
        for node in sorted(nodes):
            for pri in names.PRIORITY_STEPS:
                pipe.llen(channel._q_for_pri(node, pri))
        lengths = iter(pipe.execute())
        busy = {node for node in sorted(nodes) if sum(next(lengths) for _ in names.PRIORITY_STEPS)}
        rows = [rec for rec in rows if rec.node not in busy]
        wanted = {rec.id.encode() for rec in rows}
        held: set[bytes] = set()
        for _tag, raw in client.hscan_iter(channel.unacked_key) if wanted else ():
            held.update(i for i in wanted if i in raw)
    return [rec for rec in rows if rec.id.encode() not in held]


def _confirmed(client: Any, rows: list[TaskRecord], confirm_s: float, keep_s: float) -> list[TaskRecord]:
    """The rows already seen lost at least `confirm_s` ago; the others are marked now."""
    if not rows:
        return []
    at = time.time()
    pipe = client.pipeline(transaction=False)
    for rec in rows:
        pipe.set(names.untaken_key(rec.id), at, nx=True, ex=int(max(60.0, 10 * keep_s)))
        pipe.get(names.untaken_key(rec.id))
    replies = pipe.execute()
    due = [rec for i, rec in enumerate(rows) if at - float(replies[2 * i + 1] or at) >= confirm_s]
    if due:
        client.delete(*[names.untaken_key(rec.id) for rec in due])
    return due


def peer_source(node: Node, tier: str, prefix: str, ttl_s: float | None = None) -> dict[str, Any]:
    """Where a destination pulls from a peer: its file server and the prefix to read. No token: the destination
    signs its own, for that prefix and a few minutes, when it starts pulling, so none travels in a task's arguments
    (the broker keeps them, Flower shows them). `ttl_s` is not used (kept for callers that still pass it)."""
    if not node.file_port or not node.address:
        raise ResourceUnavailable(f"{node.name} announced no file server", {"node": node.name})
    return {
        "node": node.name,
        "tier": tier,
        "address": node.address,
        "port": node.file_port,
        "prefix": prefix,
    }


def read_token(node: str, prefix: str, ttl_s: float) -> str:
    """A token for the control plane itself to read `prefix` from `node`'s file server (it never leaves here)."""
    return sign_token(transfer_secret(redis_client(), settings().transfer_secret), node, prefix, ttl_s)
