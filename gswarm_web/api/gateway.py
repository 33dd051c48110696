"""`/v1`: one OpenAI-compatible endpoint for every served model. A request goes to a running replica of its
`model` whose engine serves the route (the one with the fewest requests in flight in the whole gateway); a request
whose replica fails before its first byte, streams included, is sent to another; a stream passes through as it
comes. With no replica free (the service is idle, scaled to zero or starting, its replicas failed or are all at
`max_in_flight`) the request waits in a bounded queue (up to the service's `cold_start_timeout_s`); beyond
`serving.cold_start_waiters` waiting requests in one web process it gets 503 with Retry-After at once. Every
request is measured (`control/serve_stats.py`, on `/metrics`). Admin and `inference` tokens may call it."""

from __future__ import annotations

import io
import itertools
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any

import marshmallow as ma
import urllib3
from flask import Flask, Response, g, request, stream_with_context
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.errors import (
    Forbidden,
    InvalidRequest,
    ModelNotFound,
    NetworkError,
    NotFound,
    ResourceUnavailable,
)

from ..control.serving import cold_start, live
from ..control.serving.attempts import ATTEMPTS, Answered, attempt
from ..control.serving.stats import Outcome
from ..control.serving.table import Directory, Target, directory
from ..errors import REQUEST_ID_RE, error_response, request_id
from .auth import Identity, identity_of

log = logging.getLogger(__name__)

blp = Blueprint(
    "gateway", __name__, url_prefix="/v1", description="OpenAI-compatible gateway to served models"
)

RETRY_AFTER_S = 5  # a cold start from DRAM takes seconds (bench/gateway.py); a client comes back about then
BODY = {
    "content": {"application/json": {"schema": {"type": "object", "required": ["model"]}}},
    "required": True,
}
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


class Unavailable(ResourceUnavailable):
    """No replica for the request now (the queue is full, or none came up in time): 503 with Retry-After."""

    status = 503


def _queue(model: str, tried: set[str], path: str) -> tuple[Target, float]:
    """No replica to take the request now (none running yet, the others failed, all at `max_in_flight`): wake the
    model's service if it sleeps and wait in the bounded queue; the replica and the seconds waited."""
    d = directory()
    svc = cold_start.wake(model)
    if svc is None:
        raise ModelNotFound(f"model: no service serves {model!r}", {"field": "model", "model": model})
    timeout_s, details = (
        svc.cold_start_timeout_s,
        {"field": "model", "service_id": svc.id, "status": svc.status},
    )
    if svc.status == "pending":  # a workflow's serve step that has not run: nothing is starting to wait for
        raise Unavailable(
            f"model: the service of {model!r} waits for its workflow's serve step to run", details
        )
    t0 = time.monotonic()
    try:
        target = cold_start.wait_for_replica(model, timeout_s, tried, path, svc.id)
    except cold_start.Full:
        d.rejected(svc.id, "rejected")
        raise Unavailable(
            f"model: {model!r} has no replica free and this gateway process already holds {cold_start.limit()} "
            f"requests waiting; retry after {RETRY_AFTER_S} s",
            {**details, "retry_after_s": RETRY_AFTER_S},
        ) from None
    if target is None:
        d.rejected(svc.id, "timeouts")
        raise Unavailable(f"model: no replica of {model!r} took the request within {timeout_s:g} s", details)
    return target, time.monotonic() - t0


def _tokens(data: bytes) -> tuple[int, int]:
    """(completion, prompt) tokens of a whole answer, from its `usage` (at its end)."""
    tail = data[-400:]
    done, prompt = _COMPLETION_TOKENS.search(tail), _PROMPT_TOKENS.search(tail)
    return (int(done.group(1)) if done else 0), (int(prompt.group(1)) if prompt else 0)


_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":\s*(\d+)')
_TEXT_EVENT = re.compile(rb'"(?:text|content)":\s*"(?:[^"\\]|\\.)')  # a streamed event that carries text


def _stream(d: Directory, answered: Answered, t0: float) -> Iterator[bytes]:
    resp, target, queue_s = answered.resp, answered.target, answered.queue_s
    ttft, tokens, status = time.monotonic() - t0, 0, resp.status
    try:
        for chunk in itertools.chain((answered.first,), answered.rest):
            tokens += len(_TEXT_EVENT.findall(chunk))
            yield chunk
    except (urllib3.exceptions.HTTPError, OSError):
        status = 0  # the replica went away mid-stream: the client's answer is cut short
        raise
    finally:
        resp.release_conn()
        outcome = Outcome(status, time.monotonic() - t0, queue_s, ttft, tokens)
        d.done(target, outcome, failed=status == 0)


def proxy(path: str) -> Response:
    """Send the request to a replica; one that fails before its first byte (streams included) is replaced by
    another, and a request with no replica free waits in the bounded queue."""
    raw, model, stream = _body()
    scope = g.get("token_models")
    if scope is not None and model not in scope:
        raise Forbidden(f"model: this token may not call {model!r} (it may call: {', '.join(scope) or 'none'})",
                        {"field": "model", "models": list(scope)})  # fmt: skip
    real = directory().real_name(model)
    if real != model:  # an alias: the engine knows its model by its own name
        raw, model = json.dumps({**json.loads(raw), "model": real}).encode(), real
    d, t0 = directory(), time.monotonic()
    if d.serves(model, path) is False:
        raise NotFound(f"{path}: not served by the engines of {model!r}", {"field": "model", "path": path})
    headers = {"Content-Type": "application/json", "X-Request-ID": request_id()}
    try:
        answered = attempt(d, model, path, raw, headers, stream, t0, ATTEMPTS, wait=_queue)
    except Unavailable as exc:
        busy = error_response(exc.status, exc.code, exc.message, exc.details)
        busy.headers["Retry-After"] = str(RETRY_AFTER_S)
        return busy
    if isinstance(answered, str):
        raise NetworkError(
            f"model {model!r}: no replica answered ({answered or 'none is running'})", {"model": model}
        )
    return _answer(d, answered, stream, t0)


