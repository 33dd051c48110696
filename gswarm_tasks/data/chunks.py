"""Chunks on a node: a chunk is one file, `<tier root>/data/<chunk id>`.

Chunks are written beside their place and renamed in, so a chunk is complete or absent. Copies between tiers
are hashed while they are copied; copies between nodes are pulled from the source's file server in ranges and
verified (blake3) before they are renamed in. The control worker records a location only when a task reports it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3

from ..context import NodeContext
from ..devices import Device
from ..errors import InvalidRequest, NetworkError, NotFound, VerificationError
from ..settings import Settings
from ..storage import hash_bytes, hash_file, verified_copy
from ..transfer.client import pull_files, read_file
from ..transfer.tokens import read_grant
from .sources import fetch_into

Progress = Callable[[int], None]
HASH_FROM_MEMORY = 1 << 20  # bytes given inline up to this are hashed as they are, not read back


def _part(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")


def _location(node: NodeContext, tier: str, chunk_id: str, path: Path, h: dict[str, Any]) -> dict[str, Any]:
    return {
        "chunk_id": chunk_id,
        "device": str(node.tiers.device(tier)),
        "path": str(path),
        "size": h["size"],
        "checksum": h.get("sha256"),
        "blake3": h["blake3"],
        "blocks": h.get("blocks"),
        "address": node.address,
        "file_port": node.file_server_port(),
    }


def store_chunk(
    node: NodeContext,
    settings: Settings,
    chunk_id: str,
    tier: str,
    data: bytes | None = None,
    source_url: str | None = None,
    checksum: str | None = None,
    progress: Progress | None = None,
    link_from: str | None = None,
) -> dict[str, Any]:
    """Write a chunk from bytes or a source, hash it, and rename it into place. With `link_from`, a chunk on the
    same tier that holds the same bytes, its file is linked instead of written again (a hard link: the file system
    counts the chunks that share it, and removing one leaves the others whole)."""
    dest = node.tiers.chunk_path(tier, chunk_id)
    tmp = _part(dest)
    try:
        if (
            data is not None
            and link_from is not None
            and _link(node.tiers.chunk_path(tier, link_from), tmp, data)
        ):
            pass
        elif data is not None:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        else:
            fetch_into(source_url, tmp, settings, progress)
        h = (
            hash_bytes(data)
            if data is not None and len(data) <= HASH_FROM_MEMORY
            else hash_file(tmp, blocks=True)
        )
        if checksum and h["sha256"] != checksum:
            raise VerificationError(
                "data: the bytes do not match their checksum", {"expected": checksum, "actual": h["sha256"]}
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return _location(node, tier, chunk_id, dest, h)


def _link(src: Path, tmp: Path, data: bytes) -> bool:
    """Link `tmp` to `src` when `src` holds exactly `data` (chunk files are never changed in place: a copy or a
    create renames a new file in); False, and nothing left at `tmp`, otherwise."""
    try:
        os.link(src, tmp)
    except OSError:  # gone meanwhile, or another file system: write the bytes
        return False
    if tmp.stat().st_size == len(data) and tmp.read_bytes() == data:
        return True
    tmp.unlink(missing_ok=True)
    return False


def _manifest_entry(chunk_id: str, expected: dict[str, Any]) -> dict[str, Any]:
    """The chunk as a one-file manifest a copy is verified against: its size and blake3 (with its blocks), else
    its sha256."""
    entry = {"path": chunk_id, "size": int(expected["size"])}
    if expected.get("blake3"):
        entry["blake3"] = expected["blake3"]
        if expected.get("blocks") is not None:
            entry["blocks"] = list(expected["blocks"])
    elif expected.get("checksum"):
        entry["sha256"] = expected["checksum"]
    else:
        raise InvalidRequest(
            f"chunk {chunk_id} has no checksum to verify a copy against", {"chunk_id": chunk_id}
        )
    return entry


def copy_chunk(
    node: NodeContext,
    settings: Settings,
    client: Any,
    key: str,
    chunk_id: str,
    tier: str,
    source: dict[str, Any],
    expected: dict[str, Any],
    remove_source: bool = False,
    progress: Progress | None = None,
    compression: str = "none",
) -> dict[str, Any]:
    """Copy a chunk to `tier` here, from a local tier or a peer; verified before it is renamed into place.

    `expected` holds the chunk's size and blake3 (or sha256); a source whose bytes differ fails the copy and
    leaves nothing behind. `remove_source` removes a local source after the copy (a move). `compression` (none,
    zstd) is what a peer does to the bytes on the wire."""
    dest = node.tiers.chunk_path(tier, chunk_id)
    wire: dict[str, Any] = {}  # from a peer: the compression asked for and the bytes on the wire
    entry = _manifest_entry(chunk_id, expected)
    if source["node"] == node.name:
        if source["tier"] == tier:
            raise InvalidRequest(
                f"target_device: the chunk is already on {node.tiers.device(tier)}",
                {"field": "target_device"},
            )
        src = node.tiers.chunk_path(str(source["tier"]), chunk_id)
        if not src.is_file():
            raise NotFound(
                f"chunk {chunk_id} is not on {node.tiers.device(source['tier'])}", {"chunk_id": chunk_id}
            )
        tmp = _part(dest)
        try:
            verified_copy(src, tmp, entry if "blake3" in entry else None, progress)
            if "sha256" in entry and hash_file(tmp)["sha256"] != entry["sha256"]:
                raise VerificationError(f"{chunk_id}: sha256 mismatch while copying", {"chunk_id": chunk_id})
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        if remove_source:
            src.unlink(missing_ok=True)
    else:
        if not source.get("address") or not source.get("port"):
            raise NotFound(f"{source['node']} announced no file server", {"node": source["node"]})
        prefix, token = read_grant(client, settings, source, "data", chunk_id)
        staging = node.tiers.staging_dir(tier, f"chunk-{key}")
        wire["compression"] = compression
        try:
            pull_files(
                str(source["address"]),
                int(source["port"]),
                token,
                prefix.rsplit("/", 1)[0],
                {"files": [entry], "total_bytes": entry["size"]},
                staging,
                streams=settings.transfer_streams,
                progress=progress,
                compression=compression,
                stats=wire,
            )
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / chunk_id, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    h = {
        "size": entry["size"],
        "blake3": expected.get("blake3"),
        "sha256": expected.get("checksum"),
        "blocks": expected.get("blocks"),
    }
    out = _location(node, tier, chunk_id, dest, h)
    out["source_device"] = str(Device(str(source["node"]), str(source["tier"])))
    out["source_removed"] = bool(remove_source and source["node"] == node.name)
    return {**out, **wire}


def read_chunk(
    node: NodeContext, settings: Settings, client: Any, chunk_id: str, loc: dict[str, Any], max_bytes: int
) -> bytes:
    """A chunk's bytes, from a local tier or a peer, checked against its blake3 (for inference and merges)."""
    dev = Device.parse(str(loc["device"]))
    if int(loc.get("size") or 0) > max_bytes:
        raise InvalidRequest(
            f"chunk {chunk_id} is over {max_bytes} bytes, too large to read whole", {"chunk_id": chunk_id}
        )
    if dev.node == node.name:
        path = node.tiers.chunk_path(dev.tier, chunk_id)
        if not path.is_file():
            raise NotFound(f"chunk {chunk_id} is not on {dev}", {"chunk_id": chunk_id})
        data = path.read_bytes()
    else:
        source = {"node": dev.node, "tier": dev.tier}
        prefix, token = read_grant(client, settings, source, "data", chunk_id)
        try:
            data = read_file(str(loc["address"]), int(loc["file_port"]), token, prefix)
        except (KeyError, TypeError, ValueError) as exc:
            raise NetworkError(
                f"reading chunk {chunk_id} from {dev} failed: {exc}", {"chunk_id": chunk_id}
            ) from exc
    want = loc.get("blake3")
    if want and blake3.blake3(data).hexdigest() != want:
        raise VerificationError(f"chunk {chunk_id} from {dev}: blake3 mismatch", {"chunk_id": chunk_id})
    return data


def remove_chunk(node: NodeContext, chunk_id: str, tier: str) -> dict[str, Any]:
    path = node.tiers.chunk_path(tier, chunk_id)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return {"chunk_id": chunk_id, "device": str(node.tiers.device(tier)), "removed": existed}
