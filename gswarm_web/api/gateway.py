"""`/v1`: one OpenAI-compatible endpoint for every served model. A request goes to a running replica of its
`model` (the one with the fewest requests in flight); a non-streaming request whose replica fails is sent to
another; a stream passes through as it comes; a model whose service was unloaded for idleness is started and the
request waits for it (up to the service's `cold_start_timeout_s`). Admin and `inference` tokens may call it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import marshmallow as ma
import urllib3
from flask import Response, request, stream_with_context
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.errors import InvalidRequest, ModelNotFound, NetworkError, ResourceUnavailable

from ..control.routing import Target, directory, forward
from ..errors import request_id

blp = Blueprint("gateway", __name__, url_prefix="/v1", description="OpenAI-compatible gateway to served models")

ATTEMPTS = 3
WAKE_POLL_S = 0.2
BODY = {"content": {"application/json": {"schema": {"type": "object", "required": ["model"]}}}, "required": True}
ANSWER = {
    "200": {
        "description": "the replica's answer (a stream of server-sent events when `stream` is true)",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    }
}


class GatewayModelSchema(ma.Schema):
    id = ma.fields.String()
    object = ma.fields.String()
    owned_by = ma.fields.String()


class GatewayModelsSchema(ma.Schema):
    object = ma.fields.String()
    data = ma.fields.List(ma.fields.Nested(GatewayModelSchema))


def _body() -> tuple[bytes, str, bool]:
    raw = request.get_data()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest("body: not valid JSON", {"field": "body"}) from exc
    if not isinstance(body, dict):
        raise InvalidRequest("body: must be a JSON object", {"field": "body"})
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: required (the served model's name)", {"field": "model"})
    return raw, model, bool(body.get("stream"))


def _cold_start(model: str) -> Target:
    """No running replica: wake the model's service and wait (bounded) for one."""
    d = directory()
    svc = d.wake(model)
    if svc is None:
        raise ModelNotFound(f"model: no service serves {model!r}", {"field": "model", "model": model})
    deadline = time.monotonic() + svc.cold_start_timeout_s
    while time.monotonic() < deadline:
        d.refresh(force=True)
        target = d.pick(model, set())
        if target is not None:
            return target
        time.sleep(WAKE_POLL_S)
    raise ResourceUnavailable(
        f"model: no replica of {model!r} came up within {svc.cold_start_timeout_s:g} s",
        {"field": "model", "service_id": svc.id, "status": svc.status},
    )


def _stream(resp: Any, target: Target) -> Iterator[bytes]:
    try:
        yield from resp.stream(8192, decode_content=False)
    finally:
        resp.release_conn()
        directory().done(target)


def proxy(path: str) -> Response:
    raw, model, stream = _body()
    d = directory()
    headers = {"Content-Type": "application/json", "X-Request-ID": request_id()}
    tried: set[str] = set()
    failure = ""
    for _ in range(ATTEMPTS):
        target = d.pick(model, tried) or (None if tried else _cold_start(model))
        if target is None:
            break
        tried.add(target.replica_id)
        try:
            resp = forward(target, path, raw, headers, stream)
        except urllib3.exceptions.HTTPError as exc:
            d.done(target, failed=True)
            failure = f"{target.url}: {type(exc).__name__}"
            continue
        if resp.status >= 500 and not stream:
            d.done(target, failed=True)
            failure = f"{target.url}: HTTP {resp.status}"
            continue
        out = {
            "Content-Type": resp.headers.get("Content-Type", "application/json"),
            "X-Gswarm-Replica": target.replica_id,
            "X-Gswarm-Attempts": str(len(tried)),  # > 1: a replica failed and another answered
        }
        if stream:
            return Response(stream_with_context(_stream(resp, target)), status=resp.status, headers=out)
        d.done(target)
        return Response(resp.data, status=resp.status, headers=out)
    raise NetworkError(f"model {model!r}: no replica answered ({failure or 'none is running'})", {"model": model})


@blp.route("/models")
class Models(MethodView):
    @blp.response(200, GatewayModelsSchema)
    def get(self) -> dict[str, Any]:
        """The served models"""
        data = [{"id": name, "object": "model", "owned_by": "gswarm"} for name in directory().models()]
        return {"object": "list", "data": data}


@blp.route("/embeddings")
class Embeddings(MethodView):
    @blp.doc(requestBody=BODY, responses=ANSWER)
    def post(self) -> Response:
        """Embeddings from a replica of `model`"""
        return proxy("/v1/embeddings")


@blp.route("/completions")
class Completions(MethodView):
    @blp.doc(requestBody=BODY, responses=ANSWER)
    def post(self) -> Response:
        """Text completions from a replica of `model` (`stream: true` passes the events through)"""
        return proxy("/v1/completions")


@blp.route("/chat/completions")
class ChatCompletions(MethodView):
    @blp.doc(requestBody=BODY, responses=ANSWER)
    def post(self) -> Response:
        """Chat completions from a replica of `model` (`stream: true` passes the events through)"""
        return proxy("/v1/chat/completions")
