"""The API's error handlers and request ids: every error answers in the shape of `gswarm_tasks.errors.error_body`,
and nothing a request sent is ever echoed into a response header."""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

import marshmallow as ma
from flask import Flask, Response, g, jsonify, request
from flask_smorest import Api
from sqlalchemy import exc as sa_exc
from werkzeug.exceptions import HTTPException

from gswarm_tasks.errors import ERROR_CODES, GswarmError, InvalidRequest, error_body

log = logging.getLogger(__name__)

DATABASE_RETRY_AFTER_S = 1
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_STATUS_CODES = {
    400: "INVALID_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "INVALID_REQUEST",
    409: "CONFLICT",
    413: "INVALID_REQUEST",
    415: "INVALID_REQUEST",
    422: "INVALID_REQUEST",
}


class ErrorBodySchema(ma.Schema):
    code = ma.fields.String(required=True, metadata={"enum": list(ERROR_CODES)})
    message = ma.fields.String(required=True)
    details = ma.fields.Dict(required=True)
    timestamp = ma.fields.DateTime(required=True, metadata={"description": "UTC, ISO 8601"})
    request_id = ma.fields.String(required=True)


class ErrorSchema(ma.Schema):
    """Every error response: `{"error": {code, message, details, timestamp, request_id}}`."""

    error = ma.fields.Nested(ErrorBodySchema, required=True)


def request_id() -> str:
    rid = getattr(g, "request_id", None)
    if rid is None:
        given = request.headers.get("X-Request-ID", "")
        rid = given if REQUEST_ID_RE.match(given) else f"req-{uuid.uuid4().hex[:20]}"
        g.request_id = rid
    return str(rid)


def error_response(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> Response:
    resp = jsonify(error_body(code, message, details, request_id()))
    resp.status_code = status
    return resp


def _flatten(messages: Any, prefix: str = "") -> list[tuple[str, str]]:
    """`{"json": {"a": {"b": ["bad"]}}}` -> [("a.b", "bad")]; the location level is dropped."""
    out: list[tuple[str, str]] = []
    if isinstance(messages, dict):
        for key, val in messages.items():
            if not prefix and key in ("json", "query", "form", "files", "headers", "view_args", "path"):
                out.extend(_flatten(val, ""))
            else:
                out.extend(_flatten(val, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(messages, list):
        if all(isinstance(m, str) for m in messages):
            out.extend((prefix or "_schema", m) for m in messages)
        else:
            for m in messages:
                out.extend(_flatten(m, prefix))
    else:
        out.append((prefix or "_schema", str(messages)))
    return out


class GswarmApi(Api):
    """flask-smorest's Api with gswarm's error shape for every HTTP error."""

    ERROR_SCHEMA = ErrorSchema

    def handle_http_exception(self, error: HTTPException) -> Response:
        status = error.code or 500
        data = getattr(error, "data", None) or {}
        if status == 422 and "messages" in data:
            pairs = _flatten(data["messages"])
            text = "; ".join(f"{f}: {m}" for f, m in pairs)
            # The fields are named in the body only: a header would carry what the request sent (newlines, any
            # character), which is how a bad field name once turned a 422 into a 500.
            return error_response(
                422, "INVALID_REQUEST", f"invalid request: {text}", {"fields": dict(_group(pairs))}
            )
        if status >= 500:
            return error_response(status, "INTERNAL", "internal error; see the server log", {})
        message = data.get("message") or error.description or error.name
        details: dict[str, Any] = {}
        if status == 405:
            details["allowed_methods"] = sorted(getattr(error, "valid_methods", None) or [])
            message = f"method {request.method} is not allowed on {request.path}"
        if status == 404 and not data.get("message"):
            message = f"no such resource: {request.path}"
        resp = error_response(status, _STATUS_CODES.get(status, "INVALID_REQUEST"), message, details)
        for key, val in error.get_headers() if hasattr(error, "get_headers") else []:
            if key.lower() in ("allow", "www-authenticate", "retry-after"):
                resp.headers[key] = val
        return resp


def _group(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f, m in pairs:
        out.setdefault(f, []).append(m)
    return out


def _find_nul(value: Any, path: str) -> str | None:
    """The path of the first string holding a NUL character (no database takes one in a text field)."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for k, v in value.items():
            if "\x00" in str(k):
                return f"{path}.{k!r}".lstrip(".")
            found = _find_nul(v, f"{path}.{k}".lstrip("."))
            if found:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _find_nul(v, f"{path}[{i}]")
            if found:
                return found
    return None


def refuse_nul_characters() -> None:
    """A NUL character anywhere in a request (path, query, JSON body) is refused before any view sees it. The
    gateway's bodies are passed to the model servers as they came (nothing of them is stored here)."""
    if request.blueprint == "gateway":
        return
    where = None
    if "\x00" in request.path:
        where = "path"
    else:
        for key, value in request.args.items(multi=True):
            if "\x00" in key or "\x00" in value:
                where = "query" if "\x00" in key else key
                break
    if where is None and request.is_json:
        where = _find_nul(request.get_json(silent=True), "")
    if where is not None:
        raise InvalidRequest(f"{where or 'body'}: a NUL character is not allowed", {"field": where or "body"})


def register_error_handlers(app: Flask) -> None:
    app.before_request(refuse_nul_characters)

    @app.errorhandler(GswarmError)
    def _gswarm_error(exc: GswarmError) -> Response:
        if exc.status >= 500 and exc.code == "INTERNAL":
            log.exception("internal error", exc_info=exc)
        return error_response(exc.status, exc.code, exc.message, exc.details)

    @app.errorhandler(sa_exc.OperationalError)
    @app.errorhandler(sa_exc.InterfaceError)
    @app.errorhandler(sa_exc.TimeoutError)
    def _database_unavailable(exc: Exception) -> Response:
        # Locked past its wait (SQLite), restarting, or out of connections: the request changed nothing (its
        # transaction is rolled back at teardown) and may be sent again.
        log.warning("database unavailable on %s %s [%s]: %s", request.method, request.path, request_id(), exc)
        resp = error_response(503, "RESOURCE_UNAVAILABLE", "the database cannot answer now; try again", {})
        resp.headers["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
        return resp

    @app.errorhandler(Exception)
    def _unhandled(exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            return app.extensions["gswarm_api"].handle_http_exception(exc)
        log.exception("unhandled error on %s %s [%s]", request.method, request.path, request_id())
        return error_response(500, "INTERNAL", "internal error; see the server log", {})

    @app.after_request
    def _add_request_id(resp: Response) -> Response:
        resp.headers["X-Request-ID"] = request_id()
        return resp
