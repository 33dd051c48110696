"""What a user asks of the data pool: create a chunk (stored once per device), copy or move it, delete it, pin it.

Each command records its chunk rows and operations and sends them; the chunk's locations change only when the
nodes report (`chunk_state`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from types import SimpleNamespace
from typing import Any

from gswarm_tasks import names
from gswarm_tasks.data.sources import parse_data_source
from gswarm_tasks.devices import Device, parse_target
from gswarm_tasks.errors import Conflict, InvalidRequest, NotFound, ResourceUnavailable

from ...extensions import db, redis_client, settings
from ...tables import ChunkLocation, ChunkRef, DataChunk, TaskRecord
from ...tables import utcnow as now
from ..dispatch import ACTIVE, record, require_node, send_recorded
from ..nodes.devices import by_address
from ..nodes.placement import choose
from .state import delete_copy, expected_of, holders, source_of, usable_locations


def data_target(text: str, field: str = "device") -> tuple[Device, dict[str, Any] | None]:
    """The device a chunk goes to: as given, or chosen by placement for `auto` (with the decision)."""
    target = parse_target(by_address(text, field), field)
    if isinstance(target, Device):
        return target.expect(field, files=True), None
    if target.kind in ("gpu", "cpu"):
        raise InvalidRequest(
            f"{field}: {target} is not a data tier (auto, auto:dram or auto:disk)", {"field": field}
        )
    decision = choose(None, "data", target)
    return Device.parse(decision["chosen"]), decision


def create_kwargs(args: dict[str, Any], prefix: str = "") -> tuple[dict[str, Any], str | None]:
    """What the node's create task gets: the bytes (checked base64, with their sha256) or a checked source."""
    s = settings()
    limit = s.data_max_inline
    field = f"{prefix}data"
    if "data" not in args:
        parse_data_source(args["source"], s, f"{prefix}source")
        return {"source_url": args["source"]}, None
    if len(args["data"]) > limit * 4 // 3 + 4:
        raise InvalidRequest(f"{field}: more than {limit} bytes; use `source`", {"field": field})
    try:
        raw = base64.b64decode(args["data"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(f"{field}: not valid base64", {"field": field}) from exc
    if len(raw) > limit:
        raise InvalidRequest(f"{field}: more than {limit} bytes; use `source`", {"field": field})
    checksum = hashlib.sha256(raw).hexdigest()
    return {"data_b64": args["data"], "checksum": checksum}, checksum


def stored_copy(checksum: str, device: Device) -> DataChunk | None:
    """A chunk with these bytes already available on `device`."""
    return db.session.scalar(
        db.select(DataChunk)
        .join(ChunkLocation)
        .where(
            DataChunk.checksum == checksum,
            ChunkLocation.device == str(device),
            ChunkLocation.status == "available",
        )
        .limit(1)
    )


def create(
    device: Device, kwargs: dict[str, Any], fields: dict[str, Any], placement: dict[str, Any] | None = None
) -> SimpleNamespace:
    """Record a chunk (`queued`) and send its create to `device`'s node, in one transaction.

    Every create is a chunk of its own (id, type, metadata, lifetime); bytes already on the device are shared, not
    written again: the node links the new chunk's file to the existing one's (the file system counts the links, so
    deleting either leaves the other whole). The answer is built from what was written, so nothing is read back
    (this takes small chunks by the thousand)."""
    row = {"id": str(uuid.uuid4()), "status": "queued", "created_at": now(), **fields}
    same = stored_copy(str(fields["checksum"]), device) if fields.get("checksum") else None
    if same is not None:
        kwargs = {**kwargs, "link_from": same.id}
    db.session.add(DataChunk(**row, locations=[], refs=[]))
    rec = record(
        "data_create",
        str(device.node),
        names.DATA_CREATE,
        {"chunk_id": row["id"], "tier": device.tier, **_staged(row["id"], kwargs)},
        target=str(device),
        extra_params={"chunk_id": row["id"], **({"placement": placement} if placement else {})},
    )
    task_id = rec.id
    db.session.commit()
    send_recorded()
    return SimpleNamespace(
        **row,
        size=None,
        blake3=None,
        status_message=None,
        last_accessed=None,
        access_count=0,
        locations=[],
        refs=[],
        task_id=task_id,
        deduplicated=same is not None,
    )


def inline_size(data_b64: str) -> int:
    """The bytes behind checked base64 text."""
    return len(data_b64) * 3 // 4 - (len(data_b64) - len(data_b64.rstrip("=")))


def _staged(chunk_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The create's arguments: bytes up to data.inline_max_bytes travel in the message (and the outbox row); larger
    ones wait in Redis for the node, so neither the broker's message nor the row carries megabytes."""
    text = kwargs.get("data_b64")
    if not isinstance(text, str) or inline_size(text) <= settings().data_inline_max_bytes:
        return kwargs
    key = names.chunk_bytes_key(chunk_id)
    redis_client().set(key, text, ex=names.KEEP_S)
    return {**{k: v for k, v in kwargs.items() if k != "data_b64"}, "data_key": key}


def _staged_batch(chunks: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A batch create's arguments: its chunks in the message while together they stay within
    data.inline_max_bytes, else waiting in Redis under one key. A batch's bytes in the outbox row cost Postgres
    about 24 ms an insert at 100 x 4 KiB (bench/chunks.py)."""
    if sum(inline_size(c["data_b64"]) for c in chunks) <= limit:
        return {"chunks": chunks}
    key = names.chunk_batch_key(chunks[0]["chunk_id"])
    redis_client().set(key, json.dumps(chunks), ex=names.KEEP_S)
    return {"chunks_key": key}


class NewChunk:
    """One chunk of a batch to create: where, the node task's arguments, the row's fields."""

    __slots__ = ("device", "kwargs", "fields", "placement")

    def __init__(
        self, device: Device, kwargs: dict[str, Any], fields: dict[str, Any], placement: dict[str, Any] | None
    ) -> None:
        self.device, self.kwargs, self.fields, self.placement = device, kwargs, fields, placement


def create_many(items: list[NewChunk]) -> list[dict[str, Any]]:
    """Create many chunks in one transaction and one round trip to the broker; what each became, in order.

    Each is a chunk of its own; bytes already available on the device (or earlier in the batch) are shared, as one
    by one. Small inline chunks bound for one device go as one operation whose message carries their bytes (the
    node stores them in order, so a later one can share an earlier one's bytes); others (sources, larger bytes) as
    one operation each, as `create` sends them."""
    same = _stored_copies(items)
    out: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    grouped: dict[str, list[tuple[dict[str, Any], NewChunk, str | None]]] = {}
    limit = settings().data_inline_max_bytes
    for item in items:
        checksum = item.fields.get("checksum")
        key = (str(checksum), str(item.device))
        link_from = same.get(key) if checksum else None
        row = {"id": str(uuid.uuid4()), "status": "queued", "created_at": now(), **item.fields}
        rows.append(row)
        answer = {
            "chunk_id": row["id"],
            "status": "queued",
            "device": str(item.device),
            "deduplicated": link_from is not None,
        }
        out.append(answer)
        text = item.kwargs.get("data_b64")
        if isinstance(text, str) and inline_size(text) <= limit:
            grouped.setdefault(str(item.device), []).append((answer, item, link_from))
            if checksum and link_from is None:
                same[key] = row["id"]  # stored before any later item of its device's batch
            continue
        kwargs = {**item.kwargs, **({"link_from": link_from} if link_from else {})}
        rec = record(
            "data_create",
            str(item.device.node),
            names.DATA_CREATE,
            {"chunk_id": row["id"], "tier": item.device.tier, **_staged(row["id"], kwargs)},
            target=str(item.device),
            extra_params={"chunk_id": row["id"], **({"placement": item.placement} if item.placement else {})},
        )
        answer["task_id"] = rec.id
    if rows:
        db.session.execute(db.insert(DataChunk), rows)  # one bulk statement
    for device, members in grouped.items():
        dev = members[0][1].device
        chunks = [
            {
                "chunk_id": a["chunk_id"],
                "data_b64": i.kwargs["data_b64"],
                "checksum": i.kwargs.get("checksum"),
                **({"link_from": link} if link else {}),
            }
            for a, i, link in members
        ]
        rec = record(
            "data_create",
            str(dev.node),
            names.DATA_CREATE_BATCH,
            {"tier": dev.tier, **_staged_batch(chunks, limit)},
            target=device,
            extra_params={
                "chunk_ids": [c["chunk_id"] for c in chunks],
                **({"placement": members[0][1].placement} if members[0][1].placement else {}),
            },
        )
        for a, _, _ in members:
            a["task_id"] = rec.id
    db.session.commit()
    send_recorded()
    return out


def _stored_copies(items: list[NewChunk]) -> dict[tuple[str, str], str]:
    """(checksum, device) -> a chunk already available there, for every item: the chunks with those checksums
    (by their index), then their available copies on those devices (by primary key). Two lookups, not one join:
    as a prepared statement the join got a generic plan that scanned every location, and took 15 ms on a fresh
    pool and 450 ms at 30,000 chunks (bench/chunks.py)."""
    checksums = {i.fields["checksum"] for i in items if i.fields.get("checksum")}
    if not checksums:
        return {}
    by_id = dict(
        db.session.execute(
            db.select(DataChunk.id, DataChunk.checksum).where(DataChunk.checksum.in_(checksums))
        )
        .tuples()
        .all()
    )
    if not by_id:
        return {}
    rows = db.session.execute(
        db.select(ChunkLocation.chunk_id, ChunkLocation.device).where(
            ChunkLocation.chunk_id.in_(by_id),
            ChunkLocation.device.in_({str(i.device) for i in items}),
            ChunkLocation.status == "available",
        )
    ).tuples()
    return {(str(by_id[i]), str(d)): str(i) for i, d in rows}


def _under_way(chunk: DataChunk, target: Device) -> TaskRecord | None:
    busy = db.session.scalars(
        db.select(TaskRecord).where(
            TaskRecord.kind.in_(("data_move", "data_transfer")),
            TaskRecord.state.in_(ACTIVE),
            TaskRecord.target_device == str(target),
        )
    )
    return next((rec for rec in busy if (rec.params or {}).get("chunk_id") == chunk.id), None)


def copy(
    chunk: DataChunk, target: Device, kind: str, priority: str, delete_source: bool, compression: str = "none"
) -> tuple[dict[str, Any], int]:
    """Send one verified copy of `chunk` (locked by the caller: `get_chunk(..., locked=True)`) to `target` (a move
    when `kind` is data_move; zstd-compressed between nodes with `compression`); idempotent while the same copy is
    under way, and a no-op when the copy exists."""
    if chunk.status != "available":
        raise Conflict(f"chunk {chunk.id} is {chunk.status}", {"chunk_id": chunk.id, "status": chunk.status})
    answer: dict[str, Any] = {"chunk_id": chunk.id, "target_device": str(target), "noop": False}
    if any(loc.device == str(target) and loc.status == "available" for loc in chunk.locations):
        return {**answer, "task_id": None, "noop": True}, 200
    require_node(str(target.node), "target_device")
    running = _under_way(chunk, target)
    if running is not None:
        return {**answer, "task_id": running.id, "source_device": running.source_device}, 202
    locs = usable_locations(chunk, prefer_node=str(target.node))
    if kind == "data_move":
        locs = [loc for loc in locs if loc.node == target.node]
    if not locs:
        where = f"on {target.node}" if kind == "data_move" else "on a reachable node"
        raise ResourceUnavailable(f"chunk {chunk.id} has no available copy {where}", {"chunk_id": chunk.id})
    src = locs[0]
    source_device = src.device
    kwargs = {
        "chunk_id": chunk.id,
        "tier": target.tier,
        "source": source_of(chunk, src, str(target.node)),
        "expected": expected_of(chunk),
        "remove_source": kind == "data_move" or (delete_source and src.node == target.node),
    }
    if compression != "none" and src.node != target.node:
        kwargs["compression"] = compression  # only then: a node of an older release takes the rest
    rec = record(
        kind,
        str(target.node),
        names.DATA_COPY,
        kwargs,
        priority,
        source=source_device,
        target=str(target),
        extra_params={"chunk_id": chunk.id, "delete_source": delete_source, "compression": compression},
    )
    answer = {
        **answer,
        "task_id": rec.id,
        "source_device": source_device,
    }  # read before the commit expires them
    db.session.commit()
    send_recorded()
    return answer, 202


def delete(chunk: DataChunk, force: bool) -> list[str]:
    """Delete a chunk (locked by the caller) and every copy (refused while someone holds it, unless `force`); the
    ids of the removals. Its bytes stay wherever another chunk shares them."""
    if chunk.status == "deleting":  # a second delete: the first one's removals are under way
        return []
    held = holders(chunk)
    if held and not force:
        raise Conflict(
            f"chunk {chunk.id} is referenced by {', '.join(held)}; unpin it, wait, or pass force=true",
            {"chunk_id": chunk.id, "references": held},
        )
    if not chunk.locations:
        if chunk.status == "queued":  # its create is under way: the copy it makes is removed when it lands
            chunk.status, chunk.status_message = "deleting", "deleted while being created"
        else:
            db.session.delete(chunk)
        db.session.commit()
        return []
    chunk.status = "deleting"
    chunk.refs.clear()
    tasks = [delete_copy(chunk.id, loc.device).id for loc in list(chunk.locations)]
    db.session.commit()
    send_recorded()
    return tasks


def pin(chunk: DataChunk, holder: str) -> bool:
    """Pin a chunk (locked by the caller) for `holder`; False when that pin was there already. A chunk being
    deleted cannot be pinned."""
    if chunk.status == "deleting":
        raise Conflict(f"chunk {chunk.id} is being deleted", {"chunk_id": chunk.id, "status": chunk.status})
    key = f"pin:{holder}"
    if any(r.holder == key for r in chunk.refs):
        return False
    chunk.refs.append(ChunkRef(chunk_id=chunk.id, holder=key, kind="pin"))
    db.session.commit()
    return True


def unpin(chunk: DataChunk, holder: str) -> None:
    """Remove `holder`'s pin of a chunk (locked by the caller)."""
    ref = next((r for r in chunk.refs if r.holder == f"pin:{holder}"), None)
    if ref is None:
        raise NotFound(f"chunk {chunk.id} has no pin {holder!r}", {"chunk_id": chunk.id, "holder": holder})
    chunk.refs.remove(ref)
    db.session.commit()
