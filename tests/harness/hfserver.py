"""A small, local Hugging Face Hub-compatible HTTP endpoint for tests.

Serves repos backed by local directories to the real ``huggingface_hub`` client (``snapshot_download``,
``hf_hub_download``, ``HfApi.model_info`` / ``list_repo_tree``), with the endpoints and headers that
huggingface_hub 2.4 uses:

- ``GET /api/models/{repo_id}[/revision/{revision}]``: model info (``sha``, ``siblings``; sizes/LFS with ``blobs=true``)
- ``GET /api/models/{repo_id}/tree/{revision}[/{path}]``: tree listing (``recursive=true`` lists sub-folders too)
- ``HEAD|GET /{repo_id}/resolve/{revision}/{filename}``: file metadata headers / content, ``Range`` answered with 206

Files are served by exact match against an index built when the server starts (the "commit"), so a name such as
``../secret`` can never reach a file outside the repo directory. No Xet headers or ``xetHash`` fields are ever sent:
the client then falls back to plain HTTP downloads through this server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".onnx", ".msgpack", ".gguf", ".model"}
LFS_MIN_SIZE = 1_000_000
_CHUNK = 1024 * 1024
_API_RE = re.compile(
    r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)??)(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?P<sub>/.*)?)?$"
)
_RESOLVE_RE = re.compile(r"^/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class _File:
    path: Path
    size: int
    oid: str  # git blob sha1 (of the LFS pointer for LFS files)
    sha256: str | None  # set for LFS files only
    pointer_size: int | None


@dataclass(frozen=True)
class _Repo:
    sha: str
    files: dict[str, _File]
    dirs: list[str]


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _index_repo(root: Path) -> _Repo:
    files: dict[str, _File] = {}
    dirs: set[str] = set()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_dir():
            dirs.add(rel)
            continue
        size = p.stat().st_size
        if p.suffix in LFS_SUFFIXES or size > LFS_MIN_SIZE:
            h = hashlib.sha256()
            with p.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{h.hexdigest()}\nsize {size}\n".encode()
            files[rel] = _File(p, size, _git_blob_oid(pointer), h.hexdigest(), len(pointer))
        else:
            files[rel] = _File(p, size, _git_blob_oid(p.read_bytes()), None, None)
    commit = hashlib.sha1("".join(f"{k}\0{v.oid}\n" for k, v in sorted(files.items())).encode()).hexdigest()
    return _Repo(commit, files, sorted(dirs))


class _HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class HfTestServer:
    """Context manager serving ``{repo_id: directory}`` on ``http://127.0.0.1:<free port>``."""

    def __init__(self, repos: dict[str, Path], token: str | None = None) -> None:
        self._dirs = {repo_id: Path(d) for repo_id, d in repos.items()}
        self.token = token
        self.repos: dict[str, _Repo] = {}
        self._lock = threading.Lock()
        self._requests: list[tuple[str, str]] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def requests(self) -> list[tuple[str, str]]:
        """Snapshot of the ``(method, unquoted path)`` of every request served so far."""
        with self._lock:
            return list(self._requests)

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def commit(self, repo_id: str) -> str:
        return self.repos[repo_id].sha

    def __enter__(self) -> HfTestServer:
        self.repos = {repo_id: _index_repo(d) for repo_id, d in self._dirs.items()}
        handler = type("_BoundHandler", (_Handler,), {"hub": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="hf-test-server", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def _record(self, method: str, path: str) -> None:
        with self._lock:
            self._requests.append((method, path))

    def _repo(self, repo_id: str, revision: str | None) -> _Repo:
        repo = self.repos.get(repo_id)
        if repo is None:
            raise _HttpError(404, f"Repository {repo_id} not found", {"X-Error-Code": "RepoNotFound"})
        if revision not in (None, "main", repo.sha):
            raise _HttpError(404, f"Invalid rev id: {revision}", {"X-Error-Code": "RevisionNotFound"})
        return repo


class _Handler(BaseHTTPRequestHandler):
    hub: HfTestServer
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle keep-alive connections get closed eventually

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def _dispatch(self, head: bool) -> None:
        split = urlsplit(self.path)
        self.hub._record(self.command, unquote(split.path))
        try:
            if self.hub.token is not None:
                auth = self.headers.get("Authorization", "")
                if not hmac.compare_digest(auth.encode(), f"Bearer {self.hub.token}".encode()):
                    # Like the Hub: anonymous -> 401 RepoNotFound (private repo), bad token -> 401 invalid credentials
                    if auth:
                        msg = "Invalid credentials in Authorization header"
                        raise _HttpError(401, msg, {"X-Error-Message": msg})
                    raise _HttpError(401, "Repository not found", {"X-Error-Code": "RepoNotFound"})
            if m := _RESOLVE_RE.match(split.path):
                self._resolve(unquote(m["repo"]), unquote(m["rev"]), unquote(m["file"]), head)
            elif not head and (m := _API_RE.match(split.path)):
                query = {k: v[-1] for k, v in parse_qs(split.query).items()}
                repo = self.hub._repo(unquote(m["repo"]), unquote(m["rev"]) if m["rev"] else None)
                data: Any
                if m["kind"] == "tree":
                    sub = unquote(m["sub"] or "").strip("/")
                    data = _tree(repo, sub, query.get("recursive", "false").lower() == "true")
                else:
                    data = _info(unquote(m["repo"]), repo, query.get("blobs", "false").lower() == "true")
                self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"}, head)
            else:
                raise _HttpError(404, f"Not found: {split.path}")
        except _HttpError as e:
            err = json.dumps({"error": e.message}).encode()
            self._send(e.status, err, {"Content-Type": "application/json", **e.headers}, head)

    def _resolve(self, repo_id: str, revision: str, filename: str, head: bool) -> None:
        repo = self.hub._repo(repo_id, revision)
        entry = repo.files.get(filename)  # exact index match: "../x", "/etc/passwd" etc. never match
        if entry is None:
            raise _HttpError(
                404, "Entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.sha}
            )
        headers = {
            "X-Repo-Commit": repo.sha,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if entry.sha256 is not None:
            headers.update({"ETag": f'"{entry.sha256}"', "X-Linked-Etag": f'"{entry.sha256}"'})
            headers["X-Linked-Size"] = str(entry.size)
        else:
            headers["ETag"] = f'"{entry.oid}"'
        start, end, status = 0, entry.size - 1, 200
        if (rng := self.headers.get("Range")) and (m := _RANGE_RE.match(rng.strip().replace(" ", ""))):
            if m[1]:
                start, end = int(m[1]), min(int(m[2]), entry.size - 1) if m[2] else entry.size - 1
            elif m[2]:
                start = max(entry.size - int(m[2]), 0)
            if (not m[1] and not m[2]) or start > end or start >= entry.size:
                headers["Content-Range"] = f"bytes */{entry.size}"
                raise _HttpError(416, f"Range not satisfiable: {rng}", headers)
            status, headers["Content-Range"] = 206, f"bytes {start}-{end}/{entry.size}"
        self._send_headers(status, end - start + 1, headers)
        if head:
            return
        with entry.path.open("rb") as f:
            f.seek(start)
            remaining = end - start + 1
            while remaining > 0 and (chunk := f.read(min(_CHUNK, remaining))):
                self.wfile.write(chunk)
                remaining -= len(chunk)

    def _send_headers(self, status: int, length: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
        self._send_headers(status, len(body), headers)
        if not head:
            self.wfile.write(body)


def _info(repo_id: str, repo: _Repo, blobs: bool) -> dict[str, Any]:
    siblings: list[dict[str, Any]] = []
    for name, f in repo.files.items():
        sibling: dict[str, Any] = {"rfilename": name}
        if blobs:
            sibling.update(size=f.size, blobId=f.oid)
            if f.sha256 is not None:
                sibling["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": f.pointer_size}
        siblings.append(sibling)
    return dict(
        _id=repo.sha[:24], id=repo_id, modelId=repo_id, sha=repo.sha, private=False, siblings=siblings
    )


def _tree(repo: _Repo, sub: str, recursive: bool) -> list[dict[str, Any]]:
    if sub and sub not in repo.dirs:
        raise _HttpError(404, f"Path {sub} not found", {"X-Error-Code": "EntryNotFound"})
    prefix = f"{sub}/" if sub else ""

    def wanted(path: str) -> bool:
        return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])

    out: list[dict[str, Any]] = []
    for d in filter(wanted, repo.dirs):
        tree_oid = hashlib.sha1(f"{repo.sha}:{d}".encode()).hexdigest()
        out.append({"type": "directory", "oid": tree_oid, "size": 0, "path": d})
    for name, f in repo.files.items():
        if wanted(name):
            entry: dict[str, Any] = {"type": "file", "oid": f.oid, "size": f.size, "path": name}
            if f.sha256 is not None:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
            out.append(entry)
    return out
