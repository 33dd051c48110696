"""Node tasks of the data pool: a chunk is one file under `<tier root>/data/<chunk id>`."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from celery import Task

from .celery_app import NodeTask, app, settings_of
from .errors import InvalidRequest
from .ops import Reporter, run_op
from .sources import parse_source
from .storage import hash_file
from .worker import require_node


def write_atomically(dest: Path, data: bytes | None, source: Path | None) -> None:
    """The chunk appears complete or not at all: written beside its place, then renamed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        if data is not None:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        else:
            assert source is not None
            shutil.copyfile(source, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


@app.task(name="gswarm.node.data.create", base=NodeTask, bind=True)
def create(
    self: Task,
    op_id: str,
    chunk_id: str,
    tier: str,
    data_b64: str | None = None,
    source_url: str | None = None,
    checksum: str | None = None,
) -> dict[str, Any]:
    """Store a chunk from inline bytes or a local source; its sha256 is checked when the sender gave one."""
    node = require_node()
    settings = settings_of(self.app)
    dest = node.tiers.chunk_path(tier, chunk_id)

    def body(rep: Reporter) -> dict[str, Any]:
        rep.set_phase("creating")
        if data_b64 is not None:
            data = base64.b64decode(data_b64, validate=True)
            if checksum and hashlib.sha256(data).hexdigest() != checksum:
                raise InvalidRequest("data: the bytes do not match their checksum", {"field": "data"})
            write_atomically(dest, data, None)
        else:
            src = parse_source(str(source_url), settings.allowed_roots, "source")
            if src.scheme != "file" or src.path is None or not Path(src.path).is_file():
                raise InvalidRequest(
                    "source: only a local file under an allowed root is supported", {"field": "source"}
                )
            write_atomically(dest, None, Path(src.path))
        h = hash_file(dest)
        return {
            "device": f"{node.name}:{tier}",
            "path": str(dest),
            "size": h["size"],
            "checksum": h["sha256"],
            "blake3": h["blake3"],
        }

    return run_op(self, op_id, body, cleanup=lambda: dest.unlink(missing_ok=True))


@app.task(name="gswarm.node.data.delete", base=NodeTask, bind=True)
def delete(self: Task, op_id: str, chunk_id: str, tier: str) -> dict[str, Any]:
    """Remove a chunk's copy from one tier of this node."""
    node = require_node()

    def body(rep: Reporter) -> dict[str, Any]:
        path = node.tiers.chunk_path(tier, chunk_id)
        existed = path.exists()
        path.unlink(missing_ok=True)
        return {"device": f"{node.name}:{tier}", "removed": existed}

    return run_op(self, op_id, body)
