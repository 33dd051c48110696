"""The original gswarm's REST paths that gswarm names otherwise, kept as aliases of gswarm's own views: the same
view, the same checks, the same endpoint (so auth, strict input and the docs treat them as the view they alias).

gsmodel's jobs are gswarm's workflows: `POST /jobs` (YAML or JSON), `POST /jobs/from-yaml` (a multipart `file`),
`GET /jobs`, `GET /jobs/{id}` and `GET /jobs/{id}/status`. Every other path of the original documents is gswarm's
own path and lives with its resource.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint

bp = Blueprint("original", __name__)

# the original's path -> (gswarm's endpoint, methods)
ALIASES: dict[str, tuple[str, list[str]]] = {
    "/api/v1/jobs": ("workflows.Workflows", ["GET", "POST"]),
    "/api/v1/jobs/from-yaml": ("workflows.Workflows", ["POST"]),
    "/api/v1/jobs/<string:workflow_id>": ("workflows.WorkflowById", ["GET"]),
    "/api/v1/jobs/<string:workflow_id>/status": ("workflows.WorkflowById", ["GET"]),
}


@bp.record_once
def _aliases(state: Any) -> None:
    for path, (endpoint, methods) in ALIASES.items():
        state.app.add_url_rule(path, endpoint=endpoint, methods=methods)
