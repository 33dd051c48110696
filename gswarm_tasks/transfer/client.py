"""The pulling client: manifests, whole small files, and resumable multi-stream pulls verified block by block
(optionally zstd-compressed on the wire: decompressed as received, hashed and written as identity bytes)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import blake3
import zstandard

from ..devices import file_path
from ..errors import NetworkError, VerificationError
from ..storage import HASH_BLOCK, MANIFEST_FILE
from .ledger import Ledger
from .server import FILES_ROOT, ZSTD
from .verify import Verifier

log = logging.getLogger(__name__)

BLOCK = HASH_BLOCK
BUF = 1024 * 1024
# Received bytes go to the page cache in writes of this size. A write's size sets the size of the page-cache
# folios the kernel allocates for it; 1 MiB writes asked for large folios, which on a host short of free
# contiguous memory cost up to 8x more time to fill than these (measured: 1 GiB written in 0.5-3.9 s with 1 MiB
# writes, 0.6-2.0 s with 64 KiB ones). curl writes 16 KiB at a time.
WRITE = 64 * 1024
LEDGER_FILE = ".gswarm-transfer.json"
COMPRESSIONS = ("none", ZSTD)  # what a pull may ask its source to do to the bytes on the wire


def files_url(prefix: str, rel: str | None = None) -> str:
    """The path a file server serves `<prefix>[/<rel>]` under: the one place `/files/` URLs are made."""
    return FILES_ROOT + quote(prefix if rel is None else f"{prefix}/{rel}")


def _get(address: str, port: int, token: str, url: str, timeout_s: float, what: str) -> bytes:
    try:
        c = http.client.HTTPConnection(address, port, timeout=timeout_s)
        c.request("GET", url, headers={"Authorization": f"Bearer {token}"})
        resp = c.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise NetworkError(f"cannot reach {address}:{port} for {what}: {exc}") from exc
    if resp.status != 200:
        raise NetworkError(f"{address}:{port} answered {resp.status} for {what}", {"status": resp.status})
    return body


def fetch_manifest(
    address: str, port: int, token: str, prefix: str, timeout_s: float = 30.0
) -> dict[str, Any]:
    """The manifest a peer keeps beside a model (`<prefix>/.gswarm-manifest.json`)."""
    body = _get(
        address, port, token, files_url(prefix, MANIFEST_FILE), timeout_s, f"the manifest of {prefix}"
    )
    return dict(json.loads(body))


def read_file(address: str, port: int, token: str, prefix: str, timeout_s: float = 60.0) -> bytes:
    """One whole file (a chunk) from a peer; the caller verifies it."""
    return _get(address, port, token, files_url(prefix), timeout_s, prefix)


class RateLimiter:
    """A token bucket shared by every stream of one transfer (bytes per second)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.next_free = time.monotonic()

    def take(self, n: int) -> None:
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            self.next_free = max(self.next_free, now) + n / self.rate
            wait = self.next_free - now - 0.25  # allow a quarter-second burst
        if wait > 0:
            time.sleep(wait)


class _Wire:
    """A response read through this: counts the bytes that crossed the wire and paces them (for zstd bodies)."""

    def __init__(self, resp: http.client.HTTPResponse, limiter: RateLimiter) -> None:
        self.resp, self.limiter, self.count = resp, limiter, 0

    def read(self, size: int = -1) -> bytes:
        data = self.resp.read(size if size >= 0 else None)
        self.count += len(data)
        self.limiter.take(len(data))
        return data


@dataclass(frozen=True)
class _Block:
    rel: str
    path: Path
    index: int
    offset: int
    length: int
    blake3: str | None  # the block's own hash, when the manifest lists them


