"""Storage tiers on a node: where a model lives on `disk` and `dram`, manifests, verified copies, atomic installs."""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import queue
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import blake3

from .devices import FILE_TIERS, Device, file_path, safe_name
from .errors import InvalidRequest, ResourceUnavailable, VerificationError

MANIFEST_FILE = ".gswarm-manifest.json"
RESERVED_FILE = (
    ".gswarm-reserved"  # in a staging directory: the bytes its operation counted against the quota
)
STAGING = ".staging"
CHUNK = 8 * 1024 * 1024
HASH_BLOCK = 16 * 1024 * 1024  # the unit of transfer ranges and of per-block hashes
KINDS = {"models": "model_name", "data": "chunk_id"}  # what lives under a tier root, and the name's field
Progress = Callable[[int], None]


def prefix(tier: str, kind: str, name: str) -> str:
    """Where a model or a chunk lives relative to a node's tier roots (`disk/models/NAME`, `dram/data/ID`): the
    path the file server serves it under, and the scope of a transfer token."""
    if tier not in FILE_TIERS or kind not in KINDS:
        raise InvalidRequest(f"no storage prefix for {tier}/{kind}", {"tier": tier, "kind": kind})
    return f"{tier}/{kind}/{safe_name(name, KINDS[kind])}"


@dataclass(frozen=True)
class Tiers:
    """The file-backed tiers of one node."""

    node: str
    disk: Path
    dram: Path

    def root(self, tier: str) -> Path:
        if tier == "disk":
            return self.disk
        if tier == "dram":
            if not self.dram.parent.is_dir():
                raise ResourceUnavailable(
                    f"{self.node}:dram is not available: no tmpfs at {self.dram.parent}",
                    {"device": f"{self.node}:dram"},
                )
            return self.dram
        raise InvalidRequest(
            f"{self.node}:{tier} is not a file tier (disk or dram)", {"device": f"{self.node}:{tier}"}
        )

    def path(self, tier: str, kind: str, name: str) -> Path:
        return self.root(tier).joinpath(*prefix(tier, kind, name).split("/")[1:])

    def model_dir(self, tier: str, model: str) -> Path:
        return self.path(tier, "models", model)

    def chunk_path(self, tier: str, chunk_id: str) -> Path:
        return self.path(tier, "data", chunk_id)

    def staging_dir(self, tier: str, key: str) -> Path:
        return self.root(tier) / STAGING / safe_name(key, "staging key")

    def device(self, tier: str) -> Device:
        return Device(self.node, tier)


def iter_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every regular file under root, sorted, skipping gswarm's own files."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (STAGING, ".cache"))
        for name in sorted(filenames):
            if name in (MANIFEST_FILE, RESERVED_FILE) or name.endswith(".gswarm-part"):
                continue
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                yield p.relative_to(root).as_posix(), p


def hash_file(
    path: Path, sha256: bool = True, progress: Progress | None = None, blocks: bool = False
) -> dict[str, Any]:
    """Size, sha256 and blake3 of a file in one pass (the hashes release the GIL). With `blocks`, also the
    blake3 of each HASH_BLOCK-sized block, which lets a transfer verify each block as it arrives."""
    s = hashlib.sha256() if sha256 else None
    b = blake3.blake3(max_threads=blake3.blake3.AUTO)
    per_block: list[str] = []
    bh = blake3.blake3() if blocks else None
    in_block = 0
    size = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        mv = memoryview(buf)
        while n := f.readinto(buf):
            chunk = mv[:n]
            if s is not None:
                s.update(chunk)
            b.update(chunk)
            if bh is not None:
                off = 0
                while off < n:  # a read may straddle a block boundary
                    take = min(n - off, HASH_BLOCK - in_block)
                    bh.update(chunk[off : off + take])
                    off, in_block = off + take, in_block + take
                    if in_block == HASH_BLOCK:
                        per_block.append(bh.hexdigest())
                        bh, in_block = blake3.blake3(), 0
            size += n
            if progress:
                progress(n)
    out: dict[str, Any] = {"size": size, "blake3": b.hexdigest()}
    if s is not None:
        out["sha256"] = s.hexdigest()
    if bh is not None:
        if in_block:
            per_block.append(bh.hexdigest())
        out["blocks"] = per_block
    return out


