"""The data pool's collector: intermediate chunks nobody holds are removed once unused for the TTL, failed chunks
that never got a copy are forgotten, and each node's dram is brought under its capacity."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func

from ...extensions import db, settings
from ...tables import DataChunk
from ..locking import lock
from .state import delete_copy, enforce_dram_capacity, holders, live_refs


def collect_garbage() -> dict[str, int]:
    """Remove intermediate chunks nobody holds once they are older than the TTL (by last access), and
    failed chunks that never got a copy."""
    cutoff = datetime.now(UTC) - timedelta(seconds=settings().data_intermediate_ttl_s)
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
    collected = 0
    for candidate in doomed:
        chunk = lock(
            DataChunk, DataChunk.id == candidate.id, skip_locked=True
        )  # a pin or a delete may be deciding
        if chunk is None or chunk.status != "available" or holders(chunk):
            continue
        collected += 1
        chunk.status, chunk.status_message = "deleting", "collected: unreferenced intermediate past its TTL"
        for loc in list(chunk.locations):
            delete_copy(chunk.id, loc.device, "collected")
        if not chunk.locations:
            db.session.delete(chunk)
            removed_rows += 1
    failed = list(
        db.session.scalars(
            db.select(DataChunk).where(DataChunk.status == "failed", DataChunk.created_at < cutoff)
        )
    )
    for chunk in failed:
        if not chunk.locations:
            db.session.delete(chunk)
            removed_rows += 1
    db.session.commit()
    evicted = enforce_dram_capacity()
    db.session.commit()
    return {"collected": collected, "rows_removed": removed_rows, "evicted": len(evicted)}