def _plan(
    dest: Path, manifest: dict[str, Any], ledger: Ledger, progress: Callable[[int], None] | None
) -> list[_Block]:
    """The blocks still to fetch; files are created at full size, blocks already on disk count as progress."""
    jobs: list[_Block] = []
    for entry in manifest["files"]:
        rel, size = entry["path"], int(entry["size"])
        hashes = entry.get("blocks")
        if hashes is not None and len(hashes) != (size + BLOCK - 1) // BLOCK:
            raise VerificationError(
                f"{rel}: the manifest lists a wrong number of block hashes", {"file": rel}
            )
        path = file_path(dest, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.stat().st_size != size:
            ledger.forget(rel)
            with open(path, "wb") as f:
                f.truncate(size)
        for block, off in enumerate(range(0, size, BLOCK)):
            length = min(size, off + BLOCK) - off
            if not ledger.has(rel, block):
                jobs.append(
                    _Block(rel, path, block, off, length, hashes[block] if hashes is not None else None)
                )
            elif progress:
                progress(length)
    return jobs


class _Fetcher:
    """Fetches blocks over one keep-alive connection per thread, writing and hashing each as it arrives."""

    def __init__(self, address: str, port: int, token: str, prefix: str, timeout_s: float, **kw: Any) -> None:
        self.address, self.port, self.token, self.prefix, self.timeout_s = (
            address,
            port,
            token,
            prefix,
            timeout_s,
        )
        self.limiter: RateLimiter = kw["limiter"]
        self.ledger: Ledger = kw["ledger"]
        self.progress: Callable[[int], None] | None = kw.get("progress")
        self.compression: str = kw.get("compression") or "none"
        self.local = threading.local()
        self.lock = threading.Lock()
        self.fetched = 0
        self.wire = 0  # bytes received on the wire (less than `fetched` when compression paid off)
        # One writer per file at a time. Buffered writes to one inode take its lock in the kernel, where the
        # other streams spin on its owner: on a small host that spinning took as much CPU as the copies
        # themselves (half of a 1 GiB pull's CPU time). Waiting here sleeps instead, while the other streams
        # receive and hash.
        self.write_locks: dict[Path, threading.Lock] = {}

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self.local, "conn", None)
        if c is None:
            c = self.local.conn = http.client.HTTPConnection(self.address, self.port, timeout=self.timeout_s)
        return c

    def __call__(self, job: _Block) -> None:
        try:
            c = self._conn()
            headers = {
                "Authorization": f"Bearer {self.token}",
                "Range": f"bytes={job.offset}-{job.offset + job.length - 1}",
            }
            if self.compression == ZSTD:
                headers["Accept-Encoding"] = ZSTD
            c.request("GET", files_url(self.prefix, job.rel), headers=headers)
            resp = c.getresponse()
            if resp.status in (401, 403, 404):
                raise NetworkError(
                    f"source refused {job.rel}: HTTP {resp.status} {resp.read()[:200]!r}", {"file": job.rel}
                )
            if resp.status != 206:
                raise NetworkError(
                    f"source answered {resp.status} for a range of {job.rel}", {"file": job.rel}
                )
            wire = self._receive(resp, job)
        except (OSError, http.client.HTTPException) as exc:
            self.local.conn = None
            raise NetworkError(
                f"transfer of {job.rel} from {self.address}:{self.port} failed: {exc}", {"file": job.rel}
            ) from exc
        with self.lock:
            self.fetched += job.length
            self.wire += wire
        self.ledger.mark(job.rel, job.index)

    def _receive(self, resp: http.client.HTTPResponse, job: _Block) -> int:
        """Write and hash one block as it arrives; the bytes it took on the wire."""
        buf = bytearray(min(BUF, job.length))
        mv = memoryview(buf)
        pos, left = job.offset, job.length
        hasher = blake3.blake3() if job.blake3 is not None else None  # verified while the bytes are in cache
        with self.lock:
            write_lock = self.write_locks.setdefault(job.path, threading.Lock())
        encoding = (resp.getheader("Content-Encoding") or "").strip().lower()
        if encoding not in ("", "identity", ZSTD):
            raise NetworkError(f"source sent {job.rel} as {encoding!r}", {"file": job.rel})
        wire = _Wire(resp, self.limiter) if encoding == ZSTD else None
        body: Any = resp
        if wire is not None:
            body = zstandard.ZstdDecompressor().stream_reader(
                cast(Any, wire), read_across_frames=False, closefd=False
            )
        with open(job.path, "r+b", buffering=0) as f:
            fd = f.fileno()
            while left:
                try:
                    n = body.readinto(mv[: min(len(buf), left)])
                except zstandard.ZstdError as exc:
                    raise NetworkError(f"{job.rel}: a corrupt zstd stream: {exc}", {"file": job.rel}) from exc
                if not n:
                    raise NetworkError(f"connection closed in the middle of {job.rel}", {"file": job.rel})
                with write_lock:
                    for off in range(0, n, WRITE):
                        os.pwrite(fd, mv[off : min(n, off + WRITE)], pos + off)
                if hasher is not None:
                    hasher.update(mv[:n])
                pos += n
                left -= n
                if wire is None:
                    self.limiter.take(n)
                if self.progress:
                    self.progress(n)
        # The rest of the frame and of the chunked body: read, so the connection can carry the next range.
        if wire is not None and (body.read(1) or wire.read()):
            raise NetworkError(f"{job.rel}: the source sent more than the range", {"file": job.rel})
        if hasher is not None and hasher.hexdigest() != job.blake3:
            raise VerificationError(
                f"{job.rel}: blake3 mismatch in block {job.index} (expected {str(job.blake3)[:16]}..., got "
                f"{hasher.hexdigest()[:16]}...)",
                {"file": job.rel, "algorithm": "blake3", "block": job.index},
            )
        return wire.count if wire is not None else job.length


