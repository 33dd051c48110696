"""Placement in the live fleet: `auto` devices resolved with the scheduler's cost model (`scheduling.placement`),
from the fleet as it is now (`control.fleet`) and what gswarm already placed on it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gswarm_tasks.devices import Auto, Device
from gswarm_tasks.errors import InvalidRequest

from ..extensions import db, settings
from ..scheduling.placement import Load, decide
from ..tables import Model, Replica, TaskRecord
from .dispatch import ACTIVE
from .fleet import current_view

STARTING = ("pending", "placing", "starting")


def need_bytes(model: Model | None) -> float:
    """GPU memory a served model needs: its weights' bytes times the configured overhead."""
    if model is None:
        return 0.0
    size = model.model_size or (model.manifest or {}).get("total_bytes") or 0
    return float(size) * settings().placement_memory_overhead


def current_load(model: Model | None = None, spread_from: set[str] | None = None) -> Load:
    """Replicas per device, memory reserved by replicas not running yet, operations under way per node."""
    load = Load(spread_from=set(spread_from or ()))
    replicas = list(
        db.session.scalars(db.select(Replica).where(Replica.status.in_((*STARTING, "running", "unhealthy"))))
    )
    load.replicas = dict(Counter(r.device for r in replicas))
    for r in replicas:
        if r.status in STARTING and Device.parse(r.device).is_gpu:
            load.reserved_bytes[r.device] = load.reserved_bytes.get(r.device, 0.0) + need_bytes(r.service.model)
    busy = db.session.execute(
        db.select(TaskRecord.node, db.func.count()).where(TaskRecord.state.in_(ACTIVE)).group_by(TaskRecord.node)
    )
    load.busy = {str(node): int(n) for node, n in busy if node}
    return load


ACTIONS = {"serve": "serve", "load": "load", "download": "store", "copy": "store", "move": "store", "data": "store"}


def choose(
    model: Model | None,
    action: str,
    target: Auto,
    load: Load | None = None,
    view: dict[str, Any] | None = None,
    on_node: str | None = None,
) -> dict[str, Any]:
    """The placement decision for an `auto` target of `action` (serve, load, download, copy, move, data), among
    every node or only `on_node` (a GPU is loaded from a copy on its own node)."""
    if action not in ACTIONS:
        raise InvalidRequest(f"action: {action!r} is not one of {', '.join(ACTIONS)}", {"field": "action"})
    kind = target.kind
    if ACTIONS[action] == "store" and kind in ("gpu", "cpu"):
        if action != "move" or kind == "cpu":
            raise InvalidRequest(f"device: {target} is not a storage tier for a {action}", {"field": "device"})
        action = "load"  # a move onto a GPU: the gpuN tier
    need = need_bytes(model) if action in ("serve", "load") else 0.0
    load = load or current_load(model)
    if action == "copy" and model is not None:  # a copy goes where the model is not yet
        load.holding = load.holding | {loc.node for loc in model.locations if loc.tier == (kind or "disk")}
    view = view or current_view()
    if on_node is not None:
        view = {**view, "nodes": [n for n in view["nodes"] if n["name"] == on_node]}
    return decide(
        view,
        model.name if model is not None else None,
        ACTIONS[action],
        kind if ACTIONS[action] != "store" else (kind or "disk"),
        need,
        load,
    )
