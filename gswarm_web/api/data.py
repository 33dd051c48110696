"""`/data`: the data pool. Chunks are bytes on node tiers; equal content on one device is stored once."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
import requests
from flask import Response, g, request, stream_with_context
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks import names
from gswarm_tasks.devices import Device
from gswarm_tasks.errors import InvalidRequest, NetworkError, ResourceUnavailable
from gswarm_tasks.storage import prefix as storage_prefix
from gswarm_tasks.transfer.client import files_url

from ..control import chunk_ops
from ..control.chunk_state import get_chunk, holders, source_of, touch, usable_locations
from ..control.dispatch import require_node
from ..errors import ErrorSchema, error_response
from ..extensions import db, settings
from ..tables import ChunkLocation, DataChunk
from .pagination import PageArgsSchema, PageSchema, page_of

CONTENT = {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    "application/json": {"schema": {}},
}

blp = Blueprint("data", __name__, url_prefix="/api/v1", description="The data pool")

TYPES = ("input", "output", "intermediate")
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
    device = ma.fields.String(
        load_default="auto", metadata={"description": "node:disk, node:dram, or auto / auto:dram / auto:disk (default)"}
    )
    metadata = ma.fields.Dict(load_default=dict)


class ChunkListArgsSchema(PageArgsSchema):
    device = ma.fields.String()
    type = ma.fields.String(validate=ma.validate.OneOf(TYPES))


class ChunkListSchema(PageSchema):
    chunks = ma.fields.List(ma.fields.Nested(ChunkSchema))


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
        return page_of("chunks", query, args)

    @blp.arguments(ChunkCreateSchema)
    @blp.response(202, ChunkCreatedSchema)
    def post(self, args: dict[str, Any]) -> Any:
        """Create a chunk from base64 `data` or a `source`; equal content on the same device is stored once"""
        dev, decision = chunk_ops.data_target(args["device"])
        if ("data" in args) == ("source" in args):
            raise InvalidRequest("data: give either `data` (base64) or `source`", {"field": "data"})
        kwargs, checksum = chunk_ops.create_kwargs(args)
        require_node(str(dev.node), "device")
        if checksum is not None:
            same = chunk_ops.stored_copy(checksum, dev)
            if same is not None:
                same.deduplicated, same.task_id = True, None
                return same, 200
        fields = {
            "chunk_type": args["type"],
            "format": args.get("format"),
            "meta": args["metadata"],
            "created_by": f"api:{g.get('token_name') or 'anonymous'}",
            "checksum": checksum,
        }
        return chunk_ops.create(dev, kwargs, fields, decision), 202


class ChunkBatchSchema(ma.Schema):
    chunks = ma.fields.List(
        ma.fields.Nested(ChunkCreateSchema),
        required=True,
        metadata={"description": "chunks as `POST /data` takes them (up to data.batch_max_count)"},
    )


class ChunkBatchItemSchema(ma.Schema):
    chunk_id = ma.fields.String()
    status = ma.fields.String()
    device = ma.fields.String()
    task_id = ma.fields.String(allow_none=True)
    deduplicated = ma.fields.Boolean()


class ChunkBatchCreatedSchema(ma.Schema):
    chunks = ma.fields.List(ma.fields.Nested(ChunkBatchItemSchema))


@blp.route("/data/batch")
class ChunkBatch(MethodView):
    @blp.arguments(ChunkBatchSchema)
    @blp.response(202, ChunkBatchCreatedSchema)
    @blp.alt_response(200, schema=ChunkBatchCreatedSchema, description="Every chunk was stored already")
    def post(self, args: dict[str, Any]) -> Any:
        """Create many chunks in one request: each as `POST /data` would, all or none (one refused refuses the
        batch, naming it); answers every chunk's id, in order"""
        s = settings()
        given = args["chunks"]
        if not given:
            raise InvalidRequest("chunks: give at least one chunk", {"field": "chunks"})
        if len(given) > s.data_batch_max_count:
            raise InvalidRequest(
                f"chunks: {len(given)} chunks, more than {s.data_batch_max_count} (data.batch_max_count)",
                {"field": "chunks", "count": len(given), "max": s.data_batch_max_count},
            )
        total = sum(chunk_ops.inline_size(c["data"]) for c in given if isinstance(c.get("data"), str))
        if total > s.data_max_inline:
            raise InvalidRequest(
                f"chunks: more than {s.data_max_inline} bytes together (data.max_inline); send fewer at a time",
                {"field": "chunks", "max_bytes": s.data_max_inline},
            )
        targets: dict[str, tuple[Device, dict[str, Any] | None]] = {}
        nodes: set[str] = set()
        items = []
        for i, c in enumerate(given):
            prefix = f"chunks[{i}]."
            if ("data" in c) == ("source" in c):
                raise InvalidRequest(
                    f"{prefix}data: give either `data` (base64) or `source`", {"field": f"{prefix}data"}
                )
            if c["device"] not in targets:  # one decision per distinct target in a request
                targets[c["device"]] = chunk_ops.data_target(c["device"], f"{prefix}device")
            dev, decision = targets[c["device"]]
            if str(dev.node) not in nodes:
                require_node(str(dev.node), f"{prefix}device")
                nodes.add(str(dev.node))
            kwargs, checksum = chunk_ops.create_kwargs(c, prefix)
            fields = {
                "chunk_type": c["type"],
                "format": c.get("format"),
                "meta": c["metadata"],
                "created_by": f"api:{g.get('token_name') or 'anonymous'}",
                "checksum": checksum,
            }
            items.append(chunk_ops.NewChunk(dev, kwargs, fields, decision))
        out = chunk_ops.create_many(items)
        return {"chunks": out}, 200 if all(o["deduplicated"] for o in out) else 202


