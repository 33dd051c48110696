"""The data pool on a node: a chunk is one file, `<tier root>/data/<chunk id>`.

Chunks are written beside their place and renamed in, so a chunk is complete or absent. Copies between
tiers are hashed while they are copied; copies between nodes are pulled from the source's file server in
ranges and verified (blake3) before they are renamed in. The control worker records a location only when
a task reports it. The `op_*` functions are shared by the Celery tasks here and the workflow steps.
"""

from __future__ import annotations

import base64
import http.client
import importlib.util
import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import blake3
import requests
from celery import Task

from .celery_app import NodeTask, app, settings_of
from .devices import Device
from .errors import InvalidRequest, NetworkError, NotFound, TaskFailed
from .ops import Reporter, redis_of, run_op
from .settings import Settings
from .sources import parse_source
from .storage import CHUNK, VerificationError, hash_file, verified_copy
from .transfer import pull_files, sign_token, transfer_secret
from .worker import NodeContext, require_node

Progress = Callable[[int], None]


# ---- sources ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataSource:
    scheme: str  # file, http, https, s3
    url: str
    path: str | None = None


def parse_data_source(url: Any, settings: Settings, field: str = "source") -> DataSource:
    """Check a chunk source: `file://` under the allowed roots, `http(s)://` to an allowed host, `s3://` when
    enabled; anything else is refused with the field named."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"{field}: a source URL is required", {"field": field})
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        src = parse_source(url, settings.allowed_roots, field)
        return DataSource("file", url, src.path)
    if scheme in ("http", "https"):
        host = (parsed.hostname or "").lower()
        try:
            port = parsed.port
        except ValueError as exc:
            raise InvalidRequest(f"{field}: {url!r} has a bad port", {"field": field, "value": url}) from exc
        allowed = settings.data_allowed_hosts
        if not host or (host not in allowed and f"{host}:{port}" not in allowed):
            raise InvalidRequest(
                f"{field}: host {parsed.netloc!r} is not in data.allowed_hosts ({', '.join(allowed) or 'none'})",
                {"field": field, "value": url, "host": parsed.netloc},
            )
        return DataSource(scheme, url)
    if scheme == "s3":
        if not settings.data_s3_enabled:
            raise InvalidRequest(
                f"{field}: s3:// sources are not enabled (set data.s3_enabled and install boto3 on the nodes)",
                {"field": field, "value": url},
            )
        if importlib.util.find_spec("boto3") is None:
            raise InvalidRequest(f"{field}: s3:// sources need boto3, which is not installed", {"field": field})
        if not parsed.netloc or not parsed.path.strip("/"):
            raise InvalidRequest(f"{field}: {url!r} is not s3://bucket/key", {"field": field, "value": url})
        return DataSource("s3", url)
    raise InvalidRequest(
        f"{field}: scheme {parsed.scheme or '(none)'!r} is not allowed for data (file://, http(s)://, s3://)",
        {"field": field, "value": url},
    )


def _fetch_http(url: str, dest: Path, max_size: int, progress: Progress | None) -> None:
    try:
        with requests.get(url, stream=True, timeout=(10, 60), allow_redirects=False) as r:
            if r.status_code in (404, 410):
                raise NotFound(f"source: {url} answered {r.status_code}", {"field": "source", "status": r.status_code})
            if r.status_code != 200:
                raise NetworkError(f"source: {url} answered {r.status_code}", {"status": r.status_code})
            declared = int(r.headers.get("Content-Length") or 0)
            if declared > max_size:
                raise InvalidRequest(
                    f"source: {declared} bytes is over data.max_size ({max_size})", {"field": "source"}
                )
            got = 0
            with open(dest, "wb") as f:
                for block in r.iter_content(CHUNK):
                    got += len(block)
                    if got > max_size:
                        raise InvalidRequest(f"source: more than data.max_size ({max_size}) bytes", {"field": "source"})
                    f.write(block)
                    if progress:
                        progress(len(block))
                f.flush()
                os.fsync(f.fileno())
    except requests.RequestException as exc:
        raise NetworkError(f"source: fetching {url} failed: {type(exc).__name__}: {exc}"[:500]) from exc


def _fetch_s3(url: str, dest: Path, settings: Settings) -> None:
    import boto3  # an optional dependency: parse_data_source refused s3:// without it

    parsed = urlparse(url)
    client = boto3.client("s3", endpoint_url=settings.data_s3_endpoint)
    head = client.head_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))
    if int(head.get("ContentLength", 0)) > settings.data_max_size:
        raise InvalidRequest(f"source: object is over data.max_size ({settings.data_max_size})", {"field": "source"})
    client.download_file(parsed.netloc, parsed.path.lstrip("/"), str(dest))


# ---- storing and copying ------------------------------------------------------------------------------------


def _part(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")


def _file_port(node: NodeContext) -> int | None:
    """The node's file server port: pool processes forked before it started read what the worker wrote."""
    if node.file_port:
        return node.file_port
    try:
        return int((node.storage_root / ".file-port").read_text())
    except (OSError, ValueError):
        return None


