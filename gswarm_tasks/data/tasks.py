"""Node tasks of the data pool: store, copy (or move) and delete one chunk, each reported as an operation."""

from __future__ import annotations

import base64
import json
from typing import Any

from celery import Task

from .. import names
from ..celery_app import NodeTask, app, settings_of
from ..context import require_node
from ..errors import InvalidRequest
from ..reporting import Reporter, redis_of, run_op
from .chunks import copy_chunk, remove_chunk, store_chunk


@app.task(name=names.DATA_CREATE, base=NodeTask, bind=True)
def create(
    self: Task,
    op_id: str,
    chunk_id: str,
    tier: str,
    data_b64: str | None = None,
    source_url: str | None = None,
    checksum: str | None = None,
    data_key: str | None = None,
    link_from: str | None = None,
) -> dict[str, Any]:
    """Store a chunk from inline bytes (in the message, or waiting in Redis under `data_key` when they were too
    large for it) or a source; its sha256 is checked when the sender gave one. `link_from` names a chunk on the
    tier with the same bytes, whose file it shares."""
    node = require_node()
    settings = settings_of(self.app)

    def body(rep: Reporter) -> dict[str, Any]:
        rep.phase = "creating"  # progress only: a phase event per small chunk would double its reports
        text = data_b64
        if data_key is not None:
            staged = rep.client.get(data_key)
            if staged is None:
                raise InvalidRequest(
                    f"chunk {chunk_id}: its bytes are no longer in Redis", {"chunk_id": chunk_id}
                )
            text = staged.decode() if isinstance(staged, bytes) else str(staged)
        data = base64.b64decode(text, validate=True) if text is not None else None
        out = store_chunk(node, settings, chunk_id, tier, data, source_url, checksum, rep.progress, link_from)
        if data_key is not None:
            rep.client.delete(data_key)  # stored: a redelivery finds the op done and needs them no more
        return out

    return run_op(self, op_id, body)


@app.task(name=names.DATA_CREATE_BATCH, base=NodeTask, bind=True)
def create_batch(
    self: Task,
    op_id: str,
    tier: str,
    chunks: list[dict[str, Any]] | None = None,
    chunks_key: str | None = None,
) -> dict[str, Any]:
    """Store many small chunks (`chunk_id`, `data_b64`, `checksum` each) that came in the message, or wait in
    Redis under `chunks_key` when together they were too large for it; one operation: one report when all are
    in place, or a failure that leaves none recorded."""
    node = require_node()
    settings = settings_of(self.app)

    def body(rep: Reporter) -> dict[str, Any]:
        rep.phase = "creating"
        given = chunks
        if chunks_key is not None:
            staged = rep.client.get(chunks_key)
            if staged is None:
                raise InvalidRequest(
                    f"the batch's bytes are no longer in Redis ({chunks_key})", {"key": chunks_key}
                )
            given = json.loads(staged)
        stored = []
        for c in given or []:
            data = base64.b64decode(c["data_b64"], validate=True)
            stored.append(
                store_chunk(
                    node,
                    settings,
                    c["chunk_id"],
                    tier,
                    data,
                    checksum=c.get("checksum"),
                    link_from=c.get("link_from"),
                )
            )
            rep.progress(len(data))
        if chunks_key is not None:
            rep.client.delete(chunks_key)  # stored: a redelivery finds the op done and needs them no more
        return {"chunks": stored, "count": len(stored)}

    return run_op(self, op_id, body)


@app.task(name=names.DATA_COPY, base=NodeTask, bind=True)
def copy(
    self: Task,
    op_id: str,
    chunk_id: str,
    tier: str,
    source: dict[str, Any],
    expected: dict[str, Any],
    remove_source: bool = False,
    compression: str = "none",
) -> dict[str, Any]:
    """Copy a chunk to a tier of this node (a move when `remove_source`), verified before it counts; from a peer,
    zstd-compressed on the wire when `compression` says so."""
    node = require_node()
    settings = settings_of(self.app)

    def body(rep: Reporter) -> dict[str, Any]:
        rep.set_phase("copying", total=int(expected["size"]))
        return copy_chunk(
            node, settings, redis_of(self), op_id, chunk_id, tier, source, expected, remove_source, rep.progress,
            compression,
        )  # fmt: skip

    return run_op(self, op_id, body)


@app.task(name=names.DATA_DELETE, base=NodeTask, bind=True)
def delete(self: Task, op_id: str, chunk_id: str, tier: str) -> dict[str, Any]:
    """Remove a chunk's copy from one tier of this node."""
    node = require_node()
    return run_op(self, op_id, lambda rep: remove_chunk(node, chunk_id, tier))