class ChunkCopySchema(ma.Schema):
    target_device = ma.fields.String(metadata={"description": "`node:tier`, or a tier (dram, disk)"})
    target_node = ma.fields.String()
    delete_source = ma.fields.Boolean(load_default=False)
    priority = ma.fields.String(load_default="normal", validate=ma.validate.OneOf(names.PRIORITY_NAMES))


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
    return Device.parse(text, field=field, default_node=default_node).expect(field, files=True)


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
        return {"tasks": chunk_ops.delete(get_chunk(chunk_id), args["force"])}


@blp.route("/data/<string:chunk_id>/content")
class ChunkContent(MethodView):
    @blp.doc(
        responses={
            str(code): {
                "description": "The chunk's bytes" + (" (a range)" if code == 206 else ""),
                "headers": {"Accept-Ranges": {"schema": {"type": "string"}}},
                "content": CONTENT,
            }
            for code in (200, 206)
        }
    )
    @blp.alt_response(416, schema=ErrorSchema, description="The range is outside the chunk or malformed")
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
        url = f"http://{src['address']}:{src['port']}" + files_url(storage_prefix(loc.tier, "data", chunk.id))
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
        return chunk_ops.copy(chunk, target, "data_move", args["priority"], False)


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
        return chunk_ops.copy(chunk, target, "data_transfer", args["priority"], args["delete_source"])


@blp.route("/data/<string:chunk_id>/pins")
class ChunkPins(MethodView):
    @blp.arguments(PinSchema)
    @blp.response(201, ChunkSchema)
    def post(self, args: dict[str, Any], chunk_id: str) -> DataChunk:
        """Pin a chunk: the collector and eviction keep it, and deleting it needs force, until it is unpinned"""
        chunk = get_chunk(chunk_id)
        chunk_ops.pin(chunk, args["holder"])
        return chunk


@blp.route("/data/<string:chunk_id>/pins/<string:holder>")
class ChunkPin(MethodView):
    @blp.response(200, ChunkSchema)
    def delete(self, chunk_id: str, holder: str) -> DataChunk:
        """Remove one pin"""
        chunk = get_chunk(chunk_id)
        chunk_ops.unpin(chunk, holder)
        return chunk
