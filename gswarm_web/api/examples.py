"""`/workflows/examples`: the workflow examples (the original docs' six, and the same with `auto` devices), for
clients that offer them one click away (the dashboard) without a copy of the package."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView
from flask_smorest import Blueprint

from ..workflows.examples import EXAMPLES, ORDER, RUNNABLE

blp = Blueprint("workflow_examples", __name__, url_prefix="/api/v1", description="Workflow examples")


class ExampleSchema(ma.Schema):
    name = ma.fields.String()
    original = ma.fields.String(metadata={"description": "the original docs' YAML, verbatim (node1, node2)"})
    runnable = ma.fields.String(
        metadata={"description": "the same with `auto` devices: runs wherever it fits"}
    )


class ExampleListSchema(ma.Schema):
    examples = ma.fields.List(ma.fields.Nested(ExampleSchema))


@blp.route("/workflows/examples")
class Examples(MethodView):
    @blp.response(200, ExampleListSchema)
    def get(self) -> dict[str, Any]:
        """The workflow examples as YAML: each original, and the same with `auto` devices"""
        return {"examples": [{"name": n, "original": EXAMPLES[n], "runnable": RUNNABLE[n]} for n in ORDER]}