def _location(node: NodeContext, tier: str, chunk_id: str, path: Path, h: dict[str, Any]) -> dict[str, Any]:
    return {
        "chunk_id": chunk_id,
        "device": f"{node.name}:{tier}",
        "path": str(path),
        "size": h["size"],
        "checksum": h.get("sha256"),
        "blake3": h["blake3"],
        "blocks": h.get("blocks"),
        "address": node.address,
        "file_port": _file_port(node),
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
) -> dict[str, Any]:
    """Write a chunk from bytes or a source, hash it, and rename it into place."""
    dest = node.tiers.chunk_path(tier, chunk_id)
    tmp = _part(dest)
    try:
        if data is not None:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        else:
            src = parse_data_source(source_url, settings)
            if src.scheme == "file":
                assert src.path is not None
                if not Path(src.path).is_file():
                    raise NotFound(f"source: {src.path} is not a file", {"field": "source"})
                shutil.copyfile(src.path, tmp)
            elif src.scheme == "s3":
                _fetch_s3(src.url, tmp, settings)
            else:
                _fetch_http(src.url, tmp, settings.data_max_size, progress)
        h = hash_file(tmp, blocks=True)
        if checksum and h["sha256"] != checksum:
            raise VerificationError(
                "data: the bytes do not match their checksum", {"expected": checksum, "actual": h["sha256"]}
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return _location(node, tier, chunk_id, dest, h)


def _token_for(settings: Settings, client: Any, source: dict[str, Any], chunk_id: str) -> tuple[str, str]:
    """The prefix and token that let this node read one chunk from `source` (signed here when not given)."""
    prefix = f"{source['tier']}/data/{chunk_id}"
    token = source.get("token")
    if not token:
        secret = transfer_secret(client, settings.transfer_secret)
        token = sign_token(secret, str(source["node"]), prefix, settings.transfer_token_ttl_s)
    return prefix, str(token)


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
) -> dict[str, Any]:
    """Copy a chunk to `tier` here, from a local tier or a peer; verified before it is renamed into place.

    `expected` holds the chunk's size and blake3 (or sha256); a source whose bytes differ fails the copy and
    leaves nothing behind. `remove_source` removes a local source after the copy (a move)."""
    dest = node.tiers.chunk_path(tier, chunk_id)
    entry = {"path": chunk_id, "size": int(expected["size"])}
    if expected.get("blake3"):
        entry["blake3"] = expected["blake3"]
        if expected.get("blocks") is not None:
            entry["blocks"] = list(expected["blocks"])
    elif expected.get("checksum"):
        entry["sha256"] = expected["checksum"]
    else:
        raise InvalidRequest(f"chunk {chunk_id} has no checksum to verify a copy against", {"chunk_id": chunk_id})
    if source["node"] == node.name:
        if source["tier"] == tier:
            raise InvalidRequest(
                f"target_device: the chunk is already on {node.name}:{tier}", {"field": "target_device"}
            )
        src = node.tiers.chunk_path(str(source["tier"]), chunk_id)
        if not src.is_file():
            raise NotFound(f"chunk {chunk_id} is not on {node.name}:{source['tier']}", {"chunk_id": chunk_id})
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
        prefix, token = _token_for(settings, client, source, chunk_id)
        staging = node.tiers.staging_dir(tier, f"chunk-{key}")
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
    out["source_device"] = f"{source['node']}:{source['tier']}"
    out["source_removed"] = bool(remove_source and source["node"] == node.name)
    return out


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
        prefix, token = _token_for(settings, client, source, chunk_id)
        try:
            c = http.client.HTTPConnection(str(loc["address"]), int(loc["file_port"]), timeout=60)
            c.request("GET", "/files/" + quote(prefix), headers={"Authorization": f"Bearer {token}"})
            resp = c.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException, KeyError, TypeError, ValueError) as exc:
            raise NetworkError(f"reading chunk {chunk_id} from {dev} failed: {exc}", {"chunk_id": chunk_id}) from exc
        if resp.status != 200:
            raise NetworkError(f"{dev} answered {resp.status} for chunk {chunk_id}", {"chunk_id": chunk_id})
    want = loc.get("blake3")
    if want and blake3.blake3(data).hexdigest() != want:
        raise VerificationError(f"chunk {chunk_id} from {dev}: blake3 mismatch", {"chunk_id": chunk_id})
    return data


