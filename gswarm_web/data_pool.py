"""Bookkeeping of the data pool: where chunks are, who holds them, what the collector and eviction remove.

Only the control plane writes these rows: a location is recorded when a node task reports the verified copy
in place, and removed when a node reports the copy gone.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import current_app
from sqlalchemy import func, or_

from gswarm_tasks.devices import Device
from gswarm_tasks.errors import NotFound, ResourceUnavailable

from .extensions import db
from .models import ChunkLocation, ChunkRef, DataChunk, Node, TaskRecord, WorkflowRun
from .registry import node_status

log = logging.getLogger(__name__)

DATA_KINDS = ("data_create", "data_move", "data_transfer", "data_delete")
TIER_PREFERENCE = {"dram": 0, "disk": 1}


def now() -> datetime:
    return datetime.now(UTC)


def live_refs() -> Any:
    """Chunk ids someone holds: pinned, or read or written by a workflow that still runs."""
    return (
        db.select(ChunkRef.chunk_id)
        .outerjoin(WorkflowRun, ChunkRef.workflow_id == WorkflowRun.id)
        .where(or_(ChunkRef.kind == "pin", WorkflowRun.status == "running"))
    )


def holders(chunk: Any) -> list[str]:
    """Who holds a chunk now: its pins and the workflows that read or write it while they run."""
    out = []
    for r in chunk.refs:
        run = db.session.get(WorkflowRun, r.workflow_id) if r.workflow_id else None
        if r.kind == "pin" or (run is not None and run.status == "running"):
            out.append(r.holder)
    return out


def usable_locations(chunk: DataChunk, prefer_node: str | None = None) -> list[ChunkLocation]:
    """Available copies on nodes that are not offline; the target's own node first, then dram before disk."""
    settings = current_app.config["GSWARM_SETTINGS"]
    out = []
    for loc in chunk.locations:
        if loc.status != "available":
            continue
        node = db.session.get(Node, loc.node)
        if (
            node is None
            or node_status(node, now(), settings.heartbeat_timeout_s, settings.offline_after_s) == "offline"
        ):
            continue
        out.append(loc)
    return sorted(out, key=lambda loc: (loc.node != prefer_node, TIER_PREFERENCE.get(loc.tier, 9), loc.device))


def expected_of(chunk: DataChunk) -> dict[str, Any]:
    return {"size": chunk.size, "blake3": chunk.blake3, "checksum": chunk.checksum, "blocks": chunk.block_hashes}


def source_of(chunk: DataChunk, loc: ChunkLocation, dest_node: str, ttl_s: float | None = None) -> dict[str, Any]:
    """What `dest_node` needs to copy `chunk` from `loc`: for a peer, its file server and a token for this
    chunk only."""
    if loc.node == dest_node:
        return {"node": loc.node, "tier": loc.tier}
    node = db.session.get(Node, loc.node)
    if node is None or not node.file_port or not node.address:
        raise ResourceUnavailable(f"{loc.node} announced no file server", {"node": loc.node})
    from .operations import peer_source

    return peer_source(node, loc.tier, f"{loc.tier}/data/{chunk.id}", ttl_s)


def location_view(chunk: DataChunk, loc: ChunkLocation) -> dict[str, Any]:
    """A location as a workflow step reads it (no token: steps sign their own)."""
    node = db.session.get(Node, loc.node)
    return {
        "device": loc.device,
        "address": node.address if node else None,
        "file_port": node.file_port if node else None,
        "size": chunk.size,
        "blake3": chunk.blake3,
        "checksum": chunk.checksum,
        "blocks": chunk.block_hashes,
        "format": chunk.format,
    }


def get_chunk(chunk_id: str, field: str = "chunk_id") -> DataChunk:
    chunk = db.session.get(DataChunk, chunk_id) if isinstance(chunk_id, str) and len(chunk_id) <= 36 else None
    if chunk is None:
        raise NotFound(f"{field}: no data chunk {chunk_id!r}", {"field": field, "chunk_id": chunk_id})
    return chunk


