"""Operations' state (`/queue/tasks`): a task row follows its node's reports, in order, and a terminal status is
final; what a finished operation means is handed to the bookkeeping of its resource. Where a queued operation stands
on its node: its place among the node's queued operations and when it should start and take, from the node's recent
operations (the original's `position` / `estimated_time`)."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import defer

from gswarm_tasks import names
from gswarm_tasks.errors import InvalidRequest, TaskFailed

from ..extensions import db, redis_client, sender, settings
from ..tables import Model, TaskRecord
from ..tables import utcnow as now
from .data import state as chunk_state
from .dispatch import ACTIVE, TERMINAL
from .models import state as model_state
from .report import Report
from .serving import reconciler
from .serving import state as service_state

log = logging.getLogger(__name__)

DATA_KINDS = ("data_create", "data_move", "data_transfer", "data_delete")
SERVICE_KINDS = ("serve", "stop_serve")


def record_result(rec: TaskRecord, data: dict[str, Any]) -> None:
    """What a finished operation changes, by its kind: model copies, services, chunks (also for workflow steps)."""
    if rec.kind in model_state.MODEL_KINDS:
        model_state.on_succeeded(rec, data)
        if rec.kind == "copy":
            reconciler.copy_landed(rec)  # replicas that waited for these weights start
    elif rec.kind in SERVICE_KINDS:
        service_state.on_succeeded(rec, data)
    elif rec.kind in DATA_KINDS:
        chunk_state.record_data_result(rec, data)


def record_failure(rec: TaskRecord) -> None:
    if rec.kind in DATA_KINDS:
        chunk_state.on_data_failure(rec)
    elif rec.kind in SERVICE_KINDS:
        service_state.on_failed(rec)
    else:
        model_state.on_failed(rec)
        if rec.kind == "copy":
            reconciler.copy_landed(rec)


def apply(rec: TaskRecord, event: str, data: dict[str, Any]) -> None:
    """One report about one operation. Reports may come twice; none moves a terminal status."""
    rec.dispatched = True  # its node has it: the outbox never sends it again
    # Only a success may follow an end: a task whose process died is reported failed by its worker's hook and may
    # succeed when redelivered, and an operation cancelled too late made its copy, which exists, so it counts.
    if rec.state in TERMINAL and (event != "succeeded" or rec.state == "succeeded"):
        return
    if event == "started":
        rec.state = "running"
        rec.started_at = rec.started_at or now()
        rec.attempts = max(rec.attempts or 0, int(data.get("attempt") or (rec.attempts or 0) + 1))
    elif event == "phase":
        if rec.state == "queued":
            rec.state, rec.started_at = "running", now()
        model_state.on_phase(rec, str(data.get("phase")))
    elif event == "retrying":
        rec.error = data.get("error")
    elif event == "succeeded":
        rec.state, rec.finished_at, rec.error = "succeeded", now(), None
        rec.started_at = rec.started_at or rec.finished_at
        rec.result = {k: v for k, v in data.items() if k != "manifest"}
        record_result(rec, data)
    elif event == "failed":
        rec.state, rec.finished_at = "failed", now()
        rec.error = data.get("error") or TaskFailed("failed").to_dict()
        record_failure(rec)


def apply_reports(reports: list[Report]) -> None:
    """A batch of operation reports, each operation's in the order its node sent them (one transaction)."""
    by_op: dict[str, list[Report]] = defaultdict(list)
    for r in reports:
        by_op[r.id].append(r)
    rows = db.session.scalars(
        db.select(TaskRecord)
        .where(TaskRecord.id.in_(list(by_op)))
        .options(defer(TaskRecord.message))  # what was sent (a chunk's bytes, say) is not needed to record it
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    recs = {rec.id: rec for rec in rows}
    # The chunks that finished data operations are about, loaded and locked at once (not a query per report).
    chunk_state.lock_chunks(
        {
            cid
            for rec in recs.values()
            if rec.kind in DATA_KINDS and any(r.event in ("succeeded", "failed") for r in by_op[rec.id])
            for cid in chunk_state.chunk_ids_of(rec)
        }
    )
    try:
        for op_id, events in by_op.items():
            rec = recs.get(op_id)
            if rec is None:
                log.warning("%d report(s) for unknown task %s", len(events), op_id)
                continue
            for r in events:
                apply(rec, r.event, r.data)
    finally:
        chunk_state.unlock_chunks()


def cancel(rec: TaskRecord) -> None:
    """Cancel a standalone operation: marked in Redis (a step that checks stops), revoked, recorded (commits)."""
    if rec.state not in ACTIVE:
        raise InvalidRequest(f"task {rec.id} is already {rec.state}", {"status": rec.state})
    redis_client().set(names.cancel_task_key(rec.id), "cancelled", ex=names.KEEP_S)
    try:
        sender().control.revoke(rec.id, terminate=True, signal="SIGTERM")
    except Exception as exc:
        log.warning("revoke of %s failed: %s", rec.id, exc)
    rec.state, rec.finished_at = "cancelled", now()
    if rec.model_name:
        model_state.on_cancelled(rec)
    db.session.commit()


HISTORY = 50  # recent finished operations of a node that its estimates come from


def _rank(priority: str | None) -> int:
    return names.PRIORITIES.get(priority or "normal", names.PRIORITIES["normal"])


def _bytes_of(result: dict[str, Any] | None) -> int | None:
    result = result or {}
    for key in ("size_bytes", "size", "fetched_bytes"):
        if isinstance(result.get(key), int):
            return int(result[key])
    return None


class _History:
    """Durations (s) and, where a result says how many bytes, throughput (bytes/s) of a node's recent operations
    per kind; the whole fleet's when the node has done none of that kind yet."""

    def __init__(self, node: str) -> None:
        self.kinds: dict[str, list[tuple[float, int | None]]] = {}
        self.fleet: dict[str, list[tuple[float, int | None]]] = {}
        for table, where in (
            (self.kinds, TaskRecord.node == node),
            (self.fleet, TaskRecord.node.is_not(None)),
        ):
            rows = db.session.execute(
                db.select(TaskRecord.kind, TaskRecord.started_at, TaskRecord.finished_at, TaskRecord.result)
                .where(where, TaskRecord.state == "succeeded", TaskRecord.started_at.is_not(None))
                .order_by(TaskRecord.finished_at.desc())
                .limit(HISTORY)
            ).all()
            for kind, started, finished, result in rows:
                if finished is None or (result or {}).get("noop"):
                    continue
                table.setdefault(kind, []).append(
                    (max(0.0, (finished - started).total_seconds()), _bytes_of(result))
                )

    def estimate(self, kind: str, size: int | None) -> float | None:
        """Seconds an operation of `kind` (of `size` bytes, when known) should take; None when nothing is known."""
        seen = self.kinds.get(kind) or self.fleet.get(kind)
        if not seen:
            return None
        sized = [(d, b) for d, b in seen if b]
        if size and sized and sum(d for d, _ in sized) > 0:
            return round(size * sum(d for d, _ in sized) / sum(b for _, b in sized if b), 3)
        return round(sum(d for d, _ in seen) / len(seen), 3)


def _size(kind: str, model_name: str | None, known: dict[str, int | None]) -> int | None:
    """The bytes a model operation moves (its model's size, when known)."""
    if not model_name or kind not in ("download", "copy", "move", "register"):
        return None
    if model_name not in known:
        known[model_name] = db.session.scalar(db.select(Model.model_size).where(Model.name == model_name))
    return known[model_name]


def place(rec: TaskRecord) -> dict[str, Any]:
    """`position` (1 = next to start on its node; 0 = running), `estimated_time` (s it should take) and
    `estimated_start` (s from now until it starts); None where not queued or nothing is known."""
    out: dict[str, Any] = {"position": None, "estimated_time": None, "estimated_start": None}
    if rec.state not in ("queued", "running") or not rec.node:
        return out
    history = _History(rec.node)
    sizes: dict[str, int | None] = {}
    out["estimated_time"] = history.estimate(rec.kind, _size(rec.kind, rec.model_name, sizes))
    if rec.state == "running":
        return {**out, "position": 0, "estimated_start": 0.0}
    rows = db.session.execute(
        db.select(
            TaskRecord.id,
            TaskRecord.kind,
            TaskRecord.state,
            TaskRecord.priority,
            TaskRecord.created_at,
            TaskRecord.started_at,
            TaskRecord.model_name,
        ).where(  # fmt: skip
            TaskRecord.node == rec.node, TaskRecord.state.in_(("queued", "running")), TaskRecord.id != rec.id
        )
    ).all()
    mine = (_rank(rec.priority), rec.created_at, rec.id)
    ahead = [r for r in rows if r.state == "queued" and (_rank(r.priority), r.created_at, r.id) < mine]
    running = [r for r in rows if r.state == "running"]
    out["position"] = len(ahead) + 1
    now = datetime.now(UTC)
    left = 0.0
    for r in [*running, *ahead]:
        est = history.estimate(r.kind, _size(r.kind, r.model_name, sizes))
        if est is None:
            return out  # one of them is unknown: so is when this one starts
        elapsed = (now - r.started_at).total_seconds() if r.state == "running" and r.started_at else 0.0
        left += max(0.0, est - elapsed)
    out["estimated_start"] = round(left / max(1, settings().max_concurrent_tasks), 3)
    return out
