"""`/data`: the data pool. Chunks are bytes on node tiers; equal content on one device is stored once."""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import marshmallow as ma
import requests
from flask import Response, current_app, g, request, stream_with_context
from flask.views import MethodView
from flask_smorest import Blueprint
from sqlalchemy import inspect as sa_inspect

from gswarm_tasks.data_tasks import parse_data_source
from gswarm_tasks.devices import Device
from gswarm_tasks.errors import Conflict, InvalidRequest, NetworkError, NotFound, ResourceUnavailable

from .data_pool import delete_copy, expected_of, get_chunk, holders, source_of, touch, usable_locations
from .errors import error_response
from .extensions import db
from .models import ChunkLocation, ChunkRef, DataChunk, TaskRecord
from .operations import ACTIVE, dispatch, require_node
from .pagination import PageArgsSchema, paginate

blp = Blueprint("data", __name__, url_prefix="/api/v1", description="The data pool")

TYPES = ("input", "output", "intermediate")
PRIORITIES = ("critical", "high", "normal", "low")
HOLDER = ma.validate.Regexp(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$", error="letters, digits and _ . : @ - (up to 128)")


class ChunkLocationSchema(ma.Schema):
    device = ma.fields.String()
    path = ma.fields.String(allow_none=True)
    status = ma.fields.String()


class ChunkSchema(ma.Schema):
    chunk_id = ma.fields.String(attribute="id")
    chunk_type = ma.fields.String()
    size = ma.fields.Integer(allow_none=True)
    format = ma.fields.String(allow_none=True)
    status = ma.fields.String()
    status_message = ma.fields.String(allow_none=True)
    locations = ma.fields.List(ma.fields.Nested(ChunkLocationSchema))
    references = ma.fields.Method("get_references")
    metadata = ma.fields.Method("get_metadata")

    def get_references(self, c: DataChunk) -> list[str]:
        return holders(c)

    def get_metadata(self, c: DataChunk) -> dict[str, Any]:
        return {
            **(c.meta or {}),
            "created_by": c.created_by,
            "created_at": c.created_at.isoformat(),
            "last_accessed": c.last_accessed.isoformat() if c.last_accessed else None,
            "access_count": c.access_count,
            "checksum": c.checksum,
            "blake3": c.blake3,
            "format": c.format,
            "size": c.size,
        }


class ChunkCreatedSchema(ChunkSchema):
    task_id = ma.fields.String(allow_none=True)
    deduplicated = ma.fields.Boolean()


class ChunkCreateSchema(ma.Schema):
    data = ma.fields.String(metadata={"description": "base64 bytes (up to data.max_inline, 16 MiB)"})
    source = ma.fields.String(
        metadata={"description": "file:///path under an allowed root, http(s):// to an allowed host, s3:// if enabled"}
    )
    type = ma.fields.String(load_default="input", validate=ma.validate.OneOf(TYPES))
    format = ma.fields.String(validate=ma.validate.Length(max=32))
    device = ma.fields.String(required=True)
    metadata = ma.fields.Dict(load_default=dict)


class ChunkListArgsSchema(PageArgsSchema):
    device = ma.fields.String()
    type = ma.fields.String(validate=ma.validate.OneOf(TYPES))


class ChunkListSchema(ma.Schema):
    chunks = ma.fields.List(ma.fields.Nested(ChunkSchema))
    total = ma.fields.Integer()
    page = ma.fields.Integer()
    per_page = ma.fields.Integer()


@blp.route("/data")
class Chunks(MethodView):
    @blp.arguments(ChunkListArgsSchema, location="query")
    @blp.response(200, ChunkListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """List chunks (filters: device, type)"""
        query = db.select(DataChunk).order_by(DataChunk.created_at.desc())
        if "type" in args:
            query = query.where(DataChunk.chunk_type == args["type"])
        if "device" in args:
            query = query.where(
                DataChunk.id.in_(db.select(ChunkLocation.chunk_id).where(ChunkLocation.device == args["device"]))
            )
        items, total = paginate(query, args["page"], args["per_page"])
        return {"chunks": items, "total": total, "page": args["page"], "per_page": args["per_page"]}

    @blp.arguments(ChunkCreateSchema)
    @blp.response(202, ChunkCreatedSchema)
    def post(self, args: dict[str, Any]) -> Any:
        """Create a chunk from base64 `data` or a `source`; equal content on the same device is stored once"""
        dev = Device.parse(args["device"], field="device")
        if dev.tier not in ("disk", "dram") or dev.index is not None:
            raise InvalidRequest(f"device: {dev} is not a data tier (disk or dram)", {"field": "device"})
        if ("data" in args) == ("source" in args):
            raise InvalidRequest("data: give either `data` (base64) or `source`", {"field": "data"})
        kwargs: dict[str, Any] = {"tier": dev.tier}
        checksum = None
        settings = current_app.config["GSWARM_SETTINGS"]
        limit = settings.data_max_inline
        if "data" in args:
            if len(args["data"]) > limit * 4 // 3 + 4:
                raise InvalidRequest(f"data: more than {limit} bytes; use `source`", {"field": "data"})
            try:
                raw = base64.b64decode(args["data"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidRequest("data: not valid base64", {"field": "data"}) from exc
            if len(raw) > limit:
                raise InvalidRequest(f"data: more than {limit} bytes; use `source`", {"field": "data"})
            checksum = hashlib.sha256(raw).hexdigest()
            kwargs.update(data_b64=args["data"], checksum=checksum)
        else:
            parse_data_source(args["source"], settings, "source")
            kwargs["source_url"] = args["source"]
        require_node(str(dev.node), "device")
        if checksum is not None:
            same = db.session.scalar(
                db.select(DataChunk)
                .join(ChunkLocation)
                .where(
                    DataChunk.checksum == checksum,
                    ChunkLocation.device == str(dev),
                    ChunkLocation.status == "available",
                )
            )
            if same is not None:
                same.deduplicated, same.task_id = True, None
                return same, 200
        fields: dict[str, Any] = {
            "id": str(uuid.uuid4()),
            "chunk_type": args["type"],
            "format": args.get("format"),
            "meta": args["metadata"],
            "status": "queued",
            "created_by": f"api:{g.get('token_name') or 'anonymous'}",
            "created_at": datetime.now(UTC),
            "checksum": checksum,
        }
        db.session.add(DataChunk(**fields, locations=[], refs=[]))
        # One transaction for the chunk and its task (dispatch commits); the answer is built from what was
        # written, so nothing is read back (this endpoint takes small chunks by the thousand).
        rec = dispatch(
            "data_create",
            str(dev.node),
            "gswarm.node.data.create",
            {"chunk_id": fields["id"], **kwargs},
            target=str(dev),
            extra_params={"chunk_id": fields["id"]},
        )
        view = SimpleNamespace(
            **fields,
            size=None,
            blake3=None,
            status_message=None,
            last_accessed=None,
            access_count=0,
            locations=[],
            refs=[],
            task_id=sa_inspect(rec).identity[0],
            deduplicated=False,
        )
        return view, 202


class ChunkCopySchema(ma.Schema):
    target_device = ma.fields.String(metadata={"description": "`node:tier`, or a tier (dram, disk)"})
    target_node = ma.fields.String()
    delete_source = ma.fields.Boolean(load_default=False)
    priority = ma.fields.String(load_default="normal", validate=ma.validate.OneOf(PRIORITIES))


class ChunkOpSchema(ma.Schema):
    chunk_id = ma.fields.String()
    task_id = ma.fields.String(allow_none=True)
    source_device = ma.fields.String(allow_none=True)
    target_device = ma.fields.String()
    noop = ma.fields.Boolean()


class DeleteArgsSchema(ma.Schema):
    force = ma.fields.Boolean(load_default=False)


class PinSchema(ma.Schema):
    holder = ma.fields.String(load_default="api", validate=HOLDER)


def _data_device(text: str, field: str, default_node: str | None) -> Device:
    dev = Device.parse(text, field=field, default_node=default_node)
    if dev.node is None or dev.tier not in ("disk", "dram") or dev.index is not None:
        raise InvalidRequest(
            f"{field}: {text!r} is not a data tier: chunks live on a node's disk or dram", {"field": field}
        )
    return dev


def _copy(chunk: DataChunk, target: Device, kind: str, priority: str, delete_source: bool) -> tuple[dict, int]:
    """Send one verified copy of `chunk` to `target`; idempotent while the same copy is under way."""
    if chunk.status not in ("available",):
        raise Conflict(f"chunk {chunk.id} is {chunk.status}", {"chunk_id": chunk.id, "status": chunk.status})
    if any(loc.device == str(target) and loc.status == "available" for loc in chunk.locations):
        return {"chunk_id": chunk.id, "task_id": None, "target_device": str(target), "noop": True}, 200
    require_node(str(target.node), "target_device")
    busy = db.session.scalars(
        db.select(TaskRecord).where(
            TaskRecord.kind.in_(("data_move", "data_transfer")),
            TaskRecord.state.in_(ACTIVE),
            TaskRecord.target_device == str(target),
        )
    )
    for rec in busy:
        if (rec.params or {}).get("chunk_id") == chunk.id:
            return {
                "chunk_id": chunk.id,
                "task_id": rec.id,
                "source_device": rec.source_device,
                "target_device": str(target),
                "noop": False,
            }, 202
    locs = usable_locations(chunk, prefer_node=str(target.node))
    if kind == "data_move":
        locs = [loc for loc in locs if loc.node == target.node]
    if not locs:
        where = f"on {target.node}" if kind == "data_move" else "on a reachable node"
        raise ResourceUnavailable(f"chunk {chunk.id} has no available copy {where}", {"chunk_id": chunk.id})
    src = locs[0]
    same_node = src.node == target.node
    rec = dispatch(
        kind,
        str(target.node),
        "gswarm.node.data.copy",
        {
            "chunk_id": chunk.id,
            "tier": target.tier,
            "source": source_of(chunk, src, str(target.node)),
            "expected": expected_of(chunk),
            "remove_source": kind == "data_move" or (delete_source and same_node),
        },
        priority=priority,
        source=src.device,
        target=str(target),
        extra_params={"chunk_id": chunk.id, "delete_source": delete_source},
    )
    return {
        "chunk_id": chunk.id,
        "task_id": rec.id,
        "source_device": src.device,
        "target_device": str(target),
        "noop": False,
    }, 202


@blp.route("/data/<string:chunk_id>")
class ChunkById(MethodView):
    @blp.response(200, ChunkSchema)
    def get(self, chunk_id: str) -> DataChunk:
        """One chunk with its metadata, locations and references"""
        return get_chunk(chunk_id)

    @blp.arguments(DeleteArgsSchema, location="query")
    @blp.response(202)
    def delete(self, args: dict[str, Any], chunk_id: str) -> dict[str, Any]:
        """Delete a chunk and every copy of it (refused while it is pinned or used by a running workflow,
        unless force=true)"""
        chunk = get_chunk(chunk_id)
        held = holders(chunk)
        if held and not args["force"]:
            raise Conflict(
                f"chunk {chunk_id} is referenced by {', '.join(held)}; unpin it, wait, or pass force=true",
                {"chunk_id": chunk_id, "references": held},
            )
        if not chunk.locations:
            if chunk.status == "queued":  # its create is under way: the copy it makes is removed when it lands
                chunk.status, chunk.status_message = "deleting", "deleted while being created"
                db.session.commit()
                return {"tasks": []}
            db.session.delete(chunk)
            db.session.commit()
            return {"tasks": []}
        chunk.status = "deleting"
        chunk.refs.clear()
        tasks = [delete_copy(chunk, loc).id for loc in list(chunk.locations)]
        return {"tasks": tasks}


@blp.route("/data/<string:chunk_id>/content")
class ChunkContent(MethodView):
    @blp.response(200, headers={"Accept-Ranges": {"schema": {"type": "string"}}})
    def get(self, chunk_id: str) -> Response:
        """The chunk's bytes, streamed from a node that holds it; a single `Range: bytes=a-b` is honoured"""
        chunk = get_chunk(chunk_id)
        locs = usable_locations(chunk)
        if not locs:
            raise ResourceUnavailable(f"chunk {chunk_id} has no copy on a reachable node", {"chunk_id": chunk_id})
        loc = locs[0]
        src = source_of(chunk, loc, dest_node="", ttl_s=300)
        headers = {"Authorization": f"Bearer {src['token']}"}
        if request.headers.get("Range"):
            headers["Range"] = request.headers["Range"]
        url = f"http://{src['address']}:{src['port']}/files/{loc.tier}/data/{chunk.id}"
        try:
            upstream = requests.get(url, headers=headers, stream=True, timeout=(5, 60))
        except requests.RequestException as exc:
            raise NetworkError(f"{loc.node} did not answer for chunk {chunk_id}: {type(exc).__name__}") from exc
        if upstream.status_code == 416:
            upstream.close()
            resp = error_response(
                416,
                "INVALID_REQUEST",
                f"Range: {request.headers.get('Range')!r} is outside the chunk ({chunk.size} bytes) or malformed",
                {"field": "Range", "size": chunk.size},
            )
            resp.headers["Content-Range"] = f"bytes */{chunk.size}"
            return resp
        if upstream.status_code not in (200, 206):
            upstream.close()
            raise NetworkError(
                f"{loc.node} answered {upstream.status_code} for chunk {chunk_id}",
                {"chunk_id": chunk_id, "device": loc.device},
            )
        touch([chunk.id])
        db.session.commit()
        out = {
            k: upstream.headers[k]
            for k in ("Content-Length", "Content-Range", "Accept-Ranges")
            if k in upstream.headers
        }
        out["Content-Type"] = "application/json" if chunk.format == "json" else "application/octet-stream"
        out["ETag"] = f'"{chunk.checksum}"'

        def body() -> Any:
            try:
                yield from upstream.iter_content(1 << 20)
            finally:
                upstream.close()

        return Response(stream_with_context(body()), status=upstream.status_code, headers=out, direct_passthrough=True)


@blp.route("/data/<string:chunk_id>/move")
class ChunkMove(MethodView):
    @blp.arguments(ChunkCopySchema)
    @blp.response(202, ChunkOpSchema)
    def post(self, args: dict[str, Any], chunk_id: str) -> Any:
        """Move a chunk to another tier of the same node (verified, then the source copy is removed)"""
        chunk = get_chunk(chunk_id)
        if not args.get("target_device"):
            raise InvalidRequest("target_device: required", {"field": "target_device"})
        nodes = sorted({loc.node for loc in chunk.locations})
        if ":" not in args["target_device"] and len(nodes) > 1:
            raise InvalidRequest(
                f"target_device: the chunk is on several nodes ({', '.join(nodes)}); name one, like {nodes[0]}:"
                f"{args['target_device']}",
                {"field": "target_device", "nodes": nodes},
            )
        target = _data_device(args["target_device"], "target_device", nodes[0] if len(nodes) == 1 else None)
        if target.node not in nodes:
            raise InvalidRequest(
                f"target_device: {target} is on another node than the chunk ({', '.join(nodes) or 'none'}); "
                "use /transfer to copy between nodes",
                {"field": "target_device"},
            )
        return _copy(chunk, target, "data_move", args["priority"], False)


@blp.route("/data/<string:chunk_id>/transfer")
class ChunkTransfer(MethodView):
    @blp.arguments(ChunkCopySchema)
    @blp.response(202, ChunkOpSchema)
    def post(self, args: dict[str, Any], chunk_id: str) -> Any:
        """Copy a chunk to another node over the signed node-to-node transfer, verified before it is recorded;
        `delete_source` removes the copy it came from afterwards"""
        chunk = get_chunk(chunk_id)
        node = args.get("target_node")
        text = args.get("target_device") or "dram"
        if node is None and ":" not in text:
            raise InvalidRequest("target_node: required (or a target_device like node2:dram)", {"field": "target_node"})
        target = _data_device(text, "target_device", node)
        if node is not None and target.node != node:
            raise InvalidRequest(f"target_device: {target} is not on target_node {node}", {"field": "target_device"})
        return _copy(chunk, target, "data_transfer", args["priority"], args["delete_source"])


@blp.route("/data/<string:chunk_id>/pins")
class ChunkPins(MethodView):
    @blp.arguments(PinSchema)
    @blp.response(201, ChunkSchema)
    def post(self, args: dict[str, Any], chunk_id: str) -> DataChunk:
        """Pin a chunk: the collector and eviction keep it, and deleting it needs force, until it is unpinned"""
        chunk = get_chunk(chunk_id)
        holder = f"pin:{args['holder']}"
        if db.session.get(ChunkRef, (chunk.id, holder)) is None:
            chunk.refs.append(ChunkRef(chunk_id=chunk.id, holder=holder, kind="pin"))
            db.session.commit()
        return chunk


@blp.route("/data/<string:chunk_id>/pins/<string:holder>")
class ChunkPin(MethodView):
    @blp.response(200, ChunkSchema)
    def delete(self, chunk_id: str, holder: str) -> DataChunk:
        """Remove one pin"""
        chunk = get_chunk(chunk_id)
        ref = db.session.get(ChunkRef, (chunk.id, f"pin:{holder}"))
        if ref is None:
            raise NotFound(f"chunk {chunk_id} has no pin {holder!r}", {"chunk_id": chunk_id, "holder": holder})
        chunk.refs.remove(ref)
        db.session.commit()
        return chunk
