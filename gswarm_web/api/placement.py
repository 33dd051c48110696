"""`/placement`: where gswarm would put something, and why, without doing anything."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.devices import AUTO_KINDS, Auto
from gswarm_tasks.errors import InvalidRequest

from ..control.models.state import find_model, get_model
from ..control.nodes.placement import ACTIONS, choose

blp = Blueprint("placement", __name__, url_prefix="/api/v1", description="Placement decisions, explained")


class PlacementArgsSchema(ma.Schema):
    model = ma.fields.String(
        metadata={"description": "the model (required for serve, load, download, copy, move)"}
    )
    action = ma.fields.String(load_default="serve", validate=ma.validate.OneOf(tuple(ACTIONS)))
    kind = ma.fields.String(
        validate=ma.validate.OneOf(AUTO_KINDS), metadata={"description": "as in auto:<kind>"}
    )


class CandidateSchema(ma.Schema):
    device = ma.fields.String()
    node = ma.fields.String()
    load_seconds = ma.fields.Float(metadata={"description": "estimated seconds to bring the weights there"})
    loaded_from = ma.fields.String(metadata={"description": "gpu (already there), dram, disk, peer or hub"})
    free_bytes = ma.fields.Integer(allow_none=True)
    replicas = ma.fields.Integer()
    chosen = ma.fields.Boolean()
    lost = ma.fields.String(metadata={"description": "why another candidate won"})


class DecisionSchema(ma.Schema):
    action = ma.fields.String()
    model = ma.fields.String(allow_none=True)
    kind = ma.fields.String(allow_none=True)
    need_bytes = ma.fields.Integer(allow_none=True)
    chosen = ma.fields.String()
    loaded_from = ma.fields.String()
    load_seconds = ma.fields.Float()
    candidates = ma.fields.List(ma.fields.Nested(CandidateSchema))


@blp.route("/placement")
class Placement(MethodView):
    @blp.arguments(PlacementArgsSchema, location="query")
    @blp.response(200, DecisionSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """The device `auto` would choose for an action, every candidate with its load estimate, and why each lost"""
        name = args.get("model")
        if name is None and args["action"] != "data":
            raise InvalidRequest(f"model: required for a {args['action']}", {"field": "model"})
        model = get_model(name, "model") if name is not None else find_model(None)
        return choose(model, args["action"], Auto(args.get("kind")))
