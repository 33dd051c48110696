"""Placement in the live fleet: `auto` devices resolved with the scheduler's cost model (`scheduling.ranking`),
from the fleet as it is now (`control.fleet`) and what gswarm already placed on it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gswarm_tasks.devices import Auto, Device
from gswarm_tasks.errors import InvalidRequest, ResourceUnavailable
from gswarm_tasks.serving.engines import AUTO

from ...extensions import db, settings
from ...scheduling.ranking import Load, decide
from ...tables import Model, Node, Replica, TaskRecord
from ..dispatch import ACTIVE
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
            gpus = (r.placement or {}).get("gpus") or [Device.parse(r.device).gpu_index]
            share = need_bytes(r.service.model) / len(gpus)  # tensor parallelism: a share on each of its GPUs
            for index in gpus:
                device = f"{r.node}:gpu{index}"
                load.reserved_bytes[device] = load.reserved_bytes.get(device, 0.0) + share
    busy = db.session.execute(
        db.select(TaskRecord.node, db.func.count())
        .where(TaskRecord.state.in_(ACTIVE))
        .group_by(TaskRecord.node)
    )
    load.busy = {str(node): int(n) for node, n in busy if node}
    return load


ACTIONS = {
    "serve": "serve",
    "load": "load",
    "download": "store",
    "copy": "store",
    "move": "store",
    "data": "store",
}


def choose(
    model: Model | None,
    action: str,
    target: Auto,
    load: Load | None = None,
    view: dict[str, Any] | None = None,
    on_node: str | None = None,
    among: list[str] | None = None,
    share: int = 1,
    engine: str | None = None,
) -> dict[str, Any]:
    """The placement decision for an `auto` target of `action` (serve, load, download, copy, move, data), among
    every node, only `on_node` (a GPU is loaded from a copy on its own node), or `among` those a service is pinned
    to that hold none of its replicas yet (`load.spread_from`): one replica on each. `share`: the GPUs a replica
    spans (tensor parallelism), each needing that share of the weights."""
    if action not in ACTIONS:
        raise InvalidRequest(f"action: {action!r} is not one of {', '.join(ACTIONS)}", {"field": "action"})
    kind = target.kind
    if ACTIONS[action] == "store" and kind in ("gpu", "cpu"):
        if action != "move" or kind == "cpu":
            raise InvalidRequest(
                f"device: {target} is not a storage tier for a {action}", {"field": "device"}
            )
        action = "load"  # a move onto a GPU: the gpuN tier
    need = need_bytes(model) / max(1, share) if action in ("serve", "load") else 0.0
    load = load or current_load(model)
    if action == "copy" and model is not None:  # a copy goes where the model is not yet
        load.holding = load.holding | {loc.node for loc in model.locations if loc.tier == (kind or "disk")}
    view = view or current_view()
    if on_node is not None:
        view = {**view, "nodes": [n for n in view["nodes"] if n["name"] == on_node]}
    if among is not None:
        allowed = set(among) - load.spread_from
        view = {**view, "nodes": [n for n in view["nodes"] if n["name"] in allowed]}
    if engine is not None and engine != AUTO:
        view = {**view, "nodes": running_engine(view["nodes"], engine)}
    return decide(
        view,
        model.name if model is not None else None,
        ACTIONS[action],
        kind if ACTIONS[action] != "store" else (kind or "disk"),
        need,
        load,
    )


def engines_of(names: list[str]) -> dict[str, dict[str, Any] | None]:
    """The serving engines each node said it runs (None: it has not said)."""
    rows = db.session.execute(db.select(Node.name, Node.engines).where(Node.name.in_(names))).all()
    return {str(name): engines for name, engines in rows}


def running_engine(nodes: list[dict[str, Any]], engine: str) -> list[dict[str, Any]]:
    """Those of `nodes` that run `engine` (or have not said what they run); none: 409 naming the engine."""
    said = engines_of([n["name"] for n in nodes])
    able = [n for n in nodes if said.get(n["name"]) is None or engine in (said[n["name"]] or {})]
    if nodes and not able:
        raise ResourceUnavailable(
            f"engine: no node runs {engine!r} ({', '.join(sorted(said))} do not: `gswarm nodes` shows what each runs)",
            {"field": "engine", "engine": engine},
        )
    return able


def require_engine(node: Node, engine: str, field: str = "engine") -> None:
    """A request for `engine` on `node` is refused at once (409 naming both) when the node said it cannot run it."""
    if engine == AUTO or node.engines is None or engine in node.engines:
        return
    runs = ", ".join(sorted(node.engines)) or "none"
    raise ResourceUnavailable(
        f"{field}: node {node.name} cannot run engine {engine!r} (it runs: {runs}); install it there "
        "(serving.engine_paths) or choose another",
        {"field": field, "engine": engine, "node": node.name, "engines": sorted(node.engines)},
    )


def tensor_parallel(decision: dict[str, Any], model: Model | None, tp: int, load: Load) -> dict[str, Any]:
    """`tp` GPUs of one node for a tensor-parallel replica, each with room for its share of the weights: the node of
    the decision's best candidate that has them (in the decision's order), its GPUs with the most room first."""
    if tp <= 1:
        return decision
    share = need_bytes(model) / tp
    view = current_view()
    nodes = {
        n["name"]: n for n in view["nodes"] if n["status"] == "healthy" and n["name"] not in load.exclude
    }
    order = list(dict.fromkeys(c["node"] for c in decision["candidates"]))
    for name in order:
        node = nodes.get(name)
        if node is None:
            continue
        room = sorted(
            (
                (g["memory_free_bytes"] - load.reserved_bytes.get(g["device"], 0.0), g["device"])
                for g in node["gpus"]
            ),
            key=lambda x: (-x[0], x[1]),
        )
        fits = [device for free, device in room if free >= share][:tp]
        if len(fits) == tp:
            fits.sort(key=lambda d: Device.parse(d).gpu_index or 0)
            tier = next((c["loaded_from"] for c in decision["candidates"] if c["node"] == name), "peer")
            return {**decision, "chosen": fits[0], "gpus": [Device.parse(d).gpu_index for d in fits],
                    "loaded_from": tier, "tensor_parallel_size": tp}  # fmt: skip
    raise ResourceUnavailable(
        f"{model.name if model else 'the model'}: tensor_parallel_size {tp} needs {tp} GPUs of one node with "
        f"{share / 2**30:.1f} GiB free each; no healthy node has them",
        {
            "field": "config.tensor_parallel_size",
            "need_bytes_per_gpu": int(share),
            "tensor_parallel_size": tp,
        },
    )
