"""Nodes as the control plane knows them: heartbeats into rows, and a node's status from its last heartbeat."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import ColumnElement

from gswarm_tasks.devices import NODE_NAME_RE, RESERVED_NODE_NAMES

from ...extensions import db
from ...tables import Node, NodeGpu

log = logging.getLogger(__name__)

STATUSES = ("healthy", "unhealthy", "offline")
MISSING = "missing"  # declared in config.yaml's `nodes:`, never seen
LISTED_STATUSES = (*STATUSES, MISSING)


@dataclass
class DeclaredNode:
    """A node config.yaml's `nodes:` declares that has not joined (no heartbeat yet): listed as `missing`, with the
    attributes of a Node row empty."""

    name: str
    address: str | None
    declared: dict[str, Any]
    status: str = MISSING
    hostname: None = None
    worker: None = None
    version: None = None
    last_seen: None = None
    first_seen: None = None
    started_at: None = None
    cpu_count: None = None
    cpu_percent: None = None
    dram_total_bytes: None = None
    dram_available_bytes: None = None
    file_port: None = None
    frames_dropped: int = 0
    storage: dict[str, Any] = field(default_factory=dict)
    gpus: list[Any] = field(default_factory=list)


def declaration(declared: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """What config.yaml says of node `name` (address, capabilities), or None."""
    entry = next((d for d in declared if d["name"] == name), None)
    return (
        None
        if entry is None
        else {"address": entry.get("address"), "capabilities": entry.get("capabilities")}
    )


def missing_nodes(declared: list[dict[str, Any]]) -> list[DeclaredNode]:
    """The declared nodes that have not joined, by name (one query, none without declarations)."""
    if not declared:
        return []
    names = [d["name"] for d in declared]
    joined = set(db.session.scalars(db.select(Node.name).where(Node.name.in_(names))))
    out = [
        DeclaredNode(d["name"], d.get("address"), declaration(declared, d["name"]) or {}) for d in declared
    ]
    return sorted((n for n in out if n.name not in joined), key=lambda n: n.name)


def node_status(node: Any, now: datetime, timeout_s: float, offline_after_s: float) -> str:
    """`node`: a Node, or a row with its `state` and `last_seen`."""
    if node.state == "stopped":
        return "offline"
    age = (now - node.last_seen).total_seconds()
    if age <= timeout_s:
        return "healthy"
    return "unhealthy" if age <= offline_after_s else "offline"


def status_clause(
    status: str, now: datetime, timeout_s: float, offline_after_s: float
) -> ColumnElement[bool]:
    """The SQL condition equal to `node_status(...) == status`."""
    fresh = now - timedelta(seconds=timeout_s)
    stale = now - timedelta(seconds=offline_after_s)
    running = Node.state != "stopped"
    if status == "healthy":
        return and_(running, Node.last_seen >= fresh)
    if status == "unhealthy":
        return and_(running, Node.last_seen < fresh, Node.last_seen >= stale)
    return or_(Node.state == "stopped", Node.last_seen < stale)


# What `GET /nodes` lists of a node: its columns but the live GPU numbers and the bookkeeping.
LISTED_COLUMNS = tuple(
    c
    for c in Node.__table__.columns
    if c.name not in ("gpu_metrics", "gpu_fingerprint", "updated_at", "status_recorded")
)
GPU_COLUMNS = (NodeGpu.node_name, NodeGpu.index, NodeGpu.uuid, NodeGpu.name, NodeGpu.memory_total_bytes)


def node_rows(
    where: ColumnElement[bool] | None, page: int, per_page: int
) -> tuple[list[Any], dict[str, list[Any]], int]:
    """One page of nodes by name as plain rows (no ORM objects: at 1,000 nodes x 8 GPUs building them was most of
    `GET /nodes`), the page's GPUs per node in index order, and the total: three queries whatever the page's size."""
    query = db.select(*LISTED_COLUMNS).order_by(Node.name)
    count = db.select(func.count()).select_from(Node)
    if where is not None:
        query, count = query.where(where), count.where(where)
    total = int(db.session.scalar(count) or 0)
    offset = (page - 1) * per_page
    if offset >= total:
        return [], {}, total
    rows = list(db.session.execute(query.limit(per_page).offset(offset)))
    gpus: dict[str, list[Any]] = {}
    if rows:
        chosen = db.select(*GPU_COLUMNS).where(NodeGpu.node_name.in_([r.name for r in rows]))
        for g in db.session.execute(chosen.order_by(NodeGpu.node_name, NodeGpu.index)):
            gpus.setdefault(g.node_name, []).append(g)
    return rows, gpus, total


def _gpu_fingerprint(gpus: list[dict[str, Any]]) -> str:
    ident = [(g.get("index"), g.get("uuid"), g.get("name"), g.get("memory_total_bytes")) for g in gpus]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32]


def _entry_time(entry_id: bytes | str) -> datetime:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return datetime.fromtimestamp(int(text.split("-", 1)[0]) / 1000.0, UTC)


def parse_heartbeats(entries: list[tuple[Any, dict[Any, Any]]]) -> dict[str, tuple[datetime, dict[str, Any]]]:
    """The newest valid heartbeat per node from stream entries; malformed ones are logged and dropped."""
    latest: dict[str, tuple[datetime, dict[str, Any]]] = {}
    for entry_id, fields in entries:
        try:
            raw = fields.get(b"data", fields.get("data"))
            data = json.loads(raw)  # type: ignore[arg-type]
            name = data["node"]
            if not isinstance(name, str) or not NODE_NAME_RE.match(name) or name in RESERVED_NODE_NAMES:
                raise ValueError(f"bad node name {name!r}")
        except (TypeError, ValueError, KeyError) as exc:
            log.warning("dropping malformed heartbeat %r: %s", entry_id, exc)
            continue
        seen = _entry_time(entry_id)
        if name not in latest or latest[name][0] <= seen:
            latest[name] = (seen, data)
    return latest


@functools.cache
def _upsert_statement(dialect: str) -> Any:
    """One cached INSERT .. ON CONFLICT statement, executed with many rows (compiled once, not per batch)."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    table = Node.__table__
    stmt = insert(table)
    keep = ("name", "first_seen", "status_recorded")
    # A redelivered old heartbeat must not move last_seen backwards.
    return stmt.on_conflict_do_update(
        index_elements=[table.c.name],
        set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keep},
        where=table.c.last_seen <= stmt.excluded.last_seen,
    )