def pull_files(
    address: str,
    port: int,
    token: str,
    remote_prefix: str,
    manifest: dict[str, Any],
    dest: Path,
    streams: int = 4,
    bandwidth_limit: float | None = None,
    progress: Callable[[int], None] | None = None,
    timeout_s: float = 30.0,
    compression: str = "none",
    stats: dict[str, int] | None = None,
) -> int:
    """Pull every manifest file into `dest`, in 16 MiB blocks over `streams` connections, verifying each.

    Blocks already on disk from an interrupted pull are kept. Returns the bytes fetched now (`stats` gets
    `wire_bytes` too: fewer with `compression="zstd"`, which the source applies per range). A network
    failure raises NetworkError (retry resumes); a checksum mismatch raises VerificationError and removes
    the bad file.
    """
    dest.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(dest / LEDGER_FILE)
    jobs = _plan(dest, manifest, ledger, progress)
    fetch = _Fetcher(
        address, port, token, remote_prefix, timeout_s,
        limiter=RateLimiter(bandwidth_limit), ledger=ledger, progress=progress, compression=compression,
    )  # fmt: skip
    verifier = Verifier(dest, manifest, ledger).start()
    pool = ThreadPoolExecutor(max_workers=max(1, streams))
    try:
        for fut in as_completed([pool.submit(fetch, j) for j in jobs]):
            fut.result()
    except BaseException as failure:
        ledger.fail()
        pool.shutdown(wait=True, cancel_futures=True)
        bad = failure.details.get("file") if isinstance(failure, VerificationError) else None
        if bad:  # a block did not match its hash: the file goes
            file_path(dest, str(bad)).unlink(missing_ok=True)
            ledger.forget(str(bad))
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        verifier.join()
    for entry in manifest["files"]:
        exc = verifier.verdict.get(entry["path"])
        if exc is not None:
            file_path(dest, entry["path"]).unlink(missing_ok=True)
            ledger.forget(entry["path"])
            raise exc
    ledger.remove()
    if stats is not None:
        stats["wire_bytes"] = fetch.wire
    return fetch.fetched
