"""Workflow actions that compute on chunks: an inference through a service's OpenAI-style endpoint, and merges."""

from __future__ import annotations

import json
from typing import Any

import requests

from .errors import InvalidRequest, NetworkError, TaskFailed


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
