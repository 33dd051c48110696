"""Workflow actions that compute on chunks: an inference through a service's OpenAI-style endpoint, and merges."""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest, NetworkError, TaskFailed
from ..urls import Allow, fetch, parse_url, read_bounded


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
    if isinstance(doc, dict) and isinstance(doc.get("choices"), list):  # an earlier model's answer: its texts
        return [str(c.get("text") or (c.get("message") or {}).get("content") or "") for c in doc["choices"]]
    if isinstance(doc, dict) and doc.get("object") == "list" and isinstance(doc.get("data"), list):
        raise InvalidRequest(
            f"chunk {chunk_id} holds the embeddings {doc.get('model')!r} answered: vectors are no model's input; "
            "chain a model that answers text (completions)",
            {"chunk_id": chunk_id},
        )
    if isinstance(doc, dict):
        return doc
    if isinstance(doc, list) and all(isinstance(x, str) for x in doc):
        return doc
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise InvalidRequest(f"chunk {chunk_id} holds no text", {"chunk_id": chunk_id})
    return lines


def run_inference(
    service_url: str,
    endpoint: str,
    model: str | None,
    data: bytes,
    chunk_id: str,
    headers: dict[str, str] | None = None,
    *,
    allow: Allow,
    field: str = "service_url",
    max_bytes: int = 1 << 30,
) -> bytes:
    """Send a chunk to a service's OpenAI-style endpoint (with its service key in `headers`), at a URL `allow`
    permits; the JSON answer (up to `max_bytes`) is the new chunk."""
    body = _texts(data, chunk_id)
    if not isinstance(body, dict):
        body = {"input": body} if "embeddings" in endpoint else {"prompt": body}
    if model and "model" not in body:
        body["model"] = model
    url = parse_url(service_url, field).join(endpoint, "endpoint")
    sent = {"Content-Type": "application/json", **(headers or {})}
    with fetch(
        url, allow, field, "POST", body=json.dumps(body).encode(), headers=sent, timeout=(10, 600)
    ) as r:
        answer = read_bounded(r, max_bytes, field)
        if r.status >= 500:
            raise NetworkError(
                f"inference at {url} answered {r.status}", {"url": str(url), "status": r.status}
            )
        if r.status != 200:
            raise TaskFailed(
                f"inference at {url} answered {r.status}: {answer[:300].decode(errors='replace')}",
                {"url": str(url), "status": r.status},
            )
    return answer


def merge_chunks(parts: list[tuple[bytes, str | None]], fmt: str | None) -> tuple[bytes, str]:
    """Combine chunks: a JSON array of their documents when all are JSON (or `format: json`), else their bytes
    one after another (`format: concat`)."""
    if fmt is None:
        fmt = "json" if all(f == "json" for _, f in parts) else "concat"
    if fmt == "json":
        try:
            docs = [json.loads(data) for data, _ in parts]
        except ValueError as exc:
            raise InvalidRequest(
                "format: json merge of a chunk that is not JSON", {"field": "format"}
            ) from exc
        return json.dumps(docs).encode(), "json"
    return b"".join(data for data, _ in parts), fmt
