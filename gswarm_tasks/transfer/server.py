"""The node's read-only file server: `GET /files/<tier>/<path>` for holders of a transfer token, single ranges, and
bodies sent with sendfile(2) so a transfer costs the worker almost no Python time; a client that sends
`Accept-Encoding: zstd` gets each range compressed with zstd as it is read (chunked, `Content-Encoding: zstd`)."""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import zstandard

from ..devices import file_path
from ..errors import InvalidRequest, error_body
from .tokens import verify_token

log = logging.getLogger(__name__)

FILES_ROOT = "/files/"
ZSTD = "zstd"
# Level 1: fast enough to keep up with a 10 GbE link on one core for weights, which compress little whatever the
# level; what compresses well (text, sparse or zero-padded tensors) already shrinks most at this level.
ZSTD_LEVEL = 1
READ = 1 << 20


def wants_zstd(accept_encoding: str | None) -> bool:
    """Whether an `Accept-Encoding` header asks for zstd (and does not refuse it with q=0)."""
    for part in (accept_encoding or "").split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() == ZSTD:
            return params.replace(" ", "").lower() not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


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


class _Handler(BaseHTTPRequestHandler):
    """One request to the file server; `server.files` is the FileServer it belongs to."""

    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("file server: " + fmt, *args)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    def _json(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _fail(self, status: int, message: str) -> None:
        code = "FORBIDDEN" if status == 403 else "NOT_FOUND"
        self._json(status, error_body(code, message, {}, f"file-{uuid.uuid4().hex[:16]}"))

    def _resolve(self) -> Path | None:
        """The file a request names, after its token is checked; None when an answer was already sent."""
        files = self.server.files
        rel = unquote(self.path.split("?", 1)[0])
        if not rel.startswith(FILES_ROOT):
            self._fail(404, "not found")
            return None
        rel = rel.removeprefix(FILES_ROOT)
        token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        try:
            verify_token(files.secret(), token, files.node, rel)
            tier, _, inner = rel.partition("/")
            if tier not in files.roots:
                raise PermissionError("unknown tier")
            return file_path(files.roots[tier], inner)
        except PermissionError as exc:
            self._fail(403, f"transfer refused: {exc}")
        except InvalidRequest as exc:
            self._fail(403, exc.message)
        return None

    def _serve(self, body: bool) -> None:
        if self.path == "/health":
            return self._json(200, {"status": "ok", "node": self.server.files.node})
        path = self._resolve()
        if path is None:
            return None
        try:
            f = open(path, "rb")  # noqa: SIM115
        except OSError:
            return self._fail(404, "no such file")
        with f:
            self._send_file(f, body)
        return None

    def _send_file(self, f: Any, body: bool) -> None:
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
        self.send_header("Accept-Ranges", "bytes")
        if body and count and wants_zstd(self.headers.get("Accept-Encoding")):
            return self._send_zstd(f, start, count)
        self.send_header("Content-Length", str(count))
        self.end_headers()
        if body and count:
            self.wfile.flush()
            self.connection.sendfile(f, start, count)

    def _send_zstd(self, f: Any, start: int, count: int) -> None:
        """The range compressed as one zstd frame, in chunks as it is read; Content-Range names identity bytes."""
        self.send_header("Content-Encoding", ZSTD)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        comp = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj(size=count)
        fd, pos, left = f.fileno(), start, count
        while left:
            data = os.pread(fd, min(READ, left), pos)
            if not data:  # the file shrank under us: end the frame short, the client's hashes catch it
                break
            pos, left = pos + len(data), left - len(data)
            self._chunk(comp.compress(data))
        self._chunk(comp.flush())
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))


class FileServer:
    """Serves `<tier>/<relative path>` from a node's tier roots, read-only, to holders of a transfer token."""

    def __init__(
        self, node: str, roots: dict[str, Path], secret: Callable[[], bytes], host: str, port: int
    ) -> None:
        self.node = node
        self.roots = roots
        self.secret = secret
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.files = self  # type: ignore[attr-defined]
        self.port = int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    def start(self) -> FileServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="gswarm-file-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