def _num(v: Any) -> int | float | None:
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _engines(value: Any) -> dict[str, Any] | None:
    """A heartbeat's engines, kept only in their shape (preset -> {version, program, distribution}, short texts)."""
    if not isinstance(value, dict):
        return None
    out = {}
    for name, info in list(value.items())[:64]:
        if isinstance(name, str) and len(name) <= 32 and isinstance(info, dict):
            out[name] = {k: str(info[k])[:300] for k in ("version", "program", "distribution") if info.get(k)}
    return out


def apply_heartbeats(entries: list[tuple[Any, dict[Any, Any]]]) -> int:
    """Upsert one row per node from a batch of heartbeat stream entries; returns the nodes written."""
    latest = parse_heartbeats(entries)
    if not latest:
        return 0
    now = datetime.now(UTC)
    known = {
        name: fp
        for name, fp in db.session.execute(
            db.select(Node.name, Node.gpu_fingerprint).where(Node.name.in_(list(latest)))
        )
    }
    rows: list[dict[str, Any]] = []
    gpu_changes: dict[str, list[dict[str, Any]]] = {}
    for name, (seen, data) in latest.items():
        gpus = [g for g in data.get("gpus") or [] if isinstance(g, dict) and isinstance(g.get("index"), int)]
        fp = _gpu_fingerprint(gpus)
        if known.get(name, "") != fp:
            gpu_changes[name] = gpus
        started = _num(data.get("started_at"))
        rows.append(
            {
                "name": name,
                "hostname": str(data.get("hostname") or "")[:255] or None,
                "address": str(data.get("address") or "")[:255] or None,
                "worker": str(data.get("worker") or "")[:255] or None,
                "version": str(data.get("version") or "")[:64] or None,
                "state": "stopped" if data.get("state") == "stopped" else "up",
                "cpu_count": _num(data.get("cpu_count")),
                "cpu_percent": _num(data.get("cpu_percent")),
                "dram_total_bytes": _num(data.get("dram_total_bytes")),
                "dram_available_bytes": _num(data.get("dram_available_bytes")),
                "storage": data.get("storage") if isinstance(data.get("storage"), dict) else {},
                "gpu_metrics": gpus,
                "gpu_fingerprint": fp,
                "file_port": _num(data.get("file_port")),
                "frames_dropped": int(_num(data.get("frames_dropped")) or 0),
                "engines": _engines(data.get("engines")),
                "allow_remote_code": data.get("allow_remote_code")
                if isinstance(data.get("allow_remote_code"), bool)
                else None,
                "started_at": datetime.fromtimestamp(started, UTC) if started else None,
                "first_seen": seen,
                "last_seen": seen,
                "updated_at": now,
                "status_recorded": "healthy",
            }
        )
    db.session.execute(_upsert_statement(db.session.get_bind().dialect.name), rows)
    for name, gpus in gpu_changes.items():
        db.session.execute(db.delete(NodeGpu).where(NodeGpu.node_name == name))
        if gpus:
            db.session.execute(
                db.insert(NodeGpu),
                [
                    {
                        "node_name": name,
                        "index": g["index"],
                        "uuid": g.get("uuid"),
                        "name": g.get("name"),
                        "memory_total_bytes": _num(g.get("memory_total_bytes")),
                    }
                    for g in gpus
                ],
            )
    db.session.commit()
    return len(rows)


def sweep(timeout_s: float, offline_after_s: float) -> list[tuple[str, str, str]]:
    """Record status changes since the last sweep; returns (node, old, new) for each change."""
    now = datetime.now(UTC)
    changes = []
    for node in db.session.scalars(db.select(Node)):
        status = node_status(node, now, timeout_s, offline_after_s)
        if status != node.status_recorded:
            changes.append((node.name, node.status_recorded, status))
            log.warning(
                "node %s is now %s (was %s, last seen %s)",
                node.name,
                status,
                node.status_recorded,
                node.last_seen,
            )
            node.status_recorded = status
    db.session.commit()
    return changes
