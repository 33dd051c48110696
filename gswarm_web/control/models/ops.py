"""The model operations the API starts: download, copy, move, remove a copy, and register a copy already on a
node. Each decides with the model's row locked (`locked_model`) and records its task in the same transaction."""

from __future__ import annotations

from typing import Any

from gswarm_tasks import names
from gswarm_tasks.devices import Device, parse_target
from gswarm_tasks.errors import Conflict, InvalidRequest
from gswarm_tasks.models.sources import parse_source
from gswarm_tasks.storage import prefix as storage_prefix

from ...extensions import db, settings
from ...tables import Model, ModelLocation, Replica, Service, TaskRecord
from ..dispatch import dispatch, peer_source, require_node, send_recorded
from ..nodes.devices import named
from ..nodes.placement import choose
from . import state as model_state
from .state import locked_model, ready_location, refuse_busy, require_gpu, start_operation


def parse_device(text: str, field: str) -> Device:
    """A device as a request names it: by node name or by a node's address."""
    return Device.parse(named(text, field) or text, field=field)


def target(
    model: Model,
    action: str,
    text: str | None,
    files: bool = False,
    gpu: bool = False,
    on_node: str | None = None,
) -> tuple[Device, dict[str, Any] | None]:
    """A named device (checked), or the one placement chooses for `auto` / nothing, with its decision."""
    dest = parse_target(named(text, "target_device"), "target_device")
    if isinstance(dest, Device):
        return dest.expect("target_device", files=files, gpu=gpu), None
    if dest.kind == "gpu" and not gpu:
        raise InvalidRequest(
            f"target_device: {dest} is not a storage tier for a {action}", {"field": "target_device"}
        )
    decision = choose(model, action, dest, on_node=on_node if dest.kind == "gpu" else None)
    return Device.parse(decision["chosen"]), {"placement": decision}


def source(model: Model, text: str | None, dst_node: str | None) -> Device:
    """A named copy, or with `auto` (or nothing) the best ready one: the target's node first, dram before disk."""
    src = parse_target(named(text, "source_device"), "source_device")
    if isinstance(src, Device):
        return src.expect("source_device", files=True)
    ready = [loc for loc in model.locations if loc.status == "ready" and loc.tier in ("dram", "disk")]
    if not ready:
        raise InvalidRequest(
            f"source_device: {model.name} has no copy on any node", {"field": "source_device"}
        )
    best = sorted(ready, key=lambda loc: (loc.node != dst_node, loc.tier != "dram", loc.device))[0]
    return Device.parse(best.device)


def download(name: str, args: dict[str, Any]) -> TaskRecord:
    """Download a model onto a node's disk or dram (from `source_url`, else its registered source)."""
    model = locked_model(name)
    dest, decision = target(model, "download", args.get("target_device"), files=True)
    url = args.get("source_url") or model.source_url
    if not url:
        raise InvalidRequest(
            "source_url: the model has no registered source; give one", {"field": "source_url"}
        )
    parse_source(url, settings().allowed_roots)
    require_node(str(dest.node), "target_device")
    refuse_busy(model, {str(dest)})
    kwargs = {"model": name, "source_url": url, "tier": dest.tier}
    return start_operation(
        model, "download", str(dest.node), names.MODEL_DOWNLOAD, kwargs, args["priority"], source="web",
        target=str(dest), extra_params=decision,
    )  # fmt: skip


def _check_copy(model: Model, src: Device, dst: Device, removes_source: bool) -> None:
    ready_location(model, src, "source_device")
    require_node(str(dst.node), "target_device")
    if not model.manifest:
        raise Conflict(f"{model.name} has no manifest yet", {"model_name": model.name})
    if dst.is_gpu and dst.node != src.node:
        raise InvalidRequest(
            "target_device: a GPU is loaded from a copy on its own node", {"field": "target_device"}
        )
    if src == dst:
        raise InvalidRequest("target_device: same as source_device", {"field": "target_device"})
    if dst.is_gpu:
        require_gpu(dst, "target_device")
    refuse_busy(model, {str(dst), *([str(src)] if removes_source else [])}, {str(src)})


