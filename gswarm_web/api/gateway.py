"""`/v1`: one OpenAI-compatible endpoint for every served model. A request goes to a running replica of its
`model` (the one with the fewest requests in flight); a non-streaming request whose replica fails is sent to
another; a stream passes through as it comes; a model whose service was unloaded for idleness is started and the
request waits for it (up to the service's `cold_start_timeout_s`). Admin and `inference` tokens may call it."""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any

import marshmallow as ma
import urllib3
from flask import Flask, Response, request, stream_with_context
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.errors import InvalidRequest, ModelNotFound, NetworkError, ResourceUnavailable

from ..control.routing import Target, directory, forward
from ..errors import REQUEST_ID_RE, request_id
from .auth import identity_of

log = logging.getLogger(__name__)

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


FAST_PATHS = frozenset({"/v1/embeddings", "/v1/completions", "/v1/chat/completions"})
GATEWAY_ROLES = frozenset({"admin", "inference"})
FAST_MAX_BYTES = 1 << 20


class FastPath:
    """The gateway's everyday request without Flask: a non-streaming POST with a known token, a JSON body naming a
    model, and a running replica that answers. That is all it handles; anything else (a missing or unknown token,
    a bad body, a stream, no replica, a replica that fails) goes on to the Flask view unchanged, which answers
    errors in the API's shape, retries on other replicas and wakes idle services. Flask's request machinery was
    about a fifth of a gateway request's time in the web process (py-spy, bench/gateway.py)."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self.flask = app.wsgi_app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path, length = environ.get("PATH_INFO", ""), environ.get("CONTENT_LENGTH") or ""
        if environ.get("REQUEST_METHOD") != "POST" or path not in FAST_PATHS or not length.isdigit():
            return self.flask(environ, start_response)
        if int(length) > FAST_MAX_BYTES:  # large (or chunked) bodies: Flask's limits and readers
            return self.flask(environ, start_response)
        raw = environ["wsgi.input"].read(int(length))
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(raw), str(len(raw))  # for the Flask view
        try:
            answer = self.answer(environ, path, raw)
        except Exception:  # the view sees the same request and answers whatever went wrong in the API's shape
            log.debug("gateway fast path declined %s", path, exc_info=True)
            answer = None
        if answer is None:
            environ["wsgi.input"] = io.BytesIO(raw)
            return self.flask(environ, start_response)
        status, headers, data = answer
        start_response(status, headers)
        return [data]

    def answer(self, environ: dict[str, Any], path: str, raw: bytes) -> tuple[str, list[tuple[str, str]], bytes] | None:
        scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        body = json.loads(raw) if raw.startswith(b"{") else None
        if scheme.lower() != "bearer" or not isinstance(body, dict) or body.get("stream"):
            return None
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return None
        given = environ.get("HTTP_X_REQUEST_ID", "")
        rid = given if REQUEST_ID_RE.match(given) else f"req-{uuid.uuid4().hex[:20]}"
        d = directory()
        with self.app.app_context():
            ident = identity_of(token.strip()) if self.app.config.get("GSWARM_AUTH", True) else ("admin", "-")
            if ident is None or ident[0] not in GATEWAY_ROLES:
                return None
            target = d.pick(model, set())
        if target is None:
            return None
        try:
            resp = forward(target, path, raw, {"Content-Type": "application/json", "X-Request-ID": rid}, False)
        except urllib3.exceptions.HTTPError:
            d.done(target, failed=True)  # quarantined: the view's retry goes elsewhere
            return None
        if resp.status >= 500:
            d.done(target, failed=True)
            return None
        d.done(target)
        headers = [
            ("Content-Type", resp.headers.get("Content-Type", "application/json")),
            ("Content-Length", str(len(resp.data))),
            ("X-Gswarm-Replica", target.replica_id),
            ("X-Gswarm-Attempts", "1"),
            ("X-Request-ID", rid),
        ]
        return f"{resp.status} {HTTPStatus(resp.status).phrase}", headers, resp.data


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