def _answer(d: Directory, answered: Answered, stream: bool, t0: float) -> Response:
    """The client's response from the answer of the replica that took the request."""
    resp, target = answered.resp, answered.target
    out = {
        "Content-Type": resp.headers.get("Content-Type", "application/json"),
        "X-Gswarm-Replica": target.replica_id,
        "X-Gswarm-Attempts": str(answered.attempts),  # > 1: a replica failed and another answered
    }
    if stream:
        return Response(stream_with_context(_stream(d, answered, t0)), status=resp.status, headers=out)
    gen, prompt = _tokens(resp.data)
    d.done(target, Outcome(resp.status, time.monotonic() - t0, answered.queue_s, None, gen, prompt))
    return Response(resp.data, status=resp.status, headers=out)


FAST_PATHS = frozenset(
    {"/v1/embeddings", "/v1/completions", "/v1/chat/completions", "/v1/rerank", "/v1/score"}
)
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
        live.install()  # the replicas' version moves with every commit that starts or stops one

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path, length = environ.get("PATH_INFO", ""), environ.get("CONTENT_LENGTH") or ""
        if environ.get("REQUEST_METHOD") != "POST" or path not in FAST_PATHS or not length.isdigit():
            return self.flask(environ, start_response)
        if int(length) > FAST_MAX_BYTES:  # large (or chunked) bodies: Flask's limits and readers
            return self.flask(environ, start_response)
        raw = environ["wsgi.input"].read(int(length))
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = (
            io.BytesIO(raw),
            str(len(raw)),
        )  # for the Flask view
        try:
            answer = self.answer(environ, path, raw)
        except Exception:  # the view sees the same request and answers whatever went wrong in the API's shape
            log.debug("gateway fast path declined %s", path, exc_info=True)
            answer = None
        if answer is None:
            environ["wsgi.input"] = io.BytesIO(raw)
            return self.flask(environ, start_response)
        status, headers, body = answer
        start_response(status, headers)
        return body

    def answer(
        self, environ: dict[str, Any], path: str, raw: bytes
    ) -> tuple[str, list[tuple[str, str]], Sent] | None:
        t0 = time.monotonic()
        scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        body = json.loads(raw) if raw.startswith(b"{") else None
        if scheme.lower() != "bearer" or not isinstance(body, dict) or body.get("stream"):
            return None
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return None
        given = environ.get("HTTP_X_REQUEST_ID", "")
        rid = given if REQUEST_ID_RE.match(given) else f"req-{uuid.uuid4().hex[:20]}"
        with self.app.app_context():
            ident = (
                identity_of(token.strip())
                if self.app.config.get("GSWARM_AUTH", True)
                else Identity("admin", "-")
            )
            if ident is None or ident.role not in GATEWAY_ROLES or not ident.may_call(model):
                return None  # the view answers it (401, 403) in the API's shape
            d = directory()
            real = d.real_name(model)
            if real != model:  # an alias: the engine knows its model by its own name
                raw, model = json.dumps({**body, "model": real}).encode(), real
            # one try, no wait: a replica that failed is set aside, and the view retries elsewhere or waits
            answered = attempt(d, model, path, raw, {"Content-Type": "application/json", "X-Request-ID": rid}, False,
                               t0, tries=1)  # fmt: skip
        if isinstance(answered, str):
            return None
        resp, target = answered.resp, answered.target
        gen, prompt = _tokens(resp.data)
        headers = [
            ("Content-Type", resp.headers.get("Content-Type", "application/json")),
            ("Content-Length", str(len(resp.data))),
            ("X-Gswarm-Replica", target.replica_id),
            ("X-Gswarm-Attempts", "1"),
            ("X-Request-ID", rid),
        ]
        sent = Sent(d, resp.data, target, Outcome(resp.status, time.monotonic() - t0, 0.0, None, gen, prompt))
        return f"{resp.status} {HTTPStatus(resp.status).phrase}", headers, sent


class Sent:
    """A fast-path answer's body: its bookkeeping (counts, measures) runs in `close`, after the server sent it."""

    def __init__(self, d: Directory, data: bytes, target: Target, outcome: Outcome) -> None:
        self.d, self.data, self.target, self.outcome = d, data, target, outcome

    def __iter__(self) -> Iterator[bytes]:
        return iter((self.data,))

    def close(self) -> None:
        self.d.done(self.target, self.outcome)


@blp.route("/models")
class Models(MethodView):
    @blp.response(200, GatewayModelsSchema)
    def get(self) -> dict[str, Any]:
        """The served models"""
        scope = g.get("token_models")
        served = [m for m in directory().models() if scope is None or m in scope]  # what this token may call
        data = [{"id": name, "object": "model", "owned_by": "gswarm"} for name in served]
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


@blp.route("/rerank")
class Rerank(MethodView):
    @blp.doc(requestBody=BODY, responses=ANSWER)
    def post(self) -> Response:
        """Documents ranked against a query by a replica of `model`, for engines that serve it (vLLM)"""
        return proxy("/v1/rerank")


@blp.route("/score")
class Score(MethodView):
    @blp.doc(requestBody=BODY, responses=ANSWER)
    def post(self) -> Response:
        """Similarity scores of text pairs from a replica of `model`, for engines that serve it (vLLM)"""
        return proxy("/v1/score")