def hash_bytes(data: bytes) -> dict[str, Any]:
    """What `hash_file(..., blocks=True)` answers for a file holding `data`, from memory (a small chunk's hashes
    without reading it back or an 8 MiB buffer)."""
    view = memoryview(data)
    blocks = [blake3.blake3(view[i : i + HASH_BLOCK]).hexdigest() for i in range(0, len(data), HASH_BLOCK)]
    return {
        "size": len(data),
        "blake3": blake3.blake3(data).hexdigest(),
        "sha256": hashlib.sha256(data).hexdigest(),
        "blocks": blocks,
    }


def build_manifest(root: Path, progress: Progress | None = None) -> dict[str, Any]:
    files = [{"path": rel, **hash_file(p, progress=progress, blocks=True)} for rel, p in iter_files(root)]
    return {"version": 1, "files": files, "total_bytes": sum(f["size"] for f in files)}


def manifest_digest(manifest: dict[str, Any]) -> str:
    ident = [(f["path"], f["size"], f.get("blake3") or f.get("sha256")) for f in manifest["files"]]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    tmp = root / f"{MANIFEST_FILE}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, root / MANIFEST_FILE)


def read_manifest(root: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((root / MANIFEST_FILE).read_text()))
    except (OSError, ValueError):
        return None


def check_file(path: Path, expected: dict[str, Any], rel: str) -> None:
    """Verify a file against its manifest entry (blake3 when present, else sha256); raise VerificationError."""
    if not path.is_file():
        raise VerificationError(f"{rel}: missing", {"file": rel})
    if path.stat().st_size != expected["size"]:
        raise VerificationError(
            f"{rel}: size {path.stat().st_size} != {expected['size']}",
            {"file": rel, "expected": expected["size"]},
        )
    got = hash_file(path, sha256="blake3" not in expected)
    key = "blake3" if "blake3" in expected else "sha256"
    if got[key] != expected[key]:
        raise VerificationError(
            f"{rel}: {key} mismatch (expected {expected[key][:16]}..., got {got[key][:16]}...)",
            {"file": rel, "algorithm": key, "expected": expected[key], "actual": got[key]},
        )


