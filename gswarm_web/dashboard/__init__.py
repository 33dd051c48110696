"""The web dashboard: one HTML page and its static ES modules, served at `/` from the package (no CDN, no build).

The pages call the REST API under `/api/v1` with the user's bearer token, like any other client; this blueprint
serves files and nothing else, so it imports nothing of gswarm. `static/vendor/` holds third-party files, each
folder with its VERSION and LICENSE.
"""

from __future__ import annotations

from flask import Blueprint, Response, render_template

bp = Blueprint(
    "dashboard",
    __name__,
    static_folder="static",
    static_url_path="/dashboard/static",
    template_folder="templates",
)
SWAGGER_UI_URL = "/dashboard/static/vendor/swagger-ui/"


@bp.get("/")
def index() -> Response:
    """The dashboard's one page; the browser routes between its views (`#/fleet`, `#/workflows/<id>`, ...)."""
    resp = Response(render_template("dashboard/index.html"))
    # Nothing but this host: the page must work on an air-gapped cluster, and this keeps it honest.
    resp.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'"
    )
    return resp
