"""Input the API does not know is refused, never ignored: a query parameter, or a body sent where the view reads
none, is a 422 naming it. Bodies a view reads through a schema are checked by the schema (marshmallow raises on
unknown fields by default); query strings are made to raise here too (webargs would drop unknown ones)."""

from __future__ import annotations

import threading
from typing import Any

from flask import Flask, request
from flask_smorest import Blueprint
from marshmallow import RAISE

from gswarm_tasks.errors import InvalidRequest

# Views that read their body themselves (YAML or multipart workflows, the gateway's pass-through bodies).
RAW_BODY = frozenset(
    {
        "workflows.Workflows",
        "workflows.WorkflowValidate",
        "gateway.Completions",
        "gateway.ChatCompletions",
        "gateway.Embeddings",
    }
)
BODY_LOCATIONS = frozenset({"json", "form", "json_or_form", "files"})
_EMPTY_BODIES = (b"", b"{}", b"null")
_declared: dict[tuple[str, str], tuple[set[str] | None, bool]] = {}
_declared_lock = threading.Lock()


def _view_method(app: Flask, endpoint: str, method: str) -> Any:
    view = app.view_functions.get(endpoint)
    cls = getattr(view, "view_class", None)
    if cls is None:
        return view
    return getattr(cls, method.lower(), None) or (getattr(cls, "get", None) if method == "HEAD" else None)


def _what_it_reads(app: Flask, endpoint: str, method: str) -> tuple[set[str] | None, bool]:
    """(the query parameters a view declares, or None where it declares no query schema; whether it reads a body)."""
    key = (endpoint, method)
    with _declared_lock:
        hit = _declared.get(key)
    if hit is not None:
        return hit
    func = _view_method(app, endpoint, method)
    params = (getattr(func, "_apidoc", {}).get("arguments") or {}).get("parameters") or []
    query: set[str] | None = None
    body = endpoint in RAW_BODY
    for p in params:
        where = p.get("in") or p.get("location")
        if where in ("query", "querystring"):
            schema = p["schema"]
            fields = (schema() if isinstance(schema, type) else schema).fields
            query = (query or set()) | {f.data_key or name for name, f in fields.items()}
        elif where in BODY_LOCATIONS:
            body = True
    out = (query, body)
    with _declared_lock:
        _declared[key] = out
    return out


def refuse_unknown_input(app: Flask, blueprints: set[str]) -> None:
    """Register the check for the API's blueprints (the dashboard's static files and the docs are left alone)."""

    @app.before_request
    def _refuse_unknown() -> None:
        if request.blueprint not in blueprints or request.endpoint is None:
            return
        query, reads_body = _what_it_reads(app, request.endpoint, request.method)
        unknown = sorted(set(request.args) - (query or set()))
        if unknown:
            allowed = f"it takes {', '.join(sorted(query))}" if query else "it takes no query parameters"
            raise InvalidRequest(
                f"{unknown[0]}: unknown query parameter of {request.method} {request.path} ({allowed})",
                {"field": unknown[0], "unknown": unknown, "location": "query"},
            )
        if not reads_body and request.method not in ("GET", "HEAD", "OPTIONS"):
            length = request.content_length or 0
            if length and (length > 64 or request.get_data(cache=True).strip() not in _EMPTY_BODIES):
                raise InvalidRequest(
                    f"body: {request.method} {request.path} takes no body",
                    {"field": "body", "location": "body"},
                )


def strict_query_strings() -> None:
    """webargs drops unknown query parameters by default; gswarm refuses them (each schema can still say EXCLUDE)."""
    Blueprint.ARGUMENTS_PARSER.DEFAULT_UNKNOWN_BY_LOCATION = {
        **Blueprint.ARGUMENTS_PARSER.DEFAULT_UNKNOWN_BY_LOCATION,
        "query": RAISE,
        "querystring": RAISE,
    }