def _upsert(chunk: DataChunk, data: dict[str, Any]) -> ChunkLocation:
    dev = Device.parse(str(data["device"]))
    loc = db.session.get(ChunkLocation, (chunk.id, str(dev)))
    if loc is None:
        loc = ChunkLocation(chunk_id=chunk.id, device=str(dev), node=str(dev.node), tier=dev.tier)
        chunk.locations.append(loc)
    loc.path, loc.status = data.get("path"), "available"
    if data.get("size") is not None:
        chunk.size = data["size"]
    chunk.checksum = chunk.checksum or data.get("checksum")
    chunk.blake3 = chunk.blake3 or data.get("blake3")
    chunk.block_hashes = chunk.block_hashes or data.get("blocks")
    if chunk.status != "deleting":
        chunk.status, chunk.status_message = "available", None
    return loc


def _drop(chunk: DataChunk, device: str) -> None:
    loc = db.session.get(ChunkLocation, (chunk.id, device))
    if loc is not None:
        chunk.locations.remove(loc)
        db.session.delete(loc)


def delete_copy(chunk: DataChunk, loc: ChunkLocation, reason: str = "delete") -> TaskRecord:
    from .operations import dispatch

    loc.status = "deleting"
    return dispatch(
        "data_delete",
        loc.node,
        "gswarm.node.data.delete",
        {"chunk_id": chunk.id, "tier": loc.tier},
        source=loc.device,
        extra_params={"chunk_id": chunk.id, "reason": reason},
    )


def record_data_result(rec: TaskRecord, data: dict[str, Any]) -> None:
    """A chunk was stored or copied (a verified location) or one copy was removed."""
    params = rec.params or {}
    # The chunk row is locked: two copies removed at once must not each see the other still there.
    chunk = db.session.get(DataChunk, params.get("chunk_id"), with_for_update=True, populate_existing=True)
    if chunk is None:
        if rec.kind != "data_delete" and data.get("device"):  # the chunk is gone: so goes the copy just made
            from .operations import dispatch

            dev = Device.parse(str(data["device"]))
            dispatch(
                "data_delete",
                str(dev.node),
                "gswarm.node.data.delete",
                {"chunk_id": params["chunk_id"], "tier": dev.tier},
                source=str(dev),
                extra_params={"chunk_id": params["chunk_id"], "reason": "the chunk was deleted"},
            )
        return
    if rec.kind == "data_delete":
        _drop(chunk, str(rec.source_device or data.get("device")))
        if not chunk.locations and chunk.status == "deleting":
            db.session.delete(chunk)
        return
    loc = _upsert(chunk, data)
    if chunk.status == "deleting":  # deleted while this copy was under way: it goes too
        delete_copy(chunk, loc, "the chunk was deleted")
        return
    if data.get("source_removed") and data.get("source_device"):
        _drop(chunk, str(data["source_device"]))
    elif rec.kind == "data_transfer" and params.get("delete_source") and rec.source_device:
        src = db.session.get(ChunkLocation, (chunk.id, rec.source_device))
        if src is not None and src.device != loc.device:
            delete_copy(chunk, src, "transfer with delete_source")
    if loc.tier == "dram":
        enforce_dram_capacity([loc.node])


def on_data_failure(rec: TaskRecord) -> None:
    params = rec.params or {}
    chunk = db.session.get(DataChunk, params.get("chunk_id"))
    if chunk is None:
        return
    message = (rec.error or {}).get("message")
    if rec.kind == "data_create" and not chunk.locations and chunk.status == "deleting":
        db.session.delete(chunk)  # deleted while being created, and the create failed: nothing is left
    elif rec.kind == "data_create" and not chunk.locations:
        chunk.status, chunk.status_message = "failed", message
    elif rec.kind == "data_delete" and rec.source_device:
        loc = db.session.get(ChunkLocation, (chunk.id, rec.source_device))
        if loc is not None and loc.status == "deleting":
            loc.status = "available"
        if chunk.status == "deleting":
            chunk.status_message = f"deleting {rec.source_device} failed: {message}"
    else:
        chunk.status_message = f"{rec.kind} to {rec.target_device} failed: {message}"


