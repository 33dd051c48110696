"""Nodes and their resources: `/nodes` (with the ones config.yaml declares that have not joined: `missing`),
`/nodes/{name}`, `/resources`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import marshmallow as ma
from flask import Response, jsonify
from flask.views import MethodView
from flask_smorest import Blueprint
from sqlalchemy.orm import defer

from gswarm_tasks.devices import validate_node_name
from gswarm_tasks.errors import NotFound

from ..control.nodes.state import (
    LISTED_STATUSES,
    MISSING,
    DeclaredNode,
    declaration,
    missing_nodes,
    node_rows,
    node_status,
    status_clause,
)
from ..extensions import db, settings
from ..tables import Node
from .pagination import PageArgsSchema, PageSchema

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
    status = ma.fields.Method(
        "get_status",
        metadata={"enum": list(LISTED_STATUSES), "description": "missing: declared, not joined yet"},
    )
    hostname = ma.fields.String(allow_none=True)
    address = ma.fields.String(allow_none=True)
    worker = ma.fields.String(allow_none=True)
    version = ma.fields.String(allow_none=True)
    last_seen = ma.fields.DateTime(allow_none=True, metadata={"description": "null for a missing node"})
    first_seen = ma.fields.DateTime(allow_none=True)
    started_at = ma.fields.DateTime(allow_none=True)
    seconds_since_seen = ma.fields.Method("get_age", metadata={"type": "number", "nullable": True})
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
    engines = ma.fields.Dict(
        allow_none=True,
        metadata={
            "description": "the serving engines it can run: preset -> {version, program, distribution}"
        },
    )
    allow_remote_code = ma.fields.Boolean(
        allow_none=True, metadata={"description": "its models.allow_remote_code"}
    )
    declared = ma.fields.Method(
        "get_declared",
        metadata={"description": "what config.yaml's `nodes:` says of it (address, capabilities)"},
    )

    def get_status(self, node: Node | DeclaredNode) -> str:
        if isinstance(node, DeclaredNode):
            return MISSING
        return node_status(node, datetime.now(UTC), *_timeouts())

    def get_age(self, node: Node | DeclaredNode) -> float | None:
        if isinstance(node, DeclaredNode):
            return None
        return round((datetime.now(UTC) - node.last_seen).total_seconds(), 3)

    def get_declared(self, node: Node | DeclaredNode) -> dict[str, Any] | None:
        return node.declared if isinstance(node, DeclaredNode) else declaration(settings().nodes, node.name)


class NodeListArgsSchema(PageArgsSchema):
    status = ma.fields.String(validate=ma.validate.OneOf(LISTED_STATUSES))


class NodeListSchema(PageSchema):
    nodes = ma.fields.List(ma.fields.Nested(NodeSchema))


def _iso(v: datetime | None) -> str | None:
    return None if v is None else v.isoformat()


def _opt(kind: type, v: Any) -> Any:
    return None if v is None else kind(v)


def listed_nodes(
    rows: list[Any], gpus: dict[str, list[Any]], declared: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """NodeSchema's answer for rows of `node_rows`, built directly (the same keys and values as its dump)."""
    now = datetime.now(UTC)
    timeouts = _timeouts()
    out = []
    for r in rows:
        out.append({
            "name": r.name, "status": node_status(r, now, *timeouts), "hostname": r.hostname, "address": r.address,
            "worker": r.worker, "version": r.version, "last_seen": _iso(r.last_seen), "first_seen": _iso(r.first_seen),
            "started_at": _iso(r.started_at), "seconds_since_seen": round((now - r.last_seen).total_seconds(), 3),
            "cpu_count": _opt(int, r.cpu_count), "cpu_percent": _opt(float, r.cpu_percent),
            "dram_total_bytes": _opt(int, r.dram_total_bytes),
            "dram_available_bytes": _opt(int, r.dram_available_bytes),
            "storage": r.storage, "file_port": _opt(int, r.file_port), "frames_dropped": _opt(int, r.frames_dropped),
            "engines": r.engines, "allow_remote_code": r.allow_remote_code,
            "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name,
                      "memory_total_bytes": _opt(int, g.memory_total_bytes)} for g in gpus.get(r.name, ())],
            "declared": declaration(declared, r.name),
        })  # fmt: skip
    return out


def get_node(name: str) -> Node:
    validate_node_name(name, "name")
    node = db.session.get(Node, name)
    if node is None:
        raise NotFound(f"node {name!r} is not registered", {"node": name})
    return node


def _page(items: list[Any], args: dict[str, Any]) -> dict[str, Any]:
    """One page of a list made here (declared nodes with the joined ones: a small list)."""
    start = (args["page"] - 1) * args["per_page"]
    return {"nodes": items[start : start + args["per_page"]], "total": len(items), "page": args["page"],
            "per_page": args["per_page"]}  # fmt: skip


@blp.route("/nodes")
class Nodes(MethodView):
    @blp.arguments(NodeListArgsSchema, location="query")
    @blp.response(200, NodeListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any] | Response:
        """List nodes with their GPUs, storage and status, and those config.yaml declares that have not joined
        (`missing`)"""
        status = args.get("status")
        missing = missing_nodes(settings().nodes) if status in (None, MISSING) else []
        if status == MISSING:
            return _page(missing, args)
        where = None if status is None else status_clause(status, datetime.now(UTC), *_timeouts())
        if (
            not missing
        ):  # rows, not ORM objects, and no field-by-field dump: at 1,000 nodes both cost most of the time
            rows, gpus, total = node_rows(where, args["page"], args["per_page"])
            listed = listed_nodes(rows, gpus, declared=settings().nodes)
            return jsonify(
                {"nodes": listed, "total": total, "page": args["page"], "per_page": args["per_page"]}
            )
        # The live GPU numbers (`gpu_metrics`, a few KB a node) are not in this answer: not read, not decoded.
        query = db.select(Node).options(defer(Node.gpu_metrics)).order_by(Node.name)
        if where is not None:
            query = query.where(where)
        return _page(sorted([*db.session.scalars(query), *missing], key=lambda n: n.name), args)


@blp.route("/nodes/<string:name>")
class NodeByName(MethodView):
    @blp.response(200, NodeSchema)
    def get(self, name: str) -> Node | DeclaredNode:
        """One node: GPUs, storage, status and last_seen (`missing` for one config.yaml declares that never joined)"""
        validate_node_name(name, "name")
        node: Node | DeclaredNode | None = db.session.get(Node, name)
        if node is None:
            node = next((n for n in missing_nodes(settings().nodes) if n.name == name), None)
        if node is None:
            raise NotFound(f"node {name!r} is not registered", {"node": name})
        return node

    @blp.response(204)
    def delete(self, name: str) -> None:
        """Forget a node (it registers again with its next heartbeat)"""
        db.session.delete(get_node(name))
        db.session.commit()


def _usage(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if not entry:
        return None
    return {
        "total": entry.get("total_bytes"),
        "used": entry.get("used_bytes"),
        "available": entry.get("free_bytes"),
    }


def node_resources(node: Node) -> dict[str, Any]:
    """One node's resources in the shape of the original API: storage, compute, per tier and GPU."""
    storage: dict[str, Any] = {}
    if node.storage.get("disk"):
        storage["disk"] = _usage(node.storage["disk"])
    if node.dram_total_bytes is not None:
        avail = node.dram_available_bytes or 0
        storage["dram"] = {
            "total": node.dram_total_bytes,
            "used": node.dram_total_bytes - avail,
            "available": avail,
        }
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
