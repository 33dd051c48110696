"""The fleet as the scheduler sees it now: every node with its status, GPUs and free memory (from heartbeats),
and where each registered model's weights are, by tier (from the model registry)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ...extensions import db, settings
from ...scheduling import fleet_view
from ...tables import Model, Node
from .state import node_status


def _node(node: Node, now: datetime) -> dict[str, Any]:
    s = settings()
    return {
        "name": node.name,
        "status": node_status(node, now, s.heartbeat_timeout_s, s.offline_after_s),
        "gpus": [
            {
                "index": g["index"],
                "name": g.get("name"),
                "memory_total_bytes": g.get("memory_total_bytes") or 0,
                "memory_used_bytes": g.get("memory_used_bytes") or 0,
            }
            for g in node.gpu_metrics or []
            if isinstance(g.get("index"), int)
        ],
        "dram_total_bytes": node.dram_total_bytes or 0,
        "dram_available_bytes": node.dram_available_bytes or 0,
    }


def _model(model: Model) -> dict[str, Any] | None:
    size = model.model_size or (model.manifest or {}).get("total_bytes")
    if not size:
        return None  # never downloaded: nothing to load yet
    return {
        "name": model.name,
        "size_bytes": size,
        "locations": [loc.device for loc in model.locations if loc.status == "ready"],
    }


def current_view() -> dict[str, Any]:
    """`scheduling.fleet_view` of the fleet in the tables."""
    now = datetime.now(UTC)
    nodes = [_node(n, now) for n in db.session.scalars(db.select(Node).order_by(Node.name))]
    models = [m for m in (_model(m) for m in db.session.scalars(db.select(Model).order_by(Model.name))) if m]
    return fleet_view(nodes, models)
