"""The scheduler's view of a live fleet, built from plain dicts of nodes and models, and the `Fleet` it implies.

The control plane reads its tables and hands them over as dicts; nothing here touches the database. Sizes are in
bytes and bandwidths in bytes/s, as everywhere in the API; missing bandwidths take the fleet defaults.
"""

from __future__ import annotations

from typing import Any

from gswarm_tasks.devices import Device

from .fields import mapping, number, sequence, text
from .fleet import DEFAULT_GB_PER_S, DEFAULT_HUB_GB_PER_S, GB, Fleet

SCHEDULABLE = ("healthy",)
BANDWIDTH_KEYS = {"h2d_bytes_per_s": "h2d", "disk_bytes_per_s": "disk", "network_bytes_per_s": "network"}


def _gpu(doc: Any, device: Device, field: str) -> dict[str, Any]:
    g = mapping(doc, field)
    total = number(g.get("memory_total_bytes"), f"{field}.memory_total_bytes")
    used = number(g.get("memory_used_bytes"), f"{field}.memory_used_bytes", default=0.0)
    return {
        "device": str(device),
        "local_index": device.gpu_index,
        "name": g.get("name") if isinstance(g.get("name"), str) else None,
        "memory_total_bytes": total,
        "memory_free_bytes": max(0.0, total - used),
    }


def _node(doc: Any, field: str) -> dict[str, Any]:
    n = mapping(doc, field)
    name = text(n.get("name"), f"{field}.name")
    status = n.get("status") if isinstance(n.get("status"), str) else "unknown"
    gpus = []
    for i, g in enumerate(sequence(n.get("gpus") or [], f"{field}.gpus")):
        index = mapping(g, f"{field}.gpus[{i}]").get("index", i)
        gpus.append(
            _gpu(g, Device.parse(f"{name}:gpu{index}", f"{field}.gpus[{i}].index"), f"{field}.gpus[{i}]")
        )
    given = mapping(n.get("bandwidths") or {}, f"{field}.bandwidths")
    defaults = {k: DEFAULT_GB_PER_S[f"{short}_gb_per_s"] * GB for k, short in BANDWIDTH_KEYS.items()}
    bandwidths = {
        k: number(given.get(k), f"{field}.bandwidths.{k}", positive=True, default=v)
        for k, v in defaults.items()
    }
    return {
        "name": name,
        "status": status,
        "schedulable": status in SCHEDULABLE and bool(gpus),
        "gpus": gpus,
        "dram_total_bytes": number(n.get("dram_total_bytes"), f"{field}.dram_total_bytes", default=0.0),
        "dram_available_bytes": number(
            n.get("dram_available_bytes"), f"{field}.dram_available_bytes", default=0.0
        ),
        "bandwidths": bandwidths,
    }


def fleet_view(nodes: list[dict[str, Any]], models: list[dict[str, Any]]) -> dict[str, Any]:
    """Nodes (status, GPUs with free memory, DRAM, bandwidths), GPUs numbered as the scheduler numbers them
    (schedulable nodes in order), and per model where its weights are by tier (`gpu` devices, `dram`/`disk` nodes)."""
    view_nodes = [_node(n, f"nodes[{i}]") for i, n in enumerate(sequence(nodes, "nodes"))]
    index = 0
    for node in view_nodes:
        for gpu in node["gpus"]:
            gpu["index"] = index if node["schedulable"] else None
            index += 1 if node["schedulable"] else 0
    known = {n["name"] for n in view_nodes}
    view_models: dict[str, Any] = {}
    for i, raw in enumerate(sequence(models, "models")):
        mf = f"models[{i}]"
        m = mapping(raw, mf)
        name = text(m.get("name"), f"{mf}.name")
        where: dict[str, list[str]] = {"gpu": [], "dram": [], "disk": []}
        for j, loc in enumerate(sequence(m.get("locations") or [], f"{mf}.locations")):
            dev = Device.parse(text(loc, f"{mf}.locations[{j}]"), f"{mf}.locations[{j}]")
            if dev.node not in known:
                continue  # a copy on a node the fleet no longer lists cannot be loaded from
            if dev.is_gpu:
                where["gpu"].append(str(dev))
            elif dev.tier in ("dram", "disk") and dev.node is not None:
                where[dev.tier].append(dev.node)
        view_models[name] = {
            "size_bytes": number(m.get("size_bytes"), f"{mf}.size_bytes", positive=True),
            **where,
        }
    usable = [n for n in view_nodes if n["schedulable"]]
    return {
        "nodes": view_nodes,
        "gpus": sum(len(n["gpus"]) for n in usable),
        "gpu_memory_free_bytes": sum(g["memory_free_bytes"] for n in usable for g in n["gpus"]),
        "models": view_models,
    }


def fleet_from_view(view: dict[str, Any]) -> Fleet:
    """The `Fleet` of a view's schedulable nodes, with the weights' current locations as its starting point.

    GPU capacity is the whole memory: what is resident now is in the view as `gpu` locations, which the
    scheduler accounts for itself.
    """
    usable = [n for n in view["nodes"] if n["schedulable"]]
    fleet = Fleet(hub_bytes_per_s=DEFAULT_HUB_GB_PER_S * GB)
    for n, node in enumerate(usable):
        fleet.node_names.append(node["name"])
        for gpu in node["gpus"]:
            fleet.gpu_node.append(n)
            fleet.gpu_local.append(gpu["local_index"])
            fleet.gpu_memory_bytes.append(gpu["memory_total_bytes"])
        fleet.dram_bytes.append(node["dram_total_bytes"])
        fleet.h2d_bytes_per_s.append(node["bandwidths"]["h2d_bytes_per_s"])
        fleet.disk_bytes_per_s.append(node["bandwidths"]["disk_bytes_per_s"])
        fleet.network_bytes_per_s.append(node["bandwidths"]["network_bytes_per_s"])
    node_index = {name: i for i, name in enumerate(fleet.node_names)}
    by_device = {fleet.gpu_name(g): g for g in range(fleet.gpus)}
    for name, m in view["models"].items():
        fleet.size_bytes[name] = m["size_bytes"]
        places = [(node_index[n], t, -1) for t in ("dram", "disk") for n in m[t] if n in node_index]
        places += [(fleet.gpu_node[by_device[d]], "gpu", by_device[d]) for d in m["gpu"] if d in by_device]
        fleet.weights[name] = places
    return fleet
