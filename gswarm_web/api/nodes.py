"""Nodes and their resources: `/nodes`, `/nodes/{name}`, `/resources`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import marshmallow as ma
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.devices import validate_node_name
from gswarm_tasks.errors import NotFound

from ..control.node_state import STATUSES, node_status, status_clause
from ..extensions import db, settings
from ..tables import Node
from .pagination import PageArgsSchema, PageSchema, page_of

blp = Blueprint("nodes", __name__, url_prefix="/api/v1", description="Nodes of the fleet and their resources")


def _timeouts() -> tuple[float, float]:
    s = settings()
    return s.heartbeat_timeout_s, s.offline_after_s


class GpuSchema(ma.Schema):
    index = ma.fields.Integer()
    uuid = ma.fields.String(allow_none=True)
    name = ma.fields.String(allow_none=True)
    memory_total_bytes = ma.fields.Integer(allow_none=True)


class NodeSchema(ma.Schema):
    name = ma.fields.String()
    status = ma.fields.Method("get_status", metadata={"enum": list(STATUSES)})
    hostname = ma.fields.String(allow_none=True)
    address = ma.fields.String(allow_none=True)
    worker = ma.fields.String(allow_none=True)
    version = ma.fields.String(allow_none=True)
    last_seen = ma.fields.DateTime()
    first_seen = ma.fields.DateTime()
    started_at = ma.fields.DateTime(allow_none=True)
    seconds_since_seen = ma.fields.Method("get_age")
    cpu_count = ma.fields.Integer(allow_none=True)
    cpu_percent = ma.fields.Float(allow_none=True)
    dram_total_bytes = ma.fields.Integer(allow_none=True)
    dram_available_bytes = ma.fields.Integer(allow_none=True)
    storage = ma.fields.Dict()
    gpus = ma.fields.List(ma.fields.Nested(GpuSchema))
    file_port = ma.fields.Integer(allow_none=True)
    frames_dropped = ma.fields.Integer(
        metadata={"description": "profiler frames the node lost to a bound while Redis was unreachable"}
    )

    def get_status(self, node: Node) -> str:
        return node_status(node, datetime.now(UTC), *_timeouts())

    def get_age(self, node: Node) -> float:
        return round((datetime.now(UTC) - node.last_seen).total_seconds(), 3)


class NodeListArgsSchema(PageArgsSchema):
    status = ma.fields.String(validate=ma.validate.OneOf(STATUSES))


class NodeListSchema(PageSchema):
    nodes = ma.fields.List(ma.fields.Nested(NodeSchema))


def get_node(name: str) -> Node:
    validate_node_name(name, "name")
    node = db.session.get(Node, name)
    if node is None:
        raise NotFound(f"node {name!r} is not registered", {"node": name})
    return node


@blp.route("/nodes")
class Nodes(MethodView):
    @blp.arguments(NodeListArgsSchema, location="query")
    @blp.response(200, NodeListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """List nodes with their GPUs, storage and status"""
        query = db.select(Node).order_by(Node.name)
        if "status" in args:
            query = query.where(status_clause(args["status"], datetime.now(UTC), *_timeouts()))
        return page_of("nodes", query, args)


@blp.route("/nodes/<string:name>")
class NodeByName(MethodView):
    @blp.response(200, NodeSchema)
    def get(self, name: str) -> Node:
        """One node: GPUs, storage, status and last_seen"""
        return get_node(name)

    @blp.response(204)
    def delete(self, name: str) -> None:
        """Forget a node (it registers again with its next heartbeat)"""
        db.session.delete(get_node(name))
        db.session.commit()


def _usage(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if not entry:
        return None
    return {"total": entry.get("total_bytes"), "used": entry.get("used_bytes"), "available": entry.get("free_bytes")}


def node_resources(node: Node) -> dict[str, Any]:
    """One node's resources in the shape of the original API: storage, compute, per tier and GPU."""
    storage: dict[str, Any] = {}
    if node.storage.get("disk"):
        storage["disk"] = _usage(node.storage["disk"])
    if node.dram_total_bytes is not None:
        avail = node.dram_available_bytes or 0
        storage["dram"] = {"total": node.dram_total_bytes, "used": node.dram_total_bytes - avail, "available": avail}
    compute: dict[str, Any] = {"cpu": {"cores": node.cpu_count, "usage": node.cpu_percent}}
    for g in node.gpu_metrics or []:
        key = f"gpu{g.get('index')}"
        total, used = g.get("memory_total_bytes"), g.get("memory_used_bytes")
        storage[key] = {
            "total": total,
            "used": used,
            "available": total - used if isinstance(total, int) and isinstance(used, int) else None,
        }
        compute[key] = {"usage": g.get("utilization_percent"), "temperature": g.get("temperature_c")}
    return {
        "node": node.name,
        "status": node_status(node, datetime.now(UTC), *_timeouts()),
        "storage": storage,
        "compute": compute,
    }


@blp.route("/resources")
class Resources(MethodView):
    @blp.response(200)
    def get(self) -> dict[str, Any]:
        """Storage and compute of every node, as of its last heartbeat"""
        nodes = list(db.session.scalars(db.select(Node).order_by(Node.name)))
        per_node = {n.name: node_resources(n) for n in nodes}
        totals: dict[str, int] = {"gpus": 0, "cpu_cores": 0, "disk_total": 0, "disk_available": 0}
        for r in per_node.values():
            totals["cpu_cores"] += r["compute"]["cpu"]["cores"] or 0
            totals["gpus"] += sum(1 for k in r["compute"] if k.startswith("gpu"))
            disk = r["storage"].get("disk") or {}
            totals["disk_total"] += disk.get("total") or 0
            totals["disk_available"] += disk.get("available") or 0
        return {"nodes": per_node, "totals": totals}
