"""Where a queued operation stands on its node: its place among the node's queued operations and when it should
start and take, from the node's recent operations (the original's `position` / `estimated_time`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gswarm_tasks import names

from ..extensions import db, settings
from ..tables import Model, TaskRecord

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
        for table, where in ((self.kinds, TaskRecord.node == node), (self.fleet, TaskRecord.node.is_not(None))):
            rows = db.session.execute(
                db.select(TaskRecord.kind, TaskRecord.started_at, TaskRecord.finished_at, TaskRecord.result)
                .where(where, TaskRecord.state == "succeeded", TaskRecord.started_at.is_not(None))
                .order_by(TaskRecord.finished_at.desc())
                .limit(HISTORY)
            ).all()
            for kind, started, finished, result in rows:
                if finished is None or (result or {}).get("noop"):
                    continue
                table.setdefault(kind, []).append((max(0.0, (finished - started).total_seconds()), _bytes_of(result)))

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
