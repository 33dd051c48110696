"""Request bodies cannot hold the API: the token is checked on a request's headers before a byte of its body is read,
and the body is then read whole within a deadline (`api.body_timeout_s`, plus a second per MiB), or the request
gets 408 and its connection is closed. A client that sends its body a byte a second holds a slot for seconds; one
without a valid token holds none at all.

The guard is the outermost WSGI layer (before the gateway's fast path, which reads bodies itself); what it read is
handed on as the request's input, so nothing below reads from the socket again.
"""

from __future__ import annotations

import io
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from flask import Flask
from werkzeug.exceptions import HTTPException

from gswarm_tasks.errors import error_body

from ..errors import REQUEST_ID_RE
from .auth import PUBLIC_ENDPOINTS, identity_of

SECONDS_PER_MIB = 1.0
READ_SIZE = 64 * 1024


class BodyTimeout(Exception):
    """The body did not arrive within its deadline."""


def _cooperative() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey is not None and monkey.is_module_patched("socket"))


def read_within(stream: Any, length: int | None, deadline_s: float) -> bytes:
    """The whole body (`length` bytes, or to its end when chunked) read within `deadline_s`. Under gevent the
    deadline interrupts a read that waits; elsewhere (a threaded server) it is checked between reads, and the
    server's own timeouts bound a read that waits."""
    timer: Any = None
    if _cooperative():
        import gevent

        timer = gevent.Timeout(deadline_s, BodyTimeout())
        timer.start()
    try:
        parts: list[bytes] = []
        got, end = 0, time.monotonic() + deadline_s
        while length is None or got < length:
            part = stream.read(READ_SIZE if length is None else min(READ_SIZE, length - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
            if time.monotonic() > end:
                raise BodyTimeout()
        return b"".join(parts)
    finally:
        if timer is not None:
            timer.cancel()


class BodyGuard:
    """WSGI middleware: the token before the body, and the body within its deadline."""

    def __init__(self, app: Flask, inner: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.inner = inner

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length_text = (environ.get("CONTENT_LENGTH") or "").strip()
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if not chunked and (not length_text.isdigit() or int(length_text) == 0):
            return self.inner(environ, start_response)  # no body (or a malformed length: werkzeug answers it)
        length = None if chunked else int(length_text)
        limit = int(self.app.config.get("MAX_CONTENT_LENGTH") or 0)
        if length is not None and limit and length > limit:
            return _answer(
                environ,
                start_response,
                413,
                "INVALID_REQUEST",
                f"body: larger than {limit} bytes",
                {"field": "body"},
            )
        refused = self.refusal(environ)
        if refused is not None:
            return _answer(environ, start_response, 401, "UNAUTHORIZED", refused, {})
        settings = self.app.config["GSWARM_SETTINGS"]
        deadline = settings.api_body_timeout_s + SECONDS_PER_MIB * (length or limit) / (1 << 20)
        try:
            body = read_within(environ["wsgi.input"], length, deadline)
        except BodyTimeout:
            message = f"body: not received within {deadline:.0f} s"
            return _answer(environ, start_response, 408, "INVALID_REQUEST", message, {"field": "body"})
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        environ["wsgi.input_terminated"] = True
        return self.inner(environ, start_response)

    def refusal(self, environ: dict[str, Any]) -> str | None:
        """Why the request may not send a body (no valid token where one is needed), else None."""
        if not self.app.config.get("GSWARM_AUTH", True):
            return None
        try:
            endpoint, _ = self.app.url_map.bind_to_environ(environ).match()
        except HTTPException:
            return None  # no such route (or method): Flask answers it without reading the body
        if endpoint in PUBLIC_ENDPOINTS:
            return None
        scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "a bearer token is required (Authorization: Bearer <token>)"
        with self.app.app_context():
            if identity_of(token.strip()) is None:
                return "the bearer token is not valid"
        return None


def _answer(
    environ: dict[str, Any],
    start_response: Callable[..., Any],
    status: int,
    code: str,
    message: str,
    details: dict[str, Any],
) -> list[bytes]:
    """An error in the API's shape, on a connection that is closed after it (its body was not read)."""
    given = environ.get("HTTP_X_REQUEST_ID", "")
    rid = given if REQUEST_ID_RE.match(given) else f"req-{uuid.uuid4().hex[:20]}"
    data = json.dumps(error_body(code, message, details, rid)).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data))), ("Connection", "close"),
               ("X-Request-ID", rid)]  # fmt: skip
    if status == 401:
        headers.append(("WWW-Authenticate", "Bearer"))
    start_response(f"{status} {HTTPStatus(status).phrase}", headers)
    return [data]