def remove_chunk(node: NodeContext, chunk_id: str, tier: str) -> dict[str, Any]:
    path = node.tiers.chunk_path(tier, chunk_id)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return {"chunk_id": chunk_id, "device": f"{node.name}:{tier}", "removed": existed}


# ---- workflow actions that compute ----------------------------------------------------------------------------


def _texts(data: bytes, chunk_id: str) -> Any:
    """What an inference sends for a chunk: a JSON object as the request itself, else its text's lines."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"chunk {chunk_id} is not text or JSON", {"chunk_id": chunk_id}) from exc
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        return doc
    if isinstance(doc, list) and all(isinstance(x, str) for x in doc):
        return doc
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise InvalidRequest(f"chunk {chunk_id} holds no text", {"chunk_id": chunk_id})
    return lines


def run_inference(service_url: str, endpoint: str, model: str | None, data: bytes, chunk_id: str) -> bytes:
    """Send a chunk to a service's OpenAI-style endpoint; the JSON answer is the new chunk."""
    body = _texts(data, chunk_id)
    if not isinstance(body, dict):
        body = {"input": body} if "embeddings" in endpoint else {"prompt": body}
    if model and "model" not in body:
        body["model"] = model
    url = service_url.rstrip("/") + "/" + endpoint.lstrip("/")
    try:
        r = requests.post(url, json=body, timeout=600)
    except requests.RequestException as exc:
        raise NetworkError(f"inference at {url} failed: {type(exc).__name__}", {"url": url}) from exc
    if r.status_code >= 500:
        raise NetworkError(f"inference at {url} answered {r.status_code}", {"url": url, "status": r.status_code})
    if r.status_code != 200:
        raise TaskFailed(
            f"inference at {url} answered {r.status_code}: {r.text[:300]}", {"url": url, "status": r.status_code}
        )
    return r.content


def merge_chunks(parts: list[tuple[bytes, str | None]], fmt: str | None) -> tuple[bytes, str]:
    """Combine chunks: a JSON array of their documents when all are JSON (or `format: json`), else their bytes
    one after another (`format: concat`)."""
    if fmt is None:
        fmt = "json" if all(f == "json" for _, f in parts) else "concat"
    if fmt == "json":
        try:
            docs = [json.loads(data) for data, _ in parts]
        except ValueError as exc:
            raise InvalidRequest("format: json merge of a chunk that is not JSON", {"field": "format"}) from exc
        return json.dumps(docs).encode(), "json"
    return b"".join(data for data, _ in parts), fmt


# ---- Celery tasks ---------------------------------------------------------------------------------------------


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
    """Store a chunk from inline bytes or a source; its sha256 is checked when the sender gave one."""
    node = require_node()
    settings = settings_of(self.app)

    def body(rep: Reporter) -> dict[str, Any]:
        rep.phase = "creating"  # progress only: a phase event per chunk would cost the control worker a task
        data = base64.b64decode(data_b64, validate=True) if data_b64 is not None else None
        return store_chunk(node, settings, chunk_id, tier, data, source_url, checksum, rep.progress)

    return run_op(self, op_id, body)


@app.task(name="gswarm.node.data.copy", base=NodeTask, bind=True)
def copy(
    self: Task,
    op_id: str,
    chunk_id: str,
    tier: str,
    source: dict[str, Any],
    expected: dict[str, Any],
    remove_source: bool = False,
) -> dict[str, Any]:
    """Copy a chunk to a tier of this node (a move when `remove_source`), verified before it counts."""
    node = require_node()
    settings = settings_of(self.app)

    def body(rep: Reporter) -> dict[str, Any]:
        rep.set_phase("copying", total=int(expected["size"]))
        return copy_chunk(
            node, settings, redis_of(self), op_id, chunk_id, tier, source, expected, remove_source, rep.progress
        )

    return run_op(self, op_id, body)


@app.task(name="gswarm.node.data.delete", base=NodeTask, bind=True)
def delete(self: Task, op_id: str, chunk_id: str, tier: str) -> dict[str, Any]:
    """Remove a chunk's copy from one tier of this node."""
    node = require_node()
    return run_op(self, op_id, lambda rep: remove_chunk(node, chunk_id, tier))