def touch(chunk_ids: list[str]) -> None:
    """A read: last_accessed and access_count, in one statement (concurrent readers never lose a count)."""
    if chunk_ids:
        db.session.execute(
            db.update(DataChunk)
            .where(DataChunk.id.in_(chunk_ids))
            .values(last_accessed=now(), access_count=DataChunk.access_count + 1)
        )


# ---- capacity and collection --------------------------------------------------------------------------------


def enforce_dram_capacity(nodes: list[str] | None = None) -> list[str]:
    """Bring each node's dram tier under `data.dram_capacity` by removing the least recently used copies that
    exist elsewhere too; a chunk's only copy, and chunks someone holds, are never evicted."""
    cap = current_app.config["GSWARM_SETTINGS"].data_dram_capacity
    if not cap:
        return []
    evicted: list[str] = []
    query = (
        db.select(ChunkLocation.node, func.sum(DataChunk.size))
        .join(DataChunk)
        .where(ChunkLocation.tier == "dram", ChunkLocation.status == "available")
        .group_by(ChunkLocation.node)
    )
    if nodes:
        query = query.where(ChunkLocation.node.in_(nodes))
    held: set[str] | None = None
    for node, used in db.session.execute(query).all():
        used = int(used or 0)
        if used <= cap:
            continue
        copies = (
            db.select(ChunkLocation.chunk_id, func.count())
            .where(ChunkLocation.status == "available")
            .group_by(ChunkLocation.chunk_id)
            .subquery()
        )
        candidates = db.session.execute(
            db.select(DataChunk, ChunkLocation)
            .join(ChunkLocation, ChunkLocation.chunk_id == DataChunk.id)
            .join(copies, copies.c.chunk_id == DataChunk.id)
            .where(
                ChunkLocation.node == node,
                ChunkLocation.tier == "dram",
                ChunkLocation.status == "available",
                copies.c.count > 1,
            )
            .order_by(func.coalesce(DataChunk.last_accessed, DataChunk.created_at), DataChunk.id)
        ).all()
        if held is None:
            held = set(db.session.scalars(live_refs()))
        for chunk, loc in candidates:
            if used <= cap:
                break
            if chunk.id in held:
                continue
            delete_copy(chunk, loc, "evicted: dram over capacity")
            used -= int(chunk.size or 0)
            evicted.append(f"{chunk.id}@{loc.device}")
        if used > cap:
            log.warning("%s:dram stays over capacity (%d > %d): the rest are only copies or held", node, used, cap)
    return evicted


def collect_garbage() -> dict[str, int]:
    """Remove intermediate chunks nobody holds once they are older than the TTL (by last access), and
    failed chunks that never got a copy."""
    settings = current_app.config["GSWARM_SETTINGS"]
    cutoff = now() - timedelta(seconds=settings.data_intermediate_ttl_s)
    stale = func.coalesce(DataChunk.last_accessed, DataChunk.created_at) < cutoff
    held = live_refs()
    doomed = list(
        db.session.scalars(
            db.select(DataChunk).where(
                DataChunk.chunk_type == "intermediate",
                DataChunk.status == "available",
                stale,
                DataChunk.id.not_in(held),
            )
        )
    )
    removed_rows = 0
    for chunk in doomed:
        chunk.status, chunk.status_message = "deleting", "collected: unreferenced intermediate past its TTL"
        for loc in list(chunk.locations):
            delete_copy(chunk, loc, "collected")
        if not chunk.locations:
            db.session.delete(chunk)
            removed_rows += 1
    failed = list(
        db.session.scalars(db.select(DataChunk).where(DataChunk.status == "failed", DataChunk.created_at < cutoff))
    )
    for chunk in failed:
        if not chunk.locations:
            db.session.delete(chunk)
            removed_rows += 1
    db.session.commit()
    evicted = enforce_dram_capacity()
    db.session.commit()
    return {"collected": len(doomed), "rows_removed": removed_rows, "evicted": len(evicted)}
