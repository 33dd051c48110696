"""`/data`: the data pool. Chunks are bytes on node tiers; equal content on one device is stored once."""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from typing import Any

import marshmallow as ma
from flask import current_app
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.devices import Device
from gswarm_tasks.errors import InvalidRequest, NotFound
from gswarm_tasks.sources import parse_source

from .extensions import db
from .models import ChunkLocation, DataChunk, TaskRecord
from .operations import dispatch, require_node
from .pagination import PageArgsSchema, paginate

blp = Blueprint("data", __name__, url_prefix="/api/v1", description="The data pool")

TYPES = ("input", "output", "intermediate")
MAX_INLINE_BYTES = 16 * 1024 * 1024


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
    metadata = ma.fields.Method("get_metadata")

    def get_metadata(self, c: DataChunk) -> dict[str, Any]:
        return {
            **(c.meta or {}),
            "created_by": c.created_by,
            "created_at": c.created_at.isoformat(),
            "last_accessed": c.last_accessed.isoformat() if c.last_accessed else None,
            "access_count": c.access_count,
            "checksum": c.checksum,
            "format": c.format,
            "size": c.size,
        }


class ChunkCreatedSchema(ChunkSchema):
    task_id = ma.fields.String(allow_none=True)
    deduplicated = ma.fields.Boolean()


class ChunkCreateSchema(ma.Schema):
    data = ma.fields.String(metadata={"description": "base64 bytes (up to 16 MiB)"})
    source = ma.fields.String(metadata={"description": "file:///path under an allowed root"})
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


def get_chunk(chunk_id: str) -> DataChunk:
    chunk = db.session.get(DataChunk, chunk_id)
    if chunk is None:
        raise NotFound(f"no data chunk {chunk_id!r}", {"chunk_id": chunk_id})
    return chunk


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
        if "data" in args:
            if len(args["data"]) > MAX_INLINE_BYTES * 4 // 3 + 4:
                raise InvalidRequest(f"data: more than {MAX_INLINE_BYTES} bytes; use `source`", {"field": "data"})
            try:
                raw = base64.b64decode(args["data"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidRequest("data: not valid base64", {"field": "data"}) from exc
            if len(raw) > MAX_INLINE_BYTES:
                raise InvalidRequest(f"data: more than {MAX_INLINE_BYTES} bytes; use `source`", {"field": "data"})
            checksum = hashlib.sha256(raw).hexdigest()
            kwargs.update(data_b64=args["data"], checksum=checksum)
        else:
            src = parse_source(args["source"], current_app.config["GSWARM_SETTINGS"].allowed_roots, "source")
            if src.scheme != "file":
                raise InvalidRequest(
                    "source: only file:// sources are supported for data chunks yet", {"field": "source"}
                )
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
        chunk = DataChunk(
            id=str(uuid.uuid4()),
            chunk_type=args["type"],
            format=args.get("format"),
            meta=args["metadata"],
            status="queued",
            created_by="api",
            locations=[],
        )
        db.session.add(chunk)
        db.session.commit()
        rec = dispatch(
            "data_create",
            str(dev.node),
            "gswarm.node.data.create",
            {"chunk_id": chunk.id, **kwargs},
            target=str(dev),
            extra_params={"chunk_id": chunk.id},
        )
        chunk.task_id, chunk.deduplicated = rec.id, False
        return chunk, 202


@blp.route("/data/<string:chunk_id>")
class ChunkById(MethodView):
    @blp.response(200, ChunkSchema)
    def get(self, chunk_id: str) -> DataChunk:
        """One chunk with its metadata and locations"""
        return get_chunk(chunk_id)

    @blp.response(202)
    def delete(self, chunk_id: str) -> dict[str, Any]:
        """Delete a chunk and every copy of it"""
        chunk = get_chunk(chunk_id)
        if not chunk.locations:
            db.session.delete(chunk)
            db.session.commit()
            return {"tasks": []}
        chunk.status = "deleting"
        tasks: list[TaskRecord] = [
            dispatch(
                "data_delete",
                loc.node,
                "gswarm.node.data.delete",
                {"chunk_id": chunk.id, "tier": loc.tier},
                source=loc.device,
                extra_params={"chunk_id": chunk.id},
            )
            for loc in list(chunk.locations)
        ]
        return {"tasks": [t.id for t in tasks]}
