"""Live placement: which device of the fleet an operation should use, with the scheduler's cost model.

A GPU must have room for the model (its weights times an overhead factor, counting what every process there
holds and what gswarm has placed there but not started yet: never over-committed); among those that do, the
cheapest load wins (weights already on that GPU, then the node's DRAM, its disk, a peer's copy, the hub), then the
least loaded. On a fleet without GPUs a server goes to the CPU of the best node by the same rule. Files (a
download, a copy, a chunk) go to the node that is quickest to fill and least busy. Every decision lists every
candidate, with its estimated load seconds and why it lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gswarm_tasks.devices import Device
from gswarm_tasks.errors import ResourceUnavailable

from .fleet import DEFAULT_HUB_GB_PER_S, GB

TIER_ORDER = ("gpu", "dram", "disk", "peer", "hub")


@dataclass
class Load:
    """What is already placed: replicas per device, bytes reserved per GPU by replicas not started yet, busy
    operations per node, and nodes a new replica should avoid (its siblings are there) or must avoid."""

    replicas: dict[str, int] = field(default_factory=dict)
    reserved_bytes: dict[str, float] = field(default_factory=dict)
    busy: dict[str, int] = field(default_factory=dict)
    spread_from: set[str] = field(default_factory=set)
    exclude: set[str] = field(default_factory=set)
    holding: set[str] = field(default_factory=set)  # nodes that already hold the copy being placed


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _where(model: dict[str, Any] | None, node: str) -> tuple[str, bool]:
    """The best tier a node can load the model from, and whether any node has it."""
    if model is None:
        return "hub", False
    anywhere = bool(model["gpu"] or model["dram"] or model["disk"])
    if node in model["dram"]:
        return "dram", anywhere
    if node in model["disk"] or any(Device.parse(d).node == node for d in model["gpu"]):
        return "disk", anywhere
    return ("peer" if anywhere else "hub"), anywhere


def _seconds(size: float, tier: str, bw: dict[str, float], to_gpu: bool) -> float:
    """Seconds to bring `size` bytes from `tier` into a process on the node (and onto a GPU when `to_gpu`)."""
    if tier == "gpu" or not size:
        return 0.0
    source = {
        "dram": 0.0,
        "disk": size / bw["disk_bytes_per_s"],
        "peer": size / bw["network_bytes_per_s"],
        "hub": size / (DEFAULT_HUB_GB_PER_S * GB),
    }[tier]
    copy = size / bw["h2d_bytes_per_s"]  # into GPU memory, or from page cache into the server's memory
    return round(max(source, copy) if to_gpu or tier == "dram" else source, 3)


def _order(c: dict[str, Any], load: Load) -> tuple[Any, ...]:
    return (
        c["node"] in load.spread_from,
        round(c["load_seconds"], 3),
        c["replicas"],
        load.busy.get(c["node"], 0),
        -(c.get("free_bytes") or 0),
        c["device"],
    )


def _lost(c: dict[str, Any], best: dict[str, Any], load: Load) -> str:
    if c["node"] in load.spread_from and best["node"] not in load.spread_from:
        return f"a replica already runs on {c['node']}; spread over nodes first"
    if round(c["load_seconds"], 3) > round(best["load_seconds"], 3):
        return (
            f"slower load: {c['load_seconds']} s from {c['loaded_from']} against {best['load_seconds']} s "
            f"from {best['loaded_from']}"
        )
    if c["replicas"] > best["replicas"]:
        return f"busier: {c['replicas']} replica(s) against {best['replicas']}"
    if load.busy.get(c["node"], 0) > load.busy.get(best["node"], 0):
        return f"busier node: {load.busy.get(c['node'], 0)} operation(s) under way"
    return "an equal candidate ahead of it"


def _gpu_candidates(
    view: dict[str, Any], model: dict[str, Any] | None, need: float, load: Load
) -> list[dict]:
    size = (model or {}).get("size_bytes") or 0.0
    out = []
    for node in view["nodes"]:
        for g in node["gpus"]:
            c: dict[str, Any] = {
                "device": g["device"],
                "node": node["name"],
                "replicas": load.replicas.get(g["device"], 0),
            }
            free = g["memory_free_bytes"] - load.reserved_bytes.get(g["device"], 0.0)
            c["free_bytes"] = int(max(0.0, free))
            if model is not None and g["device"] in model["gpu"]:
                tier = "gpu"
            else:
                tier, _ = _where(model, node["name"])
            c.update(loaded_from=tier, load_seconds=_seconds(size, tier, node["bandwidths"], True))
            if node["status"] != "healthy":
                c["lost"] = f"{node['name']} is {node['status']}"
            elif node["name"] in load.exclude:
                c["lost"] = f"{node['name']} is excluded (a replica failed there)"
            elif need and free < need:
                c["lost"] = f"needs {_gib(need)}, has {_gib(max(0.0, free))} free"
            out.append(c)
    return out


def _host_candidates(
    view: dict[str, Any], model: dict[str, Any] | None, tier: str | None, load: Load
) -> list[dict]:
    """The CPU (tier None) or a file tier of every node."""
    size = (model or {}).get("size_bytes") or 0.0
    out = []
    for node in view["nodes"]:
        device = f"{node['name']}:{tier or 'cpu'}"
        c: dict[str, Any] = {"device": device, "node": node["name"], "replicas": load.replicas.get(device, 0)}
        where, _ = _where(model, node["name"])
        if tier is not None and model is not None and node["name"] in model.get(tier, []):
            where = "gpu"  # already there: nothing to move
        c.update(loaded_from=where, load_seconds=_seconds(size, where, node["bandwidths"], False))
        c["free_bytes"] = int(node.get("dram_available_bytes") or 0) if tier != "disk" else None
        if node["status"] != "healthy":
            c["lost"] = f"{node['name']} is {node['status']}"
        elif node["name"] in load.exclude:
            c["lost"] = f"{node['name']} is excluded (a replica failed there)"
        elif node["name"] in load.holding:
            c["lost"] = f"{node['name']} already holds a copy on {tier}"
        elif tier == "dram" and not node.get("dram_total_bytes"):
            c["lost"] = f"{node['name']} has no dram tier"
        out.append(c)
    return out


def decide(
    view: dict[str, Any],
    model_name: str | None,
    action: str,
    kind: str | None = None,
    need_bytes: float = 0.0,
    load: Load | None = None,
) -> dict[str, Any]:
    """Choose a device. `action`: `serve` (a GPU, else the CPU on a fleet without GPUs), `load` (weights into a
    GPU's memory), or `store` (a file tier; `kind` dram or disk). `kind` narrows it (gpu, cpu, dram, disk).
    Raises ResourceUnavailable, naming the largest free GPU and the model's need, when nothing fits."""
    load = load or Load()
    model = view["models"].get(model_name) if model_name else None
    gpus_exist = any(n["gpus"] for n in view["nodes"] if n["status"] == "healthy")
    if action == "store":
        cands = _host_candidates(view, model, kind or "disk", load)
    elif kind == "cpu" or (action == "serve" and kind is None and not gpus_exist):
        cands = _host_candidates(view, model, None, load)
    else:
        cands = _gpu_candidates(view, model, need_bytes, load)
    usable = sorted((c for c in cands if "lost" not in c), key=lambda c: _order(c, load))
    if not usable:
        _refuse(view, model_name, action, kind, need_bytes, cands)
    best = usable[0]
    best["chosen"] = True
    for c in usable[1:]:
        c["lost"] = _lost(c, best, load)
    return {
        "action": action,
        "model": model_name,
        "kind": kind,
        "need_bytes": int(need_bytes) if need_bytes else None,
        "chosen": best["device"],
        "loaded_from": best["loaded_from"],
        "load_seconds": best["load_seconds"],
        "candidates": [best, *(c for c in cands if c is not best)],
    }


def _refuse(
    view: dict[str, Any], model: str | None, action: str, kind: str | None, need: float, cands: list
) -> None:
    gpus = [
        (g["memory_free_bytes"], g["device"])
        for n in view["nodes"]
        if n["status"] == "healthy"
        for g in n["gpus"]
    ]
    details: dict[str, Any] = {"model": model, "action": action, "candidates": cands}
    if need and (kind in (None, "gpu")) and action != "store":
        largest = max(gpus, default=(0.0, None))
        details.update(
            need_bytes=int(need), largest_free_bytes=int(largest[0]), largest_free_device=largest[1]
        )
        where = (
            f"the largest free GPU is {largest[1]} with {_gib(largest[0])}"
            if largest[1]
            else "the fleet has no GPU"
        )
        raise ResourceUnavailable(f"{model} needs {_gib(need)} of GPU memory; {where}", details)
    what = {"gpu": "a GPU", "cpu": "a CPU", "dram": "a dram tier", "disk": "a disk"}.get(
        kind or "", "a device"
    )
    if action != "store" and kind in (None, "gpu") and not gpus:
        what = "a GPU (the fleet has none)"
    raise ResourceUnavailable(f"no healthy node offers {what} for {model or 'this operation'}", details)
