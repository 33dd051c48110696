"""The data pool's state: where chunks are, who holds them, what the collector and eviction remove.

Only the control plane writes these rows: a location is recorded when a node (a data operation or a workflow
step) reports the verified copy in place, and removed when a node reports the copy gone.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from sqlalchemy import func, inspect, or_
from sqlalchemy.orm import selectinload

from gswarm_tasks import names
from gswarm_tasks.devices import Device
from gswarm_tasks.errors import NotFound
from gswarm_tasks.storage import prefix as storage_prefix

from ...extensions import db, settings
from ...tables import ChunkLocation, ChunkRef, DataChunk, Node, TaskRecord, WorkflowRun
from ...tables import utcnow as now
from ..dispatch import peer_source, record
from ..locking import lock
from ..nodes.state import node_status

log = logging.getLogger(__name__)

DATA_KINDS = ("data_create", "data_move", "data_transfer", "data_delete")
TIER_PREFERENCE = {"dram": 0, "disk": 1}


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
    s = settings()
    out = []
    for loc in chunk.locations:
        if loc.status != "available":
            continue
        node = db.session.get(Node, loc.node)
        if node is None or node_status(node, now(), s.heartbeat_timeout_s, s.offline_after_s) == "offline":
            continue
        out.append(loc)
    return sorted(
        out, key=lambda loc: (loc.node != prefer_node, TIER_PREFERENCE.get(loc.tier, 9), loc.device)
    )


def expected_of(chunk: DataChunk) -> dict[str, Any]:
    return {
        "size": chunk.size,
        "blake3": chunk.blake3,
        "checksum": chunk.checksum,
        "blocks": chunk.block_hashes,
    }


def source_of(chunk: DataChunk, loc: ChunkLocation, dest_node: str) -> dict[str, Any]:
    """What `dest_node` needs to copy `chunk` from `loc`: for a peer, its file server and the chunk's prefix (the
    destination signs its own token for it)."""
    if loc.node == dest_node:
        return {"node": loc.node, "tier": loc.tier}
    node = db.session.get(Node, loc.node)
    if node is None:
        raise NotFound(f"{loc.node} is not registered", {"node": loc.node})
    return peer_source(node, loc.tier, storage_prefix(loc.tier, "data", chunk.id))


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


def get_chunk(chunk_id: str, field: str = "chunk_id", locked: bool = False) -> DataChunk:
    """The chunk (404 naming `field` if there is none); `locked`: its row locked until the caller commits, with
    its copies and references read again, so what the caller checks stays true until it has acted."""
    chunk = None
    if isinstance(chunk_id, str) and len(chunk_id) <= 36:
        chunk = lock(DataChunk, DataChunk.id == chunk_id) if locked else db.session.get(DataChunk, chunk_id)
    if chunk is None:
        raise NotFound(f"{field}: no data chunk {chunk_id!r}", {"field": field, "chunk_id": chunk_id})
    return chunk


def _upsert(chunk: DataChunk, data: dict[str, Any]) -> ChunkLocation:
    dev = Device.parse(str(data["device"]))
    loc = next(
        (x for x in chunk.locations if x.device == str(dev)), None
    )  # the copies are loaded with the chunk
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


def delete_copy(chunk_id: str, device: str, reason: str = "delete") -> TaskRecord:
    """Record the removal of one copy (sent after the caller commits); its location goes when the node says so."""
    loc = db.session.get(ChunkLocation, (chunk_id, device))
    if loc is not None:
        loc.status = "deleting"
    dev = Device.parse(device)
    return record(
        "data_delete",
        str(dev.node),
        names.DATA_DELETE,
        {"chunk_id": chunk_id, "tier": dev.tier},
        source=device,
        extra_params={"chunk_id": chunk_id, "reason": reason},
    )


def copy_landed(chunk: DataChunk, data: dict[str, Any], delete_source: bool = False) -> ChunkLocation | None:
    """A node reports a verified copy of `chunk` in place: record it, and what follows from it (a copy of a
    deleted chunk goes too; the source of a move or of a transfer with `delete_source` goes; dram is kept under
    its capacity)."""
    loc = _upsert(chunk, data)
    if chunk.status == "deleting":  # deleted while this copy was under way: it goes too
        delete_copy(chunk.id, loc.device, "the chunk was deleted")
        return None
    source = data.get("source_device")
    if data.get("source_removed") and source:
        _drop(chunk, str(source))
    elif (
        delete_source
        and source
        and source != loc.device
        and db.session.get(ChunkLocation, (chunk.id, source))
    ):
        delete_copy(chunk.id, str(source), "transfer with delete_source")
    if loc.tier == "dram" and settings().data_dram_capacity:
        db.session.flush()
        enforce_dram_capacity([loc.node])
    return loc


_LOCKED = "gswarm_chunks_locked"


def lock_chunks(chunk_ids: set[str]) -> None:
    """Load and lock the chunks a batch of reports is about, with their copies, in two queries (in id order, so
    two lockers never wait on each other); `record_data_result` then finds them without a query each."""
    ids = sorted(i for i in chunk_ids if isinstance(i, str))
    if not ids:
        return
    query = (
        db.select(DataChunk)
        .where(DataChunk.id.in_(ids))
        .order_by(DataChunk.id)
        .options(selectinload(DataChunk.locations))
        .with_for_update(of=DataChunk)
        .execution_options(populate_existing=True)
    )
    db.session.info[_LOCKED] = {c.id: c for c in db.session.scalars(query)}  # held: the identity map is weak


def unlock_chunks() -> None:
    """Forget what `lock_chunks` loaded (the locks go with the transaction)."""
    db.session.info.pop(_LOCKED, None)


def _locked_chunk(chunk_id: Any, skip_locked: bool = False) -> DataChunk | None:
    """The chunk row, locked: two copies removed at once must not each see the other still there."""
    chunk = db.session.info.get(_LOCKED, {}).get(chunk_id)
    if chunk is not None and inspect(chunk).persistent and chunk not in db.session.deleted:
        return cast(DataChunk, chunk)
    return lock(DataChunk, DataChunk.id == chunk_id, skip_locked=skip_locked)


def chunk_ids_of(rec: TaskRecord) -> list[str]:
    """The chunks a data operation is about (a batch create makes several)."""
    params = rec.params or {}
    if params.get("chunk_ids"):
        return [str(c) for c in params["chunk_ids"]]
    return [str(params["chunk_id"])] if params.get("chunk_id") else []


def record_data_result(rec: TaskRecord, data: dict[str, Any]) -> None:
    """A data operation succeeded: a chunk was stored or copied (a verified location), or one copy removed; a batch
    create stored several."""
    params = rec.params or {}
    if params.get("chunk_ids"):
        for item in data.get("chunks") or []:
            if isinstance(item, dict) and item.get("chunk_id") in params["chunk_ids"]:
                _landed(rec, str(item["chunk_id"]), item)
        return
    _landed(rec, params.get("chunk_id"), data)


def _landed(rec: TaskRecord, chunk_id: Any, data: dict[str, Any]) -> None:
    params = rec.params or {}
    chunk = _locked_chunk(chunk_id)
    if chunk is None:
        if rec.kind != "data_delete" and data.get("device"):  # the chunk is gone: so goes the copy just made
            delete_copy(str(chunk_id), str(data["device"]), "the chunk was deleted")
        return
    if rec.kind == "data_delete":
        _drop(chunk, str(rec.source_device or data.get("device")))
        if not chunk.locations and chunk.status == "deleting":
            db.session.delete(chunk)
        return
    copy_landed(chunk, data, delete_source=rec.kind == "data_transfer" and bool(params.get("delete_source")))


def on_data_failure(rec: TaskRecord) -> None:
    for chunk_id in chunk_ids_of(rec):
        _failed(rec, chunk_id)


def _failed(rec: TaskRecord, chunk_id: str) -> None:
    chunk = db.session.get(DataChunk, chunk_id)
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
    cap = settings().data_dram_capacity
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
        for candidate, loc in candidates:
            if used <= cap:
                break
            if candidate.id in held:
                continue
            chunk = _locked_chunk(candidate.id, skip_locked=True)  # a pin may be deciding: check again, held
            if chunk is None or holders(chunk) or sum(x.status == "available" for x in chunk.locations) < 2:
                continue
            delete_copy(chunk.id, loc.device, "evicted: dram over capacity")
            used -= int(chunk.size or 0)
            evicted.append(f"{chunk.id}@{loc.device}")
        if used > cap:
            log.warning(
                "%s:dram stays over capacity (%d > %d): the rest are only copies or held", node, used, cap
            )
    return evicted


# ---- workflows ------------------------------------------------------------------------------------------------


def hold(chunk: DataChunk, workflow_id: str) -> None:
    """The workflow holds `chunk` while it runs (the collector and eviction leave it alone)."""
    holder = f"workflow:{workflow_id}"
    if (
        not any(r.holder == holder for r in chunk.refs)
        and db.session.get(ChunkRef, (chunk.id, holder)) is None
    ):
        chunk.refs.append(
            ChunkRef(chunk_id=chunk.id, holder=holder, kind="workflow", workflow_id=workflow_id)
        )


def record_step_chunk(step: TaskRecord, outputs: dict[str, Any]) -> None:
    """A data step succeeded: its chunk (made here, or a new copy), the chunks it read, and the workflow's
    reference on them."""
    cid = outputs.get("chunk_id")
    if not cid or not outputs.get("device"):
        return
    params = dict((step.params or {}).get("params") or {})
    chunk = _locked_chunk(cid)
    if chunk is None:
        chunk = DataChunk(
            id=cid,
            chunk_type=str(
                params.get("data_type") or ("input" if step.kind == "data_create" else "intermediate")
            ),
            format=outputs.get("format") or params.get("format"),
            meta=dict(params.get("metadata") or {}),
            status="available",
            created_by=f"workflow:{step.workflow_id}/{step.step_id}",
            locations=[],
            refs=[],
        )
        db.session.add(chunk)
    if step.workflow_id:
        hold(chunk, str(step.workflow_id))
    copy_landed(
        chunk, outputs, delete_source=step.kind == "data_transfer" and bool(outputs.get("delete_source"))
    )
    read = [str(x) for x in outputs.get("inputs") or [] if isinstance(x, str)]
    for rid in read:
        other = db.session.get(DataChunk, rid)
        if other is not None and step.workflow_id:
            hold(other, str(step.workflow_id))
    touch(read)
