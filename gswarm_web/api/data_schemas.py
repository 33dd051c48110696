"""The data pool's request and answer schemas (`api/data.py` holds the views)."""

from __future__ import annotations

from typing import Any

import marshmallow as ma

from gswarm_tasks import names
from gswarm_tasks.transfer.client import COMPRESSIONS

from ..control.data.state import holders
from ..tables import DataChunk
from .pagination import PageArgsSchema, PageSchema

TYPES = ("input", "output", "intermediate")
HOLDER = ma.validate.Regexp(
    r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$", error="letters, digits and _ . : @ - (up to 128)"
)


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


class PlaceSchema(ma.Schema):
    """Where the operation an answer started stands on its node (as the original's download answer)."""

    position = ma.fields.Integer(allow_none=True, metadata={"description": "1: next on its node; 0: running"})
    estimated_start = ma.fields.Float(
        allow_none=True, metadata={"description": "seconds until it should start"}
    )
    estimated_time = ma.fields.Float(allow_none=True, metadata={"description": "seconds it should take"})


class ChunkCreatedSchema(ChunkSchema, PlaceSchema):
    task_id = ma.fields.String(allow_none=True)
    deduplicated = ma.fields.Boolean(
        metadata={"description": "its bytes are shared with equal bytes on the device"}
    )
    source = ma.fields.String(
        metadata={"description": "the URL the bytes come from (given as `source` or `data`)"}
    )


class ChunkCreateSchema(ma.Schema):
    data = ma.fields.String(
        metadata={
            "description": "base64 bytes (up to data.max_inline, 16 MiB), or a URL (http(s)://, s3://, file://) "
            "taken as `source`, as the original's `base64_encoded_or_url`"
        }
    )
    source = ma.fields.String(
        metadata={
            "description": "file:///path under an allowed root, http(s):// to an allowed host, s3:// if enabled"
        }
    )
    type = ma.fields.String(load_default="input", validate=ma.validate.OneOf(TYPES))
    format = ma.fields.String(validate=ma.validate.Length(max=32))
    device = ma.fields.String(
        load_default="auto",
        metadata={"description": "node:disk, node:dram, or auto / auto:dram / auto:disk (default)"},
    )
    metadata = ma.fields.Dict(load_default=dict)


class ChunkListArgsSchema(PageArgsSchema):
    device = ma.fields.String()
    type = ma.fields.String(validate=ma.validate.OneOf(TYPES))


class ChunkListSchema(PageSchema):
    chunks = ma.fields.List(ma.fields.Nested(ChunkSchema))


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


class ChunkCopySchema(ma.Schema):
    target_device = ma.fields.String(metadata={"description": "`node:tier`, or a tier (dram, disk)"})
    target_node = ma.fields.String()
    delete_source = ma.fields.Boolean(load_default=False)
    priority = ma.fields.String(load_default="normal", validate=ma.validate.OneOf(names.PRIORITY_NAMES))
    compression = ma.fields.String(
        load_default="none",
        validate=ma.validate.OneOf(COMPRESSIONS),
        metadata={
            "description": "none, or zstd: the bytes are compressed between nodes (a move within one is not)"
        },
    )


class ChunkOpSchema(PlaceSchema):
    chunk_id = ma.fields.String()
    task_id = ma.fields.String(allow_none=True)
    source_device = ma.fields.String(allow_none=True)
    target_device = ma.fields.String()
    noop = ma.fields.Boolean()


class DeleteArgsSchema(ma.Schema):
    force = ma.fields.Boolean(load_default=False)


class PinSchema(ma.Schema):
    holder = ma.fields.String(load_default="api", validate=HOLDER)
