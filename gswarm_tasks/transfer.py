"""Node-to-node transfer: signed one-transfer tokens, the read-only file server, and the pulling client."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import logging
import mmap
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import blake3
import redis

from .devices import file_path
from .errors import InvalidRequest, NetworkError
from .storage import HASH_BLOCK, MANIFEST_FILE, VerificationError, check_file

log = logging.getLogger(__name__)

SECRET_KEY = "gswarm:transfer-secret"
BLOCK = HASH_BLOCK
BUF = 1024 * 1024


# ---- tokens -------------------------------------------------------------------------------------------------


def transfer_secret(client: redis.Redis, configured: str | None) -> bytes:
    """The signing key: configured, else generated once and shared through Redis (which every node trusts)."""
    if configured:
        return configured.encode()
    client.set(SECRET_KEY, secrets.token_hex(32), nx=True)
    value = client.get(SECRET_KEY)
    assert value is not None
    return bytes(value) if not isinstance(value, str) else value.encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_token(secret: bytes, node: str, prefix: str, ttl_s: float) -> str:
    """A token that lets its holder read files under `prefix` (`disk/models/NAME`) of `node` until it expires."""
    body = _b64(json.dumps({"node": node, "prefix": prefix, "exp": time.time() + ttl_s}).encode())
    sig = _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())
    return f"{body}.{sig}"


def verify_token(secret: bytes, token: str, node: str, path: str) -> None:
    """Raise PermissionError unless `token` is genuine, unexpired, for this node and covers `path`."""
    try:
        body, sig = token.split(".", 1)
        want = _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(want, sig):
            raise PermissionError("bad signature")
        claims = json.loads(_unb64(body))
    except (ValueError, json.JSONDecodeError) as exc:
        raise PermissionError("malformed token") from exc
    if claims.get("exp", 0) < time.time():
        raise PermissionError("token expired")
    if claims.get("node") != node:
        raise PermissionError("token is for another node")
    prefix = str(claims.get("prefix", "")).strip("/")
    if not prefix or not (path == prefix or path.startswith(prefix + "/")):
        raise PermissionError("token does not cover this path")


def parse_range(header: str, size: int) -> tuple[int, int]:
    """One `bytes=a-b`, `bytes=a-` or `bytes=-n` range as inclusive offsets; ValueError for anything else."""
    if not header.startswith("bytes=") or "," in header:
        raise ValueError(header)
    a, sep, b = header[6:].strip().partition("-")
    if not sep or (not a and not b) or not (a.isdigit() or not a) or not (b.isdigit() or not b):
        raise ValueError(header)
    if not a:
        return max(0, size - int(b)), size - 1
    start = int(a)
    end = min(int(b), size - 1) if b else size - 1
    if b and int(b) < start:
        raise ValueError(header)
    return start, end


# ---- file server --------------------------------------------------------------------------------------------


class FileServer:
    """Serves `<tier>/<relative path>` from a node's tier roots, read-only, with single-range requests.

    Bodies go out with sendfile(2), so a transfer costs the worker almost no Python time.
    """

    def __init__(self, node: str, roots: dict[str, Path], secret: Callable[[], bytes], host: str, port: int) -> None:
        self.node = node
        self.roots = roots
        self.secret = secret
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("file server: " + fmt, *args)

            def do_HEAD(self) -> None:  # noqa: N802
                self._serve(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self._serve(body=True)

            def _fail(self, code: int, message: str) -> None:
                data = json.dumps({"error": {"code": "FORBIDDEN" if code == 403 else "NOT_FOUND", "message": message}})
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def _serve(self, body: bool) -> None:
                if self.path == "/health":
                    return self._ok_health()
                rel = unquote(self.path.split("?", 1)[0]).lstrip("/")
                if not rel.startswith("files/"):
                    return self._fail(404, "not found")
                rel = rel.removeprefix("files/")
                token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                try:
                    verify_token(server.secret(), token, server.node, rel)
                    tier, _, inner = rel.partition("/")
                    if tier not in server.roots:
                        raise PermissionError("unknown tier")
                    path = file_path(server.roots[tier], inner)
                except PermissionError as exc:
                    return self._fail(403, f"transfer refused: {exc}")
                except InvalidRequest as exc:
                    return self._fail(403, exc.message)
                try:
                    f = open(path, "rb")  # noqa: SIM115
                except OSError:
                    return self._fail(404, "no such file")
                with f:
                    size = os.fstat(f.fileno()).st_size
                    start, end = 0, size - 1
                    rng = self.headers.get("Range")
                    if rng:
                        try:
                            start, end = parse_range(rng, size)
                        except ValueError:
                            start, end = size, size - 1  # malformed or several ranges: not satisfiable
                        if start > end or start >= size:
                            self.send_response(416)
                            self.send_header("Content-Range", f"bytes */{size}")
                            self.send_header("Content-Length", "0")
                            self.end_headers()
                            return
                        self.send_response(206)
                        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                    else:
                        self.send_response(200)
                    count = max(0, end - start + 1)
                    self.send_header("Content-Length", str(count))
                    self.send_header("Accept-Ranges", "bytes")
                    self.end_headers()
                    if body and count:
                        self.wfile.flush()
                        self.connection.sendfile(f, start, count)

            def _ok_health(self) -> None:
                data = json.dumps({"status": "ok", "node": server.node}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    def start(self) -> FileServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="gswarm-file-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---- pulling client -----------------------------------------------------------------------------------------


def fetch_manifest(address: str, port: int, token: str, prefix: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The manifest a peer keeps beside a model (`<prefix>/.gswarm-manifest.json`)."""
    try:
        c = http.client.HTTPConnection(address, port, timeout=timeout_s)
        c.request("GET", "/files/" + quote(f"{prefix}/{MANIFEST_FILE}"), headers={"Authorization": f"Bearer {token}"})
        resp = c.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise NetworkError(f"cannot reach {address}:{port} for the manifest: {exc}") from exc
    if resp.status != 200:
        raise NetworkError(f"{address}:{port} answered {resp.status} for the manifest of {prefix}")
    return dict(json.loads(body))


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