def verified_copy(
    src: Path,
    dst: Path,
    expected: dict[str, Any] | None,
    progress: Progress | None = None,
    opened: IO[bytes] | None = None,
) -> None:
    """Copy src (or the file `opened` from it, read from where it was checked) to dst and check blake3 against
    `expected` on the way.

    The source is mapped, not read: each chunk is copied once (page cache -> destination) while a second
    thread hashes the same mapped pages, so verification costs no extra pass over the data.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    hasher = blake3.blake3()
    size = os.fstat(opened.fileno()).st_size if opened is not None else src.stat().st_size
    if expected is not None and size != expected["size"]:
        raise VerificationError(f"{src.name}: size {size} != {expected['size']}", {"file": str(src)})
    q: queue.Queue[memoryview | None] = queue.Queue(maxsize=8)

    def hash_loop() -> None:
        while (item := q.get()) is not None:
            hasher.update(item)

    t = threading.Thread(target=hash_loop, daemon=True)
    t.start()
    try:
        with opened or open(src, "rb") as fi, open(dst, "wb", buffering=0) as fo:
            if size:
                with mmap.mmap(fi.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    view = memoryview(mm)
                    try:
                        for off in range(0, size, CHUNK):
                            chunk = view[off : off + CHUNK]
                            q.put(chunk)
                            fo.write(chunk)
                            if progress:
                                progress(len(chunk))
                    finally:
                        q.put(None)
                        t.join()
                        del chunk
                        view.release()
    finally:
        if t.is_alive():
            q.put(None)
            t.join()
    if expected is not None and "blake3" in expected and hasher.hexdigest() != expected["blake3"]:
        raise VerificationError(
            f"{src.name}: blake3 mismatch while copying", {"file": str(src), "expected": expected["blake3"]}
        )


def copy_tree_verified(
    src_root: Path, dst_root: Path, manifest: dict[str, Any], progress: Progress | None = None
) -> None:
    for entry in manifest["files"]:
        verified_copy(file_path(src_root, entry["path"]), file_path(dst_root, entry["path"]), entry, progress)


def check_tree(root: Path, manifest: dict[str, Any], hashed: bool = True) -> None:
    """`root` holds exactly the manifest's files, each of its size, and (unless the caller hashed each file against
    this manifest as it was written: `hashed`) of its hash; VerificationError naming the first that is not."""
    want = {f["path"]: f for f in manifest["files"]}
    have = dict(iter_files(root))
    extra = sorted(set(have) - set(want))
    if extra:
        raise VerificationError(f"{extra[0]}: not in the manifest", {"file": extra[0], "extra": extra[:20]})
    for rel, entry in want.items():
        path = have.get(rel)
        if path is None:
            raise VerificationError(f"{rel}: missing", {"file": rel})
        if path.stat().st_size != entry["size"]:
            raise VerificationError(f"{rel}: size {path.stat().st_size} != {entry['size']}", {"file": rel})
        if not hashed:
            check_file(path, entry, rel)


def install(staging: Path, final: Path, manifest: dict[str, Any], hashed: bool = True) -> None:
    """Move a complete staging directory into place atomically, once it holds exactly the manifest's files
    (`check_tree`); an older copy is replaced, never mixed, and nothing is replaced when the check fails."""
    check_tree(staging, manifest, hashed)
    (staging / RESERVED_FILE).unlink(missing_ok=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        trash = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, trash)
        os.rename(staging, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(staging, final)


def remove_tree(path: Path) -> bool:
    if not path.exists():
        return False
    trash = path.parent / f".{path.name}.del-{uuid.uuid4().hex[:8]}"
    os.rename(path, trash)  # disappears at once for readers, then is deleted
    shutil.rmtree(trash, ignore_errors=True)
    return True


def tree_size(root: Path) -> int:
    return sum(p.stat().st_size for _, p in iter_files(root))


def reserve(models: Path, staging: Path, need: int, cap: int, name: str) -> None:
    """Count `need` bytes for model `name` against `cap` (models.cache_size) before they are written: the models kept
    under `models` (less the copy of `name` it replaces) and what other operations under way reserved must leave
    room. The check and the reservation (a file in `staging`) are one step under a lock that every process of the
    node takes, so two operations cannot both take the last room. RESOURCE_UNAVAILABLE when there is none."""
    if cap <= 0:
        return
    staging.mkdir(parents=True, exist_ok=True)
    models.parent.mkdir(parents=True, exist_ok=True)
    with open(models.parent / ".gswarm-quota.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        kept = (
            sum(tree_size(d) for d in models.iterdir() if d.is_dir() and d.name != name)
            if models.is_dir()
            else 0
        )
        reserved = 0
        for other in staging.parent.iterdir():
            if other != staging and (other / RESERVED_FILE).is_file():
                reserved += int((other / RESERVED_FILE).read_text() or 0)
        if kept + reserved + need > cap:
            raise ResourceUnavailable(
                f"models.cache_size: {name} needs {need} bytes, and the models on this disk take {kept} (and "
                f"{reserved} more are on their way) of {cap}; delete a copy or raise models.cache_size",
                {
                    "field": "models.cache_size",
                    "need_bytes": need,
                    "used_bytes": kept + reserved,
                    "cap_bytes": cap,
                },
            )
        (staging / RESERVED_FILE).write_text(str(need))