def copy_or_move(name: str, args: dict[str, Any], keep_source: bool, kind: str) -> TaskRecord:
    """A copy, or a move (`kind`), between tiers of a node or across nodes; a GPU target loads the weights."""
    model = locked_model(name)
    explicit_src = parse_target(named(args.get("source_device"), "source_device"), "source_device")
    node_of_src = explicit_src.node if isinstance(explicit_src, Device) else None
    dst, decision = target(model, kind, args.get("target_device"), files=True, gpu=True, on_node=node_of_src)
    src = source(model, args.get("source_device"), dst.node)
    _check_copy(model, src, dst, removes_source=kind == "move" and not keep_source and src.node == dst.node)
    existing = db.session.get(ModelLocation, (model.id, str(dst)))
    if existing is not None and existing.status == "ready" and (kind == "copy" or keep_source):
        return model_state.already_there(model, kind, src, dst)
    ends = {"source": str(src), "target": str(dst)}
    if (src.node == dst.node and kind != "copy") or dst.is_gpu:
        kwargs = {"model": name, "manifest": model.manifest, "source_tier": src.tier, "target_tier": dst.tier,
                  "keep_source": keep_source}  # fmt: skip
        extra = {**(decision or {}), **_compression(args, src, dst)} or None
        return start_operation(
            model,
            "move",
            str(dst.node),
            names.MODEL_MOVE,
            kwargs,
            args["priority"],
            extra_params=extra,
            **ends,
        )
    where = {"node": src.node, "tier": src.tier}
    if src.node != dst.node:
        peer = require_node(str(src.node), "source_device")
        where = peer_source(peer, src.tier, storage_prefix(src.tier, "models", name))
    kwargs = {"model": name, "manifest": model.manifest, "target_tier": dst.tier, "source": where,
              "bandwidth_limit": args.get("bandwidth_limit")}  # fmt: skip
    if src.node != dst.node and args.get("compression", "none") != "none":
        kwargs["compression"] = args["compression"]  # only then: a node of an older release takes the rest
    real_move = kind == "move" and src.node != dst.node
    extra = {
        **({"cross_node": True, "keep_source": keep_source} if real_move else {}),
        **(decision or {}),
        **_compression(args, src, dst),
    } or None
    op = "move" if real_move else "copy"
    return start_operation(
        model, op, str(dst.node), names.MODEL_COPY, kwargs, args["priority"], extra_params=extra, **ends
    )


def _compression(args: dict[str, Any], src: Device, dst: Device) -> dict[str, Any]:
    """What the task row says about compression: asked for, and whether the bytes cross a network to apply it."""
    asked = args.get("compression")
    if not asked:
        return {}
    return {"compression": asked if src.node != dst.node else "none", "compression_asked": asked}


def delete_copy(model: Model, text: str, field: str, force: bool) -> TaskRecord:
    """Remove one copy: refused while an operation uses it, or (unless `force`) while a replica on its node runs
    from the node's last copy."""
    dev = parse_device(text, field)
    ready_location(model, dev, field)
    refuse_busy(model, {str(dev)})
    if not force and not dev.is_gpu:
        others = [loc for loc in model.locations if loc.node == dev.node and loc.tier in ("disk", "dram")]
        serving = db.session.scalars(
            db.select(Replica.id)
            .join(Service)
            .where(
                Service.model_id == model.id,
                Replica.node == dev.node,
                Replica.status.in_(("starting", "running")),
            )
        ).first()
        if serving and len(others) <= 1:
            raise Conflict(
                f"{field}: {dev} is the copy replica {serving} on {dev.node} serves from; stop it or pass force=true",
                {"field": field, "device": str(dev), "replica": serving},
            )
    rec = model_state.delete_copy(model, str(dev))
    db.session.commit()
    send_recorded()
    return rec


def register_copy(name: str, text: str) -> tuple[TaskRecord, int]:
    """Record a copy that is already on a node (`POST /models/{name}/locations`): the node checks the files under
    its tier's model directory against the model's manifest (or builds the manifest when the model has none), and
    only its report records the location. 200 and nothing sent when the copy is recorded already."""
    model = locked_model(name)
    dev = parse_device(text, "device")
    if dev.is_gpu:
        raise InvalidRequest(
            f"device: {dev} is a GPU: GPU copies are made with move (POST /models/{name}/move with target_device "
            f"{dev}), which loads the weights from a copy on {dev.node}",
            {"field": "device"},
        )
    dev = dev.expect("device", files=True)
    existing = db.session.get(ModelLocation, (model.id, str(dev)))
    if existing is not None and existing.status == "ready":
        return model_state.already_there(model, "register", dev, dev), 200
    require_node(str(dev.node), "device")
    refuse_busy(model, {str(dev)})
    kwargs = {"model": name, "tier": dev.tier, "manifest": model.manifest}
    rec = dispatch(
        "register", str(dev.node), names.MODEL_REGISTER, kwargs, "normal", model_name=name, target=str(dev)
    )
    return rec, 202