class _Progress:
    """Which blocks of which files are on disk, saved beside the partial files so a copy can resume."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        try:
            self.done: dict[str, list[int]] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.done = {}

        self.arrived = threading.Condition(self.lock)
        self.failed = False

    def has(self, rel: str, block: int) -> bool:
        return block in self.done.get(rel, ())

    def mark(self, rel: str, block: int) -> None:
        with self.lock:
            self.done.setdefault(rel, []).append(block)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.done))
            os.replace(tmp, self.path)
            self.arrived.notify_all()

    def wait_for(self, rel: str, block: int) -> bool:
        """Block until `block` of `rel` is on disk; False when the transfer failed instead."""
        with self.lock:
            while block not in self.done.get(rel, ()) and not self.failed:
                self.arrived.wait(1.0)
            return not self.failed

    def fail(self) -> None:
        with self.lock:
            self.failed = True
            self.arrived.notify_all()

    def forget(self, rel: str) -> None:
        with self.lock:
            self.done.pop(rel, None)


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
) -> int:
    """Pull every manifest file into `dest`, in 16 MiB blocks over `streams` connections, then verify each.

    Blocks already on disk from an interrupted pull are kept. Returns the bytes fetched now. A network
    failure raises NetworkError (retry resumes); a checksum mismatch raises VerificationError and removes
    the bad file.
    """
    dest.mkdir(parents=True, exist_ok=True)
    state = _Progress(dest / ".gswarm-transfer.json")
    limiter = RateLimiter(bandwidth_limit)
    jobs: list[tuple[str, Path, int, int, int]] = []
    block_hashes: dict[str, list[str]] = {}
    for entry in manifest["files"]:
        rel, size = entry["path"], int(entry["size"])
        if entry.get("blocks") is not None:
            if len(entry["blocks"]) != (size + BLOCK - 1) // BLOCK:
                raise VerificationError(f"{rel}: the manifest lists a wrong number of block hashes", {"file": rel})
            block_hashes[rel] = list(entry["blocks"])
        path = file_path(dest, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.stat().st_size != size:
            state.forget(rel)
            with open(path, "wb") as f:
                f.truncate(size)
        for block, off in enumerate(range(0, size, BLOCK)):
            if not state.has(rel, block):
                jobs.append((rel, path, block, off, min(size, off + BLOCK) - off))
            elif progress:
                progress(min(size, off + BLOCK) - off)
    fetched = 0
    lock = threading.Lock()
    local = threading.local()

    def conn() -> http.client.HTTPConnection:
        c = getattr(local, "conn", None)
        if c is None:
            c = local.conn = http.client.HTTPConnection(address, port, timeout=timeout_s)
        return c

    def fetch(job: tuple[str, Path, int, int, int]) -> None:
        nonlocal fetched
        rel, path, block, off, length = job
        url = "/files/" + quote(f"{remote_prefix}/{rel}")
        headers = {"Authorization": f"Bearer {token}", "Range": f"bytes={off}-{off + length - 1}"}
        try:
            c = conn()
            c.request("GET", url, headers=headers)
            resp = c.getresponse()
            if resp.status in (401, 403, 404):
                raise NetworkError(f"source refused {rel}: HTTP {resp.status} {resp.read()[:200]!r}", {"file": rel})
            if resp.status != 206:
                raise NetworkError(f"source answered {resp.status} for a range of {rel}", {"file": rel})
            buf = bytearray(min(BUF, length))
            mv = memoryview(buf)
            pos, left = off, length
            want = block_hashes[rel][block] if rel in block_hashes else None
            hasher = blake3.blake3() if want is not None else None  # verified while the bytes are in cache
            with open(path, "r+b", buffering=0) as f:
                fd = f.fileno()
                while left:
                    n = resp.readinto(mv[: min(len(buf), left)])
                    if not n:
                        raise NetworkError(f"connection closed in the middle of {rel}", {"file": rel})
                    os.pwrite(fd, mv[:n], pos)
                    if hasher is not None:
                        hasher.update(mv[:n])
                    pos += n
                    left -= n
                    limiter.take(n)
                    if progress:
                        progress(n)
            if hasher is not None and hasher.hexdigest() != want:
                raise VerificationError(
                    f"{rel}: blake3 mismatch in block {block} (expected {str(want)[:16]}..., got "
                    f"{hasher.hexdigest()[:16]}...)",
                    {"file": rel, "algorithm": "blake3", "block": block},
                )
            with lock:
                fetched += length
            state.mark(rel, block)
        except (OSError, http.client.HTTPException) as exc:
            local.conn = None
            raise NetworkError(f"transfer of {rel} from {address}:{port} failed: {exc}", {"file": rel}) from exc

    # Verification follows the transfer: blocks are hashed in file order as soon as they are on disk.
    verdict: dict[str, BaseException | None] = {}
    verifier = threading.Thread(target=_verify_files, args=(dest, manifest, state, verdict), daemon=True)
    verifier.start()
    pool = ThreadPoolExecutor(max_workers=max(1, streams))
    try:
        for fut in as_completed([pool.submit(fetch, j) for j in jobs]):
            fut.result()
    except BaseException as failure:
        state.fail()
        pool.shutdown(wait=True, cancel_futures=True)
        bad = failure.details.get("file") if isinstance(failure, VerificationError) else None
        if bad:  # a block did not match its hash: the file goes
            file_path(dest, str(bad)).unlink(missing_ok=True)
            state.forget(str(bad))
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        verifier.join()
    for entry in manifest["files"]:
        exc = verdict.get(entry["path"])
        if exc is not None:
            file_path(dest, entry["path"]).unlink(missing_ok=True)
            state.forget(entry["path"])
            raise exc
    (dest / ".gswarm-transfer.json").unlink(missing_ok=True)
    return fetched


def _hash_blocks(path: Path, size: int, rel: str, state: _Progress, hasher: Any) -> bool:
    """Hash a file block by block as each lands; False if the transfer failed first."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            for block, off in enumerate(range(0, size, BLOCK)):
                if not state.wait_for(rel, block):
                    return False
                hasher.update(view[off : off + BLOCK])
        finally:
            view.release()
    return True


def _verify_files(
    dest: Path, manifest: dict[str, Any], state: _Progress, verdict: dict[str, BaseException | None]
) -> None:
    for entry in manifest["files"]:
        rel, size = entry["path"], int(entry["size"])
        path = file_path(dest, rel)
        if entry.get("blocks") is not None:  # every block was checked as it arrived
            if all(state.wait_for(rel, b) for b in range((size + BLOCK - 1) // BLOCK)):
                verdict[rel] = None
            continue
        if "blake3" not in entry:  # an old manifest: check the finished file by sha256
            if not all(state.wait_for(rel, b) for b in range(0, (size + BLOCK - 1) // BLOCK)):
                return
            try:
                check_file(path, entry, rel)
                verdict[rel] = None
            except VerificationError as exc:
                verdict[rel] = exc
            continue
        hasher = blake3.blake3()
        if size and not _hash_blocks(path, size, rel, state, hasher):
            return
        got = hasher.hexdigest()
        verdict[rel] = (
            None
            if got == entry["blake3"]
            else VerificationError(
                f"{rel}: blake3 mismatch (expected {entry['blake3'][:16]}..., got {got[:16]}...)",
                {"file": rel, "algorithm": "blake3", "expected": entry["blake3"], "actual": got},
            )
        )
