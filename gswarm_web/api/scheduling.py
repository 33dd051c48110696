"""`/scheduling`: the simulator over the HTTP API, and the fleet as the scheduler sees it."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView
from flask_smorest import Blueprint

from ..control.nodes.fleet import current_view
from ..scheduling import MODES, PUBLIC_POLICIES, simulate_payload, validate_payload
from .offload import offload

blp = Blueprint(
    "scheduling", __name__, url_prefix="/api/v1", description="Scheduling: simulation and the fleet"
)

MAX_REQUESTS = 20_000  # a simulation runs inside the request: keep it to seconds


class SimulateSchema(ma.Schema):
    config = ma.fields.Dict(
        required=True, metadata={"description": "the original's config JSON (models, workflows)"}
    )
    requests = ma.fields.Raw(
        required=True,
        metadata={"description": "the request trace: {requests: [...]} as the trace YAML has it"},
    )
    gpus = ma.fields.Integer(validate=ma.validate.Range(min=1, max=4096))
    fleet = ma.fields.Dict(metadata={"description": "nodes, GPUs, DRAM, bandwidths, where weights are"})
    policy = ma.fields.String(load_default="gswarm", validate=ma.validate.OneOf(PUBLIC_POLICIES))
    mode = ma.fields.String(load_default="online", validate=ma.validate.OneOf(MODES))

    @ma.validates("requests")
    def _bounded(self, value: Any, **_: Any) -> None:
        items = value.get("requests") if isinstance(value, dict) else value
        if isinstance(items, list) and len(items) > MAX_REQUESTS:
            raise ma.ValidationError(f"at most {MAX_REQUESTS} requests per simulation (use the CLI for more)")


class ValidateSchema(SimulateSchema):
    schedule = ma.fields.Dict(required=True, metadata={"description": "a simulation's output (OUT.json)"})
    policy = ma.fields.String(load_default=None, allow_none=True)


class ExecutionSchema(ma.Schema):
    request_id = ma.fields.String()
    node_id = ma.fields.String()
    model_name = ma.fields.String()
    gpu_id = ma.fields.Integer()
    gpus = ma.fields.List(ma.fields.Integer())
    start_time = ma.fields.Float()
    end_time = ma.fields.Float()
    switch_time = ma.fields.Float()
    loaded_from = ma.fields.String()


class ScheduleSchema(ma.Schema):
    executions = ma.fields.List(ma.fields.Nested(ExecutionSchema))
    summary = ma.fields.Dict()


class VerdictSchema(ma.Schema):
    valid = ma.fields.Boolean()
    violations = ma.fields.List(ma.fields.Dict())


@blp.route("/scheduling/simulate")
class Simulate(MethodView):
    @blp.arguments(SimulateSchema)
    @blp.response(200, ScheduleSchema)
    def post(self, args: dict[str, Any]) -> dict[str, Any]:
        """Simulate a policy on a request trace (the same inputs and output as `gswarm schedule simulate`)"""
        return offload(simulate_payload, {k: v for k, v in args.items() if v is not None})


@blp.route("/scheduling/validate")
class Validate(MethodView):
    @blp.arguments(ValidateSchema)
    @blp.response(200, VerdictSchema)
    def post(self, args: dict[str, Any]) -> dict[str, Any]:
        """Check a schedule against its inputs: every step once, dependencies, overlaps, loads, summary"""
        args.pop("policy", None)
        return offload(validate_payload, {k: v for k, v in args.items() if v is not None})


@blp.route("/scheduling/fleet")
class FleetView(MethodView):
    @blp.response(200)
    def get(self) -> dict[str, Any]:
        """The fleet as the scheduler sees it: nodes, GPUs, free memory, and where each model's weights are"""
        return current_view()
