"""`/data`: the data pool. Chunks are bytes on node tiers; equal content on one device is stored once."""

from __future__ import annotations

import re
from typing import Any

import requests
from flask import Response, g, request, stream_with_context
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.devices import Device
from gswarm_tasks.errors import InvalidRequest, NetworkError, ResourceUnavailable
from gswarm_tasks.storage import prefix as storage_prefix
from gswarm_tasks.transfer.client import files_url

from ..control.data import ops as chunk_ops
from ..control.data.state import get_chunk, source_of, touch, usable_locations
from ..control.dispatch import read_token, require_node
from ..control.nodes.devices import by_address, node_by_address
from ..control.nodes.targets import resolve as resolve_tiers
from ..control.task_state import place
from ..errors import ErrorSchema, error_response
from ..extensions import db, settings
from ..tables import ChunkLocation, DataChunk, TaskRecord
from .data_schemas import (
    ChunkBatchCreatedSchema,
    ChunkBatchSchema,
    ChunkCopySchema,
    ChunkCreatedSchema,
    ChunkCreateSchema,
    ChunkListArgsSchema,
    ChunkListSchema,
    ChunkOpSchema,
    ChunkSchema,
    DeleteArgsSchema,
    PinSchema,
)
from .pagination import page_of

CONTENT = {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    "application/json": {"schema": {}},
}

blp = Blueprint("data", __name__, url_prefix="/api/v1", description="The data pool")
URL_RE = re.compile(r"^(https?|s3|file)://", re.IGNORECASE)  # base64 has no ':', so a URL is never bytes


def _url_as_source(chunk: dict[str, Any]) -> dict[str, Any]:
    """The original's `data: "base64_encoded_or_url"`: a URL given as `data` is the chunk's `source`."""
    text = chunk.get("data")
    if isinstance(text, str) and URL_RE.match(text.strip()):
        if "source" in chunk:
            raise InvalidRequest("data: a URL in `data` and a `source` too; give one", {"field": "data"})
        chunk = {**{k: v for k, v in chunk.items() if k != "data"}, "source": text.strip()}
    return chunk


def _with_place(answer: dict[str, Any], task_id: str | None) -> dict[str, Any]:
    """An operation's answer with its place in its node's queue."""
    rec = db.session.get(TaskRecord, task_id) if task_id else None
    return {**answer, **(place(rec) if rec is not None else {})}


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
            device = by_address(args["device"], "device")
            query = query.where(
                DataChunk.id.in_(db.select(ChunkLocation.chunk_id).where(ChunkLocation.device == device))
            )
        return page_of("chunks", query, args)

    @blp.arguments(ChunkCreateSchema)
    @blp.response(202, ChunkCreatedSchema)
    def post(self, args: dict[str, Any]) -> Any:
        """Create a chunk from base64 `data` or a `source` (a URL in `data` is taken as its source): a chunk of its
        own (id, type, metadata, lifetime) whose bytes, when equal bytes are already on the device, are shared with
        them (`deduplicated`); the answer has its create's place in the node's queue"""
        args = resolve_tiers(_url_as_source(args), "device")
        dev, decision = chunk_ops.data_target(args["device"])
        if ("data" in args) == ("source" in args):
            raise InvalidRequest("data: give either `data` (base64) or `source`", {"field": "data"})
        kwargs, checksum = chunk_ops.create_kwargs(args)
        require_node(str(dev.node), "device")
        fields = {
            "chunk_type": args["type"],
            "format": args.get("format"),
            "meta": args["metadata"],
            "created_by": f"api:{g.get('token_name') or 'anonymous'}",
            "checksum": checksum,
        }
        made = chunk_ops.create(dev, kwargs, fields, decision)
        for key, value in _with_place({}, made.task_id).items():
            setattr(made, key, value)
        if "source" in args:
            made.source = args["source"]
        return made, 202


@blp.route("/data/batch")
class ChunkBatch(MethodView):
    @blp.arguments(ChunkBatchSchema)
    @blp.response(202, ChunkBatchCreatedSchema)
    def post(self, args: dict[str, Any]) -> Any:
        """Create many chunks in one request: each as `POST /data` would, all or none (one refused refuses the
        batch, naming it); answers every chunk's id, in order"""
        s = settings()
        given = [resolve_tiers(_url_as_source(c), "device") for c in args["chunks"]]
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
        return {"chunks": out}, 202


def _data_device(text: str, field: str, default_node: str | None) -> Device:
    return Device.parse(by_address(text, field), field=field, default_node=default_node).expect(
        field, files=True
    )


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
        return {"tasks": chunk_ops.delete(get_chunk(chunk_id, locked=True), args["force"])}


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
            raise ResourceUnavailable(
                f"chunk {chunk_id} has no copy on a reachable node", {"chunk_id": chunk_id}
            )
        loc = locs[0]
        src = source_of(chunk, loc, dest_node="")
        headers = {"Authorization": f"Bearer {read_token(loc.node, src['prefix'], 300)}"}
        if request.headers.get("Range"):
            headers["Range"] = request.headers["Range"]
        url = f"http://{src['address']}:{src['port']}" + files_url(storage_prefix(loc.tier, "data", chunk.id))
        try:
            upstream = requests.get(url, headers=headers, stream=True, timeout=(5, 60))
        except requests.RequestException as exc:
            raise NetworkError(
                f"{loc.node} did not answer for chunk {chunk_id}: {type(exc).__name__}"
            ) from exc
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

        return Response(
            stream_with_context(body()), status=upstream.status_code, headers=out, direct_passthrough=True
        )


@blp.route("/data/<string:chunk_id>/move")
class ChunkMove(MethodView):
    @blp.arguments(ChunkCopySchema)
    @blp.response(202, ChunkOpSchema)
    @blp.alt_response(
        200, schema=ChunkOpSchema, description="The copy exists already: nothing is sent (`noop`)"
    )
    def post(self, args: dict[str, Any], chunk_id: str) -> Any:
        """Move a chunk to another tier of the same node (verified, then the source copy is removed)"""
        chunk = get_chunk(chunk_id, locked=True)
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
        answer, status = chunk_ops.copy(chunk, target, "data_move", args["priority"], False)
        return _with_place(answer, answer.get("task_id")), status


@blp.route("/data/<string:chunk_id>/transfer")
class ChunkTransfer(MethodView):
    @blp.arguments(ChunkCopySchema)
    @blp.response(202, ChunkOpSchema)
    @blp.alt_response(
        200, schema=ChunkOpSchema, description="The copy exists already: nothing is sent (`noop`)"
    )
    def post(self, args: dict[str, Any], chunk_id: str) -> Any:
        """Copy a chunk to another node over the signed node-to-node transfer, verified before it is recorded;
        `delete_source` removes the copy it came from afterwards"""
        chunk = get_chunk(chunk_id, locked=True)
        node = node_by_address(args["target_node"], "target_node") if args.get("target_node") else None
        text = args.get("target_device") or "dram"
        if node is None and ":" not in text:
            raise InvalidRequest(
                "target_node: required (or a target_device like node2:dram)", {"field": "target_node"}
            )
        target = _data_device(text, "target_device", node)
        if node is not None and target.node != node:
            raise InvalidRequest(
                f"target_device: {target} is not on target_node {node}", {"field": "target_device"}
            )
        answer, status = chunk_ops.copy(
            chunk, target, "data_transfer", args["priority"], args["delete_source"], args["compression"]
        )
        return _with_place(answer, answer.get("task_id")), status


@blp.route("/data/<string:chunk_id>/pins")
class ChunkPins(MethodView):
    @blp.arguments(PinSchema)
    @blp.response(201, ChunkSchema)
    @blp.alt_response(200, schema=ChunkSchema, description="That holder had pinned it already")
    def post(self, args: dict[str, Any], chunk_id: str) -> Any:
        """Pin a chunk: the collector and eviction keep it, and deleting it needs force, until it is unpinned
        (409 while it is being deleted)"""
        chunk = get_chunk(chunk_id, locked=True)
        added = chunk_ops.pin(chunk, args["holder"])
        return get_chunk(chunk_id), 201 if added else 200


@blp.route("/data/<string:chunk_id>/pins/<string:holder>")
class ChunkPin(MethodView):
    @blp.response(200, ChunkSchema)
    def delete(self, chunk_id: str, holder: str) -> DataChunk:
        """Remove one pin"""
        chunk_ops.unpin(get_chunk(chunk_id, locked=True), holder)
        return get_chunk(chunk_id)
